"""The one driver of every flow: ``drive`` (blocking) and ``drive_async``.

A *flow* is a generator that validates its input, yields the steps it needs (``_wire.protocol``:
a script call, a plain command or a batch of them; or, for the settle flows of
``dueq.operators``, a call), receives each reply and returns the result. A front end drives it:
``Queue`` sends each step with the blocking client (``drive``), ``AsyncQueue`` awaits it on the
asyncio client (``drive_async``). A Redis error is thrown into the flow at the step that failed,
so a flow can handle it as if it had made the call itself. This is tenacity's
``BaseRetrying.iter()`` shape, driven by ``Retrying`` and ``AsyncRetrying``: the logic is written
once and neither front end repeats it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar

from dueq._wire.protocol import Flow as Flow  # the flow type, defined with the steps it yields

T = TypeVar("T")
S = TypeVar("S")  # what a flow yields: a protocol step, or a call (the settle flows)


def drive(flow: Generator[S, Any, T], send: Callable[[S], Any]) -> T:
    """Run a flow with a blocking ``send``; errors of a step are thrown into the flow. The one
    driver of every flow: the queue flows (steps are protocol steps) and the settle flows of
    ``dueq.operators`` (steps are calls)."""
    try:
        step = next(flow)
        while True:
            try:
                reply = send(step)
            except Exception as exc:  # the flow decides; unhandled, it comes back out here
                step = flow.throw(exc)
            else:
                step = flow.send(reply)
    except StopIteration as stop:
        result: T = stop.value
        return result


async def drive_async(flow: Generator[S, Any, T], send: Callable[[S], Awaitable[Any]]) -> T:
    """Run a flow with an awaitable ``send``; errors of a step are thrown into the flow."""
    try:
        step = next(flow)
        while True:
            try:
                reply = await send(step)
            except Exception as exc:  # the flow decides; unhandled, it comes back out here
                step = flow.throw(exc)
            else:
                step = flow.send(reply)
    except StopIteration as stop:
        result: T = stop.value
        return result
