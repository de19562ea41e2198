"""Which Redis a command talks to, checked up front, and which queues it holds.

Every command takes ``--redis-url`` (default ``$DUEQ_REDIS_URL``, else
``redis://127.0.0.1:6379/0`` as redis-cli assumes) or ``--embedded`` (a throwaway local
redis-server, stopped when the command ends). Passwords never appear in messages:
``dueq.logs.shown_url`` masks the user-info password and every query parameter named
``*password*``, ``*secret*`` or ``*token*``, and the error reporter masks the URL's secrets
wherever else they might appear (``url_secrets``).

Redis Sentinel: ``redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db]``
(``rediss+sentinel://`` for TLS) asks the Sentinels for the primary of ``service`` and asks
again after a failover, so ``dueq worker`` follows it (redis-py's ``Sentinel.master_for``;
the worker waits out the outage as for any lost connection). The user-info credentials are
the data nodes'; ``?sentinel_password=`` (and ``sentinel_username``) are the Sentinels' own.

Redis Cluster: ``redis+cluster://[[user]:password@]host:port`` (``rediss+cluster://`` for
TLS) names any one node; redis-py's ``RedisCluster`` finds the others and follows slot moves
and failovers. Every command opens a queue as it is stored (``dueq.discovery.open_queue``), so
a sharded queue is addressed by its logical name.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple
from urllib.parse import parse_qsl, unquote, urlsplit

import click
import redis
import redis.sentinel
from redis.backoff import NoBackoff
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from dueq import discovery
from dueq._wire.codec import environment_codec, revealing
from dueq.cli.errors import CliError, Settings
from dueq.cli.output import safe
from dueq.logs import shown_url, split_netloc, url_secrets
from dueq.queue import Queue

ENV_URL = "DUEQ_REDIS_URL"
DEFAULT_URL = "redis://127.0.0.1:6379/0"
CONNECT_TIMEOUT_S = 5.0
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
DEFAULT_SENTINEL_PORT = 26379


def _reason(exc: BaseException) -> str:
    """The operating system's words for a failed connection, else redis-py's."""
    cause = exc.__context__ or exc.__cause__
    if isinstance(cause, OSError) and cause.strerror:
        return cause.strerror
    return str(exc).strip() or type(exc).__name__


class Connection(NamedTuple):
    """An open, checked Redis client, its URL, and the URL to name it by (password hidden).

    This record and ``RedisTarget`` are NamedTuples, not dataclasses: a dataclass costs about
    0.7 ms to create at import, on every command's start (docs/benchmarks.md, Start-up)."""

    client: redis.Redis
    url: str
    shown: str
    embedded: bool


class RedisTarget(NamedTuple):
    """Where the command's Redis is; ``open()`` connects when the command needs it."""

    url: str
    embedded: bool

    def open(self) -> Connection:
        """Connect (starting the embedded server first) and PING; CliError when that fails.

        The client and server are closed when the click context ends.
        """
        ctx = click.get_current_context()
        url = self.url
        if self.embedded:
            from dueq.server import RedisServer  # only here: a worker never imports it

            server = RedisServer().start()
            ctx.call_on_close(server.stop)
            url = server.url
        shown = safe(shown_url(url))
        try:
            client = client_from_url(url)
        except ValueError as exc:
            raise CliError(f"bad Redis URL {shown}: {exc}") from exc
        except (redis.RedisError, RedisClusterException) as exc:  # a cluster connects at once
            raise CliError(f"cannot reach the Redis Cluster at {shown}: {_reason(exc)}") from exc
        ctx.call_on_close(client.close)
        try:
            client.ping()
        except redis.AuthenticationError as exc:
            raise CliError(f"Redis at {shown} refused the credentials: {exc}") from exc
        except redis.sentinel.MasterNotFoundError as exc:
            raise CliError(f"the Sentinels at {shown} name no primary: {exc}") from exc
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise CliError(f"cannot reach Redis at {shown}: {_reason(exc)}") from exc
        except redis.RedisError as exc:
            raise CliError(f"Redis at {shown} refused PING: {exc}") from exc
        return Connection(client, url, shown, self.embedded)


def client_from_url(url: str) -> redis.Redis:
    """A client for a ``redis://``, ``rediss://``, ``unix://`` or Sentinel URL (ValueError
    when the URL cannot be read)."""
    scheme = url.partition("://")[0].lower()
    if scheme in SENTINEL_SCHEMES:
        return _sentinel_client(url, tls=scheme.startswith("rediss"))
    client: redis.Redis = discovery.client_for_url(url, socket_connect_timeout=CONNECT_TIMEOUT_S)
    return client


def _host_port(item: str) -> tuple[str, int]:
    host, port = item, ""
    if item.startswith("["):  # [IPv6]:port
        host, _, rest = item[1:].partition("]")
        port = rest.removeprefix(":")
    elif ":" in item:
        host, _, port = item.rpartition(":")
    if not host:
        raise ValueError(f"no host in {item!r}")
    if not port:
        return host, DEFAULT_SENTINEL_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bad port in {item!r}")
    return host, int(port)


