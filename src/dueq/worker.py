"""``Worker`` (a blocking loop) and ``AsyncWorker`` (a coroutine on the caller's event loop)
run a handler on one or more queues until told to stop.

It is ``observe`` + ``operators.process`` with an operator's life cycle: SIGINT or SIGTERM (or
``stop()``) ends claiming, running handlers get ``grace`` seconds to finish, and deliveries
that have not started are released for other workers (their attempt does not count). A second
signal cuts the grace period short.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from types import FrameType
from typing import TYPE_CHECKING, Any

from reactivex import abc
from reactivex.disposable import CompositeDisposable

from dueq._consume.prefetch import MAX_IN_FLIGHT, WORKER_HIGH, Prefetch
from dueq._consume.threads import consume_queue
from dueq._flows.core import QueueCore
from dueq._util.checks import whole_number
from dueq._util.clock import Duration, duration_ms, positive_duration_ms
from dueq.exceptions import ConfigurationError
from dueq.logs import stderr_fallback
from dueq.model import BatchSpec, Outcome
from dueq.named import dispatcher
from dueq.operators import MAX_CONCURRENCY
from dueq.operators._process import Handler, Processor, is_async_handler
from dueq.queue import Queue
from dueq.registry import AsyncHeartbeat, Heartbeat

if TYPE_CHECKING:
    from dueq.async_queue import AsyncQueue
    from dueq.operators._async_process import AsyncProcessor

logger = logging.getLogger(__name__)

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: How often the run loop looks for a signal or ``stop()``.
STOP_POLL_S = 0.1


class _WorkerSettings:
    """The settings and outcome counts ``Worker`` and ``AsyncWorker`` share, checked once."""

    def __init__(
        self,
        queues: Any,
        queue_type: type[Any],
        handler: Handler | None,
        *,
        concurrency: int,
        max_in_flight: int | None,
        grace: Duration,
        heartbeat: Duration,
        timeout: Duration | None,
        batch: BatchSpec | None,
    ) -> None:
        kind = queue_type.__name__
        if isinstance(queues, QueueCore):
            queues = [queues]
        self.queues = list(queues) if isinstance(queues, Iterable) else []
        if not self.queues or not all(isinstance(q, queue_type) for q in self.queues):
            raise ConfigurationError(
                f"{type(self).__name__} needs a dueq.{kind} or a non-empty list of them"
            )
        if handler is not None and not callable(handler):
            raise ConfigurationError(f"handler must be callable, got {handler!r}")
        whole_number(concurrency, "concurrency", low=1, high=MAX_CONCURRENCY)
        if batch is not None and not isinstance(batch, BatchSpec):
            raise ConfigurationError(f"batch= takes a dueq.BatchSpec, got {batch!r}")
        if batch is not None and handler is None:
            raise ConfigurationError(
                "batch= makes the worker's handler a bulk handler: give the handler too (named "
                "tasks take their own: @q.task(batch=dueq.BatchSpec(...)))"
            )
        self.handler = handler
        #: the handler's BatchSpec: it is a bulk handler, called with a list of dueq.Item
        self.batch = batch
        self.concurrency = concurrency
        self.max_in_flight: int | str = "auto" if max_in_flight is None else max_in_flight
        # a bulk handler's call fills only from what the worker holds: hold two calls' worth
        # (one running, the next gathering), as a per-task handler holds two per thread
        largest = max(
            [batch.max if batch is not None else 0]
            + [fn.batch.max for q in self.queues for fn in q.tasks.values() if fn.batch]
        )
        self._prefetch_low = min(max(2 * concurrency, 2 * largest), MAX_IN_FLIGHT)
        Prefetch.parse(self.max_in_flight, low=self._prefetch_low)  # refused here
        self.grace_s = duration_ms(grace, "grace", error=ConfigurationError) / 1000
        self.heartbeat = heartbeat
        self.timeout_s = (
            None if timeout is None else positive_duration_ms(timeout, "timeout") / 1000
        )
        self.outcomes: Counter[str] = Counter()
        self._error: Exception | None = None
        #: how often the worker beats into the registry (see ``dueq.registry``)
        self._beat_s = positive_duration_ms(heartbeat, "heartbeat") / 1000

    def _counts(self, processor: Processor | AsyncProcessor) -> tuple[int, int, int]:
        """(in flight, processed, failed) for the worker registry."""
        out = self.outcomes
        failed = out["retried"] + out["dead"]
        return processor.in_flight, out["acked"] + failed, failed

    def _settings(self) -> dict[str, Any]:
        return {
            "max_in_flight": self.max_in_flight,
            "wake": True,
            "heartbeat": self.heartbeat,
            "prefetch_low": self._prefetch_low,
        }


class _Tally(abc.ObserverBase[Outcome]):
    """Counts outcomes by kind; an error goes to ``failed`` (a plain observer: the outcome
    stream of a worker is its busiest path)."""

    def __init__(self, counts: Counter[str], failed: Callable[[Exception], None]) -> None:
        self._counts = counts
        self._failed = failed

    def on_next(self, value: Outcome) -> None:
        self._counts[value.kind] += 1

    def on_error(self, error: Exception) -> None:
        self._failed(error)

    def on_completed(self) -> None:
        pass  # a worker's sources never complete; it runs until stopped


class Worker(_WorkerSettings):
    """Runs ``handler`` on deliveries of ``queues`` with ``concurrency`` handlers at a time.

    Named tasks (``@q.task``) run their function, registered on their queue, whatever the
    handler; ``handler`` gets the plain payload tasks and may be left out when there are none.
    A task whose name is not registered ends dead at once with ``dueq.UnknownTask`` (no retry
    can fix it), as does a plain task when there is no handler (see ``dueq.named``).

    ``max_in_flight`` bounds the deliveries held per queue (running plus waiting, their leases
    kept alive). The default adapts: it holds what the handlers settle in about 0.1 s, at
    least twice the concurrency and at most 4,096 (see ``dueq._consume.prefetch``), so fast handlers
    are never starved between claims and slow ones never hoard tasks other workers could run.
    A number fixes it. ``timeout`` fails an attempt that runs longer (``dueq.TaskTimeout``,
    retried by the queue's policy; see ``dueq.operators.process``). ``outcomes`` counts what
    became of the deliveries (acked, retried, dead, released, lost).

    While it runs, the worker announces itself in the registry of each of its queues every
    ``heartbeat`` seconds (``Queue.workers``, ``dueq workers``; see ``dueq.registry``); the
    entry expires three beats after the process dies and is removed when ``run`` returns.
    ``heartbeat`` also caps how long an idle claim loop sleeps.

    ``batch=dueq.BatchSpec(max=, linger=)`` makes ``handler`` a bulk handler: it is called
    with a list of up to ``max`` ``dueq.Item`` (docs/bulk-handlers.md); named tasks take their
    own with ``@q.task(batch=...)``.
    """

    def __init__(
        self,
        queues: Queue | Iterable[Queue],
        handler: Handler | None = None,
        *,
        concurrency: int = 8,
        max_in_flight: int | None = None,
        grace: Duration = 30.0,
        heartbeat: Duration = 5.0,
        timeout: Duration | None = None,
        batch: BatchSpec | None = None,
    ) -> None:
        super().__init__(
            queues,
            Queue,
            handler,
            concurrency=concurrency,
            max_in_flight=max_in_flight,
            grace=grace,
            heartbeat=heartbeat,
            timeout=timeout,
            batch=batch,
        )
        self._stop = threading.Event()
        self._hurry = threading.Event()
        self._signalled = False  # a SIGINT/SIGTERM arrived (see _on_signal)

    def stop(self) -> None:
        """Ask ``run`` to stop (safe from any thread or a signal handler)."""
        if self._stop.is_set():
            self._hurry.set()
        self._stop.set()

    def run(self) -> None:
        """Process tasks until ``stop()``, SIGINT or SIGTERM; then shut down cleanly.

        Raises the error that ended a delivery stream, if one did (Redis outages do not).
        Its start, each failed attempt and its stop are logged; if the application set up no
        logging that receives them, they go to stderr (``dueq.logs.stderr_fallback``).
        """
        with stderr_fallback():
            self._run()

    def _run(self) -> None:
        processor = Processor(
            dispatcher(self.queues, self.handler, on_loop=False, batch=self.batch),
            self.concurrency,
            timeout_s=self.timeout_s,
        )
        previous = self._install_signal_handlers()
        names = ", ".join(q.name for q in self.queues)
        logger.info("worker started on %s with concurrency %d", names, self.concurrency)
        # each queue's claim loop hands its claims to the processor whole (no observable
        # between them: one call per claim, not a few wrappers per delivery)
        processor.start(_Tally(self.outcomes, self._failed))
        processor.attach_source(
            CompositeDisposable(
                [
                    consume_queue(
                        q,
                        processor.accept_many,
                        processor.source_error,
                        prefetch_high=WORKER_HIGH,
                        **self._settings(),
                    )
                    for q in self.queues
                ]
            )
        )
        beat = Heartbeat(self.queues, self._beat_s, lambda: self._counts(processor))
        beat.start()
        try:
            while not self._stop.wait(STOP_POLL_S):
                if self._signalled:  # set by the signal handler, which takes no lock
                    self.stop()
            logger.info(
                "worker stopping: no new tasks; %.1f s grace for running ones", self.grace_s
            )
            processor.close(self.grace_s, hurry=self._hurry)
        finally:
            beat.stop()
            self._restore_signal_handlers(previous)
        logger.info("worker stopped: %s", dict(self.outcomes))
        if self._error is not None:
            raise self._error

    def _failed(self, error: Exception) -> None:
        self._error = error
        self._stop.set()

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        """Runs on the main thread between two bytecodes, possibly while that thread holds
        ``self._stop``'s internal lock inside ``Event.wait``: so it must not set that event
        (``Event.set`` takes the same non-reentrant lock and would deadlock). It records the
        signal; the run loop acts on it within STOP_POLL_S. ``_hurry`` is safe to set here:
        the main thread never waits on it."""
        if self._stop.is_set() or self._signalled:
            logger.warning(
                "second %s: not waiting for running handlers", signal.Signals(signum).name
            )
            self._hurry.set()
        self._signalled = True

    def _install_signal_handlers(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}  # signals are only delivered to the main thread; use stop()
        previous: dict[int, Any] = {sig: signal.getsignal(sig) for sig in _SIGNALS}
        for sig in _SIGNALS:
            signal.signal(sig, self._on_signal)
        return previous

    @staticmethod
    def _restore_signal_handlers(previous: dict[int, Any]) -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class AsyncWorker(_WorkerSettings):
    """``Worker`` for ``AsyncQueue``s: ``await AsyncWorker(q, handler).run()`` processes tasks
    on the running event loop, with no threads of its own (a plain-function handler runs in a
    pool of ``concurrency`` threads), until ``stop()``, SIGINT or SIGTERM.

    The same grace and release rules as ``Worker``: stopping ends claiming, deliveries that
    have not started are released (their attempt does not count), running handlers get
    ``grace`` seconds, then are cancelled and released; a second signal or ``stop()`` cuts the
    grace short. ``handle_signals=False`` leaves SIGINT/SIGTERM to the application (a web
    server that runs the worker beside its app calls ``stop()`` at shutdown).
    """

    def __init__(
        self,
        queues: AsyncQueue | Iterable[AsyncQueue],
        handler: Handler | None = None,
        *,
        concurrency: int = 8,
        max_in_flight: int | None = None,
        grace: Duration = 30.0,
        heartbeat: Duration = 5.0,
        timeout: Duration | None = None,
        handle_signals: bool = True,
        batch: BatchSpec | None = None,
    ) -> None:
        # the asyncio front end and its consumer are imported by the async worker only: a
        # threaded worker's start never loads them (docs/benchmarks.md, Start-up)
        from dueq.async_queue import AsyncQueue

        super().__init__(
            queues,
            AsyncQueue,
            handler,
            concurrency=concurrency,
            max_in_flight=max_in_flight,
            grace=grace,
            heartbeat=heartbeat,
            timeout=timeout,
            batch=batch,
        )
        self.handle_signals = handle_signals
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._hurry: asyncio.Event | None = None
        self._stop_requests = 0  # stop() calls before run() had a loop to tell

    def stop(self) -> None:
        """Ask ``run`` to stop; a second call cuts the grace period short. Safe from any
        thread and from the loop itself."""
        loop = self._loop
        if loop is None:
            self._stop_requests += 1
            return
        from dueq._consume.aio import call_on_loop  # (loaded by run() already)

        call_on_loop(loop, self._request_stop)

    def _request_stop(self) -> None:
        assert self._stop is not None and self._hurry is not None
        if self._stop.is_set():
            self._hurry.set()
        self._stop.set()

    async def run(self) -> None:
        """Process tasks until ``stop()``, SIGINT or SIGTERM; then shut down cleanly.

        Raises the error that ended a delivery stream, if one did (Redis outages do not).
        Logs as ``Worker.run`` does, to stderr when nothing else receives its lines.
        """
        with stderr_fallback():
            await self._run()

    async def _run(self) -> None:
        from dueq._consume.aio import CLOSE_S, consume
        from dueq.operators._async_process import AsyncProcessor

        self._loop = asyncio.get_running_loop()
        self._stop, self._hurry = asyncio.Event(), asyncio.Event()
        for _ in range(self._stop_requests):
            self._request_stop()
        handler = dispatcher(self.queues, self.handler, on_loop=True, batch=self.batch)
        processor = AsyncProcessor(
            handler, self.concurrency, is_async_handler(handler), self.timeout_s
        )
        installed = self._install_signal_handlers() if self.handle_signals else {}
        names = ", ".join(q.name for q in self.queues)
        logger.info("worker started on %s with concurrency %d (asyncio)", names, self.concurrency)
        # as Worker: each queue's claim loop hands its claims to the processor whole
        processor.start(_Tally(self.outcomes, self._failed))
        loops = [
            consume(q, processor.accept_many, processor.source_error, **self._settings())
            for q in self.queues
        ]
        processor.attach_source(CompositeDisposable(loops))
        beat = AsyncHeartbeat(self.queues, self._beat_s, lambda: self._counts(processor))
        beat.start()
        try:
            await self._stop.wait()
            logger.info(
                "worker stopping: no new tasks; %.1f s grace for running ones", self.grace_s
            )
            # the claim loops end first (a claim under way hands its tasks over), so that the
            # processor releases everything it got and nothing is claimed after run() returns
            for claim_loop in loops:
                claim_loop.dispose()
            await asyncio.wait({c.task for c in loops}, timeout=CLOSE_S)
            await processor.close(self.grace_s, hurry=self._hurry)
        finally:
            await beat.stop()
            self._restore_signal_handlers(installed)
            self._loop = None
        logger.info("worker stopped: %s", dict(self.outcomes))
        if self._error is not None:
            raise self._error

    def _failed(self, error: Exception) -> None:
        self._error = error
        self.stop()

    def _on_signal(self, signum: int) -> None:
        assert self._stop is not None
        if self._stop.is_set():
            logger.warning(
                "second %s: not waiting for running handlers", signal.Signals(signum).name
            )
        self._request_stop()

    def _install_signal_handlers(self) -> dict[int, Any]:
        """Handle SIGINT/SIGTERM on the loop (``loop.add_signal_handler``); returns the
        handlers they had, to put back. Not possible off the main thread or on Windows."""
        assert self._loop is not None
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous: dict[int, Any] = {}
        for sig in _SIGNALS:
            try:
                previous[sig] = signal.getsignal(sig)
                self._loop.add_signal_handler(sig, self._on_signal, sig)
            except (NotImplementedError, RuntimeError, ValueError):  # not on this loop/platform
                previous.pop(sig, None)
        return previous

    def _restore_signal_handlers(self, previous: dict[int, Any]) -> None:
        loop = asyncio.get_running_loop()
        for sig, handler in previous.items():
            loop.remove_signal_handler(sig)
            signal.signal(sig, handler)
