"""Scheduling: ids, due times, idempotency (guarantee 6), cancel, reschedule, get."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import internals_support
import pytest
from servers_support import subscribe_wake

import dueq
from dueq._consume.wake import WAKE_TYPES


def test_schedule_stores_payload_and_due_time_from_delay(make_queue, clock):
    q = make_queue()
    tid = q.schedule({"to": "a@example.com"}, delay=60)
    info = q.get(tid)
    assert info is not None
    assert info.state == "scheduled"
    assert info.payload == {"to": "a@example.com"}
    assert info.attempt == 0
    assert info.due_at == datetime.fromtimestamp(clock.now + 60, tz=timezone.utc)
    assert info.errors == []


def test_schedule_at_aware_datetime_in_any_zone(make_queue, clock):
    q = make_queue()
    when = datetime(2030, 5, 1, 9, 0, tzinfo=timezone(timedelta(hours=2)))
    tid = q.schedule([1, 2], at=when)
    info = q.get(tid)
    assert info is not None and info.due_at == when


def test_schedule_without_time_is_due_now(make_queue):
    q = make_queue()
    tid = q.schedule("x")
    assert [d.id for d in q.claim()] == [tid]


def test_same_id_twice_changes_nothing(make_queue):
    q = make_queue()
    q.schedule({"v": 1}, id="welcome:42", delay=10)
    result = q.schedule_many([dueq.Task({"v": 2}, id="welcome:42", delay=99)])
    assert (result.added, result.existing, result.replaced) == (0, 1, 0)
    info = q.get("welcome:42")
    assert info is not None and info.payload == {"v": 1}
    assert q.stats().scheduled == 1


def test_same_id_is_not_duplicated_while_leased_or_dead(make_queue):
    q = make_queue(retry=dueq.RetryPolicy(max_attempts=1))
    q.schedule({"v": 1}, id="a")
    [d] = q.claim()
    assert q.schedule_many([dueq.Task({"v": 2}, id="a")]).existing == 1
    d.fail(RuntimeError("x"))
    assert q.get("a").state == "dead"
    assert q.schedule_many([dueq.Task({"v": 3}, id="a")]).existing == 1
    assert q.stats().scheduled == 0 and q.dead.count() == 1


def test_duplicate_ids_inside_one_batch_add_once(make_queue):
    q = make_queue()
    result = q.schedule_many([dueq.Task(i, id="same") for i in range(5)])
    assert (result.added, result.existing) == (1, 4)
    assert q.get("same").payload == 0


def test_replace_overwrites_payload_due_time_and_resets_attempts(make_queue, clock):
    q = make_queue()
    q.schedule({"v": 1}, id="a")
    [d] = q.claim()
    d.fail(RuntimeError("boom"))
    q.schedule({"v": 2}, id="a", delay=5, replace=True)
    info = q.get("a")
    assert info.payload == {"v": 2}
    assert info.attempt == 0 and info.errors == []
    assert info.due_at == datetime.fromtimestamp(clock.now + 5, tz=timezone.utc)


def test_replace_revokes_a_live_lease(make_queue):
    q = make_queue()
    q.schedule(1, id="a")
    [d] = q.claim()
    q.schedule(2, id="a", replace=True)
    try:
        d.ack()
    except dueq.LeaseLost as exc:
        assert exc.ids == ["a"]
    else:
        raise AssertionError("the old holder acked a replaced task")
    assert q.get("a").state == "scheduled"


def test_schedule_many_counts_and_returns_ids(make_queue):
    q = make_queue()
    tasks = [dueq.Task({"n": i}, delay=i) for i in range(2500)]
    result = q.schedule_many(tasks)
    assert result.added == 2500 and result.existing == 0
    assert len(set(result.ids)) == 2500
    again = q.schedule_many(dueq.Task({"n": i}, id=tid) for i, tid in enumerate(result.ids))
    assert (again.added, again.existing) == (0, 2500)


def test_cancel_removes_a_task_in_any_state(make_queue):
    q = make_queue(retry=dueq.RetryPolicy(max_attempts=1))
    for tid in "abc":
        q.schedule(tid, id=tid)
    leased = {d.id: d for d in q.claim(limit=2)}
    leased["a"].fail(RuntimeError("dies"))
    assert {q.get(t).state for t in "abc"} == {"dead", "leased", "scheduled"}
    assert all(q.cancel(t) for t in "abc")
    assert not q.cancel("a")
    assert [q.get(t) for t in "abc"] == [None, None, None]
    stats = q.stats()
    assert (stats.scheduled, stats.leased, stats.dead) == (0, 0, 0)


def test_reschedule_moves_only_scheduled_tasks(make_queue, clock):
    q = make_queue()
    q.schedule(1, id="a", delay=100)
    assert q.reschedule("a", delay=1)
    assert q.get("a").due_at == datetime.fromtimestamp(clock.now + 1, tz=timezone.utc)
    clock.advance(1)
    [d] = q.claim()
    assert not q.reschedule("a", delay=5)  # leased: not moved
    assert not q.reschedule("missing", delay=5)
    d.ack()


def _next_wake(pubsub, timeout: float) -> int | None:
    """The next wake message's due time, skipping subscribe confirmations."""
    message = pubsub.get_message(timeout=timeout)
    while message is not None and message["type"] not in WAKE_TYPES:
        message = pubsub.get_message(timeout=timeout)
    return None if message is None else int(message["data"])


