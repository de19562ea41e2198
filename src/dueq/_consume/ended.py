"""``q.wait``'s shared subscription: one ended-channel listener per client, for every waiter.

A wait used to open its own Pub/Sub subscription, a pooled connection of the queue's client
held for the whole wait, so 120 concurrent waiters on redis-py's default pool of 100 raised
``MaxConnectionsError`` and left the client's other calls without connections (issue 37).
Now the waiters of one client share one subscription (one connection): the sync front end's
listener is a thread, the asyncio one's a task on the waiters' loop (one per loop). The
listener subscribes to a queue's (or shard's) ended channel while it has a waiter on it and
unsubscribes after the last one leaves; it ends (closing its connection) when it has no
waiter left. A waiter's looks at its task (the round trips of ``wait_check_flow``) take at
most ``LOOKS`` of the client's connections at once, however many waiters there are.

Never missing an end: a waiter registers, then looks; every ended message naming its task
and every subscription confirmation of its channel (the first one, and each one after redis-py
reconnected and subscribed again: messages may have been lost meanwhile) wakes it to look
again. So an end between a look and the subscription is seen by the look that follows the
confirmation. A waiter on a channel that is subscribed already looks at once.

An error of the listener that is not an outage (e.g. an ACL that refuses SUBSCRIBE) ends
every wait on it with that error; an outage is waited out (subscribing again after a
backoff, whose confirmation wakes every waiter to look).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import weakref
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from dueq._consume.wake import (
    POLL_S,
    SHARDED_POLL_S,
    WAKE_TYPES,
    WakeSubscription,
    ended_ids,
    read_method,
    subscribe_args,
)
from dueq._util.outage import Backoff, describe, is_outage

logger = logging.getLogger("dueq._ended")

#: Most looks (``wait_check_flow``) the waiters of one client send at once.
LOOKS = 4

_CONFIRMS = frozenset({"subscribe", "ssubscribe"})

#: A pubsub method and its arguments.
Call = tuple[str, tuple[str, ...]]


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class Waiter:
    """One ``wait``'s registration: ``woken`` is set when it should look at its task again."""

    def __init__(self, channel: str, task_id: str, woken: Any) -> None:
        self.channel = channel
        self.task_id = task_id
        self.woken = woken  # threading.Event or asyncio.Event


class Waiters:
    """The bookkeeping both listeners share: who waits on which channel for which id, and
    which channels are confirmed; ``heard`` says whom a read message wakes."""

    def __init__(self) -> None:
        self.by_channel: dict[str, dict[str, set[Waiter]]] = {}
        self.confirmed: set[str] = set()
        self.sharded = False
        self.error: BaseException | None = None

    def __len__(self) -> int:
        return sum(len(w) for ids in self.by_channel.values() for w in ids.values())

    def add(self, waiter: Waiter) -> bool:
        """Register ``waiter``; True when its channel is new (to subscribe)."""
        ids = self.by_channel.setdefault(waiter.channel, {})
        new = not ids
        ids.setdefault(waiter.task_id, set()).add(waiter)
        if waiter.channel in self.confirmed:
            waiter.woken.set()  # subscribed already: look at once
        return new

    def remove(self, waiter: Waiter) -> bool:
        """Unregister ``waiter``; True when its channel has no waiter left (to unsubscribe)."""
        ids = self.by_channel.get(waiter.channel, {})
        ids.get(waiter.task_id, set()).discard(waiter)
        if not ids.get(waiter.task_id, True):
            del ids[waiter.task_id]
        if ids:
            return False
        self.by_channel.pop(waiter.channel, None)
        self.confirmed.discard(waiter.channel)
        return True

    def heard(self, message: Any) -> list[Waiter]:
        """The waiters a read message wakes: those of the ids an ended message names, or every
        waiter of a channel whose subscription was (re)confirmed."""
        if message is None:
            return []
        channel = _text(message.get("channel"))
        ids = self.by_channel.get(channel, {})
        if message.get("type") in _CONFIRMS:
            if channel in self.by_channel:
                self.confirmed.add(channel)
            return [w for waiters in ids.values() for w in waiters]
        if message.get("type") in WAKE_TYPES:
            return [w for tid in ended_ids(message["data"]) for w in ids.get(tid, ())]
        return []

    def opened(self, pubsub: Any, subscription: WakeSubscription) -> tuple[str, float]:
        """A listener opened ``pubsub`` for its first waiter: the method that reads it and
        the seconds one read waits (a Cluster's sharded subscription is read node by node,
        ``SHARDED_POLL_S`` each, as the wake listener reads it)."""
        self.sharded = subscription.sharded
        method = read_method(pubsub, subscription)
        return method, SHARDED_POLL_S if method == "get_sharded_message" else POLL_S

    def join(self, waiter: Waiter, subscription: WakeSubscription) -> Call | None:
        """Register ``waiter``: the subscribe call to send when its channel is new."""
        return subscribe_args(subscription) if self.add(waiter) else None

    def leave(self, waiter: Waiter) -> Call | None:
        """Unregister ``waiter``: the unsubscribe call to send when its channel has no waiter
        left and others have (with none left the listener closes its subscription)."""
        if self.remove(waiter) and len(self):
            return ("sunsubscribe" if self.sharded else "unsubscribe"), (waiter.channel,)
        return None

    def resubscribe(self) -> Call | None:
        """After a new connection: the call that subscribes every channel with waiters."""
        self.confirmed.clear()
        channels = tuple(self.by_channel)
        return (("ssubscribe" if self.sharded else "subscribe"), channels) if channels else None

    def everyone(self) -> list[Waiter]:
        return [w for ids in self.by_channel.values() for ws in ids.values() for w in ws]

    def failed(self, exc: BaseException) -> list[Waiter]:
        """The listener ended with ``exc``: every waiter is woken to raise it."""
        self.error = exc
        return self.everyone()

    def raise_error(self) -> None:
        if self.error is not None:
            raise self.error


