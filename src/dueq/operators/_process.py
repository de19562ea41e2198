"""The ``process`` operator: run a handler per delivery, keep its lease, ack or fail it.

Threads of one subscription:

- handler threads (or one asyncio loop for ``async def`` handlers) run the handler, and hand
  their results to the settler in batches (every ``FLUSH_S``, or sooner when a thread runs out
  of work), not one by one;
- one settler thread acks successes in batches (one script call per batch and queue), fails
  errors through the retry policy, and emits an ``Outcome`` for each delivery;
- a lease keeper on the reactivex scheduler extends the lease of every delivery held
  (waiting or running) once a third of its lease has passed.

**Only as many handler threads as help.** ``concurrency`` is the most handlers that run at
once, not how many threads take turns. Under the GIL, threads whose handlers never wait only
take the interpreter from each other: every handler that makes a system call (a log line, a
file write) hands the GIL to another thread and waits to get it back, a context switch or two
per task (measured: 8 threads writing a line per task spend 70 to 105 us of CPU per task, one
thread 43 us). So the thread runner starts with one active thread and a monitor adds one
whenever the process sat mostly idle over a window although deliveries were waiting (the
handlers wait on something: I/O, a lock, a sleep), or every active handler has run longer than
``LONG_HANDLER_S`` (a slow handler never holds up the rest), or, as a probe, every thread kept
a CPU busy (handlers in C outside the GIL may use more cores); it retires one when the process
was busy but its threads only took turns (more would only queue for the GIL). See ``Ramp``.
Handlers that wait reach ``concurrency`` threads within tens of milliseconds; handlers that
hold the GIL run on one thread. The judgement uses the process's CPU time, so a machine whose
other processes leave this one less than a third of a CPU looks like waiting handlers: it
then runs more threads, as before this change, never more than ``concurrency``.

A failing handler is an outcome, never an ``on_error``. Redis outages are waited out.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import queue as stdlib_queue
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from functools import partial
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from reactivex import Observable, abc
from reactivex.disposable import Disposable
from reactivex.scheduler import EventLoopScheduler

from dueq._util import tracing as _tracing
from dueq._util.outage import describe
from dueq.delivery import AsyncDelivery, Delivery, Item
from dueq.model import Outcome
from dueq.operators._bulk import Bundle, Gatherer, take_units, unbundled, verdicts
from dueq.operators._emit import SerialEmitter
from dueq.operators._settle import (
    KEEPER_TICK_MAX_S,
    KEEPER_TICK_MIN_S,
    SETTLE_BATCH,
    Cooldowns,
    Op,
    Pending,
    Settling,
    run_flow,
    timeout_error,
    timeout_for,
    within,
)

if TYPE_CHECKING:
    pass

from dueq.logs import task_fields

logger = logging.getLogger(__name__)

#: A handler: a plain function or an ``async def`` of one delivery (a ``Delivery`` from a
#: ``Queue``, an ``AsyncDelivery`` from an ``AsyncQueue``). Raising means failure.
Handler = Callable[[Delivery], Any] | Callable[[AsyncDelivery], Any]
#: A handler's result for the settler: the delivery and its error (or a bulk item's verdict)
_Finished = tuple[Delivery, Any]

#: Longest a handler thread keeps finished results before handing them to the settler (s).
FLUSH_S = 0.002
#: Most finished results handed to the settler at once.
FLUSH_MAX = 256
#: How often the thread runner's monitor looks at its handler threads (s).
MONITOR_TICK_S = 0.002
#: The window over which the monitor judges whether more handler threads would help (s).
RAMP_WINDOW_S = 0.01
#: Below this share of CPU time over a window with work waiting, the handlers wait on
#: something: one more thread may take work.
RAMP_UP_BELOW = 0.35
#: Above it, the process was busy all along: one thread fewer takes work.
RAMP_DOWN_ABOVE = 0.8
#: After a probe for handlers that run outside the GIL found none, no probe for this long
#: (s); doubles after each such probe, up to ``PROBE_BACKOFF_MAX_S``.
PROBE_BACKOFF_S = 0.5
PROBE_BACKOFF_MAX_S = 30.0
#: A handler running longer than this no longer counts as busy: another thread may start.
LONG_HANDLER_S = 0.02


def is_async_handler(handler: Handler) -> bool:
    """True for ``async def`` functions and objects whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 (a method lookup, not a callable test)
    )


