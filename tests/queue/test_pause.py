"""Pause and resume: a queue setting in Redis that every consumer obeys, on both front ends."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from conftest import async_mirror
from waiting_support import Blocker, wait_for

import dueq
from dueq.server import RedisServer

BOUND_S = 10.0


def test_pause_stops_claims_in_every_process_and_resume_lets_them_claim(
    make_queue: Callable[..., Any],
) -> None:
    operator, worker = make_queue("p"), make_queue("p")  # two processes' views of one queue
    worker.schedule_many(dueq.Task({"i": i}, id=f"t{i}") for i in range(3))
    settings = operator.pause()
    assert settings.paused and worker.settings().paused
    assert worker.claim(10) == []
    stats = worker.stats()
    assert stats.paused and stats.scheduled == 3 and stats.due_now == 3
    worker.schedule({"i": 3}, id="t3")  # scheduling goes on while paused
    assert not operator.resume().paused
    assert sorted(d.id for d in worker.claim(10)) == ["t0", "t1", "t2", "t3"]


def test_expired_leases_are_still_reclaimed_while_paused(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue("p", lease=10)
    q.schedule({}, id="held")
    assert [d.id for d in q.claim(1)] == ["held"]
    q.pause()
    clock.advance(11)
    assert q.claim(10) == []  # the lease ran out: back to scheduled (a failed attempt)
    info = q.get("held")
    assert info is not None and info.state == "scheduled" and info.attempt == 1
    q.resume()
    clock.advance(10)  # its retry wait
    (again,) = q.claim(1)
    assert (again.id, again.attempt) == ("held", 2)


def test_a_paused_claim_reports_no_next_due_time(make_queue: Callable[..., Any]) -> None:
    q = make_queue("p")
    q.schedule({}, id="due")
    q.pause()
    batch = q.claim_batch(10)
    assert batch.paused and batch.deliveries == [] and batch.next_due_ms is None
    q.resume()
    assert not q.claim_batch(0).paused


def test_resume_wakes_a_sleeping_threaded_consumer_at_once(r: redis.Redis) -> None:
    q = dueq.Queue("pw", r)
    q.pause()
    q.schedule({}, id="waiting")
    got: list[dueq.Delivery] = []
    arrived = threading.Event()
    sub = q.observe(heartbeat=3600).subscribe(on_next=lambda d: (got.append(d), arrived.set()))
    time.sleep(0.3)  # it claimed, found the queue paused, and sleeps for the heartbeat
    assert got == []
    q.resume()
    assert arrived.wait(BOUND_S)  # the wake channel, not its one-hour heartbeat
    sub.dispose()
    got[0].ack()


def test_resume_wakes_a_sleeping_async_consumer_at_once(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    async def main() -> None:
        client = async_mirror(r)
        q = dueq.AsyncQueue("pw-async", client)
        await q.pause()
        await q.schedule({}, id="waiting")
        it = q.deliveries(heartbeat=3600)
        waiting = asyncio.ensure_future(anext(it))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        await q.resume()
        async with asyncio.timeout(BOUND_S):  # the wake channel, not its one-hour heartbeat
            d = await waiting
        await d.ack()
        await it.aclose()
        await client.aclose()

    asyncio.run(main())


def test_a_bad_paused_value_is_refused(make_queue: Callable[..., Any], r: redis.Redis) -> None:
    q = make_queue("p")
    for bad in (1, "yes", 0.0):
        with pytest.raises(dueq.ConfigurationError, match="paused"):
            q.configure(paused=bad)
    assert not r.exists(q.keys.config)


# -- tasks a worker holds unstarted wait for the resume (issue 37) -----------------------------


def test_the_sync_workers_held_tasks_are_given_back_on_pause_not_run(
    r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="dueq.observe")
    q = dueq.Queue("ph", r)
    q.schedule({}, id="blocker")
    q.schedule_many(dueq.Task({}, id=f"held-{i}", delay=0.001) for i in range(3))
    blocker = Blocker()
    worker = dueq.Worker(q, blocker.sync, concurrency=1, max_in_flight=8)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        assert blocker.running.wait(BOUND_S)
        wait_for(lambda: q.stats().leased == 4, "all four held")
        q.pause()  # its wake makes the worker claim: it finds the queue paused
        wait_for(lambda: "paused; waiting" in caplog.text, "the worker to see the pause")
        blocker.go_on.set()
        wait_for(lambda: worker.outcomes == {"acked": 1, "released": 3}, "the held given back")
        assert blocker.seen == ["blocker"]
        stats = q.stats()
        assert stats.scheduled == 3 and stats.leased == 0
        assert all(q.get(f"held-{i}").attempt == 0 for i in range(3))  # no attempt counted
        q.resume()
        wait_for(lambda: worker.outcomes["acked"] == 4, "the three run after the resume")
    finally:
        blocker.go_on.set()
        worker.stop()
        thread.join(BOUND_S)
    assert not thread.is_alive()


@pytest.mark.parametrize("handler_kind", ["async", "sync"])
def test_the_async_workers_held_tasks_are_given_back_on_pause_not_run(
    r: redis.Redis, caplog: pytest.LogCaptureFixture, handler_kind: str
) -> None:
    caplog.set_level("INFO", logger="dueq.observe")
    blocker = Blocker()

    async def main() -> None:
        client = async_mirror(r)
        q = dueq.AsyncQueue("pha", client)
        await q.schedule({}, id="blocker")
        await q.schedule_many(dueq.Task({}, id=f"held-{i}", delay=0.001) for i in range(3))
        worker = dueq.AsyncWorker(q, blocker.handler(handler_kind), concurrency=1, max_in_flight=8)
        running = asyncio.ensure_future(worker.run())
        try:
            async with asyncio.timeout(BOUND_S):
                while not (blocker.running.is_set() and (await q.stats()).leased == 4):
                    await asyncio.sleep(0.01)
                await q.pause()
                while "paused; waiting" not in caplog.text:
                    await asyncio.sleep(0.01)
                blocker.go_on.set()
                while dict(worker.outcomes) != {"acked": 1, "released": 3}:
                    await asyncio.sleep(0.01)
                assert blocker.seen == ["blocker"]
                assert (await q.stats()).scheduled == 3
                await q.resume()
                while worker.outcomes["acked"] < 4:
                    await asyncio.sleep(0.01)
        finally:
            blocker.go_on.set()
            worker.stop()
            await running
            await client.aclose()

    asyncio.run(main())
