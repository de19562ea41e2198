"""Fan-out: steps for several shards at once (``Each``), flows run side by side
(``together``), and how the front ends send an ``Each`` (``send_each``, ``send_each_async``).

Sending: a step that goes to several shards at once (``Each``) is sent by the front end's
``_send``: ``AsyncQueue`` awaits its steps concurrently (``send_each_async``: one coroutine
per shard, the nodes work in parallel); ``Queue`` sends the first shard's step from the
calling thread and the others from a small pool of threads shared by every sharded queue of
the process (``send_each``; ``SEND_THREADS``, made again in a forked child, whose copy has no
threads), so a ``schedule_many`` or ``ack_many`` over N shards takes one round trip, not N. A
client with ``single_connection_client=True`` cannot be shared by threads: its steps go in
turn. A plain queue never yields an ``Each``, and its ``_send`` tests for one last.

"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

from dueq._flows.drive import Flow
from dueq._wire import protocol as protocol

__all__ = ["SEND_THREADS", "Each", "send_each", "send_each_async", "together"]


class Each(NamedTuple):
    """Steps for several shards at once (``together``); the front end's ``_send`` answers
    one ``(ok, value or error)`` per step (``send_each``, ``send_each_async``)."""

    steps: tuple[protocol.Step, ...]


def together(flows: Sequence[Flow[Any]]) -> Flow[list[Any]]:
    """Run flows side by side: each round sends every pending step in one ``Each``; an
    error of a step is thrown into its own flow. Returns the flows' results in order."""
    results: list[Any] = [None] * len(flows)
    pending: dict[int, protocol.Step] = {}
    for i, flow in enumerate(flows):
        try:
            pending[i] = next(flow)
        except StopIteration as stop:
            results[i] = stop.value
    while pending:
        order = list(pending)
        replies: list[tuple[bool, Any]] = yield Each(tuple(pending[i] for i in order))  # type: ignore[misc]
        for i, (ok, value) in zip(order, replies, strict=True):
            try:
                pending[i] = flows[i].send(value) if ok else flows[i].throw(value)
            except StopIteration as stop:
                results[i] = stop.value
                del pending[i]
    return results


# -- sending an Each (the front ends' ``_send``) ------------------------------------------------


def _settled_reply(send: Callable[[protocol.Step], Any], step: protocol.Step) -> tuple[bool, Any]:
    try:
        return True, send(step)
    except Exception as exc:  # thrown into the flow of that shard, which decides
        return False, exc


#: Threads that send the steps of an ``Each`` to shards other than the first (per process).
SEND_THREADS = 16
_send_pool: tuple[int, ThreadPoolExecutor] | None = None
_send_pool_lock = threading.Lock()


def _senders() -> ThreadPoolExecutor:
    """The process's pool of sending threads (a forked child makes its own: the parent's
    threads are not in it)."""
    global _send_pool
    with _send_pool_lock:
        if _send_pool is None or _send_pool[0] != os.getpid():
            pool = ThreadPoolExecutor(SEND_THREADS, thread_name_prefix="dueq-shard-send")
            _send_pool = (os.getpid(), pool)
        return _send_pool[1]


def send_each(
    send: Callable[[protocol.Step], Any], each: Each, *, in_turn: bool
) -> list[tuple[bool, Any]]:
    """The replies to an ``Each`` for a blocking ``send``: the first step from this thread,
    the others from the sending threads at the same time (in turn with ``in_turn``: a client
    of one connection, which threads must not share)."""
    first, *others = each.steps
    if not others or in_turn:
        return [_settled_reply(send, s) for s in each.steps]
    pool = _senders()
    futures = [pool.submit(_settled_reply, send, s) for s in others]
    return [_settled_reply(send, first), *(f.result() for f in futures)]


async def send_each_async(
    send: Callable[[protocol.Step], Awaitable[Any]], each: Each
) -> list[tuple[bool, Any]]:
    """The replies to an ``Each`` for an awaitable ``send``: every step awaited at once."""
    replies = await asyncio.gather(*(send(s) for s in each.steps), return_exceptions=True)
    for reply in replies:
        if isinstance(reply, BaseException) and not isinstance(reply, Exception):
            raise reply  # cancelled: not a reply of the shard
    return [(not isinstance(r, Exception), r) for r in replies]
