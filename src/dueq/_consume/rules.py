"""The claim loop's decisions, written once for both consumers (issue 26).

``Queue.observe``/``Worker`` (``dueq._consume.threads``: a reactivex scheduler and threads) and
``AsyncQueue.deliveries``/``AsyncWorker`` (``dueq._consume.aio``: the caller's event loop)
drive the same ``ClaimRules``: how many to claim, what a claim's reply means (sleep until the
next due time, claim again now, paused, an outage's backoff, the end of the stream on any other
error), when a settled delivery should bring the next claim, and every log line of the loop.
The rules do no I/O and take no time of their own: each driver claims, hands over, sleeps and
wakes in its own way, and asks the rules what to do next. Not thread-safe: the threaded driver
calls them under its lock.
"""

from __future__ import annotations

import heapq
import logging
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from dueq._consume.prefetch import Held, Prefetch
from dueq._util.outage import Backoff, describe, is_outage
from dueq.delivery import DeliveryBase
from dueq.logs import task_fields

D = TypeVar("D", bound=DeliveryBase)

logger = logging.getLogger("dueq.observe")


class ClaimedBatch(Protocol):
    """What a consumer reads of a claim's reply (``dueq.ClaimBatch``, which the lease flows
    make): named here so the consumers do not import the flows that call them."""

    @property
    def deliveries(self) -> list[Any]: ...

    @property
    def now_ms(self) -> int: ...

    @property
    def now_fraction_ms(self) -> float: ...

    @property
    def paused(self) -> bool: ...

    @property
    def fair(self) -> bool: ...

    def sleep_ms(self, heartbeat_ms: float) -> float:
        """How long to sleep after this claim, at most ``heartbeat_ms``."""
        ...


#: Most deliveries one claim call asks for (the claim script leases at most 1,000).
MAX_CLAIM = 1000
#: Claims over which a consumer remembers the quickest way to Redis (``next_claim_s``).
ARRIVAL_WINDOW = 64
#: Bounds of ``ClaimRules.margin_ms`` (ms).
MIN_MARGIN_MS = 0.1
MAX_MARGIN_MS = 1.0