class Processor(Settling):
    """Runs ``handler`` for each delivery of a source, at most ``concurrency`` at a time.

    ``subscribe`` starts it; ``close(grace_s)`` stops it: no more claims, deliveries that have
    not started are released, running handlers get ``grace_s`` to finish (``None``: don't
    wait) and are then released too.
    """

    def __init__(
        self,
        handler: Handler,
        concurrency: int,
        scheduler: abc.SchedulerBase | None = None,
        timeout_s: float | None = None,
    ) -> None:
        self._handler = handler
        self._timeout_s = timeout_s
        self._own_scheduler = EventLoopScheduler() if scheduler is None else None
        self._scheduler: abc.SchedulerBase = scheduler or self._own_scheduler  # type: ignore[assignment]
        # ``_lock`` for waiting (wait_idle); the per-task paths take ``_mutex``, its lock,
        # directly (a Condition's ``with`` is two Python calls more per round)
        self._mutex = threading.RLock()
        self._lock = threading.Condition(self._mutex)
        self._held: dict[Delivery, float] = {}  # -> when its lease was last extended (s)
        self._running: dict[Delivery, float] = {}  # -> when its handler started (s; 0.0
        # when no timeout applies to it)
        self._timed_out: set[Delivery] = set()  # failed by the keeper; late results refused
        self._spans: dict[Delivery, _tracing.AttemptSpan] = {}  # tracing on: running attempts
        self._lease_lost: set[Delivery] = set()  # held, but the keeper found its lease lost
        self.cooldowns = Cooldowns()  # keys whose held unstarted deliveries are given back
        self._closing = False
        self._give_up = threading.Event()  # stop retrying acks and fails through an outage
        self._done: stdlib_queue.SimpleQueue[list[_Finished] | None] = stdlib_queue.SimpleQueue()
        self._out: SerialEmitter[Outcome] = SerialEmitter()
        self._source: abc.DisposableBase | None = None
        self._source_ended = False
        self._keeper: abc.DisposableBase | None = None
        self._keeper_round = 0  # a keeper action of an older round does nothing
        self._keeper_due_s = KEEPER_TICK_MAX_S  # the period of the round scheduled now
        # bulk handlers' deliveries are gathered into bundles before a runner takes them
        # (see _bulk); a processor without any has no gatherer and no cost for it
        dispatch = inspect.unwrap(handler)
        self._gather = (
            Gatherer(dispatch.bulk_of, getattr(dispatch, "plain_bulk", None))
            if getattr(dispatch, "bulk", False)
            else None
        )
        # (a wrapper's own run_bulk first: a metrics wrapper measures the calls through it)
        self._run_bulk: Callable[[Any, list[Item]], Any] | None = getattr(
            handler, "run_bulk", None
        ) or getattr(dispatch, "run_bulk", None)
        self._linger: abc.DisposableBase | None = None  # the timer of the earliest linger end
        self._linger_at_s = 0.0  # when it fires (scheduler clock)
        runner = _AsyncRunner if is_async_handler(handler) else _ThreadRunner
        self._runner: _Runner = runner(
            handler,
            concurrency,
            self._begin,
            self._finished,
            self._done.put,
            self._give_back,
            timeout_s,
        )
        self._runner.run_bundle = self._run_bundle
        self._settler = threading.Thread(target=self._settle_loop, name="dueq-settler")
        self._settler.daemon = True

    # -- lifecycle ---------------------------------------------------------------------------

    def subscribe(
        self, source: Observable[Delivery], observer: abc.ObserverBase[Outcome]
    ) -> abc.DisposableBase:
        self.start(observer)
        self._source = source.subscribe(
            on_next=self._accept, on_error=self._source_error, on_completed=self._source_completed
        )
        return Disposable(lambda: self.close(None))

    @property
    def in_flight(self) -> int:
        """Deliveries held now: running, or waiting for a handler (the worker registry)."""
        return len(self._held)

    def start(self, observer: abc.ObserverBase[Outcome]) -> None:
        """Start without a source: the caller feeds ``accept_many`` and ``source_error`` (the
        ``Worker``'s own consumers, see ``observe.consume_queue``) and hands what stops them
        to ``attach_source``."""
        self._out.attach(observer)
        self._runner.start()
        self._settler.start()
        with self._lock:
            self._schedule_keeper(KEEPER_TICK_MAX_S)

    def attach_source(self, source: abc.DisposableBase) -> None:
        """What ``close`` disposes to stop claiming (for a processor fed by ``start``)."""
        with self._lock:
            closing = self._closing
            self._source = source
        if closing:
            source.dispose()

    def source_error(self, error: Exception) -> None:
        """The source of deliveries failed (not an outage: those are waited out)."""
        self._source_error(error)

    def close(self, grace_s: float | None, *, hurry: threading.Event | None = None) -> None:
        """Stop claiming, release what has not started, give running handlers ``grace_s``
        (cut short when ``hurry`` is set)."""
        with self._lock:
            already = self._closing
            self._closing = True
        if self._source is not None:
            self._source.dispose()
        if already and grace_s is None:
            return
        unstarted = self._runner.drain()
        if self._gather is not None:
            with self._mutex:
                unstarted += self._gather.drain()
                linger, self._linger = self._linger, None
            if linger is not None:
                linger.dispose()
        self._runner.stop()  # running handlers finish first
        if grace_s is None:  # release and settle in the background (Redis may be down), then stop
            closer = threading.Thread(
                target=self._finish_when_idle, args=(unstarted,), name="dueq-closer", daemon=True
            )
            closer.start()
            return
        # releases retry through an outage until the grace period ends, not beyond
        deadline = time.monotonic() + grace_s
        grace_over = threading.Timer(grace_s, self._give_up.set)
        grace_over.daemon = True
        grace_over.start()
        for d in unstarted:
            self._release(d)
        late: list[Delivery] = []
        if not self._wait_idle_or(max(deadline - time.monotonic(), 0.0), hurry):
            with self._lock:
                late = [d for d in self._held if d in self._running]
            logger.warning(
                "%d task(s) still running (or waiting for Redis to settle them) after the %.1f s "
                "grace period; releasing them (a later ack from them is refused)",
                len(late),
                grace_s,
            )
        grace_over.cancel()
        self._give_up.set()  # one try each from now on: a lease Redis keeps runs out by itself
        for d in late:
            self._release(d)
        self._done.put(None)
        self._settler.join(timeout=5)
        self._stop_keeper()

    def _wait_idle_or(self, timeout_s: float, hurry: threading.Event | None) -> bool:
        """Wait until idle, ``timeout_s`` passes or ``hurry`` is set; True when idle."""
        deadline = time.monotonic() + timeout_s
        while not self.wait_idle(min(0.1, max(deadline - time.monotonic(), 0))):
            if time.monotonic() >= deadline or (hurry is not None and hurry.is_set()):
                return False
        return True

    def _finish_when_idle(self, unstarted: list[Delivery]) -> None:
        for d in unstarted:
            self._release(d)
        self.wait_idle(None)
        self._done.put(None)
        self._stop_keeper()

    def wait_idle(self, timeout_s: float | None) -> bool:
        """Wait until no delivery is held; False on timeout."""
        with self._lock:
            return self._lock.wait_for(lambda: not self._held, timeout_s)

    # -- deliveries in -----------------------------------------------------------------------

    def _accept(self, delivery: Delivery) -> None:
        self.accept_many([delivery])

    def accept_many(self, deliveries: list[Delivery]) -> None:
        """Hold ``deliveries`` (keep their leases) and queue them for the handlers; once
        closing, give them back."""
        cooled: list[Delivery] = []
        seconds = 0.0
        if self.cooldowns.keys:  # claimed before their key's cooldown was recorded: not to start
            for d in deliveries:
                s = self.cooldowns.holds(d)
                if s is not None:
                    cooled.append(d)
                    seconds = max(seconds, s)
            if cooled:
                deliveries = [d for d in deliveries if d not in cooled]
        # the queues they came from (one, unless a sharded queue claimed them), for the
        # shortest lease: a loop in C, not a Python step per delivery
        queues = set(map(_queue_of, deliveries))
        with self._lock:
            closing = self._closing
            if not closing:
                now_s = self._scheduler.now.timestamp()
                self._held.update(dict.fromkeys(deliveries, now_s))
                shortest_s = min([q.lease_ms / 3000 for q in queues], default=self._keeper_due_s)
                if shortest_s < self._keeper_due_s and self._keeper is not None:
                    self._schedule_keeper(shortest_s)  # a shorter lease than the round allows
        if closing:
            for d in cooled + deliveries:
                self._release(d)
            return
        if cooled:
            self._give_back_cooled(cooled, seconds)
        if self._gather is not None:
            self._runner.submit_many(self._gathered(deliveries))
            return
        self._runner.submit_many(deliveries)

    def _gathered(self, deliveries: list[Any]) -> list[Any]:
        """Deliveries that run alone and the bulk handlers' bundles that are ready; the rest
        wait in open bundles until full or their linger ends (one timer for the earliest)."""
        assert self._gather is not None
        with self._mutex:
            now_s = self._scheduler.now.timestamp()
            single, ready = self._gather.sort(deliveries, now_s)
            self._set_linger(now_s)
        return single + ready

    def _set_linger(self, now_s: float) -> None:
        """Set the linger timer for the earliest open bundle (called with ``_mutex`` held)."""
        assert self._gather is not None
        at_s = self._gather.next_deadline_s()
        if at_s is None or self._closing:
            return
        if self._linger is not None and self._linger_at_s <= at_s:
            return  # one due sooner (it sets the next when it fires)
        previous = self._linger
        self._linger_at_s = at_s
        self._linger = self._scheduler.schedule_relative(max(at_s - now_s, 0.0), self._linger_over)
        if previous is not None:
            previous.dispose()

    def _linger_over(self, scheduler: abc.SchedulerBase, _state: Any = None) -> None:
        """The earliest linger ended: bundles past it run with what they have."""
        assert self._gather is not None
        with self._mutex:
            self._linger = None
            now_s = scheduler.now.timestamp()
            ready = self._gather.expired(now_s + 1e-4)  # (timers may fire a hair early)
            self._set_linger(now_s)
        if ready:
            self._runner.submit_many(ready)

    def _run_bundle(self, bundle: Bundle) -> list[_Finished]:
        """Run a bulk handler's call on ``bundle`` (where the runner runs it): the items
        that may start begin (the others are given back unstarted), the call runs once under
        one span linked to each item, and each item's verdict is what gets settled."""
        started = self._begin_many(bundle.deliveries)
        if not started:
            return []
        items = list(map(Item, started))
        call = _tracing.start_call(started)
        if call is not None:
            call.enter()
        error: BaseException | None = None
        try:
            assert self._run_bulk is not None
            value = self._run_bulk(bundle.group, items)
            if value is not None and inspect.isawaitable(value):  # an async def bulk handler
                asyncio.run(_awaited(value))
        except BaseException as exc:  # a handler's SystemExit is its items' failure too
            error = exc
        if call is not None:
            call.leave()
            _tracing.end_attempt(call, error)
        return self._finished_many(verdicts(items, error))

    def _begin_many(self, deliveries: list[Delivery]) -> list[Delivery]:
        """``_begin`` for the items of a bulk call, with one lock round for all of them (not
        one per item): those that may start, in order; the others are given back unstarted
        (outside the lock). No span per item: the call has one."""
        cooldowns = self.cooldowns
        maybe: list[Delivery] = []
        refused: list[Delivery] = []
        for d in deliveries:
            if d.cancelled or d.queue_paused or (cooldowns.keys and cooldowns.holds(d)):
                refused.append(d)  # cancelled while held, paused or cooling: given back
            else:
                maybe.append(d)
        started: list[Delivery] = []
        with self._mutex:
            if self._closing:
                refused += maybe
                maybe = []
            held, running, default_s = self._held, self._running, self._timeout_s
            now_s: float | None = None
            shortest_s: float | None = None
            for d in maybe:
                if d not in held:
                    refused.append(d)
                    continue
                timeout_s = d.timeout_s
                if timeout_s is None:
                    timeout_s = default_s
                if timeout_s is None:
                    running[d] = 0.0  # (when it started matters only to a timeout)
                else:
                    if now_s is None:
                        now_s = self._scheduler.now.timestamp()
                    running[d] = now_s
                    if shortest_s is None or timeout_s < shortest_s:
                        shortest_s = timeout_s
                started.append(d)
            if (
                shortest_s is not None
                and not self._runner.times_out
                and shortest_s < self._keeper_due_s
                and self._keeper is not None
            ):
                self._schedule_keeper(shortest_s)  # the keeper watches the timeout
        for d in refused:
            self._runner.unstarted(d)
        return started

    def _finished_many(self, finished: list[_Finished]) -> list[_Finished]:
        """``_finished`` for the items of a bulk call (each with its verdict), with one lock
        round for all of them: those to settle, in order. Items are begun without a span
        (``_begin_many``), so there is none to end here."""
        kept: list[_Finished] = []
        late: list[Delivery] = []
        with self._mutex:
            timed_out, held, running = self._timed_out, self._held, self._running
            for pair in finished:
                d = pair[0]
                # failed by the keeper at its timeout, or released by close() past its grace
                if d in timed_out or d not in held:
                    late.append(d)
                else:
                    running.pop(d, None)  # done: no timeout applies any more
                    kept.append(pair)
        for d, verdict in kept:
            if verdict is not None:
                seconds = self.cooldowns.note(d, verdict)
                if seconds is not None:  # its key cools down: what waits of that key goes back
                    self._give_back_cooled(self._take(self._cooling), seconds)
        for d in late:
            self._refuse_late(d)
        return kept

    def _refuse_late(self, delivery: Delivery) -> None:
        """Say that a handler returned after its delivery's timeout (its result refused)."""
        logger.warning(
            "queue %r: task %r attempt %d: handler returned after its timeout; its result "
            "is refused",
            delivery.queue.name,
            delivery.id,
            delivery.attempt,
            extra=task_fields(delivery.queue.name, delivery.id, delivery.attempt),
        )

    def _begin(self, delivery: Delivery) -> bool:
        """A handler is about to start on ``delivery``; False if closing (then don't).
        Called where the handler runs (its thread, or the loop's task): the attempt's span,
        if tracing is on, is current there until ``_finished``."""
        if (
            delivery.cancelled
            or delivery.queue_paused
            or (self.cooldowns.keys and self.cooldowns.holds(delivery))
        ):  # cancelled while held, its queue paused or its key cooling: given back unstarted
            return False
        with self._mutex:
            if self._closing or delivery not in self._held:
                return False
            timeout_s = delivery.timeout_s  # (timeout_for, inline: a call less per task)
            if timeout_s is None:
                timeout_s = self._timeout_s
            # when it started matters only to a timeout (the scheduler's clock costs a
            # datetime per read: not per task when none applies)
            self._running[delivery] = 0.0 if timeout_s is None else self._scheduler.now.timestamp()
            if (
                timeout_s is not None
                and not self._runner.times_out
                and timeout_s < self._keeper_due_s
                and self._keeper is not None
            ):
                self._schedule_keeper(timeout_s)  # the keeper watches the timeout
        attempt = _tracing.start_attempt(delivery)  # (outside the lock: span processors run)
        if attempt is not None:
            self._spans[delivery] = attempt
            attempt.enter()
        return True

    def _finished(self, delivery: Delivery, error: Any) -> bool:
        """A handler is done with ``delivery``; True when its result is to be settled (the
        runner then hands it to the settler, in a batch)."""
        if self._spans:
            attempt = self._spans.pop(delivery, None)
            if attempt is not None:
                attempt.leave()
                _tracing.end_attempt(attempt, error)
        with self._mutex:
            # failed by the keeper at its timeout, or released by close() past its grace: the
            # result comes too late (and must not emit that delivery's outcome again)
            late = delivery in self._timed_out or delivery not in self._held
            if not late:
                self._running.pop(delivery, None)  # done: no timeout applies any more
        if not late and error is not None:
            seconds = self.cooldowns.note(delivery, error)
            if seconds is not None:  # its key cools down: what waits of that key goes back
                self._give_back_cooled(self._take(self._cooling), seconds)
        if late:
            self._refuse_late(delivery)
            return False
        return True

    def _take(self, which: Callable[[Delivery], bool]) -> list[Delivery]:
        """Take back the held deliveries not yet started that ``which`` chooses (waiting for
        a runner, or gathering for a bulk handler)."""
        taken = self._runner.take(which)
        if self._gather is not None:
            with self._mutex:
                taken += self._gather.take(which)
        return taken

    def _source_error(self, error: Exception) -> None:
        logger.error("delivery stream failed: %s", describe(error))
        self._out.on_error(error)
        self.close(None)

    def _source_completed(self) -> None:
        with self._lock:
            self._source_ended = True
            idle = not self._held
        if idle:
            self._complete()

    def _complete(self) -> None:
        self._out.on_completed()
        self.close(None)

    # -- outcomes out ------------------------------------------------------------------------

    def _settle_loop(self) -> None:
        """Settle finished deliveries in rounds until ``close`` says stop (see _settle)."""
        pending = Pending()
        stop = False
        while not stop:
            batch, stop = self._next_batch(pending.wait_s())
            try:
                settled = run_flow(self.settle_flow(batch, pending, final=stop))
            except Exception as exc:  # a bug here must not stop every later ack: report, go on
                logger.exception("settling %d task(s) failed; their leases run out", len(batch))
                error = describe(exc)
                settled = [(d, Outcome(d.id, "lost", d.attempt, error=error)) for d, _ in batch]
            self._emit([outcome for _, outcome in settled])
            self._forget([d for d, _ in settled])

    def _next_batch(self, timeout_s: float | None) -> tuple[list[_Finished], bool]:
        """Up to SETTLE_BATCH finished deliveries (waiting at most ``timeout_s`` for the
        first), and whether ``close`` asked the settler to stop."""
        try:
            first = self._done.get(timeout=timeout_s)
        except stdlib_queue.Empty:
            return [], False
        if first is None:
            return [], True
        batch = list(first)
        while len(batch) < SETTLE_BATCH:  # (a hand-over may take a round past it, not far)
            try:
                items = self._done.get_nowait()
            except stdlib_queue.Empty:
                break
            if items is None:
                return batch, True
            batch += items
        return batch, False

    def _holds(self, d: Delivery) -> bool:
        with self._mutex:
            return d in self._held

    def _still_held(self, deliveries: list[Delivery]) -> list[Delivery]:
        with self._mutex:
            return [d for d in deliveries if d in self._held]

    def _pause(self, delay_s: float) -> Op:
        return partial(self._give_up.wait, delay_s)

    def _giving_up(self) -> bool:
        return self._give_up.is_set()

    def _release(self, d: Delivery) -> None:
        self._emit([run_flow(self.release_flow(d))])
        self._forget([d])

    def _cooling(self, d: Delivery) -> bool:
        return self.cooldowns.holds(d) is not None

    def _give_back(self, d: Delivery) -> None:
        """A held delivery that is not to start (closing, cancelled, or its key cools down)."""
        seconds = None if d.cancelled else self.cooldowns.holds(d)
        if seconds is not None:
            self._give_back_cooled([d], seconds)
        else:
            self._release(d)  # a cancelled one: Redis says so, and its outcome is "cancelled"

    def _give_back_cooled(self, deliveries: list[Delivery], seconds: float) -> None:
        """Give back, in one call per queue, held unstarted deliveries of cooling keys: due
        at the end of the cooldown (``seconds`` from now)."""
        if not deliveries:
            return
        outcomes = run_flow(self.release_cooled_flow(deliveries, seconds))
        self._emit(outcomes)
        self._forget(deliveries)

    def _emit(self, outcomes: list[Outcome]) -> None:
        self._out.on_next(*outcomes)

    def _forget(self, deliveries: list[Delivery]) -> None:
        with self._lock:
            held_pop = self._held.pop
            for d in deliveries:
                held_pop(d, None)
            # (the usual round: nothing lost or timed out, nothing of them running; a look at
            # each, not a call per delivery on each)
            running = self._running
            if running:
                for d in deliveries:
                    running.pop(d, None)
            if self._lease_lost:
                self._lease_lost.difference_update(deliveries)
            if self._timed_out:
                self._timed_out.difference_update(deliveries)
            idle = not self._held
            complete = idle and self._source_ended and not self._closing
            if idle:
                self._lock.notify_all()
        if complete:
            self._complete()

    # -- lease keeping -----------------------------------------------------------------------

    def _keep_leases(self, scheduler: abc.SchedulerBase, round_: int | None) -> None:
        with self._lock:
            if round_ != self._keeper_round:
                return  # replaced by a sooner round (or stopped)
            held = [(d, at) for d, at in self._held.items() if d not in self._lease_lost]
        now_s = scheduler.now.timestamp()
        next_timeout_s = self._fail_timed_out(now_s)
        done = run_flow(self.keep_flow(held, now_s))
        if next_timeout_s is not None:
            done.tick_s = max(min(done.tick_s, next_timeout_s), KEEPER_TICK_MIN_S)
        with self._lock:
            for d in done.extended:
                if d in self._held:
                    self._held[d] = now_s
            self._lease_lost.update(d for d in done.lost if d in self._held)
            if self._keeper is not None and round_ == self._keeper_round:
                self._schedule_keeper(done.tick_s)
        if done.cancelled:  # cancelled while waiting for a handler: dropped, never run
            cancelled = set(done.cancelled)
            for d in self._take(cancelled.__contains__):
                self._release(d)

    def _fail_timed_out(self, now_s: float) -> float | None:
        """Fail every running delivery past its timeout (threads cannot be stopped: the
        handler is abandoned, a thread takes its place, and its late result is refused).
        Returns the seconds until the next timeout, if any runs."""
        if self._runner.times_out:
            return None
        late: list[tuple[Delivery, float]] = []
        pending: list[float] = []
        with self._lock:
            for d, started_s in self._running.items():
                timeout_s = timeout_for(d, self._timeout_s)
                if timeout_s is None or d in self._timed_out:
                    continue
                if started_s + timeout_s <= now_s:
                    late.append((d, timeout_s))
                    self._timed_out.add(d)
                else:
                    pending.append(started_s + timeout_s - now_s)
        for d, timeout_s in late:
            logger.warning(
                "queue %r: task %r attempt %d: handler ran past its %.3g s timeout; abandoned",
                d.queue.name,
                d.id,
                d.attempt,
                timeout_s,
                extra=task_fields(d.queue.name, d.id, d.attempt),
            )
            self._runner.abandon(d)
            error = timeout_error(d, timeout_s)
            _tracing.end_attempt(self._spans.get(d), error)  # the handler may never return
            self._done.put([(d, error)])
        return min(pending, default=None)

    def _schedule_keeper(self, period_s: float) -> None:
        """Schedule the next keeper round in ``period`` (called with ``_lock`` held); a round
        already scheduled for later does nothing when its time comes."""
        self._keeper_round += 1
        self._keeper_due_s = period_s
        previous = self._keeper
        self._keeper = self._scheduler.schedule_relative(
            period_s, self._keep_leases, self._keeper_round
        )
        if previous is not None:
            previous.dispose()

    def _stop_keeper(self) -> None:
        with self._lock:
            keeper, self._keeper = self._keeper, None
            self._keeper_round += 1
        if keeper is not None:
            keeper.dispose()
        if self._own_scheduler is not None:
            self._own_scheduler.dispose()


