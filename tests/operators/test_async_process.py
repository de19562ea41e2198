"""``process``, ``AsyncQueue.observe()`` and ``AsyncWorker`` on the caller's event loop,
against a real Redis.

Each test runs its own loop with ``asyncio.run``. Waits are upper bounds that keep a broken
consumer from hanging the suite, never measurements.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.asyncio
from conftest import async_mirror
from reactivex import operators as ops

import dueq
from dueq.server import RedisServer

BOUND_S = 20.0


class Outcomes:
    """Outcomes of one subscription; ``await wait(n)`` until n have come."""

    def __init__(self) -> None:
        self.items: list[dueq.Outcome] = []
        self.errors: list[Exception] = []
        self.completed = asyncio.Event()
        self._changed = asyncio.Event()

    def on_next(self, outcome: dueq.Outcome) -> None:
        self.items.append(outcome)
        self._changed.set()

    def on_error(self, error: Exception) -> None:
        self.errors.append(error)
        self._changed.set()

    async def wait(self, n: int) -> list[dueq.Outcome]:
        async with asyncio.timeout(BOUND_S):
            while len(self.items) < n:
                self._changed.clear()
                await self._changed.wait()
        return list(self.items)

    def kinds(self, task_id: str) -> list[tuple[str, int]]:
        return [(o.kind, o.attempt) for o in self.items if o.id == task_id]


def run(server: RedisServer, body: Callable[[dueq.AsyncQueue], Any], **settings: Any) -> Any:
    """Run ``body(queue)`` on a fresh loop with an AsyncQueue named "ap"; closes the client."""

    async def main() -> Any:
        client = async_mirror(server.client())
        try:
            return await body(dueq.AsyncQueue("ap", client, **settings))
        finally:
            await client.aclose()

    return asyncio.run(main())


def subscribe(q: Any, handler: Any, concurrency: int = 4, **observe: Any) -> tuple[Any, Outcomes]:
    out = Outcomes()
    stream = q.observe(**observe).pipe(dueq.operators.process(handler, concurrency))
    return stream.subscribe(on_next=out.on_next, on_error=out.on_error), out


async def until(condition: Callable[[], Any], what: str) -> None:
    async with asyncio.timeout(BOUND_S):
        while not await condition():
            await asyncio.sleep(0.01)


def test_async_handlers_run_on_the_subscribing_loop_and_share_its_objects(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    async def body(q: dueq.AsyncQueue) -> None:
        loop = asyncio.get_running_loop()
        gate = asyncio.Event()  # bound to this loop: unusable from any other
        loops: list[asyncio.AbstractEventLoop] = []
        threads: set[str] = set()

        async def handle(d: dueq.AsyncDelivery) -> None:
            loops.append(asyncio.get_running_loop())
            threads.add(threading.current_thread().name)
            await gate.wait()

        await q.schedule_many(dueq.Task({"i": i}, id=f"t{i}") for i in range(10))
        sub, out = subscribe(q, handle)
        await asyncio.sleep(0.2)
        gate.set()
        await out.wait(10)
        sub.dispose()
        assert set(loops) == {loop} and threads == {threading.current_thread().name}
        assert sorted(o.kind for o in out.items) == ["acked"] * 10

    run(redis_server, body)


def test_sync_handlers_run_in_a_thread_pool_and_never_block_the_loop(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    async def body(q: dueq.AsyncQueue) -> None:
        threads: set[str] = set()
        release = threading.Event()

        def handle(d: dueq.AsyncDelivery) -> None:
            threads.add(threading.current_thread().name)
            assert release.wait(BOUND_S)

        await q.schedule_many(dueq.Task({"i": i}) for i in range(4))
        sub, out = subscribe(q, handle, concurrency=4)
        ticks = 0
        for _ in range(20):  # the loop runs while all four handlers block their threads
            await asyncio.sleep(0.01)
            ticks += 1
        release.set()
        await out.wait(4)
        sub.dispose()
        assert ticks == 20 and threading.current_thread().name not in threads
        assert [o.kind for o in out.items] == ["acked"] * 4

    run(redis_server, body)


def test_failures_are_retried_with_backoff_then_dead_and_never_end_the_stream(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    policy = dueq.RetryPolicy(max_attempts=2, wait=lambda state: 0.05)

    async def body(q: dueq.AsyncQueue) -> None:
        async def handle(d: dueq.AsyncDelivery) -> None:
            if d.payload == "bad":
                raise ValueError("boom")
            if d.payload == "fatal":
                raise dueq.Unrecoverable("no point retrying")

        await q.schedule("bad", id="bad")
        await q.schedule("fatal", id="fatal")
        await q.schedule("good", id="good")
        sub, out = subscribe(q, handle)
        await out.wait(4)
        sub.dispose()
        assert out.kinds("bad") == [("retried", 1), ("dead", 2)]
        assert out.kinds("fatal") == [("dead", 1)] and out.kinds("good") == [("acked", 1)]
        dead = await q.dead.list()
        assert sorted(t.id for t in dead) == ["bad", "fatal"]
        assert out.errors == []

    run(redis_server, body, retry=policy)


def test_a_handler_slower_than_a_short_lease_keeps_it(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    async def body(q: dueq.AsyncQueue) -> None:
        started = asyncio.Event()

        async def handle(d: dueq.AsyncDelivery) -> None:
            started.set()
            await asyncio.sleep(3.0)  # three leases long

        tid = await q.schedule({})
        sub, out = subscribe(q, handle)
        async with asyncio.timeout(BOUND_S):
            await started.wait()
        rival = dueq.Queue("ap", r, lease=1.0)
        stolen: list[dueq.Delivery] = []
        while not out.items:  # another consumer keeps trying to take it while it runs
            stolen += await asyncio.to_thread(rival.claim, 10)  # never block the loop
            await asyncio.sleep(0.05)
        sub.dispose()
        assert stolen == [] and out.kinds(tid) == [("acked", 1)]

    run(redis_server, body, lease=1.0)


def test_disposing_from_inside_the_outcome_stream_releases_the_rest(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    async def body(q: dueq.AsyncQueue) -> None:
        await q.schedule_many(dueq.Task({"i": i}, id=f"t{i}") for i in range(65))
        done = asyncio.Event()
        got: list[dueq.Outcome] = []

        async def handle(d: dueq.AsyncDelivery) -> None:
            await asyncio.sleep(0.05)

        stream = q.observe(max_in_flight=64).pipe(
            dueq.operators.process(handle, concurrency=4), ops.take(5)
        )
        stream.subscribe(on_next=got.append, on_completed=done.set)
        async with asyncio.timeout(BOUND_S):
            await done.wait()  # take(5) disposed the subscription from inside on_next
        await until(lambda: _no_lease(q), "the rest to be released")
        stats = await q.stats()
        assert len(got) == 5 and stats.scheduled == 65 - stats.counters.get("acked", 0)
        infos = [await q.get(f"t{i}") for i in range(65)]
        assert all(info.attempt == 0 for info in infos if info is not None)  # not counted

    run(redis_server, body)


async def _no_lease(q: dueq.AsyncQueue) -> bool:
    return (await q.stats()).leased == 0


def test_observe_of_an_async_queue_needs_a_running_loop(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    q = dueq.AsyncQueue("ap", async_mirror(r))
    errors: list[Exception] = []
    q.observe().subscribe(on_error=errors.append)  # from plain code: no loop to run on
    assert len(errors) == 1 and isinstance(errors[0], dueq.ConfigurationError)
    assert "coroutine" in str(errors[0])
    with pytest.raises(dueq.ConfigurationError):
        q.observe(max_in_flight=0)


def test_a_sync_queues_stream_subscribed_on_a_loop_runs_async_handlers_on_that_loop(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    # the report: an async handler ran on dueq's own loop thread and could not use
    # the application's objects ("bound to a different event loop")
    q = dueq.Queue("sync-on-loop", r)

    async def main() -> list[dueq.Outcome]:
        gate = asyncio.Event()

        async def handle(d: dueq.Delivery) -> None:
            await asyncio.wait_for(gate.wait(), BOUND_S)

        q.schedule_many(dueq.Task({"i": i}) for i in range(3))
        sub, out = subscribe(q, handle)
        await asyncio.sleep(0.1)
        gate.set()
        items = await out.wait(3)
        sub.dispose()
        await asyncio.sleep(0.1)
        return items

    assert [o.kind for o in asyncio.run(main())] == ["acked"] * 3
    assert q.stats().counters["acked"] == 3


def test_async_worker_stop_releases_unstarted_and_cancels_past_the_grace(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    async def body(q: dueq.AsyncQueue) -> dict[str, int]:
        started = asyncio.Event()

        async def handle(d: dueq.AsyncDelivery) -> None:
            started.set()
            await asyncio.sleep(3600)  # hangs: cancelled when the grace period is over

        await q.schedule_many(dueq.Task({"i": i}, id=f"t{i}") for i in range(4))
        worker = dueq.AsyncWorker(q, handle, concurrency=1, max_in_flight=4, grace=0.3)
        running = asyncio.ensure_future(worker.run())
        async with asyncio.timeout(BOUND_S):
            await started.wait()
            await until(lambda: _leased(q, 4), "the worker to hold all four")
            worker.stop()
            await running
        stats = await q.stats()
        assert stats.leased == 0 and stats.scheduled == 4
        infos = [await q.get(f"t{i}") for i in range(4)]
        assert all(info is not None and info.attempt == 0 for info in infos)  # not counted
        return dict(worker.outcomes)

    assert run(redis_server, body) == {"released": 4}


async def _leased(q: dueq.AsyncQueue, n: int) -> bool:
    return (await q.stats()).leased == n


def test_async_worker_refuses_sync_queues_and_bad_settings(r: redis.Redis) -> None:
    with pytest.raises(dueq.ConfigurationError, match="AsyncQueue"):
        dueq.AsyncWorker(dueq.Queue("x", r), lambda d: None)  # type: ignore[arg-type]
    q = dueq.AsyncQueue("x", async_mirror(r))
    for bad in ({"concurrency": 0}, {"max_in_flight": 0}, {"grace": -1}, {"heartbeat": 0}):
        with pytest.raises(dueq.ConfigurationError):
            dueq.AsyncWorker(q, lambda d: None, **bad)  # type: ignore[arg-type]


def test_an_async_ack_during_a_redis_outage_is_retried_until_redis_is_back() -> None:
    with RedisServer(appendonly=True) as server:

        async def body(q: dueq.AsyncQueue) -> list[dueq.Outcome]:
            running, proceed = asyncio.Event(), asyncio.Event()

            async def handle(d: dueq.AsyncDelivery) -> None:
                running.set()
                await proceed.wait()

            tid = await q.schedule({})
            sub, out = subscribe(q, handle, concurrency=1)
            async with asyncio.timeout(BOUND_S):
                await running.wait()
            server.kill()  # Redis is gone while the handler finishes
            proceed.set()
            await asyncio.sleep(0.5)  # the ack fails and is retried with backoff meanwhile
            assert out.items == []
            await asyncio.to_thread(server.restart)
            items = await out.wait(1)
            sub.dispose()
            assert [(o.id, o.kind, o.attempt) for o in items] == [(tid, "acked", 1)]
            return items

        run(server, body, lease=60)


def test_a_handler_that_stops_its_worker_still_has_its_task_acked(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    async def body(q: dueq.AsyncQueue) -> dict[str, int]:
        tid = await q.schedule({})
        worker: dueq.AsyncWorker

        async def handle(d: dueq.AsyncDelivery) -> None:
            worker.stop()  # e.g. a handler that shuts the service down after one job

        worker = dueq.AsyncWorker(q, handle, grace=5, handle_signals=False)
        async with asyncio.timeout(BOUND_S):
            await worker.run()
        assert await q.get(tid) is None  # done, not released to run again
        return dict(worker.outcomes)

    assert run(redis_server, body) == {"acked": 1}


def test_an_async_worker_whose_claims_fail_for_good_stops_and_raises_that_error(
    redis_server: RedisServer,
) -> None:
    async def body(q: dueq.AsyncQueue) -> None:
        await q.redis.set(q.keys.leased, "not a sorted set")  # every claim fails (no outage)
        worker = dueq.AsyncWorker(q, lambda d: None, handle_signals=False)
        try:
            with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
                async with asyncio.timeout(BOUND_S):
                    await worker.run()
        finally:
            await q.redis.delete(q.keys.leased)  # the next test's queue has the same name

    run(redis_server, body)


def test_handlers_that_never_await_still_let_the_loop_run_other_tasks(
    redis_server: RedisServer,
) -> None:
    # each handler blocks 1 ms without awaiting; over 300 of them the loop must still get to
    # other tasks (the settler, the claim loop, the application) every few ms
    async def body(q: dueq.AsyncQueue) -> None:
        ticks = 0
        seen: list[int] = []

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        async def handle(d: dueq.AsyncDelivery) -> None:
            seen.append(ticks)
            time.sleep(0.001)  # (blocks the loop on purpose: no await)

        await q.schedule_many(dueq.Task(i) for i in range(300))
        tick_task = asyncio.create_task(ticker())
        sub, out = subscribe(q, handle, concurrency=1, max_in_flight=300)
        try:
            await out.wait(300)
        finally:
            sub.dispose()
            tick_task.cancel()
        # 300 ms of handlers: at one yield per 5 ms, well over 20 distinct tick counts
        assert len(set(seen)) >= 20, len(set(seen))

    run(redis_server, body)
