"""Time values: seconds or timedelta in, integer epoch milliseconds out.

By default the queue's clock is the Redis server's ``TIME`` (read inside each script), so
workers with skewed clocks can neither fire early nor steal leases. A ``Clock`` (a zero-argument
callable returning epoch seconds) replaces it for tests and simulations.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

from dueq.exceptions import ConfigurationError, InvalidTaskError

Clock = Callable[[], float]
Duration = float | int | timedelta

#: Longest duration accepted anywhere (delays, leases, retention): 100 years. Anything longer
#: is a unit mistake, and due times past year 9999 cannot be shown as datetimes.
MAX_DURATION_S = 100 * 365 * 86400
#: Due times accepted for ``at=``: from the epoch to the end of year 9999 (what a datetime can
#: show; every value in between is an exact integer in Redis's double scores).
MIN_DUE_MS = 0
MAX_DUE_MS = 253_402_300_799_999


def duration_ms(value: Duration, what: str, *, error: type[Exception] = InvalidTaskError) -> int:
    """Convert seconds (int/float) or a timedelta to whole milliseconds, refusing bad values."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except OverflowError:  # an int beyond float range
            raise error(f"{what} is too large: at most {MAX_DURATION_S} seconds") from None
    else:
        raise error(f"{what} must be seconds (int/float) or a timedelta, got {_short(value)}")
    if math.isnan(seconds) or math.isinf(seconds):
        raise error(f"{what} must be a finite number of seconds, got {value!r}")
    if seconds < 0:
        raise error(f"{what} must not be negative, got {value!r}")
    if seconds > MAX_DURATION_S:
        raise error(f"{what} is too large: at most {MAX_DURATION_S} seconds (100 years)")
    return round(seconds * 1000)


def _short(value: object) -> str:
    """A repr for messages, cut so that a huge argument cannot flood a log line."""
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."


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
    try:
        ms = round(value.timestamp() * 1000)
    except (OverflowError, ValueError):  # e.g. datetime.min with an offset
        ms = -1
    if not MIN_DUE_MS <= ms <= MAX_DUE_MS:
        raise InvalidTaskError(f"at={value.isoformat()} is outside 1970-01-01 to 9999-12-31 UTC")
    return ms


def ms_datetime(ms: int) -> datetime:
    """An aware UTC datetime for epoch milliseconds."""
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


def stored_ms(raw: object) -> int | None:
    """A time read back from Redis (a score or a number in a stored record) as epoch ms, or
    None when it is not a finite number within 1970 to 9999: corrupted data never raises."""
    try:
        value = float(raw.decode() if isinstance(raw, bytes) else raw)  # type: ignore[arg-type]
    except (TypeError, ValueError, UnicodeDecodeError, OverflowError):
        return None
    if math.isnan(value) or not MIN_DUE_MS <= value <= MAX_DUE_MS:
        return None
    return int(value)


def stored_datetime(raw: object) -> datetime | None:
    """``stored_ms`` as an aware UTC datetime (None when unreadable)."""
    ms = stored_ms(raw)
    return None if ms is None else ms_datetime(ms)


def clock_ms(clock: Clock) -> int:
    """Read an injected clock as epoch milliseconds."""
    return round(clock() * 1000)
