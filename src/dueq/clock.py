"""Time values: seconds or timedelta in, integer epoch milliseconds out.

By default the queue's clock is the Redis server's ``TIME`` (read inside each script), so
workers with skewed clocks can neither fire early nor steal leases. A ``Clock`` (a zero-argument
callable returning epoch seconds) replaces it for tests and simulations.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

from .exceptions import ConfigurationError, InvalidTaskError

Clock = Callable[[], float]
Duration = float | int | timedelta


def duration_ms(value: Duration, what: str, *, error: type[Exception] = InvalidTaskError) -> int:
    """Convert seconds (int/float) or a timedelta to whole milliseconds, refusing bad values."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise error(f"{what} must be seconds (int/float) or a timedelta, got {value!r}")
    if math.isnan(seconds) or math.isinf(seconds):
        raise error(f"{what} must be a finite number of seconds, got {value!r}")
    if seconds < 0:
        raise error(f"{what} must not be negative, got {value!r}")
    return round(seconds * 1000)


def positive_duration_ms(value: Duration, what: str) -> int:
    """Like duration_ms, for settings: strictly positive, ConfigurationError otherwise."""
    ms = duration_ms(value, what, error=ConfigurationError)
    if ms <= 0:
        raise ConfigurationError(f"{what} must be at least 1 ms, got {value!r}")
    return ms


def datetime_ms(value: datetime) -> int:
    """Epoch milliseconds of an aware datetime; naive datetimes are refused."""
    if not isinstance(value, datetime):
        raise InvalidTaskError(f"at= must be a datetime, got {value!r}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidTaskError(
            f"at={value!r} is a naive datetime; give it a time zone (e.g. tzinfo=timezone.utc)"
        )
    return round(value.timestamp() * 1000)


def ms_datetime(ms: int) -> datetime:
    """An aware UTC datetime for epoch milliseconds."""
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


def clock_ms(clock: Clock) -> int:
    """Read an injected clock as epoch milliseconds."""
    return round(clock() * 1000)
