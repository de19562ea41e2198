"""``process`` on the caller's event loop: the asyncio twin of ``Processor``.

When ``process`` is subscribed from a coroutine (an ``AsyncQueue``'s ``observe()`` inside a
FastAPI lifespan, ``AsyncWorker.run()``), everything runs on that loop and dueq starts no
thread of its own:

- at most ``concurrency`` runner tasks take waiting deliveries one after another and run the
  handler on each: an ``async def`` handler is awaited on the loop, so it can use the
  application's clients; a plain function runs on one of ``concurrency`` handler threads
  (``HandlerThreads``): its ``timeout`` counts from when it starts there, and a thread
  abandoned past it is replaced, so what hangs never holds up the rest (up to a bound).
  A runner whose handlers never await lets the loop run others every ``RUNNER_YIELD_S``
  (the settler then acks and the claim loop claims while it works through the hold);
- one settler task acks successes in batches (one ``ack_many`` per queue and round) and
  records failures through the retry policy;
- one keeper task extends each held lease once a third of it has passed, waking when the
  earliest extension is due.

The rules (what an outage, a lost lease or an unprintable error means) are the flows of
``_settle.Settling``, shared with the threaded consumer; this module only awaits them. Calls
that would block (a sync ``Queue``'s deliveries) run in a thread, so the loop never blocks.
Outcomes are emitted on the loop, never under a lock, so a subscriber may dispose from inside
``on_next``. Past the grace period of ``close``, running handlers are cancelled and their
deliveries released (the threaded consumer can only abandon them).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from reactivex import Observable, abc
from reactivex.disposable import Disposable

from dueq._consume.aio import call_on_loop, wait_event
from dueq._util import tracing as _tracing
from dueq._util.outage import describe
from dueq.delivery import Item
from dueq.exceptions import TaskCancelled
from dueq.logs import task_fields
from dueq.model import Outcome
from dueq.operators._bulk import Bundle, Gatherer, take_units, unbundled, verdicts
from dueq.operators._emit import SerialEmitter
from dueq.operators._settle import (
    KEEPER_TICK_MAX_S,
    SETTLE_BATCH,
    Cooldowns,
    Op,
    Pending,
    Settling,
    run_flow_async,
    timeout_error,
    timeout_for,
    within,
)

logger = logging.getLogger("dueq.operators._process")

#: Longest a runner keeps the loop when its handlers never await (s).
RUNNER_YIELD_S = 0.005
#: Most seconds ``close`` waits for the settler's last round.
SETTLER_STOP_S = 5.0

_Finished = tuple[Any, BaseException | None]

#: Processors subscribed and not yet closed. The loop keeps only weak references to tasks, and
#: a subscriber may drop its subscription (``take(5)`` does): without this, a processor and its
#: tasks could be garbage-collected half-way through releasing what it holds.
_LIVE: set[AsyncProcessor] = set()


class AsyncProcessor(Settling):
    """Runs ``handler`` for each delivery of a source on the running loop; see the module
    docstring. ``subscribe`` must be called on that loop; ``close`` is a coroutine."""

    def __init__(
        self, handler: Any, concurrency: int, is_async: bool, timeout_s: float | None = None
    ) -> None:
        self._handler = handler
        self._concurrency = concurrency
        self._timeout_s = timeout_s
        self._is_async = is_async
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pool: ThreadPoolExecutor | None = None  # blocking Redis calls (a sync Queue)
        self._threads: HandlerThreads | None = None  # plain-function handlers
        self._waiting: deque[Any] = deque()  # accepted, not yet picked up by a runner
        self._runners = 0  # runner tasks alive (at most concurrency)
        self._held: dict[Any, float] = {}  # -> loop time its lease was last extended
        self._running: dict[Any, asyncio.Task[None]] = {}
        self._lease_lost: set[Any] = set()
        self._cancelling: set[Any] = set()  # handlers cancelled because q.cancel() hit their task
        self.cooldowns = Cooldowns()  # keys whose held unstarted deliveries are given back
        self._closing = False
        self._source_ended = False
        self._give_up = asyncio.Event()
        self._done: list[_Finished] = []
        self._done_event = asyncio.Event()
        self._settler_stop = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._keeper_poke = asyncio.Event()
        self._keeper_tick_s = KEEPER_TICK_MAX_S
        self._tasks: set[asyncio.Task[Any]] = set()
        self._settler: asyncio.Task[None] | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._source: abc.DisposableBase | None = None
        self._out: SerialEmitter[Outcome] = SerialEmitter()
        # bulk handlers' deliveries are gathered into bundles before a runner takes them
        # (see _bulk); without any there is no gatherer and no cost for it
        dispatch = inspect.unwrap(handler)
        self._gather = (
            Gatherer(dispatch.bulk_of, getattr(dispatch, "plain_bulk", None))
            if getattr(dispatch, "bulk", False)
            else None
        )
        # (a wrapper's own run_bulk first: a metrics wrapper measures the calls through it)
        self._run_bulk: Any = getattr(handler, "run_bulk", None) or getattr(
            dispatch, "run_bulk", None
        )
        self._linger: asyncio.TimerHandle | None = None  # the earliest linger end's timer
        self._linger_at_s = 0.0
        self._in_calls: set[Any] = set()  # items of bulk calls running (not cancelled alone)

    # -- lifecycle ---------------------------------------------------------------------------

    def subscribe(
        self, source: Observable[Any], observer: abc.ObserverBase[Outcome]
    ) -> abc.DisposableBase:
        self.start(observer)
        self._source = source.subscribe(
            on_next=self._on_next,
            on_error=lambda exc: self._on_loop(self._source_error, exc),
            on_completed=lambda: self._on_loop(self._source_completed),
        )
        return Disposable(lambda: self._on_loop(self._dispose))

    @property
    def in_flight(self) -> int:
        """Deliveries held now: running, or waiting for a handler (the worker registry)."""
        return len(self._held)

    def start(self, observer: abc.ObserverBase[Outcome]) -> None:
        """Start on the running loop without a source: the caller feeds ``accept_many`` and
        ``source_error`` on this loop (``AsyncWorker``'s own claim loops, see
        ``_consume.aio.consume``) and hands what stops them to ``attach_source``."""
        self._loop = asyncio.get_running_loop()
        _LIVE.add(self)
        self._out.attach(observer)
        self._settler = self._spawn(self._settle_loop())
        self._keeper = self._spawn(self._keep_loop())

    def attach_source(self, source: abc.DisposableBase) -> None:
        """What ``close`` disposes to stop claiming (for a processor fed by ``start``)."""
        self._source = source
        if self._closing:
            source.dispose()

    def source_error(self, error: Exception) -> None:
        """The source of deliveries failed (called on the loop)."""
        self._source_error(error)

    def _dispose(self) -> None:
        if not self._closing:
            self._spawn(self.close(None))

    async def close(self, grace_s: float | None, *, hurry: asyncio.Event | None = None) -> None:
        """Stop claiming, release what has not started, give running handlers ``grace_s``
        (``None``: settle them in the background; cut short when ``hurry`` is set), then
        cancel and release what still runs."""
        already, self._closing = self._closing, True
        if self._source is not None:
            self._source.dispose()
        if already and grace_s is None:
            return
        # only what no handler has picked up: a delivery whose handler already returned waits
        # for its ack in _done, and releasing it would run the task again
        unstarted = [d for d in unbundled(self._waiting) if d in self._held]
        self._waiting.clear()
        if self._gather is not None:
            unstarted += self._gather.drain()
            if self._linger is not None:
                self._linger.cancel()
                self._linger = None
        await asyncio.gather(*(self._release(d) for d in unstarted))
        if grace_s is None:
            await self._idle.wait()
            await self._stop_helpers()
            return
        idle = self._spawn(self._idle.wait())
        waits: set[asyncio.Future[Any]] = {idle}
        if hurry is not None:
            waits.add(self._spawn(hurry.wait()))
        await asyncio.wait(waits, timeout=grace_s, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
        late = dict(self._running)
        if late:
            logger.warning(
                "%d task(s) still running after the %.1f s grace period; cancelling and "
                "releasing them",
                len(late),
                grace_s,
            )
            for task in late.values():
                task.cancel()
            await asyncio.gather(*late.values(), return_exceptions=True)
        self._give_up.set()  # one try each from now on: a lease Redis keeps runs out by itself
        await asyncio.gather(*(self._release(d) for d in late if d in self._held))
        await self._stop_helpers()

    async def _stop_helpers(self) -> None:
        self._settler_stop = True
        self._done_event.set()
        if self._settler is not None:
            await asyncio.wait({self._settler}, timeout=SETTLER_STOP_S)
        if self._keeper is not None:
            self._keeper.cancel()
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        if self._threads is not None:
            self._threads.stop()
        _LIVE.discard(self)

    # -- deliveries in -----------------------------------------------------------------------

    def _on_next(self, delivery: Any) -> None:
        self._on_loop(self._accept, delivery)

    def _on_loop(self, fn: Any, *args: Any) -> None:
        assert self._loop is not None
        call_on_loop(self._loop, fn, *args)

    def _accept(self, d: Any) -> None:
        self.accept_many([d])

    def accept_many(self, deliveries: list[Any]) -> None:
        """Hold ``deliveries`` and queue them for the runners (on the loop); once closing,
        give them back."""
        if self._closing:
            for d in deliveries:
                self._spawn(self._release(d))
            return
        if self.cooldowns.keys:  # claimed before their key's cooldown was recorded: not to start
            cooled = [(d, s) for d in deliveries if (s := self.cooldowns.holds(d)) is not None]
            if cooled:
                given = {d for d, _ in cooled}
                deliveries = [d for d in deliveries if d not in given]
                self._hold_back([d for d, _ in cooled], max(s for _, s in cooled))
        assert self._loop is not None
        now_s = self._loop.time()
        held = self._held
        tick_s = self._keeper_tick_s
        for d in deliveries:
            held[d] = now_s
            if d.queue.lease_ms / 3000 < tick_s:
                self._keeper_poke.set()  # a shorter lease than the keeper's round allows for
        self._idle.clear()
        if self._gather is not None:
            single, ready = self._gather.sort(deliveries, self._loop.time())
            self._set_linger()
            deliveries = single + ready
        self._waiting.extend(deliveries)
        for _ in range(min(self._concurrency - self._runners, len(deliveries))):
            self._runners += 1
            self._spawn(self._runner())

    def _cool_waiting(self, cooling_s: float) -> None:
        """A key cools down: what waits for a runner (or gathers) of that key goes back now."""
        cooling = self.cooldowns

        def cooled(w: Any) -> bool:
            return cooling.holds(w) is not None

        taken, left = take_units(self._waiting, cooled)
        if self._gather is not None:
            taken += self._gather.take(cooled)
        if taken:
            self._waiting = deque(left)
            self._hold_back(taken, cooling_s)

    def _set_linger(self) -> None:
        """Set the linger timer for the earliest open bundle."""
        assert self._gather is not None and self._loop is not None
        at_s = self._gather.next_deadline_s()
        if at_s is None or self._closing:
            return
        if self._linger is not None and self._linger_at_s <= at_s:
            return  # one due sooner (it sets the next when it fires)
        if self._linger is not None:
            self._linger.cancel()
        self._linger_at_s = at_s
        self._linger = self._loop.call_at(at_s, self._linger_over)

    def _linger_over(self) -> None:
        """The earliest linger ended: bundles past it run with what they have."""
        assert self._gather is not None and self._loop is not None
        self._linger = None
        ready = self._gather.expired(self._loop.time() + 1e-4)  # (timers may fire early)
        self._set_linger()
        if ready and not self._closing:
            self._waiting.extend(ready)
            for _ in range(min(self._concurrency - self._runners, len(ready))):
                self._runners += 1
                self._spawn(self._runner())

    async def _run_bundle(self, bundle: Bundle, task: asyncio.Task[Any]) -> None:
        """Run a bulk handler's call on ``bundle``: items that may start begin (the others
        are given back unstarted), one call under one span linked to each item, with the
        shortest timeout of its items; each item's verdict is what gets settled."""
        started: list[Any] = []
        held, cooldowns = self._held, self.cooldowns
        timeout_s: float | None = None  # the shortest of its items' (timeout_for, inline)
        default_s = self._timeout_s
        for d in bundle.deliveries:
            if d not in held:
                continue  # close() released it
            if d.cancelled or d.queue_paused:
                self._spawn(self._release(d))
            elif cooldowns.keys and (cooling_s := cooldowns.holds(d)) is not None:
                self._hold_back([d], cooling_s)
            else:
                started.append(d)
                own_s = d.timeout_s
                if own_s is None:
                    own_s = default_s
                if own_s is not None and (timeout_s is None or own_s < timeout_s):
                    timeout_s = own_s
        if not started:
            return
        self._running.update(dict.fromkeys(started, task))
        self._in_calls.update(started)
        items = list(map(Item, started))
        call = _tracing.start_call(started)
        if call is not None:
            call.enter()
        error: BaseException | None = None
        try:
            if self._is_async:
                await within(self._run_bulk(bundle.group, items), timeout_s, started[0])
            else:
                run = partial(self._run_bulk, bundle.group, items)
                value = await self._in_handler_thread(lambda _d: run(), started[0], timeout_s)
                if inspect.isawaitable(value):  # an async def bulk handler of a sync dispatcher
                    await within(value, timeout_s, started[0])
        except asyncio.CancelledError as exc:
            error = exc
            raise  # close() cancelled it past the grace period and releases its items
        except BaseException as exc:  # a handler's SystemExit is its items' failure too
            error = exc
        finally:
            running_pop = self._running.pop
            for d in started:
                running_pop(d, None)
            self._in_calls.difference_update(started)
            if call is not None:
                call.leave()
                _tracing.end_attempt(call, error)
        finished = verdicts(items, error)
        # (only a failure can cool its key: no call per acked item)
        cooling_s = max(
            (self.cooldowns.note(d, e) or 0.0 for d, e in finished if e is not None), default=0.0
        )
        if cooling_s:
            self._cool_waiting(cooling_s)
        self._done += finished
        self._done_event.set()

    async def _runner(self) -> None:
        """One of at most ``concurrency`` tasks: runs waiting deliveries one after another
        until none waits (a task per runner, not per delivery: cheaper at 40k tasks/s)."""
        task = asyncio.current_task()
        assert task is not None and self._loop is not None
        since_s = self._loop.time()  # when this runner last let the loop run others
        try:
            while self._waiting and not self._closing:
                d = self._waiting.popleft()
                if type(d) is Bundle:  # a bulk handler's call
                    await self._run_bundle(d, task)
                    since_s = self._loop.time()
                    continue
                if d not in self._held:
                    continue  # close() released it
                if d.cancelled or d.queue_paused:  # cancelled while held (the keeper found
                    # out), or its queue paused (the claim loop found out): given back, not run
                    self._spawn(self._release(d))
                    continue
                if self.cooldowns.keys and (cooling_s := self.cooldowns.holds(d)) is not None:
                    self._hold_back([d], cooling_s)  # its key cools down: given back unstarted
                    continue
                self._running[d] = task
                error: BaseException | None = None
                attempt = _tracing.start_attempt(d)  # the attempt's span, current in here
                if attempt is not None:
                    attempt.enter()
                try:
                    if self._is_async:
                        timeout_s = timeout_for(d, self._timeout_s)
                        if timeout_s is None:  # (one coroutine less per task)
                            value = await self._handler(d)
                        else:
                            value = await within(self._handler(d), timeout_s, d)
                    else:  # past its timeout, the thread is abandoned (another takes its place)
                        timeout_s = timeout_for(d, self._timeout_s)
                        if attempt is None:
                            call = self._handler
                        else:  # the handler's thread runs in this task's context (the span)
                            call = partial(contextvars.copy_context().run, self._handler)
                        value = await self._in_handler_thread(call, d, timeout_s)
                        if inspect.isawaitable(value):  # e.g. a partial of an async function
                            value = await within(value, timeout_s, d)
                    if value is not None:  # kept by the ack while the queue keeps results
                        d.result = value
                except asyncio.CancelledError as exc:
                    if d not in self._cancelling:
                        error = exc  # (for the span)
                        raise  # close() cancelled it past the grace period and releases it
                    # q.cancel() removed its task: the handler was cancelled; settling it
                    # reports the outcome "cancelled"
                    self._cancelling.discard(d)
                    if sys.version_info >= (3, 11):
                        task.uncancel()
                    error = TaskCancelled(f"task {d.id!r} was cancelled while running", [d.id])
                except BaseException as exc:  # a handler's SystemExit is its task's failure too
                    error = exc
                finally:
                    self._running.pop(d, None)
                    if attempt is not None:
                        attempt.leave()
                        _tracing.end_attempt(attempt, error)
                if error is not None and (cooling_s := self.cooldowns.note(d, error)):
                    self._cool_waiting(cooling_s)
                self._done.append((d, error))
                self._done_event.set()
                if self._loop.time() - since_s >= RUNNER_YIELD_S:
                    # handlers that never await would keep the loop to this runner for the
                    # whole hold: let the settler ack, the claim loop claim, the app serve
                    await asyncio.sleep(0)
                    since_s = self._loop.time()
        finally:
            self._runners -= 1

    def _source_error(self, error: Exception) -> None:
        logger.error("delivery stream failed: %s", describe(error))
        self._out.on_error(error)
        self._dispose()

    def _source_completed(self) -> None:
        self._source_ended = True
        if not self._held:
            self._complete()

    def _complete(self) -> None:
        self._out.on_completed()
        self._dispose()

    # -- outcomes out ------------------------------------------------------------------------

    async def _settle_loop(self) -> None:
        pending = Pending()
        while True:
            if not self._done and not self._settler_stop:
                await wait_event(self._done_event, pending.wait_s())  # or retry what was refused
            self._done_event.clear()
            batch, self._done = self._done[:SETTLE_BATCH], self._done[SETTLE_BATCH:]
            final = self._settler_stop and not self._done
            try:
                settled = await self.drive(self.settle_flow(batch, pending, final=final))
            except Exception as exc:  # a bug here must not stop every later ack: report, go on
                logger.exception("settling %d task(s) failed; their leases run out", len(batch))
                error = describe(exc)
                settled = [(d, Outcome(d.id, "lost", d.attempt, error=error)) for d, _ in batch]
            self._out.on_next(*(outcome for _, outcome in settled))
            self._forget([d for d, _ in settled])
            if final:
                return

    async def _release(self, d: Any) -> None:
        outcome = await self.drive(self.release_flow(d))
        self._out.on_next(outcome)
        self._forget([d])

    def _hold_back(self, deliveries: list[Any], seconds: float) -> None:
        """Give back, in one call per queue, held unstarted deliveries of cooling keys: due
        at the end of the cooldown (``seconds`` from now)."""
        self._spawn(self._give_back_cooled(deliveries, seconds))

    async def _give_back_cooled(self, deliveries: list[Any], seconds: float) -> None:
        outcomes = await self.drive(self.release_cooled_flow(deliveries, seconds))
        self._out.on_next(*outcomes)
        self._forget(deliveries)

    def _forget(self, deliveries: list[Any]) -> None:
        for d in deliveries:
            self._held.pop(d, None)
            self._lease_lost.discard(d)
        if not self._held:
            self._idle.set()
            if self._source_ended and not self._closing:
                self._complete()

    # -- lease keeping -----------------------------------------------------------------------

    async def _keep_loop(self) -> None:
        assert self._loop is not None
        while True:
            now_s = self._loop.time()
            held = [(d, at) for d, at in self._held.items() if d not in self._lease_lost]
            try:
                done = await self.drive(self.keep_flow(held, now_s))
            except Exception:  # a bug in one round must not end lease keeping: report, go on
                logger.exception("lease keeper round failed")
                await asyncio.sleep(KEEPER_TICK_MAX_S)
                continue
            for d in done.extended:
                if d in self._held:
                    self._held[d] = now_s
            self._lease_lost.update(d for d in done.lost if d in self._held)
            if done.cancelled:  # cancelled while waiting for a runner: dropped, never run
                cancelled = set(done.cancelled)
                waiting = [w for w in self._waiting if w in cancelled and w in self._held]
                if waiting:
                    dropped = set(waiting)
                    self._waiting = deque(w for w in self._waiting if w not in dropped)
                    for d in waiting:
                        self._spawn(self._release(d))
            for d in done.cancelled:  # cancel its handler (a plain function sees d.cancelled)
                runner = self._running.get(d)
                if (
                    runner is not None
                    and self._is_async
                    and d not in self._cancelling
                    and d not in self._in_calls  # a bulk call's item: its handler checks
                ):
                    self._cancelling.add(d)
                    runner.cancel()
            self._keeper_tick_s = done.tick_s
            self._keeper_poke.clear()
            await wait_event(self._keeper_poke, done.tick_s)  # or the next extension is due

    # -- the flows' I/O ----------------------------------------------------------------------

    def _holds(self, d: Any) -> bool:
        return d in self._held

    def _pause(self, delay_s: float) -> Op:
        return partial(wait_event, self._give_up, delay_s)

    def _giving_up(self) -> bool:
        return self._give_up.is_set()

    async def drive(self, flow: Any) -> Any:
        return await run_flow_async(flow, self._in_thread)

    async def _in_thread(self, fn: Any, *args: Any) -> Any:
        """Run a blocking Redis call (a sync Queue's ack, extend, release) in this processor's
        pool, which handlers never use (a hanging handler cannot hold up an ack)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(2 * self._concurrency, thread_name_prefix="dueq-redis")
        assert self._loop is not None
        return await self._loop.run_in_executor(self._pool, fn, *args)

    async def _in_handler_thread(self, handler: Any, d: Any, timeout_s: float | None) -> Any:
        """Run a plain-function handler on one of the handler threads and return its result.
        ``timeout_s`` counts from when the handler starts in its thread (waiting for a thread
        is no part of the attempt); past it the thread is abandoned and TaskTimeout raised."""
        if self._threads is None:
            self._threads = HandlerThreads(self._concurrency)
        assert self._loop is not None
        threads = self._threads
        job = threads.submit(handler, d, self._loop, timed=timeout_s is not None)
        try:
            if timeout_s is not None:
                started_s = await job.started  # (time.monotonic() in the handler's thread)
                left_s = started_s + timeout_s - time.monotonic()
                if not job.done.done():
                    await asyncio.wait({job.done}, timeout=max(left_s, 0.0))
                if not job.done.done() and threads.abandon(job, timed_out_s=timeout_s):
                    raise timeout_error(d, timeout_s)
            await job.done  # (set at once if the handler finished as its time ran out)
        except asyncio.CancelledError:  # close() past its grace: the thread is let go
            threads.abandon(job)
            raise
        return job.result()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        assert self._loop is not None
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("dueq task failed", exc_info=task.exception())


#: Handler threads abandoned past their timeout and still running that a processor keeps
#: replacing: ``max(ABANDONED_MIN, 2 * concurrency)``. Past that bound an abandoned thread is
#: not replaced (an error says so), so a handler stuck for good on every task cannot grow
#: threads without end: at most ``concurrency + max(8, 2 * concurrency)`` handler threads.
ABANDONED_MIN = 8

_WAITING, _RUNNING, _FINISHED, _ABANDONED, _DROPPED = range(5)


class HandlerJob:
    """One call of a plain-function handler on a handler thread. ``started`` gets the
    ``time.monotonic()`` at which the handler started (for a timed job), ``done`` is set when
    it returned in time; ``result()`` then returns or raises what it did."""

    __slots__ = ("_handler", "_loop", "_timed", "_value", "d", "done", "started", "state", "why")

    def __init__(self, handler: Any, d: Any, loop: asyncio.AbstractEventLoop, timed: bool) -> None:
        self._handler = handler
        self.d = d
        self._loop = loop
        self._timed = timed
        self.started: asyncio.Future[float] = loop.create_future()
        self.done: asyncio.Future[None] = loop.create_future()
        self.state = _WAITING  # guarded by the HandlerThreads lock
        self.why = "its timeout"  # what it was abandoned for (the late line says it)
        self._value: tuple[Any, BaseException | None] = (None, None)

    def run(self) -> None:
        """Run the handler (in its thread, outside any lock) and keep what it returned."""
        if self._timed:
            self._post(self.started, time.monotonic())
        try:
            self._value = (self._handler(self.d), None)
        except BaseException as exc:  # a handler's SystemExit is its task's failure too
            self._value = (None, exc)

    def finished(self) -> None:
        self._post(self.done, None)

    def result(self) -> Any:
        value, error = self._value
        self._value = (None, None)  # (no cycle through the exception's traceback)
        if error is not None:
            raise error
        return value

    def _post(self, future: asyncio.Future[Any], value: Any) -> None:
        # a closed loop (RuntimeError): nobody waits for this any more
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(_set_result, future, value)


def _set_result(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


class HandlerThreads:
    """Threads for a plain-function handler on an asyncio consumer: up to ``concurrency`` live
    ones (started as work needs them), each running one job at a time from a queue.

    A job abandoned past its timeout leaves its thread to the handler, and that thread no
    longer counts: the next job gets a new thread, so ``concurrency`` handlers can always run
    at once, whatever hangs. When the abandoned handler returns, its result is refused (a log
    line says so) and its thread takes work again if a live one is missing, else ends. At most
    ``max(ABANDONED_MIN, 2 * concurrency)`` abandoned threads are replaced; each one past that
    leaves one live thread fewer until an abandoned one returns (jobs then wait for a thread,
    which does not count against their timeout).
    """

    def __init__(self, concurrency: int) -> None:
        self._concurrency = concurrency
        self.abandoned_max = max(ABANDONED_MIN, 2 * concurrency)
        self._lock = threading.Lock()
        self._work_ready = threading.Condition(self._lock)
        self._jobs: deque[HandlerJob] = deque()  # submitted, not picked up by a thread
        self._live = 0  # threads that take work: waiting for it or running a job
        self._idle = 0  # live threads waiting for work and not yet woken for a job
        self._abandoned = 0  # threads still running a job that was abandoned
        self._started = 0  # threads ever started (their names)
        self._stopping = False

    def submit(
        self, handler: Any, d: Any, loop: asyncio.AbstractEventLoop, *, timed: bool
    ) -> HandlerJob:
        job = HandlerJob(handler, d, loop, timed)
        with self._lock:
            self._jobs.append(job)
            self._staff()
        return job

    def abandon(self, job: HandlerJob, *, timed_out_s: float | None = None) -> bool:
        """Give up on ``job`` (past ``timed_out_s``, or the consumer closes). True when it will
        never deliver a result; False when it finished first (its result stands)."""
        with self._lock:
            if job.state == _WAITING:
                self._jobs.remove(job)
                job.state = _DROPPED
                return True
            if job.state != _RUNNING:
                return job.state != _FINISHED
            job.state = _ABANDONED
            if timed_out_s is None:
                job.why = "it was released (the consumer closed past its grace period)"
            self._live -= 1
            self._abandoned += 1
            abandoned, live = self._abandoned, self._capacity()
            self._staff()
        d = job.d
        if timed_out_s is not None:
            logger.warning(
                "queue %r: task %r attempt %d: handler ran past its %.3g s timeout; abandoned",
                d.queue.name,
                d.id,
                d.attempt,
                timed_out_s,
                extra=task_fields(d.queue.name, d.id, d.attempt),
            )
        if abandoned > self.abandoned_max:
            logger.error(
                "%d handler thread(s) abandoned past their timeout still run, more than the %d "
                "this consumer replaces (max(%d, 2 x concurrency)); this one is not replaced: "
                "%d of %d handler(s) can run at once until an abandoned one returns",
                abandoned,
                self.abandoned_max,
                ABANDONED_MIN,
                live,
                self._concurrency,
            )
        return True

    def stop(self) -> None:
        """Idle threads end now, busy ones when their handler returns."""
        with self._lock:
            self._stopping = True
            self._work_ready.notify_all()

    def _capacity(self) -> int:
        """Live threads allowed now: ``concurrency``, less one per abandoned thread past the
        bound (called with the lock held)."""
        return self._concurrency - max(0, self._abandoned - self.abandoned_max)

    def _staff(self) -> None:
        """Wake or start threads for the jobs waiting (called with the lock held)."""
        waiting = len(self._jobs)
        wake = min(self._idle, waiting)
        if wake:
            self._idle -= wake
            self._work_ready.notify(wake)
        for _ in range(min(waiting - wake, self._capacity() - self._live)):
            self._live += 1
            self._started += 1
            thread = threading.Thread(
                target=self._work, name=f"dueq-handler-{self._started}", daemon=True
            )
            thread.start()

    def _work(self) -> None:
        lock = self._lock
        with lock:
            while True:
                while not self._jobs:
                    if self._stopping:
                        self._live -= 1
                        return
                    self._idle += 1
                    self._work_ready.wait()  # (whoever wakes it takes it out of _idle)
                job = self._jobs.popleft()
                job.state = _RUNNING
                lock.release()
                try:
                    job.run()
                finally:
                    lock.acquire()
                if job.state == _RUNNING:
                    job.state = _FINISHED
                    job.finished()
                    continue
                # abandoned while it ran: take work again if a live thread is missing
                self._abandoned -= 1
                rejoin = not self._stopping and self._live < self._capacity()
                if rejoin:
                    self._live += 1
                lock.release()
                try:
                    _refused(job.d, job.why)
                finally:
                    lock.acquire()
                if not rejoin:
                    return


def _refused(d: Any, why: str) -> None:
    """Say that an abandoned handler returned and its result is dropped (past its timeout:
    the threaded consumer's line)."""
    logger.warning(
        "queue %r: task %r attempt %d: handler returned after %s; its result is refused",
        d.queue.name,
        d.id,
        d.attempt,
        why,
        extra=task_fields(d.queue.name, d.id, d.attempt),
    )
