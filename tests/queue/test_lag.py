"""Lag (issue 27): how long a claimable task has waited, counted from when it became due or
was scheduled, whichever is later. A due time in the past is stored as the time it was
scheduled, so ``stats().oldest_due_lag_s`` (and the CLI, the dashboard and the Prometheus
gauge, which all read it) never reports a task as years late."""

from __future__ import annotations

import re
from datetime import datetime, timezone

from internals_support import protocol, script_runner
from paths_support import DOCS

import dueq
from dueq._util.clock import ms_datetime
from dueq._wire.envelope import ENVELOPE_PREFIX, FLAG_ABSOLUTE, pack_task
from dueq._wire.keys import SparkBatchKeys
from dueq.metrics import QueueCollector, new_registry

Y2020 = datetime(2020, 1, 1, tzinfo=timezone.utc)


def at_clock(clock) -> datetime:
    return ms_datetime(round(clock() * 1000))


def test_a_task_scheduled_at_a_past_time_lags_under_a_minute_by_the_server_clock(make_queue):
    q = make_queue(clock=None)  # Redis TIME, as `dueq schedule Q '{}' --at 2020-...` runs
    q.schedule({}, id="old", at=Y2020)
    stats = q.stats()
    assert stats.due_now == 1
    assert 0 <= stats.oldest_due_lag_s < 60


def test_a_past_at_is_stored_as_the_time_it_was_scheduled_and_lag_counts_from_there(
    make_queue, clock
):
    q = make_queue()
    q.schedule("x", id="old", at=Y2020)
    assert q.get("old").due_at == at_clock(clock)
    assert q.stats().oldest_due_lag_s == 0.0
    clock.advance(5)
    assert q.stats().oldest_due_lag_s == 5.0


def test_schedule_many_stores_past_times_as_the_time_it_was_scheduled(make_queue, clock):
    q = make_queue()
    q.schedule_many(
        [
            dueq.Task("a", id="a", at=Y2020),
            dueq.Task("b", id="b", at=datetime(2019, 6, 1, tzinfo=timezone.utc)),
            dueq.Task("c", id="c", delay=60),
        ]
    )
    assert [q.get(i).due_at for i in "ab"] == [at_clock(clock)] * 2
    assert q.get("c").due_at == ms_datetime(round((clock() + 60) * 1000))
    stats = q.stats()
    assert (stats.due_now, stats.oldest_due_lag_s) == (2, 0.0)


def test_reschedule_to_a_past_time_makes_the_task_due_at_the_time_of_the_call(make_queue, clock):
    q = make_queue()
    q.schedule("x", id="t", delay=3600)
    clock.advance(10)
    assert q.reschedule("t", at=Y2020)
    assert q.get("t").due_at == at_clock(clock)
    assert q.stats().oldest_due_lag_s == 0.0


def test_a_past_at_runs_before_tasks_scheduled_later_and_after_tasks_already_waiting(
    make_queue, clock
):
    q = make_queue()
    q.schedule("waiting", id="waiting")  # due now, not claimed yet: genuinely late soon
    clock.advance(10)
    q.schedule("past", id="past", at=Y2020)
    clock.advance(1)
    q.schedule("later", id="later")
    q.schedule("later-past", id="later-past", at=Y2020)
    assert q.stats().oldest_due_lag_s == 11.0  # the task that really waited
    claimed = [d.id for d in q.claim(limit=10)]
    # first come, first served: a past time does not jump the queue (priority= does)
    assert claimed[:2] == ["waiting", "past"]
    assert set(claimed[2:]) == {"later", "later-past"}  # due the same ms: order by id


def test_scheduling_an_existing_id_again_at_a_past_time_changes_nothing_and_replace_moves_it(
    make_queue, clock
):
    q = make_queue()
    q.schedule("x", id="t")
    first = at_clock(clock)
    clock.advance(30)
    result = q.schedule_many([dueq.Task("x", id="t", at=Y2020)])
    assert (result.added, result.existing) == (0, 1)
    assert q.get("t").due_at == first
    assert q.stats().oldest_due_lag_s == 30.0
    q.schedule("y", id="t", at=Y2020, replace=True)
    assert q.get("t").due_at == at_clock(clock)
    assert q.stats().oldest_due_lag_s == 0.0


def test_the_prometheus_lag_gauge_reads_the_same_honest_lag(r, clock):
    q = dueq.Queue("lag", r, clock=clock)
    q.schedule({}, at=Y2020)
    clock.advance(2)
    registry = new_registry(process=False)
    registry.register(QueueCollector(r, ["lag"], clock=clock))
    gauge = {
        s.labels["queue"]: s.value
        for family in registry.collect()
        for s in family.samples
        if s.name == "dueq_oldest_due_lag_seconds"
    }
    assert gauge == {"lag": q.stats().oldest_due_lag_s} == {"lag": 2.0}


def test_a_streaming_commit_stores_a_past_due_time_as_the_time_it_was_committed(r, clock):
    # the Spark data source's path (spark_stage.lua, then spark_commit.lua falling through
    # into schedule.lua), driven without Spark
    q = dueq.Queue("stream", r, clock=clock)
    run = script_runner(q)
    sk = SparkBatchKeys.for_batch("stream", "query", 0)
    due_ms = int(Y2020.timestamp() * 1000)
    blob = pack_task(FLAG_ABSOLUTE, due_ms, "row-1", ENVELOPE_PREFIX + b'{"n":1}')
    for call in (
        protocol.spark_stage(sk, q.now_arg(), "query", 0, 60_000, blob),
        protocol.spark_commit(
            q.keys, sk, q.now_arg(), query="query", batch=0, memory_ms=60_000, window_ms=0
        ),
    ):
        call.parse(run.run(call.script, call.keys, call.args))
    assert q.get("row-1").due_at == at_clock(clock)
    assert q.stats().oldest_due_lag_s == 0.0


def test_the_lag_page_example_runs_as_written(r):
    page = DOCS / "lag.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    assert len(blocks) == 1
    exec(compile(blocks[0], str(page), "exec"), {"r": r})  # its asserts are the test


def test_a_sharded_queue_stores_past_times_as_the_time_they_were_scheduled(make_queue, clock):
    q = make_queue("sharded", shards=3)
    q.schedule_many(dueq.Task(n, id=f"t{n}", at=Y2020) for n in range(6))
    assert q.reschedule("t0", at=Y2020)
    clock.advance(4)
    stats = q.stats()
    assert (stats.due_now, stats.oldest_due_lag_s) == (6, 4.0)