#: A delivery's queue (``Delivery.queue``), for ``map``.
_queue_of = attrgetter("queue")


def _no_bundles(bundle: Bundle) -> list[_Finished]:
    raise AssertionError("a bundle reached a runner with no bulk handler")


class _Runner:
    """Runs handlers; see the two implementations below."""

    def __init__(
        self,
        handler: Handler,
        concurrency: int,
        begin: Callable[[Delivery], bool],
        finished: Callable[[Delivery, BaseException | None], bool],
        hand_over: Callable[[list[_Finished]], None],
        unstarted: Callable[[Delivery], None],
        timeout_s: float | None = None,
    ) -> None:
        self._handler: Callable[[Any], Any] = handler
        self._concurrency = concurrency
        self._begin = begin
        self._finished = finished  # True: settle the result (hand it over)
        self._hand_over = hand_over  # results to the settler, in order
        self._unstarted = unstarted
        self.unstarted = unstarted
        self._timeout_s = timeout_s
        #: runs a bulk handler's call on a bundle, returning what to settle (the processor's)
        self.run_bundle: Callable[[Bundle], list[_Finished]] = _no_bundles

    #: True when the runner enforces the timeout itself (cancelling a coroutine); else the
    #: processor's keeper fails a handler past its timeout and calls ``abandon``.
    times_out = False

    def abandon(self, delivery: Delivery) -> None:
        """The handler running ``delivery`` is past its timeout: carry on without it."""

    def start(self) -> None:
        raise NotImplementedError

    def submit(self, delivery: Any) -> None:  # (a Delivery or a Bundle)
        raise NotImplementedError

    def submit_many(self, deliveries: list[Any]) -> None:
        for d in deliveries:
            self.submit(d)

    def drain(self) -> list[Delivery]:
        """Take back the deliveries not yet picked up by a handler."""
        raise NotImplementedError

    def take(self, which: Callable[[Delivery], bool]) -> list[Delivery]:
        """Take back those of the deliveries not yet picked up by a handler that ``which``
        chooses."""
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


