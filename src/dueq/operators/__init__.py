"""reactivex operators for streams of deliveries.

``process`` is the one most services need::

    outcomes = queue.observe(max_in_flight=64).pipe(dueq.operators.process(handle, concurrency=8))
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import reactivex
from reactivex import Observable, abc

from dueq._util.checks import whole_number
from dueq._util.clock import Duration, positive_duration_ms
from dueq.exceptions import ConfigurationError
from dueq.model import Outcome
from dueq.operators._process import Handler, Processor, is_async_handler

__all__ = ["Handler", "process"]

#: Most handler threads (or concurrent coroutines) one ``process`` may run.
MAX_CONCURRENCY = 1024


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def process(
    handler: Handler,
    concurrency: int = 8,
    *,
    timeout: Duration | None = None,
    scheduler: abc.SchedulerBase | None = None,
) -> Callable[[Observable[Any]], Observable[Outcome]]:
    """Run ``handler`` on each delivery, at most ``concurrency`` at a time; emit ``Outcome``s.

    Subscribed from a coroutine (an ``AsyncQueue``'s ``observe()``, ``AsyncWorker``), it runs
    on that event loop with no threads of its own: an ``async def`` handler is awaited there
    (so it can use the application's clients), a plain function runs in a pool of
    ``concurrency`` threads, and outcomes are emitted on the loop. Subscribed elsewhere (a
    sync ``Queue``, ``Worker``), a plain function runs on up to ``concurrency`` threads
    (added only while they help: see ``dueq.operators._process``) and an
    ``async def`` on an event loop thread of dueq's own.

    Returning acks the task; raising fails it through the queue's retry policy
    (``dueq.Unrecoverable`` goes straight to dead); a handler may also settle the delivery
    itself (``d.fail(exc, retry_in=60)``, ``d.release()``). While the handler runs, its lease is
    extended every third of the queue's lease. A failing handler is an ``Outcome`` (retried or
    dead), never an ``on_error``; acks and failures are retried through Redis outages.
    Disposing the subscription stops claiming and releases deliveries that have not started;
    running handlers finish and are settled. ``timeout`` (seconds or a timedelta) fails an
    attempt that runs longer with ``dueq.TaskTimeout``, which follows the retry policy: an
    ``async def`` handler is cancelled, a plain function's thread is abandoned (another takes
    its place) and its late result refused; its lease is no longer kept. ``scheduler`` times
    the lease keeper (a thread of its own by default; giving one always selects the threaded
    consumer).
    """
    if not callable(handler):
        raise ConfigurationError(f"handler must be callable, got {handler!r}")
    whole_number(concurrency, "concurrency", low=1, high=MAX_CONCURRENCY)
    timeout_s = None if timeout is None else positive_duration_ms(timeout, "timeout") / 1000

    def operator(source: Observable[Any]) -> Observable[Outcome]:
        def subscribe(
            observer: abc.ObserverBase[Outcome], _scheduler: abc.SchedulerBase | None = None
        ) -> abc.DisposableBase:
            if scheduler is None and _running_loop() is not None:
                # only on an event loop: a threaded consumer never imports the asyncio one
                from dueq.operators._async_process import AsyncProcessor

                processor = AsyncProcessor(
                    handler, concurrency, is_async_handler(handler), timeout_s
                )
                return processor.subscribe(source, observer)
            threaded = Processor(handler, concurrency, scheduler, timeout_s)
            return threaded.subscribe(source, observer)

        return reactivex.create(subscribe)

    return operator
