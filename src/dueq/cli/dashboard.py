"""``dueq dashboard``: serve the web UI (``dueq.dashboard``) with uvicorn until Ctrl-C.

It binds 127.0.0.1 unless ``--host`` says otherwise, and refuses a non-loopback address
without ``--token`` (or ``$DUEQ_DASHBOARD_TOKEN``, which keeps it out of the process list) or
an explicit ``--insecure``. It answers only to the Host names of docs/dashboard-security.md
(loopback, ``--host``, the arrival address, each ``--allow-host``).
Needs the dashboard extra: ``pip install 'dueq[dashboard]'``.
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from typing import Any

import click

from dueq.cli.connection import RedisTarget, embedded_redis_options, require_queue
from dueq.cli.errors import CliError
from dueq.exceptions import ConfigurationError

DEFAULT_HOST = "127.0.0.1"
#: Bind-anywhere addresses: no browser names the dashboard by these, so they are not allowed
#: as a Host (the address a request arrives on is, see ``dueq.dashboard._guard.HostRules``).
WILDCARDS = ("0.0.0.0", "::", "")
ENV_TOKEN = "DUEQ_DASHBOARD_TOKEN"
#: A health threshold: a positive number of seconds. The dead-letter window is at most the
#: 24 h of per-minute history Redis keeps (``dueq.dashboard.HealthRules``).
SECONDS = click.FloatRange(min=0, min_open=True)
DEAD_WINDOW_MAX_S = 86_400


def dashboard_module() -> Any:
    """``dueq.dashboard``, or CliError naming the extra to install."""
    try:
        from dueq import dashboard
    except ImportError as exc:
        raise CliError(f"{exc}") from None
    return dashboard


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port``, as uvicorn would bind it (SO_REUSEADDR); CliError
    in one line when it cannot be (the port is taken, the address is not this machine's), so
    that happens before the URL is printed and uvicorn is started."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:  # socket.gaierror too: the host name does not resolve
        raise CliError(f"cannot serve the dashboard on {host}:{port}: {exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(socket.SOMAXCONN)
    except OSError as exc:
        sock.close()
        reason = "the port is in use" if exc.errno == errno.EADDRINUSE else exc.strerror
        raise CliError(
            f"cannot serve the dashboard on {host}:{port}: {reason} (choose another --port)"
        ) from None
    return sock


def serve(app: Any, sock: socket.socket) -> None:
    """Run ``app`` with uvicorn on the bound ``sock`` until Ctrl-C or SIGTERM (uvicorn
    handles both)."""
    try:
        import uvicorn
    except ImportError:
        raise CliError("the dashboard needs uvicorn: pip install 'dueq[dashboard]'") from None
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    with sock:
        server.run(sockets=[sock])
    if not server.started:
        raise CliError("the dashboard could not start (see uvicorn's message above)")


@click.command()
@click.option("--host", default=DEFAULT_HOST, show_default=True, help="Address to bind.")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=8080, show_default=True, help="TCP port."
)
@click.option("--read-only", is_flag=True, help="Show everything, change nothing (no buttons).")
@click.option(
    "--token",
    envvar=ENV_TOKEN,
    metavar="TOKEN",
    help=f"Require this token (Bearer header or login form); also ${ENV_TOKEN}.",
)
@click.option("--insecure", is_flag=True, help="Allow a non-loopback --host without a token.")
@click.option(
    "--allow-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME[:PORT]",
    help="Also answer to this Host name (repeatable): the name people and proxies use. "
    "Default: 127.0.0.1, localhost, ::1, --host and the address a request arrived on.",
)
@click.option(
    "--behind-tls",
    is_flag=True,
    help="Browsers reach it over https (a TLS proxy in front): mark its cookies Secure.",
)
@click.option(
    "--session-hours",
    type=click.FloatRange(min=0, min_open=True),
    default=12.0,
    show_default=True,
    help="How long a login lasts (with --token).",
)
@click.option(
    "--queue",
    "queues",
    multiple=True,
    metavar="QUEUE",
    help="Show this queue (repeatable); default: every queue found.",
)
@click.option(
    "--health-no-worker-bad-s",
    type=SECONDS,
    metavar="SECONDS",
    help="A queue is bad when its oldest due task has waited this long with no live worker "
    "(default 60).",
)
@click.option(
    "--health-lag-bad-s",
    type=SECONDS,
    metavar="SECONDS",
    help="A queue is bad when its oldest due task has waited this long at all (default 300).",
)
@click.option(
    "--health-dead-window-s",
    type=click.FloatRange(min=0, max=DEAD_WINDOW_MAX_S, min_open=True),
    metavar="SECONDS",
    help="A queue warns when a task died in this window (default 3600, at most 86400: the "
    "history Redis keeps).",
)
@click.option(
    "--decrypt",
    is_flag=True,
    help="Show encrypted payloads opened with the keys in $DUEQ_KEYS (off: they show as "
    "<encrypted KEY, N B>). Anyone who can load a page reads them: give it a --token.",
)
@embedded_redis_options
def dashboard(
    host: str,
    port: int,
    read_only: bool,
    token: str | None,
    insecure: bool,
    allowed_hosts: tuple[str, ...],
    behind_tls: bool,
    session_hours: float,
    queues: tuple[str, ...],
    health_no_worker_bad_s: float | None,
    health_lag_bad_s: float | None,
    health_dead_window_s: float | None,
    decrypt: bool,
    target: RedisTarget,
) -> None:
    """Serve a web UI of the queues at http://HOST:PORT/ (and /metrics) until Ctrl-C.

    Overview, queue pages (due histogram, leased, scheduled with search, dead by error type),
    task pages, workers and cron. Every change is a confirmed POST with a CSRF token. The
    --health-* options set when a queue's row turns warn or bad (docs/dashboard-health.md).
    """
    d = dashboard_module()
    try:
        d.check_bind(host, token=token, insecure=insecure)
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from None
    thresholds = {
        "no_worker_bad_s": health_no_worker_bad_s,
        "lag_bad_s": health_lag_bad_s,
        "dead_window_s": health_dead_window_s,
    }
    try:
        health = d.HealthRules(**{k: v for k, v in thresholds.items() if v is not None})
    except ConfigurationError as exc:  # nan passes click's range check
        given = next(
            (f"--health-{k[:-2].replace('_', '-')}-s" for k in thresholds if k in str(exc)), None
        )
        raise click.BadParameter(str(exc), param_hint=given) from None
    conn = target.open()
    for name in queues:
        require_queue(conn, name)
    sock = listen(host, port)
    ctx = click.get_current_context()
    ctx.call_on_close(sock.close)  # closed at once if anything below fails; else uvicorn's
    port = sock.getsockname()[1]  # --port 0: the port the system chose
    shown = host if ":" not in host else f"[{host}]"
    if host not in WILDCARDS:  # the name it is bound to, at its port (an address: harmless)
        allowed_hosts = (f"{shown}:{port}", *allowed_hosts)
    settings = d.DashboardSettings(
        read_only=read_only,
        token=token or None,
        queues=queues,
        allowed_hosts=allowed_hosts,
        behind_tls=behind_tls,
        session_s=session_hours * 3600,
        health=health,
        decrypt=decrypt,
    )
    try:
        app = d.create_app(conn.url, settings)
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(f"dueq dashboard on http://{shown}:{port}/ (Redis {conn.shown})", err=True)
    serve(app, sock)


class Background:
    """The dashboard served by uvicorn in a daemon thread (``dueq demo --dashboard``)."""

    def __init__(self, app: Any, host: str, port: int) -> None:
        import uvicorn

        self.server = uvicorn.Server(
            uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = f"http://{host}:{port}/"

    def start(self, timeout_s: float = 10.0) -> Background:
        """Start serving; CliError when it has not started within ``timeout_s``."""
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise CliError(f"the dashboard could not start on {self.url}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
