"""Small argument checks shared by the public API."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import redis

from dueq.exceptions import ConfigurationError, DueqError

T = TypeVar("T")


def whole_number(value: object, what: str, *, low: int, high: int | None = None) -> int:
    """``value`` if it is an int (not a bool) within [low, high], else ConfigurationError."""
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or value < low
        or (high is not None and value > high)
    ):
        bounds = f"from {low} to {high}" if high is not None else f">= {low}"
        raise ConfigurationError(f"{what} must be an int {bounds}, got {value!r}")
    return value


#: Longest name of a queue or a cron definition.
MAX_NAME_LENGTH = 200


def checked_name(name: object, what: str, error: type[DueqError], *, forbidden: str = "") -> str:
    """``name`` if it can name a queue or a cron definition, else ``error``.

    One rule for both: a non-empty str of at most MAX_NAME_LENGTH printable characters with
    no whitespace anywhere. Whitespace is refused because names travel where spaces split
    words: ACL rules (``~dueq:{name}:*``, one rule per word), shell commands, log lines and
    Prometheus label values read by people. ``forbidden`` adds characters of the kind's own
    (queue names: the braces of the Redis Cluster hash tag).
    """
    if not isinstance(name, str) or not name:
        raise error(f"{what} must be a non-empty string, got {name!r}")
    if len(name) > MAX_NAME_LENGTH:
        raise error(f"{what} is longer than {MAX_NAME_LENGTH} characters")
    if not name.isprintable() or any(c.isspace() or c in forbidden for c in name):
        extra = f" or {' '.join(forbidden)}" if forbidden else ""
        raise error(f"{what} {name!r} must be printable, without spaces{extra}")
    return name


#: Longest lease holder name: it is kept with every leased task (see ``Queue(holder=...)``), and
#: 32 characters keep that under 40 bytes per task (scripts/bench/views.py measures it).
MAX_HOLDER_LENGTH = 32


def validate_holder(holder: object) -> str:
    """A lease holder name: printable, without "|", at most MAX_HOLDER_LENGTH characters."""
    if (
        not isinstance(holder, str)
        or not holder
        or len(holder) > MAX_HOLDER_LENGTH
        or "|" in holder
        or not holder.isprintable()
    ):
        raise ConfigurationError(
            f"holder must be a printable string of 1 to {MAX_HOLDER_LENGTH} characters "
            f'without "|", got {holder!r}'
        )
    return holder


def with_driver_info(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` for redis-py's ``from_url`` with its ``driver_info`` (the name and version
    CLIENT SETINFO sends) resolved once, unless the caller gave it or ``lib_name``/
    ``lib_version``. Without it redis-py 7+ resolves it for every connection its pool opens,
    reading the installed package's metadata each time: milliseconds of CPU per connection,
    and a worker opens three or four before its first task. The values sent are the same."""
    found = dict(options)
    if {"driver_info", "lib_name", "lib_version"} & found.keys():
        return found
    try:
        from redis.driver_info import DriverInfo
    except ImportError:  # redis-py before 7 takes no driver_info (and resolves nothing)
        return found
    # redis.__version__ is the installed version redis-py reports (it is what
    # importlib.metadata finds); DriverInfo() alone would search every sys.path entry's
    # package metadata for it once more (5-14 ms of a worker's start, docs/benchmarks.md)
    found["driver_info"] = DriverInfo(lib_version=redis.__version__)
    return found


def client_from_url(
    from_url: Callable[..., T], url: object, client_options: Mapping[str, Any] | None
) -> T:
    """``from_url(url, **client_options)`` (redis-py's ``Redis.from_url``, blocking or asyncio);
    a URL it cannot use (not a str, an unknown scheme) is a ConfigurationError. Nothing is
    connected yet: redis-py connects at the first command."""
    if not isinstance(url, str):
        raise ConfigurationError(f"the Redis URL must be a str, got {type(url).__name__}")
    try:
        return from_url(url, **with_driver_info(client_options or {}))
    except ValueError as exc:  # redis-py's word for a URL it cannot read
        raise ConfigurationError(f"cannot use the Redis URL: {exc}") from exc