class Ramp:
    """How many handler threads may take work, judged once per window in which deliveries
    waited and every allowed thread took them (``step``); between 1 and ``ceiling``:

    - one more when the handlers wait on something (the process used less than
      ``RAMP_UP_BELOW`` of a CPU), or every running handler has run long;
    - one more, as a probe, when every thread used a whole CPU (handlers that run outside
      the GIL, in C, can use more cores): kept if the next window shows one more CPU used,
      else taken back and not tried again for a while (``PROBE_BACKOFF_S``, doubling);
    - one fewer when the process was busy but the threads did not each use a CPU: they
      take turns at the GIL, and another would only add hand-offs.
    """

    def __init__(self, ceiling: int, cores: int) -> None:
        self.active = 1
        self._ceiling = ceiling
        self._cores = max(cores, 1)
        self._probing = False  # the last step added a thread to see if it used another CPU
        self._backoff_s = PROBE_BACKOFF_S
        self._next_probe_s = 0.0

    def step(self, cpu_share: float, all_long: bool, now_s: float) -> int:
        active, probing, self._probing = self.active, self._probing, False
        busy_each = cpu_share > active * RAMP_DOWN_ABOVE  # every thread used a whole CPU
        if probing:
            if busy_each:
                self._backoff_s = PROBE_BACKOFF_S  # it did: more may help, go on
            else:
                self._next_probe_s = now_s + self._backoff_s
                self._backoff_s = min(2 * self._backoff_s, PROBE_BACKOFF_MAX_S)
        if all_long or cpu_share < RAMP_UP_BELOW:
            active += 1
        elif busy_each and active < self._cores and now_s >= self._next_probe_s:
            active += 1
            self._probing = active <= self._ceiling
        elif cpu_share > RAMP_DOWN_ABOVE and not busy_each:
            active -= 1
        self.active = max(1, min(active, self._ceiling))
        return self.active


