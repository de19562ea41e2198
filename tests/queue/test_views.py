"""Task views (list page by page, run now, lease holders) and the per-minute history, on both
front ends (``make_queue``), against a real Redis."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from internals_support import protocol

import dueq
from dueq import worker_id


def _all(q: Any, state: str, limit: int = 100, **filters: Any) -> list[dueq.TaskInfo]:
    """Every task of a listing, following cursors by hand (and never more pages than tasks)."""
    found: list[dueq.TaskInfo] = []
    cursor = None
    for _ in range(10_000):
        page = q.list_tasks(state, limit=limit, cursor=cursor, **filters)
        assert len(page.tasks) <= limit
        found += page.tasks
        cursor = page.cursor
        if cursor is None:
            return found
    raise AssertionError("the listing never ended")


def test_scheduled_tasks_list_by_priority_then_due_then_parked_each_once(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue("v")
    q.configure(key_concurrency=1)
    q.schedule_many(
        [
            dueq.Task("late", id="late", delay=60),
            dueq.Task("soon", id="soon", delay=10),
            dueq.Task("urgent", id="urgent", delay=30, priority=5),
            dueq.Task("k1", id="k1", key="tenant"),
            dueq.Task("k2", id="k2", key="tenant"),
        ]
    )
    [held] = q.claim(1)  # k1 or k2 is leased; the other is parked on the next claim
    assert q.claim(5) == []
    parked = "k2" if held.id == "k1" else "k1"
    ids = [t.id for t in _all(q, "scheduled", limit=2)]
    assert ids == ["urgent", "soon", "late", parked]
    assert [t.state for t in _all(q, "scheduled")] == ["scheduled"] * 4
    assert _all(q, "scheduled", limit=1)[1].due_at == datetime.fromtimestamp(clock.now + 10, UTC)


def test_tasks_due_at_the_same_ms_page_through_without_repeats_or_gaps(
    make_queue: Callable[..., Any],
) -> None:
    q = make_queue("v")
    at = datetime(2030, 1, 1, tzinfo=UTC)
    q.schedule_many(dueq.Task(i, id=f"t{i:03d}", at=at) for i in range(250))
    first = q.list_tasks("scheduled", limit=100)
    # tasks before and at the cursor leave between pages: the rest still comes exactly once
    q.cancel(first.tasks[-1].id)
    q.cancel(first.tasks[0].id)
    rest: list[str] = []
    cursor = first.cursor
    while cursor is not None:
        page = q.list_tasks("scheduled", limit=100, cursor=cursor)
        rest += [t.id for t in page.tasks]
        cursor = page.cursor
    assert [t.id for t in first.tasks] + rest == [f"t{i:03d}" for i in range(250)]


def test_a_filter_looks_at_a_bounded_number_of_tasks_per_call(
    make_queue: Callable[..., Any],
) -> None:
    q = make_queue("v")
    q.schedule_many(dueq.Task({"n": i}, id=f"t{i:04d}", delay=i) for i in range(1500))
    page = q.list_tasks("scheduled", limit=10, grep='"n":1499')
    assert page.tasks == [] and page.cursor is not None and page.looked_at == 1000
    assert [t.id for t in q.iter_tasks("scheduled", grep='"n":1499')] == ["t1499"]
    assert [t.id for t in _all(q, "scheduled", id_prefix="t149")] == [f"t149{i}" for i in range(10)]


def test_the_due_window_bounds_the_listing(make_queue: Callable[..., Any], clock: Any) -> None:
    q = make_queue("v")
    q.schedule_many(dueq.Task(i, id=f"t{i}", delay=i * 60) for i in range(10))
    start = datetime.fromtimestamp(clock.now, UTC)
    found = _all(
        q, "scheduled", after=start + timedelta(minutes=3), before=start + timedelta(minutes=5)
    )
    assert [t.id for t in found] == ["t3", "t4", "t5"]


def test_leased_tasks_name_their_holder(make_queue: Callable[..., Any]) -> None:
    q = make_queue("v")
    q.schedule_many(dueq.Task(i, id=f"t{i}") for i in range(3))
    q.claim(1)
    make_queue("v", holder="worker-7").claim(1)
    q.claim_batch(1, holder="host-b:42")
    holders = {t.id: t.holder for t in _all(q, "leased")}
    assert holders == {
        "t0": worker_id(),  # the default: this process's worker id, as in logs and metrics
        "t1": "worker-7",
        "t2": "host-b:42",
    }
    assert q.get("t1").holder == "worker-7"
    assert {t.holder for t in _all(q, "scheduled")} == set()


def test_a_delivery_from_a_named_holder_settles_as_any_other(
    make_queue: Callable[..., Any],
) -> None:
    q = make_queue("v", holder="w@1")
    q.schedule("x", id="x")
    [d] = q.claim()
    d.extend(5)
    d.ack()
    assert q.get("x") is None and q.stats().counters["acked"] == 1


@pytest.mark.parametrize("holder", ["", "a|b", "x" * 33, "tab\there", 7])
def test_a_holder_that_cannot_be_kept_is_refused(
    make_queue: Callable[..., Any], holder: Any
) -> None:
    with pytest.raises(dueq.ConfigurationError):
        make_queue("v", holder=holder)
    q = make_queue("v")
    with pytest.raises(dueq.ConfigurationError):
        q.claim_batch(1, holder=holder)


def test_dead_tasks_filter_by_their_last_error_type_and_replay_by_it(
    make_queue: Callable[..., Any],
) -> None:
    q = make_queue("v", retry=dueq.RetryPolicy(max_attempts=1))
    q.schedule_many(dueq.Task(i, id=f"t{i}") for i in range(6))
    for d in q.claim(6):
        d.fail(TimeoutError("smtp") if int(d.id[1]) % 2 else ValueError("bad"))
    timeouts = _all(q, "dead", error_type="TimeoutError")
    assert [t.id for t in timeouts] == ["t5", "t3", "t1"]  # newest first (one died-at: by id)
    assert q.dead.replay(error_type="TimeoutError") == 3
    assert sorted(t.id for t in _all(q, "scheduled")) == ["t1", "t3", "t5"]
    assert q.dead.purge(error_type="ValueError") == 3
    assert q.dead.count() == 0
    with pytest.raises(dueq.InvalidTaskError):
        q.dead.replay(["t1"], error_type="TimeoutError")


def test_dead_tasks_list_newest_first_as_dead_list_does_and_page_without_repeats(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue("v", retry=dueq.RetryPolicy(max_attempts=1))
    start = datetime.fromtimestamp(clock.now, UTC)
    q.schedule_many(dueq.Task(i, id=f"t{i:03d}") for i in range(250))
    for _ in range(5):  # 50 die each second: ties at one died-at go by id, descending
        for d in q.claim(50):
            d.fail("boom")
        clock.advance(1)
    newest = sorted((f"t{i:03d}" for i in range(250)), reverse=True)
    assert [t.id for t in q.dead.list(limit=250)] == newest  # offset paging: newest first
    assert [t.id for t in _all(q, "dead", limit=7)] == newest  # cursor paging: the same order
    first = q.list_tasks("dead", limit=100)
    assert [t.id for t in first.tasks] == newest[:100]
    # tasks at and before the cursor leave, new ones die: the rest still comes exactly once
    q.dead.purge([first.tasks[-1].id, first.tasks[0].id, newest[150]])
    q.schedule("late", id="late")
    [d] = q.claim()
    d.fail("boom")
    rest: list[str] = []
    cursor = first.cursor
    while cursor is not None:
        page = q.list_tasks("dead", limit=100, cursor=cursor)
        rest += [t.id for t in page.tasks]
        cursor = page.cursor
    assert rest == [i for i in newest[100:] if i != newest[150]]
    window = _all(
        q, "dead", limit=20, after=start + timedelta(seconds=1), before=start + timedelta(seconds=2)
    )
    # died 1 s and 2 s after the start (less the purged one)
    assert [t.id for t in window] == [i for i in newest[100:200] if i != newest[150]]


def test_run_now_makes_scheduled_and_dead_tasks_due_and_leaves_leased_ones(
    make_queue: Callable[..., Any],
) -> None:
    q = make_queue("v", retry=dueq.RetryPolicy(max_attempts=1))
    q.schedule_many(
        [
            dueq.Task("later", id="later", delay=3600),
            dueq.Task("dies", id="dies"),
            dueq.Task("runs", id="runs", delay=1800),
        ]
    )
    [d] = q.claim()
    d.fail("boom")
    assert q.run_now("later") and q.run_now("dies")
    assert q.get("dies").state == "scheduled" and q.get("dies").errors == []
    claimed = q.claim(5)
    assert sorted(x.id for x in claimed) == ["dies", "later"]
    assert not q.run_now("dies")  # leased: running already
    assert not q.run_now("missing")
    assert q.get("runs").state == "scheduled"


def test_bad_listing_arguments_are_refused(make_queue: Callable[..., Any]) -> None:
    q = make_queue("v")
    with pytest.raises(dueq.InvalidTaskError):
        q.list_tasks("running")
    with pytest.raises(dueq.InvalidTaskError):
        q.list_tasks("dead", cursor="not-a-cursor")
    with pytest.raises(dueq.ConfigurationError):
        q.list_tasks("dead", limit=0)
    with pytest.raises(dueq.InvalidTaskError):
        q.list_tasks("dead", grep=b"x")
    q.schedule("x", delay=5)
    page = q.list_tasks("scheduled", limit=1)
    with pytest.raises(dueq.InvalidTaskError):
        q.list_tasks("leased", cursor=page.cursor or "")


def test_history_counts_each_minute_of_a_simulated_hour(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    clock.now = 1_800_000_000.0 - 1_800_000_000.0 % 60  # the start of a minute
    q = make_queue("h", lease=30, retry=dueq.RetryPolicy(max_attempts=2, wait=lambda s: 1.0))
    for minute in range(60):
        q.schedule_many(dueq.Task(minute, id=f"m{minute}-{i}") for i in range(minute % 4 + 1))
        for d in q.claim(10):  # new tasks and the last minute's retries
            if d.id == f"m{minute}-0":
                d.ack()
            else:
                d.fail("retry me")  # a new one is retried, a retried one dies
        clock.advance(60)
    clock.advance(-60)  # the last minute of the hour is the current one
    points = q.history(60)
    assert [p.minute for p in points] == [
        datetime.fromtimestamp(clock.now - 60 * (59 - i), UTC) for i in range(60)
    ]
    for minute, p in enumerate(points):
        n = minute % 4 + 1
        retried_before = 0 if minute == 0 else (minute - 1) % 4
        assert (p.scheduled, p.acked, p.retried) == (n, 1, n - 1), minute
        assert p.claimed == n + retried_before, minute  # last minute's retries run again
        assert p.dead == (retried_before if minute else 0), minute
    assert sum(p.acked for p in q.history(1440)) == 60


def test_history_keeps_one_day_and_leases_that_expire_count_in_their_minute(
    make_queue: Callable[..., Any], r: Any, clock: Any
) -> None:
    q = make_queue("h", lease=30)
    q.schedule("a", id="a")
    q.claim()
    clock.advance(3600 * 25)
    q.schedule("b", id="b")
    q.claim()  # a's lease expired (a waits out its backoff); b is claimed
    [now] = q.history(1)
    assert (now.scheduled, now.expired, now.claimed) == (1, 1, 1)
    assert sum(p.scheduled for p in q.history(1440)) == 1  # the day-old minute is gone
    fields = r.hkeys(q.keys.history)
    assert len(fields) <= 1 + 6  # "last" and this minute's counters only


def test_due_histogram_counts_every_priority_and_parked_tasks(
    make_queue: Callable[..., Any],
) -> None:
    q = make_queue("h")
    q.schedule_many(
        [
            dueq.Task(0, delay=0),
            dueq.Task(1, delay=30),
            dueq.Task(2, delay=61, priority=3),
            dueq.Task(3, delay=120),
            dueq.Task(4, delay=10_000),
        ]
    )
    histogram = q.due_histogram(bucket=60, buckets=2)
    assert (histogram.overdue, histogram.counts, histogram.later) == (1, [1, 2], 1)
    assert histogram.bucket == timedelta(seconds=60)
    with pytest.raises(dueq.ConfigurationError):
        q.due_histogram(bucket=60, buckets=0)


def test_history_stays_in_the_queues_own_key(make_queue: Callable[..., Any]) -> None:
    q = make_queue("h")
    call = protocol.history(q.keys, "", minutes=1, bucket_ms=1, buckets=1)
    assert call.keys[0] == q.keys.history and q.keys.history in q.keys.names()


def test_an_unreadable_history_restarts_and_never_stops_a_script(
    make_queue: Callable[..., Any], r: Any, clock: Any
) -> None:
    q = make_queue("h")
    q.schedule("a", id="a")
    [now] = q.history(1)
    minute = int(now.minute.timestamp()) // 60
    r.hset(q.keys.history, f"{minute}|scheduled", "not a number")
    q.schedule("b", id="b")  # the bucket restarts at this call's count
    assert q.history(1)[0].scheduled == 1
    r.hset(q.keys.history, "last", "garbage")
    q.schedule("c", id="c")  # the whole history restarts
    assert q.history(1)[0].scheduled == 1
    assert [t.id for t in _all(q, "scheduled")] == ["a", "b", "c"]


def test_a_clock_that_went_back_counts_in_its_own_minute_while_in_the_window(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue("h")
    q.schedule("a", id="a")
    clock.advance(120)
    q.schedule("b", id="b")
    clock.advance(-120)
    q.schedule("c", id="c")  # another producer's clock, two minutes behind
    clock.advance(120)
    assert [p.scheduled for p in q.history(3)] == [2, 0, 1]
    clock.advance(-3600 * 25)  # older than the window: not kept, nothing else changes
    q.schedule("d", id="d")
    clock.advance(3600 * 25)
    assert [p.scheduled for p in q.history(3)] == [2, 0, 1]
