"""Run a test's queue under the real worker of its front end (``Worker`` on a thread for a
``Queue``, ``AsyncWorker`` on the test's loop for an ``AsyncQueue`` that ``make_queue`` wrapped
in ``Blocking``) until a condition holds, then stop it."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from async_support import Blocking

import dueq


def target(q: Any) -> Any:
    """The queue behind a test's queue."""
    return object.__getattribute__(q, "_target") if isinstance(q, Blocking) else q


def run_worker(
    q: Any,
    until: Callable[[], bool],
    handler: Any = None,
    *,
    timeout_s: float = 20.0,
    **options: Any,
) -> dueq.Worker | dueq.AsyncWorker:
    """Run the front end's worker on ``q`` until ``until()`` (checked every 10 ms) or
    ``timeout_s`` (an AssertionError); returns the stopped worker (its ``outcomes``)."""
    queue = target(q)
    options.setdefault("grace", 5)
    if isinstance(queue, dueq.Queue):
        worker = dueq.Worker(queue, handler, **options)
        thread = threading.Thread(target=worker.run)
        thread.start()
        try:
            _wait(until, timeout_s)
        finally:
            worker.stop()
            thread.join(30)
        return worker
    loop: asyncio.AbstractEventLoop = object.__getattribute__(q, "_loop")

    async def main() -> dueq.AsyncWorker:
        aworker = dueq.AsyncWorker(queue, handler, handle_signals=False, **options)
        running = asyncio.ensure_future(aworker.run())
        try:
            deadline = time.monotonic() + timeout_s
            while not await asyncio.get_running_loop().run_in_executor(None, until):
                if running.done():
                    running.result()  # (raises what ended it)
                assert time.monotonic() < deadline, "the worker did not get there in time"
                await asyncio.sleep(0.01)
        finally:
            aworker.stop()
            await asyncio.wait_for(running, 30)
        return aworker

    return loop.run_until_complete(main())


def _wait(until: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not until():
        assert time.monotonic() < deadline, "the worker did not get there in time"
        time.sleep(0.01)