class EndedListener:
    """The sync front end's shared ended subscription of one client (a thread while it has
    waiters)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._lock = threading.Lock()
        self._looks = threading.BoundedSemaphore(LOOKS)
        self.waiters = Waiters()
        self._pubsub: Any = None
        self._read, self._read_s = "", POLL_S

    @contextmanager
    def looking(self) -> Iterator[None]:
        """Hold one of the ``LOOKS`` slots while a waiter looks at its task."""
        with self._looks:
            yield

    def add(self, subscription: WakeSubscription, task_id: str) -> Waiter:
        (channel,) = subscription.channels
        waiter = Waiter(channel, task_id, threading.Event())
        with self._lock:
            self.waiters.raise_error()
            start = self._pubsub is None
            if start:
                self._pubsub = self._client.pubsub()
                self._read, self._read_s = self.waiters.opened(self._pubsub, subscription)
            call = self.waiters.join(waiter, subscription)
            if call is not None:
                try:
                    getattr(self._pubsub, call[0])(*call[1])
                except Exception:  # (a waiter left behind would never hear its channel)
                    self.waiters.remove(waiter)
                    raise
            if start:
                threading.Thread(target=self._run, name="dueq-ended", daemon=True).start()
        return waiter

    def remove(self, waiter: Waiter) -> None:
        with self._lock:
            call = self.waiters.leave(waiter)
            if call is not None and self._pubsub is not None:
                try:
                    getattr(self._pubsub, call[0])(*call[1])
                except Exception:  # a broken connection: the listener subscribes again anyway
                    logger.debug("error unsubscribing an ended channel", exc_info=True)

    def _run(self) -> None:
        backoff = Backoff()
        while True:
            with self._lock:
                pubsub = self._pubsub
                if not len(self.waiters) or self.waiters.error is not None:
                    self._pubsub = None
                    _close(pubsub)
                    return
            try:
                message = getattr(pubsub, self._read)(timeout=self._read_s)
            except Exception as exc:  # an outage is waited out; anything else ends the waits
                if not is_outage(exc):
                    with self._lock:
                        woken = self.waiters.failed(exc)
                    for w in woken:
                        w.woken.set()
                    continue
                delay_s = backoff.failed()
                logger.debug("ended channel down (%s); again in %.2f s", describe(exc), delay_s)
                threading.Event().wait(delay_s)
                self._resubscribe()
                continue
            backoff.succeeded()
            with self._lock:
                woken = self.waiters.heard(message)
            for w in woken:
                w.woken.set()

    def _resubscribe(self) -> None:
        """A new subscription to every channel with waiters (their confirmations wake them)."""
        with self._lock:
            _close(self._pubsub)
            self._pubsub = self._client.pubsub()
            call = self.waiters.resubscribe()
            if call is not None:
                try:
                    getattr(self._pubsub, call[0])(*call[1])
                except Exception:  # still down: the next read fails and backs off again
                    logger.debug("error subscribing the ended channels again", exc_info=True)


class AsyncEndedListener:
    """The asyncio front end's shared ended subscription of one client on one loop (a task
    while it has waiters)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._lock = asyncio.Lock()
        self._looks = asyncio.Semaphore(LOOKS)
        self.waiters = Waiters()
        self._pubsub: Any = None
        self._read, self._read_s = "", POLL_S
        self._task: asyncio.Task[None] | None = None

    @asynccontextmanager
    async def looking(self) -> AsyncIterator[None]:
        async with self._looks:
            yield

    async def add(self, subscription: WakeSubscription, task_id: str) -> Waiter:
        (channel,) = subscription.channels
        waiter = Waiter(channel, task_id, asyncio.Event())
        async with self._lock:
            self.waiters.raise_error()
            start = self._pubsub is None
            if start:
                self._pubsub = self._client.pubsub()
                self._read, self._read_s = self.waiters.opened(self._pubsub, subscription)
            call = self.waiters.join(waiter, subscription)
            if call is not None:
                try:
                    await asyncio.shield(getattr(self._pubsub, call[0])(*call[1]))
                except BaseException:  # (a waiter left behind would never hear its channel)
                    self.waiters.remove(waiter)
                    raise
            if start:
                self._task = asyncio.get_running_loop().create_task(self._run())
        return waiter

    async def remove(self, waiter: Waiter) -> None:
        call = self.waiters.leave(waiter)
        if call is not None and self._pubsub is not None:
            try:
                await asyncio.shield(getattr(self._pubsub, call[0])(*call[1]))
            except (Exception, asyncio.CancelledError):  # the listener subscribes again anyway
                logger.debug("error unsubscribing an ended channel", exc_info=True)

    async def _run(self) -> None:
        backoff = Backoff()
        try:
            while len(self.waiters) and self.waiters.error is None:
                try:
                    message = await getattr(self._pubsub, self._read)(timeout=self._read_s)
                except Exception as exc:  # an outage is waited out; anything else ends waits
                    if not is_outage(exc):
                        for w in self.waiters.failed(exc):
                            w.woken.set()
                        continue
                    delay_s = backoff.failed()
                    logger.debug("ended channel down (%s); again in %.2f s", describe(exc), delay_s)
                    await asyncio.sleep(delay_s)
                    await self._resubscribe()
                    continue
                backoff.succeeded()
                for w in self.waiters.heard(message):
                    w.woken.set()
        finally:
            pubsub, self._pubsub = self._pubsub, None
            await _aclose(pubsub)

    async def _resubscribe(self) -> None:
        async with self._lock:
            await _aclose(self._pubsub)
            self._pubsub = self._client.pubsub()
            call = self.waiters.resubscribe()
            if call is not None:
                try:
                    await getattr(self._pubsub, call[0])(*call[1])
                except Exception:  # still down: the next read fails and backs off again
                    logger.debug("error subscribing the ended channels again", exc_info=True)


