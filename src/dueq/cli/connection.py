"""Which Redis a command talks to, checked up front, and which queues it holds.

Every command takes ``--redis-url`` (default ``$DUEQ_REDIS_URL``, else
``redis://127.0.0.1:6379/0`` as redis-cli assumes) or ``--embedded`` (a throwaway local
redis-server, stopped when the command ends). Passwords never appear in messages.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import click
import redis

from ..keys import PREFIX, QueueKeys
from ..queue import Queue
from ..server import RedisServer
from ..snapshot import text
from .errors import CliError

ENV_URL = "DUEQ_REDIS_URL"
DEFAULT_URL = "redis://127.0.0.1:6379/0"
CONNECT_TIMEOUT_S = 5.0


def shown_url(url: str) -> str:
    """``url`` with its password replaced by ``***``, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def _reason(exc: BaseException) -> str:
    """The operating system's words for a failed connection, else redis-py's."""
    cause = exc.__context__ or exc.__cause__
    if isinstance(cause, OSError) and cause.strerror:
        return cause.strerror
    return str(exc).strip() or type(exc).__name__


@dataclass
class Connection:
    """An open, checked Redis client, its URL, and the URL to name it by (password hidden)."""

    client: redis.Redis
    url: str
    shown: str
    embedded: bool


@dataclass(frozen=True)
class RedisTarget:
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
            server = RedisServer().start()
            ctx.call_on_close(server.stop)
            url = server.url
        shown = shown_url(url)
        try:
            client = redis.Redis.from_url(url, socket_connect_timeout=CONNECT_TIMEOUT_S)
        except ValueError as exc:
            raise CliError(f"bad Redis URL {shown}: {exc}") from exc
        ctx.call_on_close(client.close)
        try:
            client.ping()
        except redis.AuthenticationError as exc:
            raise CliError(f"Redis at {shown} refused the credentials: {exc}") from exc
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise CliError(f"cannot reach Redis at {shown}: {_reason(exc)}") from exc
        except redis.RedisError as exc:
            raise CliError(f"Redis at {shown} refused PING: {exc}") from exc
        return Connection(client, url, shown, self.embedded)


def redis_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--redis-url`` and ``--embedded`` to a command; it receives ``target=RedisTarget``."""

    @functools.wraps(command)
    def wrapper(*args: Any, redis_url: str, embedded: bool, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        if (
            embedded
            and ctx.get_parameter_source("redis_url") is click.core.ParameterSource.COMMANDLINE
        ):
            raise click.UsageError("--redis-url and --embedded exclude each other")
        return command(*args, target=RedisTarget(redis_url, embedded), **kwargs)

    wrapper = click.option(
        "--embedded",
        is_flag=True,
        help="Start a throwaway local redis-server for this command (stopped at exit).",
    )(wrapper)
    return click.option(
        "--redis-url",
        envvar=ENV_URL,
        default=DEFAULT_URL,
        show_default=True,
        metavar="URL",
        help=f"Redis to use (redis:// or rediss://); also ${ENV_URL}.",
    )(wrapper)


def queue_names(client: redis.Redis) -> list[str]:
    """Names of the queues with any key in this database (SCAN, incremental)."""
    start = f"{PREFIX}:{{"
    names = {
        key[len(start) : key.index("}:")]
        for key in (text(k) for k in client.scan_iter(match=f"{start}*}}:*", count=1000))
    }
    return sorted(names)


def open_queue(target: RedisTarget, name: str) -> Queue:
    """Connect and return queue ``name``; CliError if it has no key in Redis."""
    conn = target.open()
    require_queue(conn, name)
    return Queue(name, conn.client)


def require_queue(conn: Connection, name: str) -> None:
    """CliError unless queue ``name`` has any key (tasks, dead tasks or counters) in Redis."""
    k = QueueKeys.for_queue(name)
    if not conn.client.exists(k.due, k.leased, k.tasks, k.dead, k.stats, k.cron, k.done):
        raise CliError(f"no queue named {name!r} at {conn.shown}")
