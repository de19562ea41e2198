"""Expiry (``expires=``: a task never starts after it) and debounce (``debounce=`` with
``max_wait=``), enforced by the scripts; and cancel waking consumers capped by
``configure(concurrency=N)``. Contract tests on both front ends, on the queue's manual clock;
the worker tests run on real time."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import redis
from servers_support import subscribe_wake
from waiting_support import wait_for

import dueq
from dueq._consume.wake import WAKE_TYPES
from dueq._wire.keys import QueueKeys

WAIT_S = 10.0


def test_an_expired_task_is_never_leased_and_ends_expired(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue()
    q.configure(keep_results=3600)
    q.schedule({"n": 1}, id="late", expires=timedelta(seconds=10))
    q.schedule({"n": 2}, id="fresh", expires=timedelta(minutes=10))
    clock.advance(11)
    assert [d.id for d in q.claim(10)] == ["fresh"]
    info = q.get("late")
    assert info is not None and info.state == "expired" and info.payload == {"n": 1}
    assert q.wait("late", timeout=0).state == "expired"
    assert q.stats().counters.get("expired_tasks") == 1
    assert [t.id for t in q.list_tasks("expired").tasks] == ["late"]


def test_an_expired_task_without_keep_results_is_gone_and_still_counted(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue()
    at = datetime.fromtimestamp(clock() + 5, timezone.utc)
    q.schedule({"n": 1}, id="late", delay=10, expires=at)
    clock.advance(10)
    assert q.claim(10) == []
    assert q.get("late") is None
    stats = q.stats()
    assert stats.counters.get("expired_tasks") == 1 and stats.scheduled == 0


def test_a_retry_that_would_start_past_the_expiry_ends_expired_not_dead(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue()  # retries wait 10 s
    q.configure(keep_results=3600)
    q.schedule({}, id="t", expires=timedelta(seconds=5), max_attempts=5)
    (d,) = q.claim(1)
    outcome = d.fail(ValueError("boom"))
    assert outcome.kind == "expired"
    info = q.get("t")
    assert info is not None and info.state == "expired"
    assert [e.type for e in info.errors] == ["ValueError"]
    assert q.dead.count() == 0


def test_a_retrying_task_waiting_past_its_expiry_ends_expired_when_claimed(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue()
    q.schedule({}, id="t", expires=timedelta(seconds=30))
    (d,) = q.claim(1)
    d.fail(ValueError("boom"), retry_in=5)  # before its expiry: retried
    clock.advance(31)
    assert q.claim(1) == [] and q.dead.count() == 0
    assert q.stats().counters.get("expired_tasks") == 1


# A lease that runs out (the worker died or hung) is judged as a failed attempt is: when the
# retry would start at or after the task's expiry, the task ends "expired" (the same record,
# counters, ended channel, event and batch count as an expiry at claim time), not retried.


def _expired_kinds(r: redis.Redis, queue: str) -> list[tuple[str, str]]:
    """(id, kind) of each outcome event in the queue's events stream, in order."""
    stream = r.xrange(QueueKeys.for_queue(queue).events)
    return [(fields[b"id"].decode(), fields[b"kind"].decode()) for _, fields in stream]


def test_a_lease_that_runs_out_past_the_expiry_ends_expired_not_retried(
    make_queue: Callable[..., Any], clock: Any, r: redis.Redis
) -> None:
    q = make_queue(lease=30)  # retries wait 10 s
    q.configure(keep_results=3600, events=timedelta(hours=1))
    q.schedule({"n": 1}, id="t", expires=timedelta(seconds=60), batch="b")
    q.close_batch("b")
    assert len(q.claim(1)) == 1
    clock.advance(61)  # the lease ran out at 30 s; reclaimed after the expiry
    assert q.claim(10) == []
    info = q.get("t")
    assert info is not None and info.state == "expired" and info.attempt == 1
    assert [e.type for e in info.errors] == ["LeaseExpired"]
    assert q.wait("t", timeout=0).state == "expired"
    counters = q.stats().counters
    assert counters.get("expired_tasks") == 1 and counters.get("expired") == 1
    assert counters.get("retried", 0) == 0 and q.stats().scheduled == 0
    assert [t.id for t in q.list_tasks("expired").tasks] == ["t"]
    assert _expired_kinds(r, "q") == [("t", "expired")]
    batch = q.batch("b")
    assert batch is not None and (batch.expired, batch.complete) == (1, True)
    (point,) = [p for p in q.history(minutes=5) if p.expired or p.retried]
    assert (point.expired, point.retried) == (1, 0)