def test_earlier_schedule_publishes_on_the_wake_channel(make_queue, r, clock):
    q = make_queue()
    pubsub = subscribe_wake(r, q.keys.wake)  # SSUBSCRIBE from Redis 7.0, SUBSCRIBE on 6.2
    now_ms = round(clock.now * 1000)
    q.schedule(1, delay=100)
    first = _next_wake(pubsub, 1)
    q.schedule(2, delay=200)  # later than the head: no wake-up
    q.schedule(3, delay=50)
    second = _next_wake(pubsub, 1)
    pubsub.close()
    assert (first, second) == (now_ms + 100_000, now_ms + 50_000)


def test_get_unknown_id_is_none(make_queue):
    assert make_queue().get("nope") is None


def test_all_keys_of_a_queue_share_one_hash_tag(make_queue, r):
    q = make_queue("emails", retry=dueq.RetryPolicy(max_attempts=1))
    q.schedule(1, id="a")
    q.schedule(2, id="b", delay=50)
    [d] = q.claim()
    d.fail(RuntimeError("x"))
    keys = [k.decode() for k in r.keys("*")]
    assert keys and all(k.startswith("dueq:{emails}:") for k in keys)


def test_a_generated_id_that_is_taken_is_retried_never_dropped(make_queue, monkeypatch):
    q = make_queue()
    q.schedule({"v": "old"}, id="taken")
    monkeypatch.setattr(
        internals_support.schedule_flows, "generated_ids", lambda: iter(["taken", "taken", "fresh"])
    )
    result = q.schedule_many([dueq.Task({"v": "new"})])
    assert (result.added, result.existing, result.ids) == (1, 0, ["fresh"])
    assert q.get("taken").payload == {"v": "old"}
    assert q.get("fresh").payload == {"v": "new"}


def test_generated_ids_are_short_and_distinct(make_queue):
    ids = make_queue().schedule_many(dueq.Task(i) for i in range(20_000)).ids
    assert all(len(i) == 12 for i in ids)
    assert len(set(ids)) == 20_000


def test_first_claimed_at_marks_the_start_of_the_retry_history(make_queue, clock):
    q = make_queue(retry=dueq.RetryPolicy(max_attempts=3, wait=lambda s: 10))
    tid = q.schedule("x")
    assert q.get(tid).first_claimed_at is None
    start = clock.now
    [d] = q.claim()
    d.fail(RuntimeError("e"))
    clock.advance(10)
    [d2] = q.claim()
    info = q.get(tid)
    assert info.first_claimed_at == datetime.fromtimestamp(start, tz=timezone.utc)
    assert (d2.claimed_ms - d2.first_claimed_ms) == 10_000


def test_large_payloads_are_sent_in_batches_bounded_by_bytes(make_queue, admin):
    q = make_queue()  # default payload limit: 1 MiB
    big = "x" * (1024 * 1024 - 16)
    q.schedule("load the script first")  # so no NOSCRIPT retry is counted below
    admin.config_resetstat()
    result = q.schedule_many(dueq.Task({"blob": big}, id=f"big{i}") for i in range(12))
    calls = int(admin.info("commandstats")["cmdstat_evalsha"]["calls"])
    assert result.added == 12
    assert calls == 2  # 12 MiB of tasks: two calls under the 8 MiB batch bound, not one
    assert q.get("big11").payload == {"blob": big}


def test_get_many_reads_the_tasks_that_exist_in_the_order_given_once_each(make_queue):
    q = make_queue()
    q.schedule({"n": 1}, id="a")
    q.schedule({"n": 2}, id="b", delay=60)
    q.schedule({"n": 3}, id="c", delay=30)
    (leased,) = q.claim(1)
    assert leased.id == "a"
    infos = q.get_many(["c", "missing", "a", "c", "b"])
    assert [(i.id, i.state, i.payload["n"]) for i in infos] == [
        ("c", "scheduled", 3),
        ("a", "leased", 1),
        ("b", "scheduled", 2),
    ]
    assert q.get_many([]) == []
    assert q.get_many(iter(["b"]))[0] == q.get("b")


def test_get_many_reads_more_ids_than_one_page_holds(make_queue):
    q = make_queue()
    q.schedule_many(dueq.Task({"i": i}, id=f"t{i:04d}", delay=60) for i in range(2500))
    infos = q.get_many(f"t{i:04d}" for i in reversed(range(2600)))
    assert [i.payload["i"] for i in infos] == list(reversed(range(2500)))


@pytest.mark.parametrize("bad", ["", "x" * 600, 42, "\ud800"], ids=["empty", "long", "int", "lone"])
def test_get_many_refuses_a_bad_id_before_it_reads_anything(make_queue, bad):
    q = make_queue()
    q.schedule({}, id="a")
    with pytest.raises(dueq.InvalidTaskError):
        q.get_many(["a", bad])
    with pytest.raises(dueq.InvalidTaskError, match="iterable of ids"):
        q.get_many("a")