def _close(pubsub: Any) -> None:
    if pubsub is not None:
        try:
            pubsub.close()
        except Exception:  # closing a broken connection may raise; nothing to do about it
            logger.debug("error closing the ended subscription", exc_info=True)


async def _aclose(pubsub: Any) -> None:
    if pubsub is not None:
        try:
            await asyncio.wait_for(asyncio.shield(pubsub.aclose()), 1.0)
        except (Exception, asyncio.CancelledError):  # broken or slow to close: let it go
            logger.debug("error closing the ended subscription", exc_info=True)


_LOCK = threading.Lock()
_SYNC: weakref.WeakKeyDictionary[Any, EndedListener] = weakref.WeakKeyDictionary()
_ASYNC: weakref.WeakKeyDictionary[Any, weakref.WeakKeyDictionary[Any, AsyncEndedListener]] = (
    weakref.WeakKeyDictionary()
)


def listener(client: Any) -> EndedListener:
    """The sync client's shared ended listener (one per client in this process)."""
    with _LOCK:
        found = _SYNC.get(client)
        if found is None or (found.waiters.error is not None and not len(found.waiters)):
            found = _SYNC[client] = EndedListener(client)
        return found


def async_listener(client: Any) -> AsyncEndedListener:
    """The asyncio client's shared ended listener on the running loop."""
    loop = asyncio.get_running_loop()
    with _LOCK:
        per_loop = _ASYNC.setdefault(client, weakref.WeakKeyDictionary())
        found = per_loop.get(loop)
        if found is None or (found.waiters.error is not None and not len(found.waiters)):
            found = per_loop[loop] = AsyncEndedListener(client)
        return found


def waiting(client: Any) -> int:
    """How many waits of this process are registered on ``client``'s listeners (for tests
    and diagnostics)."""
    with _LOCK:
        found = [_SYNC.get(client), *(_ASYNC.get(client) or {}).values()]
    return sum(len(x.waiters) for x in found if x is not None)


def _forget_after_fork() -> None:
    """A child process has no listener thread: its waits start their own."""
    _SYNC.clear()
    _ASYNC.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
