"""``q.progress(task_id)``'s drivers: run the follow flow (``dueq._flows.progress``) with a
Pub/Sub subscription of its own, blocking (``follow``) or on an event loop (``afollow``).

The flow is written once: it yields the queue's protocol steps (the driver sends them as every
flow's, with the front end's ``send``) and ``FollowStep``s, which only a follower has: open a
subscription (closing the one open), read one message with a timeout, hand an entry to the
caller, sleep. An error of a step is thrown into the flow, which waits out an outage and
decides about anything else. Each follower holds one connection of the client's pool (its
subscription) while it runs; leaving the iterator (``break``, ``close()`` / ``aclose()``)
closes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator
from typing import Any, NamedTuple

from dueq._consume.wake import WakeSubscription, read_method, subscribe_args
from dueq.model import Progress


class FollowOp(enum.Enum):
    """What a ``FollowStep`` asks its driver to do (and what it sends back)."""

    OPEN = "open"  # a new subscription to `subscription` (closing any open): None
    READ = "read"  # one message of the subscription, waiting at most timeout_s: it, or None
    EMIT = "emit"  # hand `entry` to the caller: None
    SLEEP = "sleep"  # wait timeout_s: None


class FollowStep(NamedTuple):
    """One step of a follow flow that is not a protocol step."""

    op: FollowOp
    subscription: WakeSubscription | None = None
    timeout_s: float = 0.0
    entry: Progress | None = None


#: A follow flow: yields protocol steps and FollowSteps, returns when the follow ends.
FollowFlow = Generator[Any, Any, None]


def _open(client: Any, subscription: WakeSubscription) -> tuple[Any, str]:
    pubsub = client.pubsub()
    method, channels = subscribe_args(subscription)
    try:
        getattr(pubsub, method)(*channels)
    except BaseException:
        _close(pubsub)
        raise
    return pubsub, read_method(pubsub, subscription)


def _close(pubsub: Any) -> None:
    if pubsub is not None:
        with contextlib.suppress(Exception):  # a broken connection may raise as it closes
            pubsub.close()


def follow(flow: FollowFlow, send: Callable[[Any], Any], client: Any) -> Iterator[Progress]:
    """Drive a follow flow with blocking I/O, yielding each entry it emits."""
    pubsub: Any = None
    read = "get_message"
    try:
        step = next(flow)
        while True:
            reply: Any = None
            if isinstance(step, FollowStep) and step.op is FollowOp.EMIT:
                assert step.entry is not None
                yield step.entry
                step = flow.send(None)
                continue
            try:
                if not isinstance(step, FollowStep):
                    reply = send(step)
                elif step.op is FollowOp.OPEN:
                    assert step.subscription is not None
                    _close(pubsub)
                    pubsub = None
                    pubsub, read = _open(client, step.subscription)
                elif step.op is FollowOp.READ:
                    reply = getattr(pubsub, read)(timeout=step.timeout_s)
                else:
                    time.sleep(step.timeout_s)
            except Exception as exc:  # the flow decides: an outage is waited out
                step = flow.throw(exc)
            else:
                step = flow.send(reply)
    except StopIteration:
        return
    finally:
        flow.close()
        _close(pubsub)


async def _aopen(client: Any, subscription: WakeSubscription) -> tuple[Any, str]:
    pubsub = client.pubsub()
    method, channels = subscribe_args(subscription)
    try:
        await getattr(pubsub, method)(*channels)
    except BaseException:
        await _aclose(pubsub)
        raise
    return pubsub, read_method(pubsub, subscription)


async def _aclose(pubsub: Any) -> None:
    if pubsub is not None:
        with contextlib.suppress(Exception, asyncio.CancelledError):  # broken or slow: let go
            await asyncio.wait_for(asyncio.shield(pubsub.aclose()), 1.0)


async def afollow(
    flow: FollowFlow, send: Callable[[Any], Awaitable[Any]], client: Any
) -> AsyncIterator[Progress]:
    """Drive a follow flow on the running loop, yielding each entry it emits."""
    pubsub: Any = None
    read = "get_message"
    try:
        step = next(flow)
        while True:
            reply: Any = None
            if isinstance(step, FollowStep) and step.op is FollowOp.EMIT:
                assert step.entry is not None
                yield step.entry
                step = flow.send(None)
                continue
            try:
                if not isinstance(step, FollowStep):
                    reply = await send(step)
                elif step.op is FollowOp.OPEN:
                    assert step.subscription is not None
                    old, pubsub = pubsub, None
                    await _aclose(old)
                    pubsub, read = await _aopen(client, step.subscription)
                elif step.op is FollowOp.READ:
                    reply = await getattr(pubsub, read)(timeout=step.timeout_s)
                else:
                    await asyncio.sleep(step.timeout_s)
            except Exception as exc:  # the flow decides: an outage is waited out
                step = flow.throw(exc)
            else:
                step = flow.send(reply)
    except StopIteration:
        return
    finally:
        flow.close()
        await _aclose(pubsub)
