"""Run the due durable tasks of a test's queue as a worker does (``dueq.named``'s dispatcher,
then an ack of the value, a fail on an exception, nothing when the run settled the delivery
itself), on either front end: ``make_queue`` wraps an ``AsyncQueue`` in ``Blocking``, whose loop
runs the dispatcher here (a plain function on a thread, as ``AsyncWorker`` runs it)."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

from async_support import Blocking

import dueq
from dueq.named import dispatcher


def target(q: Any) -> Any:
    """The queue behind a test's queue."""
    return object.__getattribute__(q, "_target") if isinstance(q, Blocking) else q


def keys_of(q: Any, task_id: str) -> Any:
    """The keys of the queue (or shard) that holds ``task_id``."""
    return target(q).shard(task_id).keys


class Ran:
    """What one delivery's run came to: ``value`` (acked with it), ``error`` (failed with
    it), or ``outcome`` (settled by the run itself: handed back, lost)."""

    def __init__(self, d: Any, value: Any = None, error: BaseException | None = None) -> None:
        self.id = d.id
        self.value = value
        self.error = error
        self.outcome = d.outcome

    def __repr__(self) -> str:
        return f"Ran({self.id!r}, value={self.value!r}, error={self.error!r}, {self.outcome})"


def run_due(q: Any, deliveries: list[Any] | None = None) -> list[Ran]:
    """Claim the due tasks of ``q`` (or take ``deliveries``, claimed by the test) and run each
    as a worker would."""
    queue = target(q)
    if isinstance(queue, dueq.Queue):
        run = dispatcher([queue], None, on_loop=False)
        return [_settle(d, run) for d in (queue.claim() if deliveries is None else deliveries)]
    loop: asyncio.AbstractEventLoop = object.__getattribute__(q, "_loop")
    given = None if deliveries is None else [target(d) for d in deliveries]

    async def main() -> list[Ran]:
        run = dispatcher([queue], None, on_loop=True)  # (on the loop: it knows the loop)
        out = []
        for d in await queue.claim() if given is None else given:
            try:
                if inspect.iscoroutinefunction(run.__call__):
                    value = await run(d)
                else:
                    value = await asyncio.get_running_loop().run_in_executor(None, run, d)
                if inspect.isawaitable(value):
                    value = await value
            except Exception as exc:  # the run failed: the worker fails the delivery
                if not d.settled:
                    await d.fail(exc)
                out.append(Ran(d, error=exc))
                continue
            if not d.settled:
                await d.ack(value)
            out.append(Ran(d, value=value))
        return out

    return loop.run_until_complete(main())


def _settle(d: Any, run: Any) -> Ran:
    try:
        value = run(d)
        if inspect.isawaitable(value):
            value = asyncio.run(value)
    except Exception as exc:  # the run failed: the worker fails the delivery
        if not d.settled:
            d.fail(exc)
        return Ran(d, error=exc)
    if not d.settled:
        d.ack(value)
    return Ran(d, value=value)
