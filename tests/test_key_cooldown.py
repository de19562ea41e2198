"""Key cooldown: a handler raises ``dueq.KeyCooldown(seconds)`` (a manual consumer calls
``d.cooldown(seconds)``): the task goes back to due after ``seconds`` with no attempt counted,
and its limit key is held as long, so the key's other tasks wait (parked) while other keys run.
A task without a key only waits itself. Contract tests on both front ends, and through both
workers."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import redis
from conftest import async_mirror
from waiting import wait_for

import dueq

WAIT_S = 30


def schedule_keyed(q: Any, key: str | None, n: int, prefix: str) -> None:
    q.schedule_many(dueq.Task({"i": i}, id=f"{prefix}-{i:03d}", key=key) for i in range(n))


def test_a_cooled_down_key_waits_while_other_keys_run(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue()
    schedule_keyed(q, "hot", 3, "hot")
    clock.advance(1)
    schedule_keyed(q, "cold", 2, "cold")
    [first] = q.claim(1)
    assert first.id == "hot-000"
    outcome = first.cooldown(30)
    assert outcome.kind == "released"
    assert sorted(d.id for d in q.claim(10)) == ["cold-000", "cold-001"]  # hot waits
    clock.advance(29)
    assert q.claim(10) == []  # still cooling down
    clock.advance(2)
    again = q.claim(10)
    assert sorted(d.id for d in again) == ["hot-000", "hot-001", "hot-002"]
    assert {d.id: d.attempt for d in again}["hot-000"] == 1  # the cooled delivery not counted


def test_a_cooldown_counts_no_attempt_and_records_no_error(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue()
    q.schedule({"a": 1}, id="t", key="k")
    [d] = q.claim(1)
    outcome = d.fail(dueq.KeyCooldown(timedelta(seconds=5)))  # the same as d.cooldown(5)
    info = q.get("t")
    assert info.state == "scheduled" and info.attempt == 0 and info.errors == []
    assert outcome.kind == "released"
    assert info.due_at == outcome.at == datetime.fromtimestamp(clock() + 5, timezone.utc)
    assert q.stats().counters.get("retried", 0) == 0


def test_a_task_without_a_key_only_waits_itself(make_queue: Callable[..., Any], clock: Any) -> None:
    q = make_queue()
    schedule_keyed(q, None, 3, "free")
    [d] = q.claim(1)
    d.cooldown(30)
    assert sorted(x.id for x in q.claim(10)) == ["free-001", "free-002"]


def test_a_cooldown_holds_a_key_with_its_own_limits_too(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue()
    q.configure(key_concurrency=5, key_rate=dueq.Rate(100, per=1.0))
    schedule_keyed(q, "k", 3, "k")
    [d] = q.claim(1)
    d.cooldown(10)
    clock.advance(5)
    assert q.claim(10) == []
    clock.advance(6)
    assert len(q.claim(10)) == 1  # the key's rate spaces claims 10 ms apart again


@pytest.mark.parametrize("bad", [0, -1, float("nan"), "5", True, 366 * 86_400 + 1])
def test_a_bad_cooldown_is_refused(bad: Any) -> None:
    with pytest.raises(dueq.ConfigurationError):
        dueq.KeyCooldown(bad)


def test_key_cooldown_is_a_dueq_error() -> None:
    assert issubclass(dueq.KeyCooldown, dueq.DueqError)
    assert dueq.KeyCooldown(2.5).seconds == 2.5


# -- through the workers ----------------------------------------------------------------------


def handler_cooling(log: list[str]) -> Callable[[Any], None]:
    def handle(d: Any) -> None:
        log.append(d.id)
        if d.key == "hot":
            raise dueq.KeyCooldown(60)

    return handle


def check_cooled(q: dueq.Queue) -> None:
    first = q.get("hot-000")
    assert first is not None and first.state == "scheduled"
    assert first.attempt == 0 and first.errors == []
    parked = q.get("hot-001")
    assert parked is not None and parked.state == "scheduled" and parked.attempt == 0


def test_the_sync_worker_handles_a_key_cooldown(r: redis.Redis, clock: Any) -> None:
    q = dueq.Queue("cool-sync", r, clock=clock)
    schedule_keyed(q, "hot", 3, "hot")
    clock.advance(1)
    schedule_keyed(q, "cold", 3, "cold")
    log: list[str] = []
    # one held at a time: tasks of the key already leased before the cooldown would still run
    worker = dueq.Worker(q, handler_cooling(log), concurrency=1, max_in_flight=1)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_for(lambda: worker.outcomes["acked"] == 3, "the cold tasks acked")
        assert worker.outcomes["released"] == 1
        assert [i for i in log if i.startswith("hot")] == ["hot-000"]  # the key waits
    finally:
        worker.stop()
        thread.join(WAIT_S)
    assert not thread.is_alive()
    check_cooled(q)


def test_the_async_worker_handles_a_key_cooldown(r: redis.Redis, clock: Any) -> None:
    log: list[str] = []

    async def main() -> dict[str, int]:
        client = async_mirror(r)
        q = dueq.AsyncQueue("cool-async", client, clock=clock)
        await q.schedule_many(dueq.Task({"i": i}, id=f"hot-{i:03d}", key="hot") for i in range(3))
        clock.advance(1)
        await q.schedule_many(dueq.Task({"i": i}, id=f"cold-{i:03d}", key="cold") for i in range(3))

        async def handle(d: dueq.AsyncDelivery) -> None:
            handler_cooling(log)(d)

        worker = dueq.AsyncWorker(q, handle, concurrency=1, max_in_flight=1)
        running = asyncio.ensure_future(worker.run())
        async with asyncio.timeout(WAIT_S):
            while worker.outcomes["acked"] < 3:
                await asyncio.sleep(0.02)
            worker.stop()
            await running
        await client.aclose()
        return dict(worker.outcomes)

    outcomes = asyncio.run(main())
    assert outcomes == {"acked": 3, "released": 1}
    assert [i for i in log if i.startswith("hot")] == ["hot-000"]
    check_cooled(dueq.Queue("cool-async", r, clock=clock))
