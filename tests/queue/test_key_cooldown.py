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
from fairness_support import MODES, fairness_param
from waiting_support import wait_for

import dueq


@pytest.fixture(params=MODES)
def make_queue(make_queue: Callable[..., Any], request: pytest.FixtureRequest) -> Any:
    """The module's queues with fairness off and on (fairness_support)."""
    return fairness_param(make_queue, request)


WAIT_S = 30


def schedule_keyed(q: Any, key: str | None, n: int, prefix: str) -> None:
    q.schedule_many(dueq.Task({"i": i}, id=f"{prefix}-{i:03d}", key=key) for i in range(n))


def test_a_cooled_down_key_waits_while_other_keys_run(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue()
    schedule_keyed(q, "hot", 3, "hot")
    [first] = q.claim(1)
    assert first.id == "hot-000"
    clock.advance(1)
    schedule_keyed(q, "cold", 2, "cold")
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


# -- tasks a worker holds unstarted obey the cooldown (issue 37) ------------------------------


class CoolingOnce:
    """A handler that cools the key "hot" down for 60 s on hot-000's first run and records
    when (queue clock) each task started."""

    def __init__(self, clock: Any) -> None:
        self.clock = clock
        self.started: list[tuple[str, float]] = []
        self.cooled_at: float | None = None

    def __call__(self, d: Any) -> None:
        self.started.append((d.id, self.clock()))
        if d.id == "hot-000" and self.cooled_at is None:
            self.cooled_at = self.clock()
            raise dueq.KeyCooldown(60)

    def hot_started(self) -> list[tuple[str, float]]:
        return [(i, at) for i, at in self.started if i.startswith("hot")]


def schedule_hot_then_cold(q: dueq.Queue, clock: Any) -> None:
    schedule_keyed(q, "hot", 3, "hot")
    clock.advance(1)
    schedule_keyed(q, "cold", 3, "cold")


def check_given_back(q: dueq.Queue, handler: CoolingOnce, outcomes: Any) -> None:
    """While the clock stands still the cooldown never ends: of the key's tasks only the cooled
    one started; the two held with it went back unstarted, no attempt counted, due at the end."""
    assert outcomes["acked"] == 3 and outcomes["released"] == 3, outcomes
    assert [i for i, _ in handler.hot_started()] == ["hot-000"]
    assert handler.cooled_at is not None
    end = datetime.fromtimestamp(handler.cooled_at + 60, timezone.utc)
    for task_id in ("hot-001", "hot-002"):
        info = q.get(task_id)
        assert info is not None and info.state == "scheduled", info
        assert info.attempt == 0 and info.errors == []
        assert info.due_at is not None and info.due_at >= end


def check_after_the_cooldown(handler: CoolingOnce) -> None:
    """No task of the key started before the cooldown's end (queue clock)."""
    assert handler.cooled_at is not None
    later = handler.hot_started()[1:]
    assert sorted(i for i, _ in later) == ["hot-000", "hot-001", "hot-002"]
    assert all(at >= handler.cooled_at + 60 for _, at in later), later


def test_the_sync_worker_gives_back_its_held_tasks_of_a_cooled_key(
    r: redis.Redis, clock: Any
) -> None:
    q = dueq.Queue("cool-held-sync", r, clock=clock)
    schedule_hot_then_cold(q, clock)
    handler = CoolingOnce(clock)
    # one handler at a time, holding all six (the default prefetch holds 2 * concurrency at
    # first, then more: any hold above one showed the defect)
    worker = dueq.Worker(q, handler, concurrency=1, max_in_flight=8)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_for(
            lambda: worker.outcomes["released"] == 3 and worker.outcomes["acked"] == 3,
            "the cold tasks acked, the hot ones given back",
        )
        check_given_back(q, handler, worker.outcomes)
        clock.advance(61)
        q.schedule({}, id="poke")  # wakes the worker: its claim finds the key free again
        wait_for(lambda: worker.outcomes["acked"] == 7, "the key's tasks run after it")
        check_after_the_cooldown(handler)
    finally:
        worker.stop()
        thread.join(WAIT_S)
    assert not thread.is_alive()


@pytest.mark.parametrize("handler_kind", ["async", "sync"])
def test_the_async_worker_gives_back_its_held_tasks_of_a_cooled_key(
    r: redis.Redis, clock: Any, handler_kind: str
) -> None:
    handler = CoolingOnce(clock)
    q_sync = dueq.Queue("cool-held-async", r, clock=clock)
    schedule_hot_then_cold(q_sync, clock)

    async def main() -> None:
        client = async_mirror(r)
        q = dueq.AsyncQueue("cool-held-async", client, clock=clock)

        async def handle(d: dueq.AsyncDelivery) -> None:
            handler(d)

        worker = dueq.AsyncWorker(
            q, handle if handler_kind == "async" else handler, concurrency=1, max_in_flight=8
        )
        running = asyncio.ensure_future(worker.run())
        try:
            async with asyncio.timeout(WAIT_S):
                while not (worker.outcomes["released"] == 3 and worker.outcomes["acked"] == 3):
                    await asyncio.sleep(0.02)
                check_given_back(q_sync, handler, worker.outcomes)
                clock.advance(61)
                await q.schedule({}, id="poke")
                while worker.outcomes["acked"] < 7:
                    await asyncio.sleep(0.02)
                check_after_the_cooldown(handler)
        finally:
            worker.stop()
            await running
            await client.aclose()

    asyncio.run(main())


def test_process_gives_back_its_held_tasks_of_a_cooled_key(r: redis.Redis, clock: Any) -> None:
    """``q.observe().pipe(process(...))`` with an ``async def`` handler (its own loop thread)."""
    q = dueq.Queue("cool-held-process", r, clock=clock)
    schedule_hot_then_cold(q, clock)
    handler = CoolingOnce(clock)

    async def handle(d: dueq.Delivery) -> None:
        handler(d)

    outcomes: list[dueq.Outcome] = []
    subscription = (
        q.observe(max_in_flight=8)
        .pipe(dueq.operators.process(handle, concurrency=1))
        .subscribe(outcomes.append)
    )
    try:
        wait_for(lambda: len(outcomes) == 6, "six outcomes")
        kinds = [o.kind for o in outcomes]
        check_given_back(q, handler, {k: kinds.count(k) for k in ("acked", "released")})
    finally:
        subscription.dispose()


def test_release_many_gives_leases_back_in_one_call_and_says_what_became_of_each(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue()
    schedule_keyed(q, "hot", 3, "hot")
    q.schedule({}, id="other", key="cold")
    held = q.claim(10)
    assert len(held) == 4
    assert q.cancel("hot-002")
    hot = [d for d in held if d.key == "hot"]
    outcomes = q.release_many(hot, delay=30, hold=True)
    assert [(o.id, o.kind) for o in outcomes] == [
        ("hot-000", "released"),
        ("hot-001", "released"),
        ("hot-002", "cancelled"),
    ]
    end = datetime.fromtimestamp(clock() + 30, timezone.utc)
    assert outcomes[0].at == outcomes[1].at == end
    info = q.get("hot-001")
    assert info is not None and info.state == "scheduled" and info.attempt == 0
    schedule_keyed(q, "hot", 1, "late")  # due now, but its key is held for 30 s
    clock.advance(29)
    assert q.claim(10) == []
    clock.advance(1)
    assert sorted(d.id for d in q.claim(10)) == ["hot-000", "hot-001", "late-000"]
    assert q.stats().counters.get("released") == 2