def test_a_lease_whose_retry_would_start_past_the_expiry_ends_expired(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue(lease=30)  # retries wait 10 s: at 41 s, past the expiry at 35 s
    q.schedule({}, id="t", expires=timedelta(seconds=35))
    q.claim(1)
    clock.advance(31)
    assert q.claim(10) == []
    assert q.get("t") is None and q.dead.count() == 0
    assert q.stats().counters.get("expired_tasks") == 1


def test_a_lease_that_runs_out_before_the_expiry_is_still_retried(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue(lease=30)
    q.schedule({}, id="t", expires=timedelta(seconds=120))
    q.claim(1)
    clock.advance(31)
    assert q.claim(10) == []  # back to due in 10 s, before its expiry
    info = q.get("t")
    assert info is not None and info.state == "scheduled"
    clock.advance(10)
    (d,) = q.claim(1)
    assert d.attempt == 2
    assert q.stats().counters.get("expired_tasks", 0) == 0


def test_a_last_attempts_lease_that_runs_out_past_the_expiry_ends_dead_as_a_fail_would(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue(lease=30)
    q.schedule({}, id="t", expires=timedelta(seconds=60), max_attempts=1)
    q.claim(1)
    clock.advance(61)
    assert q.claim(10) == []
    assert q.dead.count() == 1 and q.stats().counters.get("expired_tasks", 0) == 0


def test_schedule_many_carries_expiry_and_other_options(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue()
    q.schedule_many(
        [
            dueq.Task({"i": 1}, id="a", expires=timedelta(seconds=1), priority=3, key="k|x"),
            dueq.Task({"i": 2}, id="b", expires=timedelta(hours=1), priority=3, key="k|x"),
        ]
    )
    clock.advance(2)
    (d,) = q.claim(10)
    assert (d.id, d.options.priority, d.options.key) == ("b", 3, "k|x")
    assert d.options.expires_ms == round((clock() - 2) * 1000) + 3_600_000


def test_a_task_without_expiry_is_stored_exactly_as_before(
    make_queue: Callable[..., Any], r: redis.Redis
) -> None:
    q = make_queue()
    q.schedule({"to": "a"}, id="plain")
    q.schedule({"to": "a"}, id="opts", priority=2)
    q.schedule({"to": "a"}, id="exp", expires=timedelta(minutes=1))
    assert r.hget(q.keys.tasks, "plain") == b'1:{"to":"a"}'
    assert r.hget(q.keys.tasks, "opts") == b'2:2|||\n{"to":"a"}'
    assert r.hget(q.keys.tasks, "exp").startswith(b"3:0|||")  # type: ignore[union-attr]
    assert r.hlen(q.keys.meta) == 0 and not r.exists(q.keys.debounce)
    # memory per task: the plain one is as small as ever (the envelope is the whole cost)
    assert r.memory_usage(q.keys.tasks) is not None


def test_a_worker_never_calls_the_handler_for_an_expired_task(r: redis.Redis) -> None:
    q = dueq.Queue("wexp", r)
    q.schedule({"n": 0}, id="late", expires=timedelta(milliseconds=1))
    wait_for(
        lambda: q.stats().now.timestamp() * 1000 > q.get("late").due_at.timestamp() * 1000 + 5,  # type: ignore[union-attr]
        "the expiry to pass",
    )
    q.schedule({"n": 1}, id="ok", expires=timedelta(minutes=5))
    seen: list[str] = []
    worker = dueq.Worker(q, lambda d: seen.append(d.id), concurrency=1)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_for(lambda: seen == ["ok"], "the fresh task to run")
    finally:
        worker.stop()
        thread.join(WAIT_S)
    assert seen == ["ok"]
    assert q.stats().counters.get("expired_tasks") == 1


def test_an_async_worker_never_calls_the_handler_for_an_expired_task(
    redis_server: Any,
) -> None:
    import redis.asyncio

    async def main() -> list[str]:
        client = redis.asyncio.Redis.from_url(redis_server.url)
        q = dueq.AsyncQueue("awexp", client)
        await q.schedule({"n": 0}, id="late", expires=timedelta(milliseconds=1))
        await asyncio.sleep(0.05)
        await q.schedule({"n": 1}, id="ok")
        seen: list[str] = []
        worker = dueq.AsyncWorker(q, lambda d: seen.append(d.id), concurrency=1)
        task = asyncio.ensure_future(worker.run())
        for _ in range(500):
            if seen:
                break
            await asyncio.sleep(0.01)
        worker.stop()
        await asyncio.wait_for(task, WAIT_S)
        assert (await q.stats()).counters.get("expired_tasks") == 1
        await client.aclose()
        return seen

    assert asyncio.run(main()) == ["ok"]


def test_expiry_is_validated(make_queue: Callable[..., Any]) -> None:
    q = make_queue()
    with pytest.raises(dueq.InvalidTaskError):
        q.schedule({}, expires=timedelta(0))
    with pytest.raises(dueq.InvalidTaskError):
        q.schedule({}, expires=datetime(2030, 1, 1))  # naive


# -- debounce ------------------------------------------------------------------------------


def test_debounce_runs_once_with_the_last_payload(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue()
    for n in range(4):
        q.schedule({"n": n}, id="reindex:42", debounce=timedelta(seconds=5))
        clock.advance(2)
        assert q.claim(10) == []  # each call moved it to that call + 5 s
    clock.advance(3)
    (d,) = q.claim(10)
    assert d.payload == {"n": 3}
    d.ack()
    assert q.claim(10) == [] and q.stats().scheduled == 0


def test_debounce_never_waits_past_max_wait(make_queue: Callable[..., Any], clock: Any) -> None:
    q = make_queue()
    start = clock()
    for n in range(10):  # a call every 2 s, each within the debounce of 5 s
        q.schedule({"n": n}, id="r", debounce=timedelta(seconds=5), max_wait=timedelta(seconds=12))
        if q.get("r").state == "scheduled":  # type: ignore[union-attr]
            assert q.get("r").due_at.timestamp() <= start + 12  # type: ignore[union-attr]
        clock.advance(2)
        got = q.claim(10)
        if got:
            break
    assert clock() - start <= 14
    (d,) = got
    assert d.due_at.timestamp() == start + 12


def test_a_debounced_schedule_while_running_keeps_one_follow_up_and_the_lease(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue()
    q.schedule({"n": 0}, id="r", debounce=timedelta(seconds=1))
    clock.advance(1)
    (running,) = q.claim(1)
    for n in (1, 2, 3):
        q.schedule({"n": n}, id="r", debounce=timedelta(seconds=1))
    assert q.get("r").state == "leased"  # type: ignore[union-attr]
    clock.advance(5)  # the follow-up's own time has come, but the run has not ended
    assert q.claim(10) == []
    running.extend(30)  # the lease was never revoked
    running.ack()
    (follow,) = q.claim(10)  # due at once: its own time was before the run ended
    assert (follow.id, follow.payload, follow.attempt) == ("r", {"n": 3}, 1)
    follow.ack()
    assert q.claim(10) == [] and q.stats().scheduled == 0


def test_a_follow_up_waits_for_its_own_time_after_a_short_run(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue()
    q.schedule({"n": 0}, id="r", debounce=timedelta(seconds=1))
    clock.advance(1)
    (running,) = q.claim(1)
    q.schedule({"n": 1}, id="r", debounce=timedelta(seconds=10))
    running.ack()
    assert q.claim(10) == []
    clock.advance(10)
    (follow,) = q.claim(10)
    assert follow.payload == {"n": 1}


def test_a_follow_up_starts_when_the_run_ends_dead(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue()
    q.schedule({"n": 0}, id="r", debounce=timedelta(seconds=1))
    clock.advance(1)
    (running,) = q.claim(1)
    q.schedule({"n": 1}, id="r", debounce=timedelta(seconds=1))
    assert running.fail(dueq.Unrecoverable("no")).kind == "dead"
    clock.advance(1)
    (follow,) = q.claim(10)
    assert follow.payload == {"n": 1}


def test_cancel_drops_the_follow_up_too(make_queue: Callable[..., Any], clock: Any) -> None:
    q = make_queue()
    q.schedule({"n": 0}, id="r", debounce=timedelta(seconds=1))
    clock.advance(1)
    assert len(q.claim(1)) == 1
    q.schedule({"n": 1}, id="r", debounce=timedelta(seconds=1))
    assert q.cancel("r")
    clock.advance(5)
    assert q.claim(10) == [] and q.get("r") is None


def test_debounce_needs_an_id_and_no_due_time(make_queue: Callable[..., Any]) -> None:
    q = make_queue()
    with pytest.raises(dueq.InvalidTaskError):
        q.schedule({}, debounce=5)
    with pytest.raises(dueq.InvalidTaskError):
        q.schedule({}, id="x", debounce=5, delay=3)
    with pytest.raises(dueq.InvalidTaskError):
        q.schedule({}, id="x", debounce=5, max_wait=2)
    with pytest.raises(dueq.InvalidTaskError):
        q.schedule({}, id="x", max_wait=2)


# -- cancel at the concurrency cap -----------------------------------------------------------


def test_cancelling_a_lease_at_the_cap_wakes_capped_consumers(
    make_queue: Callable[..., Any], r: redis.Redis
) -> None:
    q = make_queue()
    q.configure(concurrency=2)
    q.schedule_many(dueq.Task({}, id=f"t{i}") for i in range(4))
    a, b = q.claim(10)
    pubsub = subscribe_wake(r, q.keys.wake)
    try:

        def wakes() -> int:
            n = 0
            while (m := pubsub.get_message(timeout=0.2)) is not None:
                n += m["type"] in WAKE_TYPES
            return n

        wakes()  # the subscribe confirmation
        assert q.cancel(a.id)  # the queue was at its cap: a capped consumer must hear of it
        assert wakes() == 1
        assert q.cancel(b.id)  # below the cap: nobody is capped, no wake
        assert wakes() == 0
    finally:
        pubsub.close()


def test_the_cli_schedules_with_expiry_and_debounce_and_show_names_the_expiry(
    invoke: Callable[..., Any], r: redis.Redis
) -> None:
    out = invoke("schedule", "cliexp", '{"a": 1}', "--id", "x", "--expires", "600")
    assert out.exit_code == 0, out.output
    shown = invoke("show", "cliexp", "x")
    assert shown.exit_code == 0 and "expires:" in shown.output, shown.output
    for n in (1, 2):
        out = invoke(
            "schedule",
            "cliexp",
            f'{{"n": {n}}}',
            "--id",
            "d",
            "--debounce",
            "60",
            "--max-wait",
            "120",
        )
        assert out.exit_code == 0, out.output
    info = dueq.Queue("cliexp", r).get("d")
    assert info is not None and info.payload == {"n": 2}
    bad = invoke("schedule", "cliexp", "{}", "--debounce", "5")
    assert bad.exit_code != 0  # debounce needs an id
