"""Options a producer states per task, kept with it in Redis: priority (among due tasks the
higher runs first, never early), max_attempts and timeout (overriding the consumer's), and the
limit key. Contract tests run on both front ends (``make_queue``)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import redis
from conftest import async_mirror

import dueq
from dueq._wire.keys import QueueKeys

WAIT_S = 30


def ids_of(deliveries: list[Any]) -> list[str]:
    return [d.id for d in deliveries]


def test_due_tasks_are_claimed_by_priority_then_earliest_due(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue()
    q.schedule({}, id="p0-early", delay=0)
    q.schedule({}, id="p5", delay=2, priority=5)
    q.schedule({}, id="p9-late", delay=3, priority=9)
    q.schedule({}, id="p9-early", delay=1, priority=9)
    q.schedule({}, id="p0-late", delay=3)
    clock.advance(3)
    assert ids_of(q.claim(2)) == ["p9-early", "p9-late"]
    assert ids_of(q.claim(10)) == ["p5", "p0-early", "p0-late"]


def test_a_high_priority_task_is_never_claimed_before_it_is_due(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue()
    q.schedule({}, id="later", delay=10, priority=9)
    q.schedule({}, id="now")
    batch = q.claim_batch(10)
    assert ids_of(batch.deliveries) == ["now"]
    assert batch.next_due_ms == batch.now_ms + 10_000  # the consumer sleeps until the p9 task
    clock.advance(9.999)
    assert q.claim(10) == []
    clock.advance(0.001)
    [d] = q.claim(10)
    assert (d.id, d.priority) == ("later", 9)


def test_retried_released_reclaimed_and_replayed_tasks_keep_their_priority(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue(lease=5)
    q.schedule_many(dueq.Task({}, id=f"low{i}") for i in range(3))
    q.schedule({}, id="high", priority=7)
    [d] = q.claim(1)
    assert d.id == "high"
    d.fail(ValueError("boom"), retry_in=0)
    [d] = q.claim(1)
    assert d.id == "high" and d.attempt == 2
    d.release()
    [d] = q.claim(1)
    assert d.id == "high"
    clock.advance(6)
    assert q.claim(0) == []  # reclaims the expired lease: back to its level after a 10 s wait
    clock.advance(10)
    [d] = q.claim(1)
    assert (d.id, d.attempt) == ("high", 3)  # attempt 2 was released: it does not count
    d.fail(ValueError("last"))  # max_attempts=3: dead
    assert q.dead.replay(["high"]) == 1
    [d] = q.claim(1)
    assert d.id == "high"


def test_scheduled_task_with_a_priority_can_be_read_rescheduled_cancelled_and_counted(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue()
    q.schedule({"n": 1}, id="a", delay=60, priority=3)
    q.schedule({"n": 2}, id="b", delay=120)
    info = q.get("a")
    assert info is not None and info.state == "scheduled" and info.priority == 3
    stats = q.stats()
    assert stats.scheduled == 2 and stats.next_due_at == info.due_at
    assert q.reschedule("a", delay=1)
    clock.advance(1)
    assert q.stats().due_now == 1
    assert q.cancel("a")
    assert q.get("a") is None and q.stats().scheduled == 1


def test_replace_moves_a_task_to_its_new_priority(
    make_queue: Callable[..., Any], r: redis.Redis
) -> None:
    q = make_queue()
    q.schedule({"v": 1}, id="t", priority=2)
    q.schedule({"v": 2}, id="t", priority=8, replace=True)
    keys = QueueKeys.for_queue("q")
    assert r.zscore(keys.due_levels[2], "t") is None
    assert r.zscore(keys.due_levels[8], "t") is not None
    [d] = q.claim(5)
    assert (d.payload, d.priority) == ({"v": 2}, 8)


def test_options_come_with_the_delivery_and_the_snapshot(make_queue: Callable[..., Any]) -> None:
    q = make_queue()
    q.schedule({}, id="o", priority=4, key="tenant:42", timeout=2.5, max_attempts=7)
    q.schedule({}, id="plain")
    info = q.get("o")
    assert info is not None
    assert (info.priority, info.key, info.timeout, info.max_attempts) == (
        4,
        "tenant:42",
        timedelta(seconds=2.5),
        7,
    )
    by_id = {d.id: d for d in q.claim(10)}
    o, plain = by_id["o"], by_id["plain"]
    assert (o.priority, o.key, o.timeout_s, o.max_attempts) == (4, "tenant:42", 2.5, 7)
    assert (plain.priority, plain.key, plain.timeout_s, plain.max_attempts) == (0, None, None, None)


def test_tasks_without_options_keep_the_version_1_envelope(
    make_queue: Callable[..., Any], r: redis.Redis
) -> None:
    q = make_queue()
    q.schedule({"a": 1}, id="plain")
    q.schedule({"a": 1}, id="opt", priority=1)
    keys = QueueKeys.for_queue("q")
    assert r.hget(keys.tasks, "plain") == b'1:{"a":1}'
    assert r.hget(keys.tasks, "opt") == b'2:1|||\n{"a":1}'


def test_a_tasks_own_max_attempts_wins_over_the_consumers_policy(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue()  # the policy allows 3 attempts
    q.schedule({}, id="once", max_attempts=1)
    q.schedule({}, id="more", max_attempts=4)
    for d in q.claim(10):
        assert d.fail(ValueError("no")).kind == ("dead" if d.id == "once" else "retried")
    for attempt in (2, 3, 4):
        clock.advance(10)
        [d] = q.claim(10)
        assert (d.id, d.attempt) == ("more", attempt)
        assert d.fail(ValueError("no")).kind == ("dead" if attempt == 4 else "retried")
    assert sorted(t.id for t in q.dead.list()) == ["more", "once"]


def test_an_expired_lease_on_the_tasks_last_own_attempt_sends_it_to_dead(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue(lease=5)
    q.schedule({}, id="one-shot", max_attempts=1)
    assert ids_of(q.claim(1)) == ["one-shot"]
    clock.advance(6)
    assert q.claim(1) == []  # the claim reclaims the lease: one attempt made, so dead
    info = q.get("one-shot")
    assert info is not None and info.state == "dead"
    assert [e.type for e in info.errors] == ["LeaseExpired"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"priority": 10}, "priority must be an int from 0 to 9"),
        ({"priority": -1}, "priority must be an int from 0 to 9"),
        ({"priority": True}, "priority must be an int from 0 to 9"),
        ({"priority": "9"}, "priority must be an int from 0 to 9"),
        ({"key": ""}, "must be non-empty"),
        ({"key": "a\nb"}, "without control characters"),
        ({"key": 42}, "key must be a str"),
        ({"key": "x" * 201}, "longer than 200 bytes"),
        ({"key": "\ud800"}, "not valid Unicode"),
        ({"timeout": 0}, "timeout must be more than 0 s"),
        ({"timeout": -1}, "timeout"),
        ({"timeout": float("nan")}, "timeout"),
        ({"max_attempts": 0}, "max_attempts must be an int from 1"),
        ({"max_attempts": 1.5}, "max_attempts must be an int from 1"),
    ],
)
def test_bad_options_raise_a_typed_error_and_write_nothing(
    make_queue: Callable[..., Any], options: dict[str, Any], message: str
) -> None:
    q = make_queue()
    with pytest.raises(dueq.InvalidTaskError, match=message):
        q.schedule_many([dueq.Task({}, id="good"), dueq.Task({}, id="bad", **options)])
    assert q.stats().scheduled == 0


def test_a_corrupted_options_head_is_buried_not_crashing_the_claim(
    make_queue: Callable[..., Any], r: redis.Redis
) -> None:
    q = make_queue()
    keys = QueueKeys.for_queue("q")
    q.schedule({}, id="bad", priority=3)
    q.schedule({}, id="good", priority=3)
    r.hset(keys.tasks, "bad", b"2:3|x|y|\n{}")  # a head the scripts and the client cannot read
    delivered = q.claim(10)
    assert ids_of(delivered) == ["good"]
    info = q.get("bad")
    assert info is not None and info.state == "dead"
    assert info.errors[0].type == "PayloadError"


@pytest.mark.parametrize(
    "stored",
    [b"2:3|||k" + b"x" * 2000 + b"\n{}", b"2:3|||k{}"],
    ids=["head-past-900-bytes", "no-newline"],
)
def test_an_options_head_without_an_end_is_buried_with_a_payload_error(
    make_queue: Callable[..., Any], r: redis.Redis, stored: bytes
) -> None:
    q = make_queue()
    q.schedule({}, id="bad")
    q.schedule({}, id="good")
    r.hset(QueueKeys.for_queue("q").tasks, "bad", stored)
    assert ids_of(q.claim(10)) == ["good"]
    info = q.get("bad")
    assert info is not None and info.state == "dead"
    assert info.errors[0].type == "PayloadError"


def test_deliveries_over_more_keys_than_the_client_keeps_heads_of_each_carry_their_own_key(
    make_queue: Callable[..., Any],
) -> None:
    # the client reads each distinct options head once and keeps 16,384 of them; a claim over
    # more distinct heads than that (here keys and priorities) still gives every task its own
    q = make_queue()
    n = 17_000
    q.schedule_many(
        dueq.Task({"i": i}, id=f"t{i:05d}", key=f"k{i}", priority=i % 10) for i in range(n)
    )
    seen = 0
    while batch := q.claim(1000):
        for d in batch:
            assert d.key == f"k{d.payload['i']}" and d.priority == d.payload["i"] % 10
        seen += len(batch)
        q.ack_many(batch)
    assert seen == n


def test_a_tasks_own_timeout_fails_a_thread_handler_the_consumer_has_no_timeout_for(
    r: redis.Redis,
) -> None:
    q = dueq.Queue("t", r, lease=30, retry=dueq.RetryPolicy(max_attempts=1))
    tid = q.schedule({}, timeout=0.2)
    release, done = threading.Event(), threading.Event()
    outcomes: list[dueq.Outcome] = []

    def on_next(outcome: dueq.Outcome) -> None:
        outcomes.append(outcome)
        done.set()

    stream = q.observe().pipe(dueq.operators.process(lambda d: release.wait(WAIT_S)))
    sub = stream.subscribe(on_next=on_next)
    try:
        assert done.wait(WAIT_S)
    finally:
        release.set()
        sub.dispose()
    assert [(o.id, o.kind) for o in outcomes] == [(tid, "dead")]
    [dead] = q.dead.list()
    assert dead.errors[0].type == "TaskTimeout" and "0.2 s" in dead.errors[0].message


def test_a_tasks_own_timeout_cancels_an_async_handler(r: redis.Redis) -> None:
    async def main() -> list[dueq.Outcome]:
        client = async_mirror(r)
        q = dueq.AsyncQueue("t", client, lease=30, retry=dueq.RetryPolicy(max_attempts=1))
        await q.schedule({}, id="slow", timeout=0.2)
        await q.schedule({}, id="quick")
        cancelled: list[str] = []

        async def handle(d: dueq.AsyncDelivery) -> None:
            if d.id == "slow":
                try:
                    await asyncio.sleep(WAIT_S)
                except asyncio.CancelledError:
                    cancelled.append(d.id)
                    raise

        outcomes: list[dueq.Outcome] = []
        two = asyncio.Event()

        def on_next(o: dueq.Outcome) -> None:
            outcomes.append(o)
            if len(outcomes) == 2:
                two.set()

        sub = q.observe().pipe(dueq.operators.process(handle, concurrency=2)).subscribe(on_next)
        try:
            await asyncio.wait_for(two.wait(), WAIT_S)
        finally:
            sub.dispose()
            await client.aclose()
        assert cancelled == ["slow"]
        return outcomes

    outcomes = asyncio.run(main())
    assert sorted((o.id, o.kind) for o in outcomes) == [("quick", "acked"), ("slow", "dead")]


def test_the_cli_schedules_options_and_file_lines_override_them(
    invoke: Callable[..., Any], r: redis.Redis, tmp_path: Any
) -> None:
    result = invoke("schedule", "jobs", "{}", "--id", "one", "--priority", "7", "--key", "t:1")
    assert result.exit_code == 0, result.output
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        '{"payload": 1, "id": "a"}\n'
        '{"payload": 2, "id": "b", "priority": 2, "key": "t:2", "timeout": 1.5,'
        ' "max_attempts": 4}\n'
    )
    result = invoke("schedule", "jobs", "--file", str(tasks), "--priority", "9", "--timeout", "30")
    assert result.exit_code == 0, result.output
    q = dueq.Queue("jobs", r)
    got = {i: q.get(i) for i in ("one", "a", "b")}
    shown = {
        i: (t.priority, t.key, t.timeout, t.max_attempts) for i, t in got.items() if t is not None
    }
    assert shown == {
        "one": (7, "t:1", None, None),
        "a": (9, None, timedelta(seconds=30), None),
        "b": (2, "t:2", timedelta(seconds=1.5), 4),
    }


def test_the_cli_refuses_bad_options_before_writing(
    invoke: Callable[..., Any], r: redis.Redis, tmp_path: Any
) -> None:
    result = invoke("schedule", "jobs", "{}", "--priority", "12")
    assert result.exit_code == 2 and "priority must be an int from 0 to 9" in result.output
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"payload": 1}\n{"payload": 2, "key": ""}\n')
    result = invoke("schedule", "jobs", "--file", str(tasks))
    assert result.exit_code != 0 and "line 2" in result.output
    assert not r.exists(dueq.Queue("jobs", r).keys.tasks)
