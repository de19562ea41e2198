"""Cron expressions in an IANA time zone: the only module that talks to croniter.

Expressions have 5 fields (minute hour day month weekday), 6 with seconds first, or are one of
the ``@daily``-style aliases.

croniter walks the expression over naive local wall-clock times; this module maps each wall
time to an instant the way classic cron does around daylight-saving changes:

- a wall time inside a skipped hour (spring forward) maps to the instant of the change, so it
  runs right after it (several such slots collapse into that one instant);
- a wall time inside a repeated hour (fall back) maps to its first occurrence only.

The mapping never goes backwards as wall time goes forwards, which the searches below rely on.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Protocol

from dueq.exceptions import CronError

if TYPE_CHECKING:  # croniter and zoneinfo are imported on first use: a worker of a queue
    # without cron never needs them (docs/benchmarks.md, Start-up)
    from zoneinfo import ZoneInfo

    from croniter import croniter

#: Aliases accepted besides 5-field expressions.
ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
#: How far back a fall-back is looked for when searching for the latest slot.
MAX_REPEAT = timedelta(hours=3)
#: Most candidate wall times one search looks at (only a repeated hour's slots are passed over).
MAX_STEPS = 10_000


def normalize_expression(expr: object) -> str:
    """The canonical text of a 5-field expression or alias; CronError if croniter refuses it."""
    if not isinstance(expr, str):
        raise CronError(f"cron expression must be a str, got {type(expr).__name__}")
    text = " ".join(expr.split())
    if text.startswith("@"):
        text = text.lower()
        if text not in ALIASES:
            raise CronError(f"unknown cron alias {expr!r}; use one of {', '.join(ALIASES)}")
        return text
    if len(text.split(" ")) not in (5, 6):
        raise CronError(
            f"cron expression {expr!r} must have 5 fields (minute hour day month weekday), "
            "or 6 with seconds first"
        )
    from croniter import CroniterError

    try:
        _walker(text, datetime(2000, 1, 1))
    except (CroniterError, ValueError, TypeError, KeyError) as exc:
        raise CronError(f"invalid cron expression {expr!r}: {exc}") from exc
    return text


def _walker(fields: str, start: datetime) -> croniter:
    """croniter over naive wall times; a 6th field is seconds, first (as BullMQ and Quartz)."""
    from croniter import croniter

    return croniter(fields, start, second_at_beginning=len(fields.split(" ")) == 6)


def load_zone(tz: object) -> ZoneInfo:
    """The IANA zone named ``tz``; CronError if there is no such zone."""
    if not isinstance(tz, str) or not tz:
        raise CronError(f"tz must be an IANA zone name such as 'Europe/Berlin', got {tz!r}")
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        # OSError: zoneinfo reads tz as a file path, so "America" is a directory and a
        # very long name is too long for the file system.
        raise CronError(f"unknown time zone {tz!r}") from exc


def _ms(instant: datetime) -> int:
    return round(instant.timestamp() * 1000)


def _ms_of(span: timedelta) -> int:
    return round(span.total_seconds() * 1000)


class CronSchedule:
    """The instants (epoch ms) at which one expression fires in one zone."""

    def __init__(self, expr: str, tz: str) -> None:
        self.expr = normalize_expression(expr)
        self.zone = load_zone(tz)
        self._fields = ALIASES.get(self.expr, self.expr)
        # One croniter per thread, moved to each search's start: building one parses the
        # expression again, about 40% of a search. Thread-local because a walker is stateful
        # and a schedule is shared (schedule_for) by every thread of the process.
        self._walkers = threading.local()
        self.next_after(0)  # refuse expressions that never fire (e.g. 31 February)

    def _wall(self, ms: int) -> datetime:
        """The naive local wall time of an instant."""
        return datetime.fromtimestamp(ms / 1000, self.zone).replace(tzinfo=None, fold=0)

    def instant(self, wall: datetime) -> int:
        """Epoch ms at which a wall-clock slot fires (see the module docstring)."""
        first = wall.replace(tzinfo=self.zone, fold=0)
        ms = _ms(first)
        if self._wall(ms) == wall:
            return ms
        # Skipped wall time: fold=0 lands after the change, fold=1 before it. The change is
        # the first instant whose wall time is at or past the slot; find it to the second.
        low = _ms(wall.replace(tzinfo=self.zone, fold=1)) // 1000
        high = ms // 1000
        while low < high:
            mid = (low + high) // 2
            if self._wall(mid * 1000) >= wall:
                high = mid
            else:
                low = mid + 1
        return high * 1000

    def next_after(self, ms: int) -> int:
        """The first firing strictly after ``ms``."""
        return self._search(self._wall(ms), forwards=True, accept=lambda c: c > ms)

    def latest_at_or_before(self, ms: int) -> int:
        """The last firing at or before ``ms``."""
        # After a fall-back, first-pass wall times later than wall(ms) lie before ms: start
        # that much later (and a second later, as croniter's get_prev is strictly before).
        repeat = self._offset(ms - _ms_of(MAX_REPEAT)) - self._offset(ms)
        start = self._wall(ms) + max(repeat, timedelta(0)) + timedelta(seconds=1)
        return self._search(start, forwards=False, accept=lambda c: c <= ms)

    def _offset(self, ms: int) -> timedelta:
        return datetime.fromtimestamp(ms / 1000, self.zone).utcoffset() or timedelta(0)

    def _search(self, start: datetime, *, forwards: bool, accept: Callable[[int], bool]) -> int:
        """The first wall-clock slot from ``start`` whose instant ``accept`` takes."""
        from croniter import CroniterError

        walker: croniter | None = getattr(self._walkers, "walker", None)
        if walker is None:
            walker = self._walkers.walker = _walker(self._fields, start)
        else:
            walker.set_current(start, force=True)
        step = walker.get_next if forwards else walker.get_prev
        try:
            for _ in range(MAX_STEPS):
                candidate = self.instant(step(datetime))
                if accept(candidate):
                    return candidate
        except CroniterError as exc:  # e.g. "0 0 31 2 *" never fires
            raise CronError(f"cron expression {self.expr!r} never fires: {exc}") from exc
        raise CronError(f"cron expression {self.expr!r} found no slot in {MAX_STEPS} steps")

    def between(self, after_ms: int, until_ms: int, limit: int) -> list[int]:
        """Up to ``limit`` distinct firings in ``(after_ms, until_ms]``, earliest first."""
        found: list[int] = []
        ms = after_ms
        while len(found) < limit:
            ms = self.next_after(ms)
            if ms > until_ms:
                break
            found.append(ms)
        return found


@functools.lru_cache(maxsize=1024)
def schedule_for(expr: str, tz: str) -> CronSchedule:
    """A shared CronSchedule per (expression, zone); building one validates it."""
    return CronSchedule(expr, tz)


def slot_label(ms: int) -> str:
    """A slot as compact UTC text for task ids, e.g. ``20260329T010000Z``."""
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def parse_slot_label(label: str) -> int | None:
    """Epoch ms of a ``slot_label``, or None if ``label`` is not one."""
    try:
        parsed = datetime.strptime(label, "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc)
    except ValueError:
        return None
    return _ms(parsed)


class EverySchedule:
    """Fixed-interval slots: every multiple of ``every_ms`` since the Unix epoch, plus
    ``offset_ms`` (``0 <= offset_ms < every_ms``). Every process computes the same slots, with
    no stored start: ``every=5 min, offset=10 s`` fires at :00:10, :05:10, ... UTC."""

    def __init__(self, every_ms: int, offset_ms: int = 0) -> None:
        if every_ms < 1000 or every_ms % 1000:
            raise CronError(
                f"every must be a whole number of seconds, at least 1, got {every_ms} ms"
            )
        if not 0 <= offset_ms < every_ms or offset_ms % 1000:
            raise CronError("offset must be whole seconds, at least 0 and shorter than every")
        self.every_ms = every_ms
        self.offset_ms = offset_ms

    def next_after(self, ms: int) -> int:
        """The first slot strictly after ``ms``."""
        return ((ms - self.offset_ms) // self.every_ms + 1) * self.every_ms + self.offset_ms

    def latest_at_or_before(self, ms: int) -> int:
        """The last slot at or before ``ms``."""
        return ((ms - self.offset_ms) // self.every_ms) * self.every_ms + self.offset_ms

    def between(self, after_ms: int, until_ms: int, limit: int) -> list[int]:
        """Up to ``limit`` slots in ``(after_ms, until_ms]``, earliest first."""
        found: list[int] = []
        ms = self.next_after(after_ms)
        while ms <= until_ms and len(found) < limit:
            found.append(ms)
            ms += self.every_ms
        return found


class Slots(Protocol):
    """What the planners need of a schedule: a cron expression's or a fixed interval's."""

    def next_after(self, ms: int) -> int: ...
    def latest_at_or_before(self, ms: int) -> int: ...


class Window:
    """A schedule's slots limited to ``[start_ms, end_ms]`` (either end open when None):
    ``next_after`` and ``latest_at_or_before`` return None where no slot of the window is."""

    def __init__(self, inner: Slots, start_ms: int | None, end_ms: int | None) -> None:
        self.inner = inner
        self.start_ms = start_ms
        self.end_ms = end_ms

    def next_after(self, ms: int) -> int | None:
        if self.start_ms is not None:
            ms = max(ms, self.start_ms - 1)
        found = self.inner.next_after(ms)
        return None if self.end_ms is not None and found > self.end_ms else found

    def latest_at_or_before(self, ms: int) -> int | None:
        if self.end_ms is not None:
            ms = min(ms, self.end_ms)
        found = self.inner.latest_at_or_before(ms)
        return None if self.start_ms is not None and found < self.start_ms else found

    def between(self, after_ms: int, until_ms: int, limit: int) -> list[int]:
        """Up to ``limit`` slots of the window in ``(after_ms, until_ms]``, earliest first."""
        found: list[int] = []
        ms = after_ms
        while len(found) < limit:
            following = self.next_after(ms)
            if following is None or following > until_ms:
                break
            found.append(following)
            ms = following
        return found
