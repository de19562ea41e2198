"""``Queue.observe``: an observable of deliveries that claims each task the moment it is due.

Each subscription runs one consumer loop on a reactivex scheduler (a driver of
``dueq._consume.rules.ClaimRules``, the decisions it shares with the asyncio consumer, and of the
wake listener flow ``dueq._consume.wake.wake_flow``):

1. claim as many due tasks as there are free slots (``max_in_flight`` minus the deliveries
   emitted and not yet acked, failed or released);
2. emit them;
3. sleep exactly until the next due time or lease deadline the claim script returned
   (counted from when the claim was sent, so the next claim reaches Redis at that time:
   ``ClaimRules.next_claim_s``; capped by ``heartbeat``), until a wake message says an
   earlier task was scheduled, or, when less than a quarter of the hold was free, until
   settled deliveries have freed a quarter of it (``Held.refill``: a claim worth its round
   trip, not one per settled delivery, nor a claim of the last few slots right after a big
   one).

``Worker`` runs the same loop without reactivex between it and its handlers
(``consume_queue``): each claim goes to the processor whole, in one call, instead of one
``on_next`` per delivery through the observable's wrappers.

All timing goes through the scheduler, so ``reactivex.testing.TestScheduler`` drives it in
virtual time. Redis outages (see ``dueq._util.outage``: lost connections, and replies such as
NOREPLICAS, MASTERDOWN, LOADING, OOM) are logged and retried with backoff; they never reach
``on_error``. Any other error of the claim (a permission missing, a bug) ends the stream with
``on_error``: waiting would hide it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, Protocol

import reactivex
from reactivex import Observable, abc
from reactivex.disposable import Disposable
from reactivex.scheduler import EventLoopScheduler

from dueq._consume.prefetch import AUTO_HIGH, AUTO_LOW, Prefetch
from dueq._consume.rules import ClaimedBatch, ClaimRules, release_failed, subscriber_raised
from dueq._consume.wake import WakeListener, Wakes
from dueq._util.clock import Duration, positive_duration_ms
from dueq.delivery import Delivery, SettleHook


class Claims(Wakes, Protocol):
    """What a threaded consumer needs of its queue (``Queue`` has it): a wake listener's
    members and the claim call."""

    def claim_batch(self, limit: int) -> ClaimedBatch: ...


def observe_queue(
    queue: Claims,
    *,
    max_in_flight: int | str = 64,
    scheduler: abc.SchedulerBase | None = None,
    wake: bool = True,
    heartbeat: Duration = 5.0,
    prefetch_low: int = AUTO_LOW,
) -> Observable[Delivery]:
    """The observable behind ``Queue.observe``; see there. ``prefetch_low`` is the least an
    ``"auto"`` bound holds (``Worker`` passes twice its concurrency)."""
    Prefetch.parse(max_in_flight, low=prefetch_low)  # refused here, not when subscribed
    heartbeat_ms = positive_duration_ms(heartbeat, "heartbeat")

    def subscribe(
        observer: abc.ObserverBase[Delivery], subscribe_scheduler: abc.SchedulerBase | None
    ) -> abc.DisposableBase:
        chosen = scheduler or subscribe_scheduler
        own = EventLoopScheduler() if chosen is None else None
        prefetch = Prefetch.parse(max_in_flight, low=prefetch_low)
        consumer = _Consumer(queue, observer, chosen or own, prefetch, heartbeat_ms)  # type: ignore[arg-type]
        consumer.start(wake)

        def dispose() -> None:
            consumer.stop()
            if own is not None:
                own.dispose()

        return Disposable(dispose)

    return reactivex.create(subscribe)


def consume_queue(
    queue: Claims,
    on_claimed: Callable[[list[Delivery]], None],
    on_error: Callable[[Exception], None],
    *,
    max_in_flight: int | str = 64,
    wake: bool = True,
    heartbeat: Duration = 5.0,
    prefetch_low: int = AUTO_LOW,
    prefetch_high: int = AUTO_HIGH,
) -> abc.DisposableBase:
    """The loop of ``observe_queue`` on a thread of its own, without the observable: each
    claim goes to ``on_claimed`` whole (``Worker`` gives its processor's ``accept_many``, and
    ``prefetch_high``, the most an ``"auto"`` bound holds); an error that ends the loop goes
    to ``on_error``. Disposing stops claiming; deliveries handed over stay with their
    receiver."""
    prefetch = Prefetch.parse(max_in_flight, low=prefetch_low, high=prefetch_high)
    heartbeat_ms = positive_duration_ms(heartbeat, "heartbeat")
    scheduler = EventLoopScheduler()
    observer = reactivex.Observer[Delivery](on_error=on_error)
    consumer = _Consumer(queue, observer, scheduler, prefetch, heartbeat_ms, on_claimed)
    consumer.start(wake)

    def dispose() -> None:
        consumer.stop()
        scheduler.dispose()

    return Disposable(dispose)


class _Consumer:
    """One subscription's claim loop: a driver of ``ClaimRules`` (``dueq._consume.rules``, shared
    with the asyncio consumer) on a scheduler. Thread-safe: wake messages and settled
    deliveries arrive from other threads; claims run on the scheduler."""

    def __init__(
        self,
        queue: Claims,
        observer: abc.ObserverBase[Delivery],
        scheduler: abc.SchedulerBase,
        prefetch: Prefetch,
        heartbeat_ms: int,
        on_claimed: Callable[[list[Delivery]], None] | None = None,
    ) -> None:
        self._queue = queue
        self._observer = observer
        self._on_claimed = on_claimed  # each claim whole, instead of observer.on_next
        self._scheduler = scheduler
        self._rules: ClaimRules[Delivery] = ClaimRules(queue.name, prefetch, heartbeat_ms)
        self._lock = threading.Lock()
        self._timer: abc.DisposableBase | None = None
        self._timer_at: datetime | None = None
        self._claiming = False  # a claim step is running
        self._again = False  # something asked for a claim while one was running
        self._stopped = False
        self._listener: WakeListener | None = None
        # each held delivery's on_settled (one object: an ack of a batch calls it once)
        self._hook = SettleHook(self._settled, self._settled_many)

    # -- control -----------------------------------------------------------------------------

    def start(self, wake: bool) -> None:
        if wake:
            self._listener = WakeListener(self._queue, self.poke)
            self._listener.start()
        self._request(0)

    def stop(self) -> None:
        """Stop claiming. Deliveries already emitted stay with their subscriber."""
        with self._lock:
            self._stopped = True
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.dispose()
        if self._listener is not None:
            self._listener.stop()

    def poke(self) -> None:
        """Claim now (an earlier task was scheduled, or a slot came free)."""
        self._request(0)

    def _settled(self, delivery: Delivery) -> None:
        with self._lock:
            claim_now = self._rules.settled(delivery)
        if claim_now:
            self._request(0)

    def _settled_many(self, deliveries: list[Delivery]) -> None:
        with self._lock:
            claim_now = self._rules.settled_many(deliveries)
        if claim_now:
            self._request(0)

    def _request(self, delay_ms: float) -> None:
        """Run a claim step after ``delay_ms`` unless one is already due sooner."""
        with self._lock:
            if self._stopped:
                return
            if self._claiming:
                self._again = self._again or delay_ms == 0
                return
            due = self._scheduler.now + timedelta(milliseconds=delay_ms)
            if self._timer is not None and self._timer_at is not None and self._timer_at <= due:
                return
            previous = self._timer
            self._timer_at = due
            self._timer = self._scheduler.schedule_relative(
                timedelta(milliseconds=delay_ms), self._step
            )
        if previous is not None:
            previous.dispose()

    # -- the loop ----------------------------------------------------------------------------

    def _step(self, _scheduler: abc.SchedulerBase, _state: Any = None) -> None:
        with self._lock:
            if self._stopped:
                return
            self._timer = self._timer_at = None
            self._claiming, self._again = True, False
            sent_s = self._scheduler.now.timestamp()
            count = self._rules.to_claim(sent_s)
        next_s: float | None = sent_s + self._rules.heartbeat_ms / 1000
        try:
            next_s = self._claim(count, sent_s)
        finally:
            with self._lock:
                self._claiming = False
                if self._again and next_s is not None:
                    next_s = sent_s
        if next_s is not None:
            self._request(max(0.0, (next_s - self._scheduler.now.timestamp()) * 1000))

    def _claim(self, count: int, sent_s: float) -> float | None:
        """One claim, sent at ``sent_s``; returns when to claim next (the scheduler's clock,
        seconds), or None when the stream has ended."""
        try:
            batch = self._queue.claim_batch(count)
        except Exception as exc:  # the rules decide: an outage's backoff, or the end
            backoff_ms = self._rules.failed(exc)
            if backoff_ms is None:
                self.stop()
                self._observer.on_error(exc)
                return None
            return self._scheduler.now.timestamp() + backoff_ms / 1000
        replied_s = self._scheduler.now.timestamp()
        deliveries = batch.deliveries
        with self._lock:
            wait_ms = self._rules.claimed(batch, self._hook)
            stopped = self._stopped
        if stopped:
            self._give_back(deliveries)
            return None
        if self._on_claimed is not None:
            if deliveries:
                self._on_claimed(deliveries)
        else:
            self._emit(deliveries)
        with self._lock:
            return self._rules.next_claim_s(
                sent_s, replied_s, wait_ms, batch.now_ms + batch.now_fraction_ms
            )

    def _emit(self, deliveries: list[Delivery]) -> None:
        for i, d in enumerate(deliveries):
            try:
                self._observer.on_next(d)
            except Exception:  # the subscriber raised: reactivex has detached it
                subscriber_raised(self._queue.name)
                self.stop()
                self._give_back(deliveries[i + 1 :])
                return

    def _give_back(self, deliveries: list[Delivery]) -> None:
        """Release claimed deliveries that were never emitted (attempts do not count)."""
        for d in deliveries:
            try:
                d.release()
            except Exception as exc:  # its lease expires on its own and it is redelivered
                release_failed(self._queue.name, d, exc)
