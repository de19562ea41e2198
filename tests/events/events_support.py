"""Followers of a queue's outcome events on both front ends, for the events tests: ``Queue.events``
(an Observable on a reader thread) and ``AsyncQueue.events`` (an async iterator on a loop of the
follower's own thread), of queue "q", plain or sharded (``shards=``)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

import redis
from conftest import ManualClock, async_mirror

import dueq


class SyncFollower:
    def __init__(
        self, r: redis.Redis, clock: ManualClock, ack: bool, shards: int = 1, **kwargs: Any
    ) -> None:
        self.events: list[Any] = []
        self.ack = ack
        q = dueq.Queue("q", r, clock=clock, shards=shards)
        self._subscription = q.events(**kwargs).subscribe(on_next=self._on)

    def _on(self, ev: dueq.Event) -> None:
        self.events.append(ev)
        if self.ack:
            ev.ack()

    def settle(self, ev: dueq.Event) -> None:
        ev.ack()

    def stop(self) -> None:
        self._subscription.dispose()


class AsyncFollower:
    def __init__(
        self, r: redis.Redis, clock: ManualClock, ack: bool, shards: int = 1, **kwargs: Any
    ) -> None:
        self.events: list[Any] = []
        self.ack = ack
        self._r, self._clock, self._kwargs, self._shards = r, clock, kwargs, shards
        self._loop = asyncio.new_event_loop()
        self._task: asyncio.Task[None] | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._started.wait(5)

    def _run(self) -> None:
        self._loop.run_until_complete(self._main())
        self._loop.close()

    async def _main(self) -> None:
        self._task = asyncio.current_task()
        client = async_mirror(self._r)
        q = dueq.AsyncQueue("q", client, clock=self._clock, shards=self._shards)
        try:
            async with contextlib.aclosing(q.events(**self._kwargs)) as events:
                self._started.set()
                async for ev in events:
                    self.events.append(ev)
                    if self.ack:
                        await ev.ack()
        except asyncio.CancelledError:  # stop(): the follower goes away
            pass
        finally:
            self._started.set()
            await client.aclose()

    def settle(self, ev: dueq.AsyncEvent) -> None:
        """Ack on the follower's own loop (its queue's client lives there)."""
        asyncio.run_coroutine_threadsafe(ev.ack(), self._loop).result(10)

    def stop(self) -> None:
        task = self._task
        if task is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(task.cancel)
        self._thread.join(10)
        # a follower left reading would make its group again in a later test's flushed Redis
        assert not self._thread.is_alive(), "the async events reader did not end when cancelled"


def start_follower(front_end: str, r: redis.Redis, clock: ManualClock, **kwargs: Any) -> Any:
    """A follower of queue "q" on ``front_end`` ("sync" or "async"), acking what it reads
    unless ``ack=False``; ``kwargs`` go to ``events()`` (and ``shards=`` to the queue)."""
    ack = kwargs.pop("ack", True)
    cls = SyncFollower if front_end == "sync" else AsyncFollower
    return cls(r, clock, ack, **kwargs)
