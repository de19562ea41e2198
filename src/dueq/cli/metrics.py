"""``dueq metrics``: a Prometheus exporter for the queues of one Redis (``dueq.metrics``).

It serves ``QueueCollector`` (and the exporter process's own metrics) at
``http://HOST:PORT/metrics`` until Ctrl-C or SIGTERM. It binds 127.0.0.1 unless ``--host`` says
otherwise. Without ``--queue`` every queue found at each scrape is exported.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

import click

from dueq.cli.connection import RedisTarget, redis_options, require_queue
from dueq.cli.errors import CliError

DEFAULT_HOST = "127.0.0.1"


def metrics_module() -> Any:
    """``dueq.metrics``, or CliError naming the extra to install."""
    try:
        from dueq import metrics
    except ImportError as exc:
        raise CliError(f"{exc}") from None
    return metrics


def start_exporter(registry: Any, port: int, host: str) -> Any:
    """Serve ``registry``; CliError when the address cannot be bound."""
    try:
        return metrics_module().serve(registry, port, host)
    except OSError as exc:
        raise CliError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}") from exc


@click.command()
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=9808,
    show_default=True,
    help="TCP port to serve /metrics on (0: any free port).",
)
@click.option("--host", default=DEFAULT_HOST, show_default=True, help="Address to bind.")
@click.option(
    "--queue",
    "queues",
    multiple=True,
    metavar="QUEUE",
    help="Export this queue (repeatable); default: every queue found at each scrape.",
)
@redis_options
def metrics(port: int, host: str, queues: tuple[str, ...], target: RedisTarget) -> None:
    """Serve Prometheus metrics of the queues at http://HOST:PORT/metrics until Ctrl-C.

    Gauges by state (dueq_tasks{state="delayed|due|leased|dead"}), oldest due lag, paused,
    cron definitions, and the queues' lifetime counters (dueq_task_outcomes_total{outcome=...},
    dueq_tasks_scheduled_total, ...; docs/metrics.md), read from Redis at each scrape. Needs the
    metrics extra: pip install 'dueq[metrics]'.
    """
    m = metrics_module()
    conn = target.open()
    for name in queues:
        require_queue(conn, name)
    registry = m.new_registry()
    registry.register(m.QueueCollector(conn.client, list(queues) or None))
    server = start_exporter(registry, port, host)
    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    previous = signal.signal(signal.SIGTERM, on_signal)
    click.echo(f"serving metrics on http://{host}:{server.server_port}/metrics", err=True)
    try:
        while not stop.wait(0.2):
            pass
    except KeyboardInterrupt:  # Ctrl-C is how the exporter ends
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.shutdown()
        server.server_close()