class ClaimRules(Generic[D]):
    """One consumer's claim loop, as decisions: ``to_claim`` before each claim, then
    ``claimed`` (the claim's reply: what to hand over and how long to wait) or ``failed`` (its
    error: how long to back off, or None when the stream ends with it); ``settled`` for each
    settled delivery (True: claim now, the hold has room worth a claim again)."""

    def __init__(self, queue_name: str, prefetch: Prefetch, heartbeat_ms: int) -> None:
        self.queue_name = queue_name
        self.held: Held[D] = Held(prefetch)
        self.heartbeat_ms = heartbeat_ms
        self._backoff = Backoff()
        self._paused = False  # the last claim found the queue paused
        self._starved = False  # the last claim left no room worth a claim
        # queue clock at each recent claim's read minus the driver's clock at its send (ms)
        self._ways_ms: deque[float] = deque(maxlen=ARRIVAL_WINDOW)

    def to_claim(self, now_s: float) -> int:
        """How many to claim now: the free slots (0 still reads the time and reclaims lapsed
        leases), at most ``MAX_CLAIM``."""
        return min(self.held.free(now_s), MAX_CLAIM)

    def claimed(self, batch: ClaimedBatch, on_settled: Callable[[D], None]) -> float:
        """Take a claim's reply (a ``ClaimBatch``): its deliveries are held (each reports to
        ``on_settled``), and held ones whose lease ran out are let go. Returns the ms to wait
        before the next claim, unless a settle or a wake comes first: the heartbeat when the
        hold is full (a settle that frees a quarter of it claims sooner), else until the next
        due time or lease deadline."""
        if self._backoff.succeeded():
            logger.info("queue %r: Redis is back; claiming again", self.queue_name)
        if batch.paused != self._paused:
            self._paused = batch.paused
            logger.info(
                "queue %r: %s", self.queue_name, "paused; waiting" if batch.paused else "resumed"
            )
            # what this consumer holds and has not started waits for the resume as the tasks
            # in Redis do: process gives it back instead of starting it
            for d in self.held.deliveries:
                d.mark_queue_paused(batch.paused)
        self.held.prefetch.fair(batch.fair)
        for d in batch.deliveries:
            d.on_settled = on_settled
        for d in self.held.add(batch.deliveries, batch.now_ms):
            d.on_settled = None  # its lease ran out unsettled: no longer ours
        self._starved = self.held.full
        if self._starved:
            return self.heartbeat_ms
        return batch.sleep_ms(self.heartbeat_ms)

    def next_claim_s(
        self, sent_s: float, replied_s: float, wait_ms: float, clock_ms: float
    ) -> float:
        """When to claim next, on the driver's clock: ``wait_ms`` (from ``claimed``) counted
        from when the claim was sent (``sent_s``), plus how much longer than the quickest of
        the last ``ARRIVAL_WINDOW`` claims this one took to reach Redis (``clock_ms``: the
        queue clock Redis read, ``now_ms`` and ``now_fraction_ms`` of the reply).

        The wait is until the next due time as of the moment Redis read its clock, somewhere
        in the round trip. Counted from the reply, the next claim reached Redis that much after
        the due time (a median 0.5 ms of lag per delivery, measured: the reply's way back and
        its parsing). Counted from the send, the next claim arrives when the task is due if it
        takes as long to reach Redis as this one did; a claim that arrived early would lease
        nothing and cost another claim, so the next one is assumed to be as quick as the
        quickest recent one. The two clocks need not agree (their offset cancels out); the
        correction is at most the round trip (``replied_s - sent_s``). In virtual time (a
        claim that takes no time) this is exactly the wait; a wait of 0 (more is due now) is
        now."""
        way_ms = clock_ms - sent_s * 1000
        self._ways_ms.append(way_ms)
        if wait_ms <= 0:
            return sent_s
        round_trip_ms = max(0.0, (replied_s - sent_s) * 1000)
        slower_ms = min(max(way_ms - min(self._ways_ms), 0.0), round_trip_ms)
        return sent_s + (wait_ms + slower_ms) / 1000

    def margin_ms(self) -> float:
        """How much later than ``next_claim_s`` a driver whose timing is exact should claim,
        so that its claim does not reach Redis before the task is due (one that does leases
        nothing and costs another round trip): the spread between the two quickest ways to
        Redis of the last ``ARRIVAL_WINDOW`` claims (how much quicker than the quickest one the
        next may be), at least ``MIN_MARGIN_MS`` and at most ``MAX_MARGIN_MS``; the most with
        a single way seen (nothing known of the spread yet).

        The asyncio driver adds it (its wait ends within µs of its aim: ``wait_until``). The
        threaded driver does not: it met its lag target without, before and after the asyncio
        one took it (docs/benchmarks.md, Punctuality), and was left as it was."""
        if len(self._ways_ms) < 2:
            return MAX_MARGIN_MS
        quickest, second = heapq.nsmallest(2, self._ways_ms)
        return min(max(second - quickest, MIN_MARGIN_MS), MAX_MARGIN_MS)

    def failed(self, exc: Exception) -> float | None:
        """A claim raised ``exc``: the ms to back off for an outage (logged, retried), or None
        when the stream ends with it (anything else: waiting would hide it)."""
        if not is_outage(exc):
            logger.error("queue %r: consumer stopped by %s", self.queue_name, describe(exc))
            return None
        delay_s = self._backoff.failed()
        logger.warning(
            "queue %r: Redis unavailable (try %d): %s; retrying in %.2f s",
            self.queue_name,
            self._backoff.failures,
            describe(exc),
            delay_s,
        )
        return round(delay_s * 1000)

    def settled(self, delivery: D) -> bool:
        """``delivery`` was acked, failed or released: True when the loop, waiting on a full
        hold, should claim now."""
        self.held.settled(delivery)
        if self._starved and self.held.refill:
            self._starved = False
            return True
        return False

    def settled_many(self, deliveries: list[D]) -> bool:
        """``settled`` for deliveries acked together (``task.SettleHook``)."""
        self.held.settled_many(deliveries)
        if self._starved and self.held.refill:
            self._starved = False
            return True
        return False


def release_failed(queue_name: str, d: DeliveryBase, exc: Exception) -> None:
    """Log a delivery given back (claimed, never handed over) whose release failed: its lease
    runs out instead and it is delivered again."""
    logger.warning(
        "queue %r: task %r attempt %d: could not release it: %s",
        queue_name,
        d.id,
        d.attempt,
        describe(exc),
        extra=task_fields(queue_name, d.id, d.attempt),
    )


def subscriber_raised(queue_name: str) -> None:
    """Log a subscriber that raised from ``on_next`` (the stream stops)."""
    logger.exception("queue %r: subscriber raised; stopping", queue_name)
