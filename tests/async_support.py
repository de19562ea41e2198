"""Run an AsyncQueue's API from a blocking test body, so contract tests serve both front ends.

``Blocking(target, loop)`` forwards attribute access to ``target``; a call whose result is
awaitable is run to completion on ``loop``. Results that have awaitable methods themselves
(deliveries, ``dead``, ``cron``, claim batches) come back wrapped too, and wrapped values
passed as arguments are unwrapped, so ``q.ack_many(q.claim())`` reads the same for both.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import dueq
from dueq.cron.flows import AsyncCrons
from dueq.dead import AsyncDeadLetters

_WRAPPED = (
    dueq.AsyncDelivery,
    dueq.AsyncQueue,
    AsyncDeadLetters,
    AsyncCrons,
    dueq.ClaimBatch,
    dueq.AsyncTaskFunction,
)


class Blocking:
    __slots__ = ("_loop", "_target")

    def __init__(self, target: Any, loop: asyncio.AbstractEventLoop) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_loop", loop)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if name == "deliveries" and isinstance(self._target, dueq.ClaimBatch):
            return [self._wrap(d) for d in value]
        if not inspect.ismethod(value):
            return self._wrap(value)

        def call(*args: Any, **kwargs: Any) -> Any:
            result = value(*_unwrap(args), **{k: _unwrap(v) for k, v in kwargs.items()})
            if inspect.isawaitable(result):
                result = self._loop.run_until_complete(result)
            elif inspect.isasyncgen(result):  # an async iterator (iter_tasks): as a list
                result = self._loop.run_until_complete(_collect(result))
            return self._wrap(result)

        return call

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._target, name, value)

    def __eq__(self, other: object) -> bool:
        return bool(self._target == _target(other))

    def __hash__(self) -> int:
        return hash(self._target)

    def __repr__(self) -> str:
        return f"Blocking({self._target!r})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the target (an ``AsyncTaskFunction``: the function itself)."""
        result = self._target(*_unwrap(args), **{k: _unwrap(v) for k, v in kwargs.items()})
        if inspect.isawaitable(result):
            result = self._loop.run_until_complete(result)
        return self._wrap(result)

    def _wrap(self, value: Any) -> Any:
        if isinstance(value, _WRAPPED):
            return Blocking(value, self._loop)
        if inspect.isfunction(value):  # a decorator a method returned (q.task(name=...))
            return Blocking(value, self._loop)
        if isinstance(value, list):
            return [self._wrap(v) for v in value]
        if isinstance(value, tuple) and not hasattr(value, "_fields"):  # (a NamedTuple as is)
            return tuple(self._wrap(v) for v in value)
        return value


async def _collect(agen: Any) -> list[Any]:
    return [item async for item in agen]


def _unwrap(value: Any) -> Any:
    """The target of a wrapped value, also inside a list or tuple, and inside the tuples of a
    list (``fail_many``'s (delivery, error) items); deeper, payloads are passed through
    untouched."""
    if isinstance(value, (list, tuple)) and any(isinstance(v, Blocking) for v in value):
        return type(value)(_target(v) for v in value)
    if isinstance(value, list) and any(
        isinstance(v, tuple) and any(isinstance(w, Blocking) for w in v) for v in value
    ):
        return [tuple(map(_target, v)) if isinstance(v, tuple) else v for v in value]
    return _target(value)


def _target(value: Any) -> Any:
    return object.__getattribute__(value, "_target") if isinstance(value, Blocking) else value