class _ThreadRunner(_Runner):
    """A plain function on up to ``concurrency`` threads fed by one in-memory queue, with
    only as many of them taking work as help (see the module docstring).

    One lock guards the inbox and the counts. A thread takes deliveries one after another
    while ``_working <= _active``, parks when the inbox is empty (or it is one too many), and
    keeps its results in ``_results`` for the settler, handed over by whichever thread (or
    the monitor) finds them ``FLUSH_S`` old, ``FLUSH_MAX`` long, or finds nothing left to do.
    Handlers never run under the lock.
    """

    def __init__(
        self,
        *args: Any,
        cpu_clock: Callable[[], float] = time.process_time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(*args)
        self._cpu_clock = cpu_clock
        self._clock = clock  # when handlers started, results waited, ramp windows (s)
        self._lock = threading.Lock()
        self._work_ready = threading.Condition(self._lock)  # handler threads wait here
        self._monitor_wake = threading.Condition(self._lock)  # the monitor waits here
        self._inbox: deque[Any] = deque()  # deliveries, and bundles of them
        self._ramp = Ramp(self._concurrency, os.cpu_count() or 1)
        self._active = 1  # threads that may take work now (the ramp's judgement)
        self._working = 0  # threads taking work (running a handler, or about to)
        self._stopping = False
        self._current: dict[int, tuple[Any, float]] = {}  # thread -> (delivery/bundle, start)
        self._retired: set[int] = set()  # threads whose handler was abandoned: exit when done
        self._results: list[_Finished] = []  # finished, not yet handed to the settler
        self._results_since_s = 0.0  # when the oldest of them finished
        self._monitor_idle = False  # the monitor waits without a timeout
        self._threads = [self._thread(i) for i in range(self._concurrency)]
        self._started = 0  # of _threads: started when the ramp first lets that many work
        self._monitor = threading.Thread(
            target=self._watch, name="dueq-handler-monitor", daemon=True
        )

    def _thread(self, i: int) -> threading.Thread:
        return threading.Thread(target=self._work, name=f"dueq-handler-{i}", daemon=True)

    @property
    def active(self) -> int:
        """How many handler threads may take work now."""
        with self._lock:
            return self._active

    def abandon(self, delivery: Delivery) -> None:
        with self._lock:
            ident = next(
                (
                    i
                    for i, (d, _) in self._current.items()
                    if d is delivery or (type(d) is Bundle and delivery in d.deliveries)
                ),
                None,
            )
            if ident is None:
                return  # it finished meanwhile
            self._retired.add(ident)
            del self._current[ident]
            self._working -= 1  # it takes no more work: another may
            replacement = self._thread(len(self._threads))
            self._threads.insert(self._started, replacement)  # among the started ones
            self._started += 1
        replacement.start()  # concurrency stays what was asked for
        with self._lock:
            self._work_ready.notify()

    def start(self) -> None:
        """Start the monitor and the one thread that may take work at first (``_active``);
        the others start when the ramp first lets them work (``_start_up_to``): starting
        all ``concurrency`` before the first claim made a worker's first task wait for each
        thread's start-up handshake (1.6 ms on an idle 2-core machine, 20-24 ms on a busy one:
        docs/benchmarks.md, Start-up)."""
        self._monitor.start()
        with self._lock:
            self._start_up_to(self._active)

    def _start_up_to(self, count: int) -> None:
        """Start threads until ``count`` run (called with the lock held: a thread's start
        waits only for its bootstrap, which takes no lock of ours)."""
        while self._started < count:
            self._threads[self._started].start()
            self._started += 1

    def submit(self, delivery: Any) -> None:  # (a Delivery or a Bundle)
        self.submit_many([delivery])

    def submit_many(self, deliveries: list[Any]) -> None:
        with self._lock:
            self._inbox.extend(deliveries)
            if self._working < self._active:
                self._work_ready.notify(min(self._active - self._working, len(deliveries)))
            if self._monitor_idle:
                self._monitor_idle = False
                self._monitor_wake.notify()

    def drain(self) -> list[Delivery]:
        with self._lock:
            taken = unbundled(self._inbox)
            self._inbox.clear()
        return taken

    def take(self, which: Callable[[Delivery], bool]) -> list[Delivery]:
        with self._lock:
            taken, left = take_units(self._inbox, which)
            if taken:
                self._inbox = deque(left)
        return taken

    def stop(self) -> None:
        """Threads finish what they run (and what still waits: ``begin`` refuses it once the
        processor closes, so it is released), then exit."""
        with self._lock:
            self._stopping = True
            self._work_ready.notify_all()
            self._monitor_wake.notify_all()

    def _flush(self) -> None:
        """Hand the finished results to the settler (called with the lock held; the hand-over
        is a queue put, no user code)."""
        if self._results:
            results, self._results = self._results, []
            self._hand_over(results)

    def _work(self) -> None:
        ident = threading.get_ident()
        with self._lock:
            while True:
                while not (self._inbox and (self._working < self._active or self._stopping)):
                    self._flush()  # nothing to do for now: the settler gets what is finished
                    if self._stopping and not self._inbox:
                        return
                    self._work_ready.wait()
                self._working += 1
                while True:
                    d = self._inbox.popleft()
                    self._current[ident] = (d, self._clock())
                    if type(d) is Bundle:  # a bulk handler's call: many results at once
                        if self._run_bundle_unlocked(d, ident):
                            return
                        if not self._inbox or (self._working > self._active and not self._stopping):
                            break
                        continue
                    self._lock.release()
                    try:
                        error, settle = self._run(d)
                    finally:
                        self._lock.acquire()
                    if ident in self._retired:  # abandoned past its timeout: a replacement runs
                        self._retired.discard(ident)
                        return
                    del self._current[ident]
                    if settle:
                        if not self._results:
                            self._results_since_s = self._clock()
                            if self._monitor_idle:  # it hands them over if no thread does
                                self._monitor_idle = False
                                self._monitor_wake.notify()
                        self._results.append((d, error))
                        if len(self._results) >= FLUSH_MAX:
                            self._flush()
                    if not self._inbox or (self._working > self._active and not self._stopping):
                        break
                self._working -= 1

    def _run_bundle_unlocked(self, bundle: Bundle, ident: int) -> bool:
        """Run ``bundle``'s call outside the lock (called and returning with it held), keep
        its results for the settler; True when this thread was abandoned meanwhile (one of
        its items ran past its timeout: a replacement took its place), so it ends."""
        self._lock.release()
        try:
            finished = self.run_bundle(bundle)
        finally:
            self._lock.acquire()
        if finished:  # (those past their timeout were failed already: not among them)
            if not self._results:
                self._results_since_s = self._clock()
                if self._monitor_idle:
                    self._monitor_idle = False
                    self._monitor_wake.notify()
            self._results += finished
            if len(self._results) >= FLUSH_MAX:
                self._flush()
        if ident in self._retired:
            self._retired.discard(ident)
            self._flush()
            return True
        del self._current[ident]
        return False

    def _run(self, d: Delivery) -> tuple[BaseException | None, bool]:
        """Run the handler on ``d`` (outside the lock); its error, and whether to settle it."""
        if not self._begin(d):
            self._unstarted(d)
            return None, False
        error: BaseException | None = None
        try:
            result = self._handler(d)
            if result is not None and inspect.isawaitable(result):  # a partial of an async def
                result = asyncio.run(_awaited(result))
            if result is not None:  # kept by the ack while the queue keeps results
                d.result = result
        except BaseException as exc:  # a handler's SystemExit is its task's failure too
            error = exc
        return error, self._finished(d, error)

    def _watch(self) -> None:
        """The monitor: hands over results no thread is about to, and sets how many threads
        take work (``ramp``) once per ``RAMP_WINDOW_S`` in which deliveries waited."""
        window: tuple[float, float] | None = None  # (monotonic, cpu clock) at its start
        with self._lock:
            while True:
                if self._stopping:  # after the last results of the last thread
                    if not (self._working or self._results):
                        return
                elif not (self._results or self._inbox):  # (submit and results wake it)
                    window = None
                    self._monitor_idle = True
                    self._monitor_wake.wait()
                    continue
                self._monitor_wake.wait(MONITOR_TICK_S)
                now_s = self._clock()
                if self._results and now_s - self._results_since_s >= FLUSH_S:
                    self._flush()
                if not (self._inbox and self._working >= self._active):
                    window = None  # nobody waits for a thread: nothing to judge
                    continue
                if window is None:
                    window = (now_s, self._cpu_clock())
                    continue
                if now_s - window[0] < RAMP_WINDOW_S:
                    continue
                cpu_share = (self._cpu_clock() - window[1]) / (now_s - window[0])
                all_long = all(now_s - at >= LONG_HANDLER_S for _, at in self._current.values())
                active = self._ramp.step(cpu_share, all_long, now_s)
                if active > self._active:
                    self._start_up_to(active)
                    self._work_ready.notify()
                self._active = active
                window = (now_s, self._cpu_clock())


class _AsyncRunner(_Runner):
    """An ``async def`` handler on one event loop thread, ``concurrency`` at a time."""

    times_out = True  # a handler past its timeout is cancelled here

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name="dueq-async-handlers", daemon=True)
        self._waiting: set[Any] = set()  # deliveries, and bundles of them
        self._waiting_lock = threading.Lock()
        self._semaphore: asyncio.Semaphore | None = None

    def start(self) -> None:
        self._thread.start()

    def _serve(self) -> None:
        try:
            self._loop.run_forever()
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        finally:
            self._loop.close()

    def submit(self, delivery: Any) -> None:  # (a Delivery or a Bundle)
        with self._waiting_lock:
            self._waiting.add(delivery)
        asyncio.run_coroutine_threadsafe(self._run(delivery), self._loop)

    def drain(self) -> list[Delivery]:
        with self._waiting_lock:
            taken, self._waiting = unbundled(self._waiting), set()
        return taken

    def take(self, which: Callable[[Delivery], bool]) -> list[Delivery]:
        with self._waiting_lock:
            taken, left = take_units(self._waiting, which)
            self._waiting = set(left)
        return taken

    def stop(self) -> None:
        def stop_when_done() -> None:
            pending = [t for t in asyncio.all_tasks(self._loop) if not t.done()]
            if pending:
                self._loop.call_later(0.05, stop_when_done)
            else:
                self._loop.stop()

        self._loop.call_soon_threadsafe(stop_when_done)

    async def _run(self, d: Any) -> None:  # (a Delivery or a Bundle)
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self._concurrency)
        async with self._semaphore:
            with self._waiting_lock:
                if d not in self._waiting:
                    return  # drained: the closer releases it
                self._waiting.discard(d)
            if type(d) is Bundle:  # a bulk handler's call (its coroutine run on a thread)
                finished = await asyncio.get_running_loop().run_in_executor(
                    None, self.run_bundle, d
                )
                if finished:
                    self._hand_over(finished)
                return
            if not self._begin(d):
                await asyncio.get_running_loop().run_in_executor(None, self._unstarted, d)
                return
            error: BaseException | None = None
            try:
                value = await within(self._handler(d), timeout_for(d, self._timeout_s), d)
                if value is not None:  # kept by the ack while the queue keeps results
                    d.result = value
            except BaseException as exc:  # a handler's SystemExit is its task's failure too
                error = exc
            if self._finished(d, error):
                self._hand_over([(d, error)])


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable
