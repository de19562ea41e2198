"""Timeouts: ``process(handler, timeout=...)`` fails an attempt that runs longer with
``dueq.TaskTimeout``, which follows the retry policy, on both consumers: the threaded one's
lease keeper fails it and abandons the thread (another takes its place); the asyncio one
cancels the handler. Waits are upper bounds, never measurements."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import redis
from conftest import async_mirror

import dueq

WAIT_S = 30


class Outcomes:
    def __init__(self) -> None:
        self.items: list[dueq.Outcome] = []
        self._cond = threading.Condition()

    def on_next(self, outcome: dueq.Outcome) -> None:
        with self._cond:
            self.items.append(outcome)
            self._cond.notify_all()

    def wait(self, n: int) -> list[dueq.Outcome]:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.items) >= n, WAIT_S), self.items
            return list(self.items)


def never_retry_wait(state: Any) -> float:
    return 0.0


def test_a_thread_handler_past_its_timeout_fails_the_attempt_then_goes_dead(
    r: redis.Redis,
) -> None:
    policy = dueq.RetryPolicy(max_attempts=2, wait=never_retry_wait)
    q = dueq.Queue("t", r, lease=30, retry=policy)
    tid = q.schedule({})
    release = threading.Event()
    started: list[int] = []

    def handle(d: dueq.Delivery) -> None:
        started.append(d.attempt)
        release.wait(WAIT_S)  # hangs until the test ends

    out = Outcomes()
    stream = q.observe().pipe(dueq.operators.process(handle, concurrency=1, timeout=0.3))
    sub = stream.subscribe(on_next=out.on_next)
    try:
        items = out.wait(2)
    finally:
        release.set()  # the abandoned handlers return now: their results must be refused
        sub.dispose()
    assert [(o.kind, o.attempt) for o in items] == [("retried", 1), ("dead", 2)]
    assert started == [1, 2]  # the second attempt ran on a thread that replaced the first
    dead = q.dead.list()
    assert [t.id for t in dead] == [tid]
    assert [e.type for e in dead[0].errors] == ["TaskTimeout", "TaskTimeout"]
    assert "timeout of 0.3 s" in dead[0].errors[0].message


def test_a_thread_handler_that_returns_after_its_timeout_is_not_acked(r: redis.Redis) -> None:
    policy = dueq.RetryPolicy(max_attempts=5, wait=lambda state: 3600)
    q = dueq.Queue("t", r, lease=30, retry=policy)
    tid = q.schedule({})
    release, returned = threading.Event(), threading.Event()

    def handle(d: dueq.Delivery) -> None:
        release.wait(WAIT_S)
        returned.set()

    out = Outcomes()
    stream = q.observe().pipe(dueq.operators.process(handle, concurrency=1, timeout=0.2))
    sub = stream.subscribe(on_next=out.on_next)
    (outcome,) = out.wait(1)
    release.set()  # the abandoned handler now returns: its result must be refused
    assert returned.wait(WAIT_S)
    threading.Event().wait(0.3)  # time for a wrong ack or a second outcome to show
    sub.dispose()
    assert (outcome.kind, outcome.attempt) == ("retried", 1)
    assert [(o.kind, o.attempt) for o in out.items] == [("retried", 1)]
    info = q.get(tid)
    assert info is not None and info.state == "scheduled" and info.errors[0].type == "TaskTimeout"
    assert q.stats().counters.get("acked", 0) == 0


def test_an_async_handler_past_its_timeout_is_cancelled_and_retried(
    r: redis.Redis,
) -> None:
    policy = dueq.RetryPolicy(max_attempts=2, wait=never_retry_wait)

    async def main() -> tuple[list[dueq.Outcome], list[str]]:
        client = async_mirror(r)
        q = dueq.AsyncQueue("ta", client, lease=30, retry=policy)
        await q.schedule({}, id="slow")
        seen: list[str] = []
        done = asyncio.Event()
        items: list[dueq.Outcome] = []

        async def handle(d: dueq.AsyncDelivery) -> None:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                seen.append(f"cancelled {d.attempt}")
                raise

        def on_next(o: dueq.Outcome) -> None:
            items.append(o)
            if len(items) == 2:
                done.set()

        stream = q.observe().pipe(dueq.operators.process(handle, concurrency=2, timeout=0.2))
        sub = stream.subscribe(on_next=on_next)
        await asyncio.wait_for(done.wait(), WAIT_S)
        sub.dispose()
        dead = await q.dead.list()
        assert [e.type for e in dead[0].errors] == ["TaskTimeout", "TaskTimeout"]
        await client.aclose()
        return items, seen

    items, seen = asyncio.run(main())
    assert [(o.kind, o.attempt) for o in items] == [("retried", 1), ("dead", 2)]
    assert seen == ["cancelled 1", "cancelled 2"]


def test_a_sync_handler_on_the_loop_past_its_timeout_is_abandoned_and_others_go_on(
    r: redis.Redis,
) -> None:
    policy = dueq.RetryPolicy(max_attempts=1, wait=never_retry_wait)
    release = threading.Event()

    def handle(d: dueq.AsyncDelivery) -> None:
        if d.payload == "hang":
            release.wait(WAIT_S)

    async def main() -> list[tuple[str, str]]:
        client = async_mirror(r)
        q = dueq.AsyncQueue("ts", client, lease=30, retry=policy)
        await q.schedule("hang", id="hang")
        await q.schedule("quick", id="quick", delay=0.05)
        items: list[dueq.Outcome] = []
        done = asyncio.Event()

        def on_next(o: dueq.Outcome) -> None:
            items.append(o)
            if len(items) == 2:
                done.set()

        stream = q.observe().pipe(dueq.operators.process(handle, concurrency=1, timeout=0.3))
        sub = stream.subscribe(on_next=on_next)
        await asyncio.wait_for(done.wait(), WAIT_S)
        sub.dispose()
        release.set()
        await client.aclose()
        return sorted((o.id, o.kind) for o in items)

    assert asyncio.run(main()) == [("hang", "dead"), ("quick", "acked")]


def test_a_bad_timeout_is_a_configuration_error(r: redis.Redis) -> None:
    for bad in (0, -1, float("nan"), "1s", True):
        with pytest.raises(dueq.ConfigurationError, match="timeout"):
            dueq.operators.process(lambda d: None, timeout=bad)
        with pytest.raises(dueq.ConfigurationError, match="timeout"):
            dueq.Worker(dueq.Queue("t", r), lambda d: None, timeout=bad)