def _sentinel_client(url: str, *, tls: bool) -> redis.Redis:
    """The primary of the URL's service, found (and found again after a failover) through
    the Sentinels the URL lists."""
    parts = urlsplit(url)
    user, password, hosts = split_netloc(parts.netloc)
    nodes = [_host_port(item) for item in hosts.split(",") if item]
    if not nodes:
        raise ValueError("a Sentinel URL lists host:port[,host:port...]")
    path = [unquote(p) for p in parts.path.split("/") if p]
    if not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ValueError("a Sentinel URL ends in /service_name or /service_name/db")
    query = dict(parse_qsl(parts.query))
    unknown = sorted(set(query) - {"sentinel_password", "sentinel_username"})
    if unknown:
        raise ValueError(f"unknown parameter(s) {', '.join(unknown)}")
    common: dict[str, Any] = {"socket_connect_timeout": CONNECT_TIMEOUT_S, "ssl": tls}
    # (Any: redis-py's Sentinel is untyped in some releases, typed in others)
    make_sentinel: Any = redis.sentinel.Sentinel
    sentinel = make_sentinel(
        nodes,
        sentinel_kwargs={
            **common,
            # a Sentinel that is down is skipped at once for the next (no retries with backoff)
            "retry": Retry(NoBackoff(), 0),
            "username": query.get("sentinel_username"),
            "password": query.get("sentinel_password"),
        },
        **common,
    )
    client: redis.Redis = sentinel.master_for(
        path[0],
        username=unquote(user) if user else None,
        password=unquote(password) if password is not None else None,
        db=int(path[1]) if len(path) == 2 else 0,
    )
    return client


#: ``--embedded`` is offered only where an empty Redis is of use (``embedded_redis_options``):
#: ``dashboard`` prints its URL, for ``schedule`` and ``worker`` to use (``demo`` fills its own).
EMBEDDED_HELP = "Start a throwaway local redis-server for this command (stopped at exit)."


def redis_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--redis-url`` to a command; it receives ``target=RedisTarget``.

    ``dueq --redis-url URL COMMAND`` works as ``COMMAND --redis-url URL``; ``dueq --embedded
    COMMAND`` is a usage error (only ``embedded_redis_options`` commands offer it)."""
    return _redis_options(command, embedded=False)


def embedded_redis_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``redis_options`` and ``--embedded``: for a command an empty Redis is of use to."""
    return _redis_options(command, embedded=True)


def _redis_options(command: Callable[..., Any], *, embedded: bool) -> Callable[..., Any]:
    offered = embedded

    @functools.wraps(command)
    def wrapper(*args: Any, redis_url: str, **kwargs: Any) -> Any:
        wanted = bool(kwargs.pop("embedded", False))
        ctx = click.get_current_context()
        given = ctx.get_parameter_source("redis_url") is click.core.ParameterSource.COMMANDLINE
        settings = ctx.find_object(Settings)
        if settings is not None:  # dueq --redis-url URL / --embedded before the command
            if settings.redis_url is not None:
                if given and redis_url != settings.redis_url:
                    raise click.UsageError("--redis-url given twice, with different URLs")
                redis_url, given = settings.redis_url, True
            if settings.embedded and not offered:
                raise click.UsageError(
                    f"'{ctx.command_path}' has no --embedded: a throwaway Redis holds no queue "
                    f"(give --redis-url)"
                )
            wanted = wanted or settings.embedded
        if wanted and given:
            raise click.UsageError("--redis-url and --embedded exclude each other")
        if settings is not None:
            settings.secrets |= url_secrets(redis_url)
        return command(*args, target=RedisTarget(redis_url, wanted), **kwargs)

    if offered:
        wrapper = click.option("--embedded", is_flag=True, help=EMBEDDED_HELP)(wrapper)
    return click.option(
        "--redis-url",
        envvar=ENV_URL,
        default=DEFAULT_URL,
        show_default=True,
        metavar="URL",
        help=f"Redis to use (redis://, rediss://, unix://, redis+sentinel://HOST:PORT[,...]"
        f"/SERVICE or redis+cluster://HOST:PORT); also ${ENV_URL}.",
    )(wrapper)


def queue_names(client: redis.Redis) -> list[str]:
    """Names of the queues with any key in this database (``dueq.discovery``). CliError
    when this user may not SCAN."""
    try:
        return discovery.queue_names(client)
    except redis.exceptions.NoPermissionError as exc:
        raise CliError(
            f"this Redis user may not SCAN to find queues ({exc}); name the queue instead"
        ) from exc


def open_queue(target: RedisTarget, name: str, *, decrypt: bool = False) -> Queue:
    """Connect and return queue ``name``; CliError if it has no key in Redis. Its encrypted
    payloads show as markers unless ``decrypt`` (``--decrypt``: opened with ``DUEQ_KEYS``,
    checked before connecting)."""
    codec = revealing(decrypt, "--decrypt")
    conn = target.open()
    require_queue(conn, name)
    return discovery.open_queue(conn.client, name, codec=codec)


def payload_settings(compression: str | None) -> dict[str, Any]:
    """``codec=`` and ``compression=`` of a queue a command schedules or runs tasks on: sealed
    and opened with the keys of ``DUEQ_KEYS`` when it is set (``environment_codec``; a worker
    holding the keys is the point, so no ``--decrypt`` is asked for), with ``--compression``.
    ConfigurationError (one line) for a malformed ``DUEQ_KEYS``, before connecting."""
    return {"codec": environment_codec(), "compression": compression}


def require_queue(conn: Connection, name: str, hint: str = "") -> None:
    """CliError unless queue ``name`` exists (``dueq.discovery.queue_exists``: any of its keys,
    live workers included, is in Redis); ``hint`` ends the message."""
    if not discovery.queue_exists(conn.client, name):
        raise CliError(f"no queue named {safe(repr(name))} at {conn.shown}{hint}")
