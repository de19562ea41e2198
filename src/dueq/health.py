"""Whether a queue needs a look: the health rule, and the one way a duration is written.

Pure functions of what a caller already read (a queue's stats, its live workers, its
per-minute history), so the rule is tested with an explicit ``now`` and the dashboard's pages,
its JSON API, ``q.doctor()`` (``dueq doctor``) and a script all judge a queue the same way:
``judge_health`` is the one verdict. It lives outside ``dueq.dashboard`` (which re-exports it)
because it needs no web framework. See docs/dashboard-health.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from dueq.exceptions import ConfigurationError
from dueq.model import HistoryPoint, QueueStats

Level = Literal["ok", "warn", "bad"]
LEVELS: tuple[Level, ...] = ("ok", "warn", "bad")
#: How far back a queue's history goes (``Queue.history`` keeps 24 hours).
MAX_WINDOW_S = 86_400.0
MINUTE = timedelta(minutes=1)


def human_duration(seconds: float) -> str:
    """``seconds`` in its two largest units: ``850 ms``, ``59 s``, ``2 min 3 s``,
    ``11 h 4 min``, ``2 d 1 h``. Whole units, rounded down (a wait of 59.9 s has not yet
    lasted a minute); under a second in milliseconds; a negative duration is ``0 ms``."""
    seconds = max(0.0, seconds)
    ms = round(seconds * 1000)
    if ms < 1000:
        return f"{ms} ms"
    whole = max(1, int(seconds))
    for big, big_s, small, small_s in (
        ("d", 86_400, "h", 3600),
        ("h", 3600, "min", 60),
        ("min", 60, "s", 1),
    ):
        if whole >= big_s:
            n, rest = divmod(whole, big_s)
            part = rest // small_s
            return f"{n} {big} {part} {small}" if part else f"{n} {big}"
    return f"{whole} s"


def _plural(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


@dataclass(frozen=True)
class HealthRules:
    """When a queue is ``warn`` or ``bad`` (seconds each).

    ``bad``: the oldest due task has waited over ``no_worker_bad_s`` (default 1 min) with no
    live worker, or over ``lag_bad_s`` (default 5 min) at all. ``warn``: due tasks and no live
    worker, or tasks sent to the dead-letter queue in the last ``dead_window_s`` (default 1 h,
    at most 24 h: the history Redis keeps)."""

    no_worker_bad_s: float = 60.0
    lag_bad_s: float = 300.0
    dead_window_s: float = 3600.0

    def __post_init__(self) -> None:
        for name in ("no_worker_bad_s", "lag_bad_s", "dead_window_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ConfigurationError(
                    f"{name} must be a positive number of seconds, got {value!r}"
                )
        if self.dead_window_s > MAX_WINDOW_S:
            raise ConfigurationError(
                f"dead_window_s can be at most {MAX_WINDOW_S:g} (24 h of history is kept), "
                f"got {self.dead_window_s!r}"
            )

    @property
    def history_minutes(self) -> int:
        """The minutes of history ``judge_health`` needs to count the recent dead letters."""
        return min(int(MAX_WINDOW_S // 60), int(-(-self.dead_window_s // 60)) + 1)


@dataclass(frozen=True)
class Health:
    """A queue's health: ``level`` (``ok``, ``warn`` or ``bad``) and the ``reasons`` for it,
    in words (none when ``ok``)."""

    level: Level
    reasons: tuple[str, ...] = ()

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons) or "ok"


def dead_in_window(history: Iterable[HistoryPoint], now: datetime, window_s: float) -> int:
    """Tasks sent to the dead-letter queue in the ``window_s`` before ``now``, counted by
    whole minutes (a minute that ends inside the window counts)."""
    since = now - timedelta(seconds=window_s)
    return sum(p.dead for p in history if p.minute + MINUTE > since)


def judge_health(
    stats: QueueStats,
    *,
    live_workers: int,
    history: Sequence[HistoryPoint] = (),
    rules: HealthRules | None = None,
) -> Health:
    """The health of a queue with these ``stats`` (``Queue.stats()``), ``live_workers``
    serving it (``dueq.discovery.discover_workers``) and this per-minute ``history``
    (``Queue.history(rules.history_minutes)``), judged at ``stats.now`` by ``rules``."""
    rules = rules or HealthRules()
    level: Level = "ok"
    reasons: list[str] = []

    def worse(to: Level, reason: str) -> None:
        nonlocal level
        level = max(level, to, key=LEVELS.index)
        reasons.append(reason)

    lag_s = stats.oldest_due_lag_s
    if stats.due_now and not live_workers:  # its reason names the wait, whichever limit it passed
        worse(
            "bad" if lag_s > min(rules.no_worker_bad_s, rules.lag_bad_s) else "warn",
            f"{stats.due_now} due, no live worker (oldest waiting {human_duration(lag_s)})",
        )
    elif stats.due_now and lag_s > rules.lag_bad_s:
        worse(
            "bad",
            f"oldest due task has waited {human_duration(lag_s)} "
            f"(limit {human_duration(rules.lag_bad_s)})",
        )
    dead = dead_in_window(history, stats.now, rules.dead_window_s)
    if dead:
        worse(
            "warn",
            f"{_plural(dead, 'dead letter')} in the last {human_duration(rules.dead_window_s)}",
        )
    return Health(level, tuple(reasons))


def worst(healths: Iterable[Health]) -> Level:
    """The worst level among ``healths`` (``ok`` when there are none): the overview's."""
    return max((h.level for h in healths), key=LEVELS.index, default="ok")


__all__ = ["Health", "HealthRules", "dead_in_window", "human_duration", "judge_health", "worst"]
