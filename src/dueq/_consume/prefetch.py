"""How many deliveries a consumer may hold at once: a fixed number, or adaptive.

A consumer that holds too few deliveries starves its handlers between claims (one round trip
per handful of tasks); one that holds too many hoards tasks that other workers could run, and
keeps their leases alive while they wait. ``max_in_flight="auto"`` (``Worker``'s default)
sizes the hold by Little's law: hold what the handlers settle in ``HOLD_S`` at the rate they
settle now, ``limit = rate * HOLD_S``, re-estimated every ``WINDOW_S``:

- handlers that settle a delivery within ``HOLD_S`` of its claim make the estimate exceed the
  current limit, so it grows (at most ``GROWTH``-fold per window, up to ``high``); a window
  also ends early, after ``MIN_WINDOW_S``, once the handlers have settled a whole hold's worth
  (the hold turned over faster than ``WINDOW_S``: the estimate can only grow then);
- handlers that take longer make it fall, down to ``low`` (enough to keep every handler busy);
- an idle queue settles nothing, so the limit falls back to ``low`` until work comes again,
  and a burst then ramps up in a few turnovers (16 -> 64 -> 256 -> 1024). Measured on the
  worker bench (20,000 quick tasks, a drain of about half a second): with 20 ms windows only,
  the ramp took ~60 ms, every claim of it finding the hold already empty (handlers starved,
  13-37k tasks/s); ending a window at each turnover takes it to 1024 in ~10 ms.

On a fair queue (each claim's reply says so) an adaptive bound holds at most ``FAIR_HIGH``:
fairness decides what a claim leases, and a tenant's task claimed fairly still waits behind
whatever the consumer held before it.

The consumer asks ``limit`` before each claim and reports each settled delivery; the rest of
the consumer (free slots = limit - held) is unchanged. Time is whatever clock the consumer
passes in (its scheduler's, or the event loop's), so tests drive it in virtual time.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from dueq._util.checks import whole_number
from dueq.delivery import DeliveryBase
from dueq.exceptions import ConfigurationError

D = TypeVar("D", bound=DeliveryBase)

#: Seconds of settling the adaptive limit holds.
HOLD_S = 0.1
#: Seconds between two estimates.
WINDOW_S = 0.02
#: Shortest window: one that settled a whole hold ends after this long, not ``WINDOW_S``.
MIN_WINDOW_S = 0.001
#: Most the limit grows in one window (a factor).
GROWTH = 4
#: Bounds of ``"auto"`` when the consumer does not know its handlers' concurrency.
AUTO_LOW = 16
AUTO_HIGH = 1024
#: The most ``"auto"`` holds for a ``Worker``, whose own handlers take each claim whole: four
#: claims' worth (a claim leases at most 1,000), so the next claim goes out, and its reply is
#: parsed, while the handlers still work through the one before. With ``AUTO_HIGH`` a claim
#: of 1,000 filled the hold: claim, handlers and ack ran one after another (bench/bulk.py:
#: 0.55x the engine loop; 2,048: 0.62-0.73x; 4,096: 0.66-0.86x). Slow handlers still hold
#: only what they settle in ``HOLD_S``.
WORKER_HIGH = 4096
#: The most ``"auto"`` holds on a fair queue: a tenant's task, claimed fairly, waits behind
#: what the consumer holds, so a fair queue's consumer holds at most this many (at 50k tasks/s
#: about 5 ms of work; measured in scripts/bench/fairness.py).
FAIR_HIGH = 256
#: A consumer whose hold was full claims again once this share of it is free (1/4).
REFILL_SHARE = 4
#: Most deliveries one consumer may hold (one claim call leases at most 1,000).
MAX_IN_FLIGHT = 100_000


class Prefetch:
    """A consumer's bound on held deliveries: fixed (``Prefetch.fixed(n)``) or adaptive
    between ``low`` and ``high`` (see the module docstring). Not thread-safe: the consumer
    calls it under its own lock."""

    def __init__(self, low: int, high: int, *, adaptive: bool) -> None:
        self.low = low
        self.high = high
        self._high = high  # as parsed: ``high`` while the queue is not fair
        self.adaptive = adaptive
        self._limit = low
        self._settled = 0
        self._since_s: float | None = None

    @classmethod
    def parse(
        cls, max_in_flight: int | str, *, low: int = AUTO_LOW, high: int = AUTO_HIGH
    ) -> Prefetch:
        """``"auto"`` (adaptive from ``low`` to ``max(high, low)``) or a whole number
        (fixed); anything else is a ConfigurationError."""
        if max_in_flight == "auto":
            return cls(low, max(high, low), adaptive=True)
        if isinstance(max_in_flight, str):
            raise ConfigurationError(
                f"max_in_flight must be a whole number or 'auto', got {max_in_flight!r}"
            )
        whole_number(max_in_flight, "max_in_flight", low=1, high=MAX_IN_FLIGHT)
        return cls(max_in_flight, max_in_flight, adaptive=False)

    def fair(self, on: bool) -> None:
        """The last claim said whether the queue is fair: an adaptive bound holds at most
        ``FAIR_HIGH`` then (never below ``low``), its own ``high`` otherwise."""
        if not self.adaptive:
            return
        high = max(min(self._high, FAIR_HIGH), self.low) if on else self._high
        if high != self.high:
            self.high = high
            self._limit = min(self._limit, high)

    @property
    def limit(self) -> int:
        """How many deliveries the consumer may hold now."""
        return self._limit

    def settled(self, n: int = 1) -> None:
        """``n`` held deliveries were acked, failed, released or lost."""
        self._settled += n

    def update(self, now_s: float) -> int:
        """Re-estimate at most once per ``WINDOW_S``; returns the limit."""
        if not self.adaptive:
            return self._limit
        if self._since_s is None:
            self._since_s = now_s
            return self._limit
        window_s = now_s - self._since_s
        turned_over = self._settled >= self._limit and window_s >= MIN_WINDOW_S - 1e-6
        if window_s < WINDOW_S - 1e-6 and not turned_over:  # (float steps of exactly WINDOW_S)
            return self._limit
        rate = self._settled / window_s
        self._settled, self._since_s = 0, now_s
        target = round(rate * HOLD_S)
        self._limit = max(self.low, min(self.high, target, GROWTH * self._limit))
        return self._limit


class Held(Generic[D]):
    """The deliveries a consumer holds (emitted, not yet settled) and its prefetch bound:
    free slots, settling, and deliveries whose lease ran out while held. Shared by the
    threaded and the asyncio consumer; not thread-safe (the threaded one holds its lock)."""

    def __init__(self, prefetch: Prefetch) -> None:
        self.prefetch = prefetch
        self.deliveries: set[D] = set()
        self._earliest_deadline_ms: int | None = None  # of those held, or earlier

    def __len__(self) -> int:
        return len(self.deliveries)

    def free(self, now_s: float) -> int:
        """Free slots for the next claim (the adaptive bound re-estimated at ``now_s``)."""
        return max(self.prefetch.update(now_s) - len(self.deliveries), 0)

    @property
    def full(self) -> bool:
        """True when the hold has no room worth a claim (less than a ``REFILL_SHARE`` of the
        bound free): the consumer then waits for ``refill`` (or its heartbeat), not claiming
        the last few slots one round trip at a time (a claim of 1,000 into a bound of 1,024
        was followed by a claim of 24)."""
        return not self.refill

    @property
    def refill(self) -> bool:
        """True when the hold has room for a claim worth its round trip: a
        ``REFILL_SHARE`` of the bound (at least one slot). A consumer waiting on a full hold
        claims again then, not at the first settled delivery: claiming one slot at a time
        spends a script call (and a consumer wake-up) per few tasks while the handlers still
        have most of the hold to work through."""
        free = self.prefetch.limit - len(self.deliveries)
        return free >= max(1, self.prefetch.limit // REFILL_SHARE)

    def add(self, claimed: list[D], now_ms: int) -> list[D]:
        """Hold ``claimed``; returns the held deliveries whose lease ran out unsettled by
        ``now_ms`` (no longer ours: their slots are freed). Scans only once the earliest
        deadline seen has passed (leases are extended while held, so that deadline is a lower
        bound, never too late)."""
        self.deliveries.update(claimed)
        earliest = self._earliest_deadline_ms
        for d in claimed:
            if earliest is None or d.lease_deadline_ms < earliest:
                earliest = d.lease_deadline_ms
        lapsed: list[D] = []
        if earliest is not None and earliest <= now_ms:
            lapsed = [d for d in self.deliveries if d.lease_deadline_ms <= now_ms]
            for d in lapsed:
                self.settled(d)
            earliest = min((d.lease_deadline_ms for d in self.deliveries), default=None)
        self._earliest_deadline_ms = earliest
        return lapsed

    def settled(self, d: D) -> None:
        if d in self.deliveries:
            self.deliveries.discard(d)
            self.prefetch.settled()

    def settled_many(self, deliveries: list[D]) -> None:
        """``settled`` for each of ``deliveries`` (set operations, no call per delivery)."""
        held = self.deliveries.intersection(deliveries)
        if held:
            self.deliveries -= held
            self.prefetch.settled(len(held))
