"""What the demo has seen so far, shared by its sources, workers and view (thread-safe)."""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone

from dueq.model import Outcome


@dataclass(frozen=True)
class Event:
    """One line of the demo's event tail: seconds since start, kind and text."""

    t: float
    kind: str
    text: str


@dataclass
class SourceState:
    """A source of tasks: its status line, how many tasks it added, whether it has finished."""

    status: str = "waiting"
    added: int = 0
    done: bool = False
    failed: bool = False
    #: While it starts (``Board.starting``): the ``Board.elapsed()`` by which it must have
    #: started (``Board.start_done``) or be left out (``Board.leave_out_late``).
    start_by: float | None = None


@dataclass
class Board:
    """Counts and events of one demo run."""

    #: How long a source may take to start (``starting`` to ``start_done``), e.g. Spark's JVM.
    start_timeout_s: float = 120.0
    started: float = field(default_factory=time.monotonic)
    sources: dict[str, SourceState] = field(default_factory=dict)
    outcomes: Counter[str] = field(default_factory=Counter)
    delays: defaultdict[int, list[float]] = field(default_factory=lambda: defaultdict(list))
    events: list[Event] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def _event(self, kind: str, text: str) -> None:
        self.events.append(Event(self.elapsed(), kind, text))

    def source(self, name: str, status: str, *, added: int = 0, done: bool = False) -> None:
        """A source reports progress: a new status, tasks it added, or that it finished."""
        with self._lock:
            state = self.sources.setdefault(name, SourceState())
            state.status, state.added, state.done = status, state.added + added, done
            if done:
                self._event("source", f"{name}: {status}")

    def starting(self, name: str, status: str) -> None:
        """A source begins a start that may be slow (a JVM): unless it reports ``start_done``
        within ``start_timeout_s``, the demo leaves it out and goes on with the rest."""
        with self._lock:
            state = self.sources.setdefault(name, SourceState())
            state.status, state.start_by = status, self.elapsed() + self.start_timeout_s

    def start_done(self, name: str) -> bool:
        """A source has started and is about to add tasks: True if it still may (it was not
        left out meanwhile); from then on the demo waits for it to finish."""
        with self._lock:
            state = self.sources.setdefault(name, SourceState())
            if state.failed:
                return False
            state.start_by = None
            return True

    def leave_out_late(self) -> None:
        """Mark each source still starting past its bound as failed (done): the demo stops
        waiting for it, and its ``start_done`` answers False, so it adds nothing later."""
        with self._lock:
            now = self.elapsed()
            for name, state in self.sources.items():
                if state.start_by is not None and now > state.start_by and not state.done:
                    why = f"did not start within {self.start_timeout_s:g} s, left out"
                    state.status, state.done, state.failed = f"failed: {why}", True, True
                    state.start_by = None
                    self._event("source", f"{name} failed: {why}")

    def source_failed(self, name: str, error: BaseException) -> None:
        with self._lock:
            state = self.sources.setdefault(name, SourceState())
            state.status, state.done, state.failed = f"failed: {error}", True, True
            self._event("source", f"{name} failed: {type(error).__name__}: {error}")

    def sources_done(self) -> bool:
        with self._lock:
            return all(s.done for s in self.sources.values())

    def outcome(self, worker: str, o: Outcome) -> None:
        """A worker reports what became of a delivery."""
        with self._lock:
            self.outcomes[o.kind] += 1
            if o.kind == "retried" and o.at is not None:
                delay = max((o.at - datetime.now(timezone.utc)).total_seconds(), 0.0)
                self.delays[o.attempt].append(delay)
                self._event(
                    "retried",
                    f"{o.id} attempt {o.attempt}, next in {delay:.2f} s: {o.error} ({worker})",
                )
            elif o.kind != "acked":
                self._event(o.kind, f"{o.id} attempt {o.attempt}, no more: {o.error} ({worker})")

    def worker_failed(self, worker: str, error: Exception) -> None:
        with self._lock:
            self._event("error", f"{worker} stopped: {type(error).__name__}: {error}")

    def mean_delays(self) -> list[tuple[int, float]]:
        """(attempt, mean retry delay after it) for each failed attempt seen."""
        with self._lock:
            return [(a, sum(d) / len(d)) for a, d in sorted(self.delays.items())]

    def snapshot(self) -> tuple[dict[str, SourceState], Counter[str], list[Event]]:
        """Copies of the sources, outcome counts and events, for a view to render."""
        with self._lock:
            sources = {k: SourceState(**vars(v)) for k, v in self.sources.items()}
            return sources, Counter(self.outcomes), list(self.events)
