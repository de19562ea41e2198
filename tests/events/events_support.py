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


class Followers:
    """The followers a test starts (``followers(**kwargs)``: one more, see ``start_follower``;
    ``defaults`` go to each), all stopped by ``stop()`` at the test's end."""

    def __init__(self, front_end: str, r: redis.Redis, clock: ManualClock, **defaults: Any) -> None:
        self._args = (front_end, r, clock)
        self._defaults = defaults
        self._started: list[Any] = []

    def __call__(self, **kwargs: Any) -> Any:
        follower = start_follower(*self._args, **{**self._defaults, **kwargs})
        self._started.append(follower)
        return follower

    def stop(self) -> None:
        for follower in self._started:
            follower.stop()


def start_follower(front_end: str, r: redis.Redis, clock: ManualClock, **kwargs: Any) -> Any:
    """A follower of queue "q" on ``front_end`` ("sync" or "async"), acking what it reads
    unless ``ack=False``; ``kwargs`` go to ``events()`` (and ``shards=`` to the queue)."""
    ack = kwargs.pop("ack", True)
    cls = SyncFollower if front_end == "sync" else AsyncFollower
    return cls(r, clock, ack, **kwargs)


def outcomes(q: dueq.Queue, n: int, prefix: str = "t") -> set[tuple[str, str]]:
    """Make n outcomes, a quarter of each kind: acked, retried, dead, cancelled."""
    expected = set()
    ids = [f"{prefix}{i}" for i in range(n)]
    for tid in ids:
        q.schedule({"n": tid}, id=tid)
    deliveries = {d.id: d for d in q.claim(limit=n)}
    for i, tid in enumerate(ids):
        kind = ("acked", "retried", "dead", "cancelled")[i % 4]
        if kind == "acked":
            deliveries[tid].ack({"ok": tid})
        elif kind == "retried":
            deliveries[tid].fail(RuntimeError("again"))
        elif kind == "dead":
            deliveries[tid].fail(dueq.Unrecoverable("no"))
        else:
            q.cancel(tid)
        expected.add((tid, kind))
    return expected


def seen(*followers: Any) -> list[tuple[str, str]]:
    return [(ev.task_id, ev.kind) for f in followers for ev in f.events]
