"""Cron policies (issue 29): every=, start/end, limit, jitter, overlap, catch-up window, pause
after failures, task options and backfill, on both front ends against a real Redis.

Slot logic runs on the queue's manual clock (``clock`` fixture, epoch seconds moved by hand);
one overlap test runs in real time with a handler slower than its interval.
"""

from __future__ import annotations

import itertools
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import redis
from servers_support import subscribe_wake
from waiting_support import wait_for

import dueq
from dueq.cron.flows import occurrence_id, parse_occurrence_id


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, timezone.utc)


def slots_of(ids: list[str]) -> list[int]:
    return [parsed[1] for i in ids if (parsed := parse_occurrence_id(i))]


def claim_ids(q: Any, ack: bool = True) -> list[str]:
    got = q.claim(limit=100)
    if ack:
        for d in got:
            d.ack()
    return [d.id for d in got]


def run_every(q: Any, clock: Any, seconds: float, step: float) -> list[str]:
    """Move the clock by ``step`` until ``seconds`` passed, claiming and acking all due."""
    fired: list[str] = []
    end = clock.now + seconds
    while clock.now < end:
        clock.advance(step)
        fired += claim_ids(q)
    return fired


# -- every=, offset, start/end, limit, jitter ----------------------------------------------------


def test_every_slots_are_epoch_multiples_plus_offset_the_same_in_every_process(make_queue, clock):
    clock.now = 1_800_000_007.0
    q1, q2 = make_queue("p"), make_queue("p")
    every, offset = timedelta(minutes=5), timedelta(seconds=10)
    assert q1.cron.add("poll", every=every, offset=offset) == "added"
    assert q2.cron.add("poll", every=every, offset=offset) == "unchanged"
    fired = run_every(q1, clock, 1200, 7)
    slot_ms = slots_of(fired)
    assert slot_ms == [1_800_000_010_000 + n * 300_000 for n in range(5)]
    assert all(ms % 300_000 == 10_000 for ms in slot_ms)
    definition = q2.cron.get("poll")
    assert definition.every == every and definition.offset == offset and definition.expr == ""


def test_expr_and_every_are_exclusive_and_every_is_whole_seconds(make_queue):
    q = make_queue("p")
    with pytest.raises(dueq.CronError):
        q.cron.add("x", "* * * * *", every=60)
    with pytest.raises(dueq.CronError):
        q.cron.add("x")
    with pytest.raises(dueq.CronError):
        q.cron.add("x", every=1.5)
    with pytest.raises(dueq.CronError):
        q.cron.add("x", every=60, offset=60)
    assert q.cron.list() == []


def test_no_firing_outside_start_and_end_and_then_finished(make_queue, clock):
    q = make_queue("p")
    start, end = at(clock.now + 600), at(clock.now + 900)
    q.cron.add("w", every=60, start=start, end=end)
    fired = run_every(q, clock, 1800, 20)
    slots = [at(ms / 1000) for ms in slots_of(fired)]
    assert slots == [start + timedelta(minutes=n) for n in range(6)]
    definition = q.cron.get("w")
    assert definition.finished == "end" and definition.next_at is None
    assert definition.problem is None


def test_a_window_already_over_stores_the_definition_finished(make_queue, clock):
    q = make_queue("p")
    assert q.cron.add("old", every=60, end=at(clock.now - 10)) == "added"
    assert q.stats().scheduled == 0
    assert q.cron.get("old").finished == "end"
    assert q.cron.add("old", every=60, end=at(clock.now - 10)) == "unchanged"
    assert q.stats().scheduled == 0


def test_limit_fires_exactly_that_many_then_the_definition_is_finished(make_queue, clock):
    q = make_queue("p")
    q.cron.add("five", every=60, limit=5)
    fired = run_every(q, clock, 900, 30)
    assert len(fired) == 5
    definition = q.cron.get("five")
    assert (definition.fired, definition.finished, definition.next_at) == (5, "limit", None)
    assert q.stats().scheduled == 0


def test_limit_holds_when_missed_slots_all_run_after_downtime(make_queue, clock):
    q = make_queue("p")
    q.cron.add("three", every=60, limit=3, missed="all", max_missed=10)
    clock.advance(600)  # ten slots missed
    fired: list[str] = []
    for _ in range(5):
        fired += claim_ids(q)
        clock.advance(1)
    assert len(fired) == 3
    assert q.cron.get("three").finished == "limit"


def test_jitter_is_a_fixed_per_slot_offset_every_process_agrees_on(make_queue, clock):
    q1, q2 = make_queue("p"), make_queue("p")
    jitter = timedelta(seconds=30)
    q1.cron.add("j", every=3600, jitter=jitter)
    first = q1.cron.get("j").next_at
    tid = occurrence_id("j", round(first.timestamp() * 1000))
    due = q1.get(tid).due_at
    assert first <= due < first + jitter
    q1.cron.remove("j")
    q2.cron.add("j", every=3600, jitter=jitter)
    assert q2.get(tid).due_at == due  # another process computes the same offset
    offsets = set()
    for _ in range(6):
        clock.now = q2.get(tid).due_at.timestamp() + 0.001
        [d] = q2.claim(limit=10)
        d.ack()
        slot = dueq.Occurrence.from_id(d.id).slot
        offsets.add(d.due_at - slot)
        tid = occurrence_id("j", round(q2.cron.get("j").next_at.timestamp() * 1000))
    assert len(offsets) > 1 and all(timedelta(0) <= o < jitter for o in offsets)


def test_occurrences_carry_the_definitions_task_options(make_queue, clock):
    q = make_queue("p")
    q.cron.add(
        "opts",
        every=60,
        priority=5,
        key="reports",
        timeout=timedelta(seconds=600),
        max_attempts=2,
        task="send_report",
        payload={"n": 1},
    )
    clock.advance(60)
    [d] = q.claim(limit=10)
    info = q.get(d.id)
    assert (info.priority, info.key, info.timeout, info.max_attempts) == (
        5,
        "reports",
        timedelta(seconds=600),
        2,
    )
    assert info.task_name == "send_report" and d.payload == {"n": 1}
    d.ack()
    definition = q.cron.get("opts")
    assert (definition.priority, definition.key, definition.task) == (5, "reports", "send_report")
    clock.advance(60)
    assert [d.id for d in q.claim(limit=10)]  # the next occurrence, on priority 5, is claimed
    assert q.cron.remove("opts")


def test_a_definition_without_policies_keeps_its_stored_json(make_queue, r):
    q = make_queue("p")
    q.cron.add("plain", "0 3 * * *")
    stored = r.hget("dueq:{p}:cron", "plain")
    assert (
        stored
        == b'{"expr":"0 3 * * *","max_missed":10,"missed":"latest","payload":null,"tz":"UTC"}'
    )
    assert r.hget("dueq:{p}:cron:runs", "plain") is None


# -- overlap -------------------------------------------------------------------------------------


def test_overlap_skip_drops_a_slot_while_the_previous_runs_and_counts_it(make_queue, clock):
    q = make_queue("p", lease=600)
    q.cron.add("s", every=60, overlap="skip")
    clock.advance(60)
    [running] = q.claim(limit=10)
    clock.advance(60)
    assert q.claim(limit=10) == []  # the slot came while the previous one ran: skipped
    definition = q.cron.get("s")
    assert definition.skipped == 1 and definition.next_at is not None
    running.ack()
    clock.advance(60)
    [after] = q.claim(limit=10)
    assert slots_of([after.id])[0] - slots_of([running.id])[0] == 120_000
    assert q.cron.get("s").fired == 2


def test_overlap_skip_also_waits_for_a_retrying_occurrence(make_queue, clock):
    q = make_queue("p", lease=600, retry=dueq.RetryPolicy(max_attempts=3, wait=lambda s: 100.0))
    q.cron.add("s", every=60, overlap="skip")
    clock.advance(60)
    [first] = q.claim(limit=10)
    first.fail(RuntimeError("boom"))  # back in due for 100 s
    clock.advance(60)
    assert q.claim(limit=10) == []
    clock.advance(40)
    [again] = q.claim(limit=10)
    assert again.id == first.id and again.attempt == 2
    again.ack()
    assert q.cron.get("s").skipped == 1


def test_overlap_allow_all_lets_occurrences_overlap(make_queue, clock):
    q = make_queue("p", lease=600)
    q.cron.add("a", every=60)
    clock.advance(60)
    assert len(q.claim(limit=10)) == 1
    clock.advance(60)
    assert len(q.claim(limit=10)) == 1


def test_overlap_buffer_one_keeps_one_waiting_and_runs_it_after(make_queue, clock):
    q = make_queue("p", lease=300)
    q.cron.add("b", every=60, overlap="buffer_one")
    clock.advance(60)
    [running] = q.claim(limit=10)
    clock.advance(60)
    assert q.claim(limit=10) == []  # buffered
    clock.advance(60)
    assert q.claim(limit=10) == []  # a second one while one waits: skipped
    assert q.cron.get("b").skipped == 1
    running.ack()
    clock.advance(300)  # the buffered one looks again at the running one's lease deadline
    got = q.claim(limit=10)
    ids = [d.id for d in got]
    buffered = occurrence_id("b", slots_of([running.id])[0] + 60_000)
    assert buffered in ids
    assert all(a.id == buffered or slots_of([a.id])[0] > slots_of([buffered])[0] for a in got)


def test_overlap_cancel_other_cancels_the_running_one_honestly(make_queue, clock):
    q = make_queue("p", lease=600)
    q.cron.add("c", every=60, overlap="cancel_other")
    clock.advance(60)
    [running] = q.claim(limit=10)
    clock.advance(60)
    [new] = q.claim(limit=10)
    assert new.id != running.id
    with pytest.raises(dueq.TaskCancelled):
        running.ack()
    assert q.get(running.id) is None
    definition = q.cron.get("c")
    assert definition.last_outcome == "cancelled" and definition.last_occurrence == running.id
    new.ack()


def test_overlap_cancel_other_ends_the_running_one_as_cancel_does(make_queue, clock, r):
    """The cancelled occurrence gets what ``q.cancel`` gives a task: a ``cancelled`` record
    (keep_results) that ``q.wait`` returns, a message on the ended channel, a ``cancelled``
    event, its batch's count, and its waiting children buried."""
    q = make_queue("p", lease=600)
    q.configure(keep_results=3600, events=3600)
    first_slot_ms = (int(clock.now) // 60 + 1) * 60_000
    occurrence = occurrence_id("c", first_slot_ms)
    q.schedule({"first": True}, id=occurrence, batch="nightly")  # the occurrence, in a batch
    q.close_batch("nightly")
    q.cron.add("c", every=60, overlap="cancel_other")
    clock.advance(60)
    [running] = q.claim(limit=10)
    assert running.id == occurrence
    q.schedule({"upload": 1}, id="upload", after=[running.id])
    ended = subscribe_wake(r, q.keys.ended)
    try:
        wait_for(lambda: ended.get_message(timeout=0.1) is not None, "the subscription")
        clock.advance(60)
        [new] = q.claim(limit=10)
        message = wait_for(lambda: ended.get_message(timeout=0.1), "the ended message")
    finally:
        ended.close()
    assert running.id.encode() in message["data"]
    info = q.wait(running.id, timeout=0)
    assert (info.state, info.payload) == ("cancelled", {"first": True})
    kinds = [(f[b"id"].decode(), f[b"kind"].decode()) for _, f in r.xrange(q.keys.events)]
    assert (running.id, "cancelled") in kinds and ("upload", "dead") in kinds
    child = q.get("upload")
    assert child.state == "dead"
    assert child.errors[-1].message == f"parent {running.id} ended cancelled"
    batch = q.batch("nightly")
    assert (batch.total, batch.cancelled, batch.pending, batch.complete) == (1, 1, 0, True)
    with pytest.raises(dueq.TaskCancelled):
        running.ack()
    new.ack()


@pytest.mark.parametrize("front_end", ["sync"], indirect=True)
def test_overlap_skip_in_real_time_never_overlaps_and_fires_exactly_limit(make_queue, redis_server):
    """every=1 s, a handler that takes 2.5 s, three workers: no two occurrences overlap."""
    q = make_queue("rt", clock=None, lease=30)
    q.cron.add("slow", every=1, overlap="skip", limit=3)
    runs: list[tuple[float, float]] = []
    lock = threading.Lock()

    def handle(d: dueq.Delivery) -> None:
        began = time.monotonic()
        time.sleep(2.5)
        with lock:
            runs.append((began, time.monotonic()))

    worker = dueq.Worker(q, handle, concurrency=3)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and q.cron.get("slow").finished is None:
            time.sleep(0.1)
        while time.monotonic() < deadline and len(runs) < 3:
            time.sleep(0.1)
    finally:
        worker.stop()
        thread.join(10)
    runs.sort()
    assert len(runs) == 3
    for (_, end), (begin, _) in itertools.pairwise(runs):
        assert end <= begin  # no intersection
    definition = q.cron.get("slow")
    assert definition.fired == 3 and definition.skipped >= 2


# -- catch-up window, pause after failures, backfill ----------------------------------------------


def test_catchup_window_skips_missed_slots_older_than_it(make_queue, clock):
    q = make_queue("p")
    q.cron.add("c", every=60, missed="all", max_missed=100, catchup_window=timedelta(minutes=5))
    start = clock.now
    clock.advance(20 * 60 + 1)  # twenty slots missed
    fired = claim_ids(q)
    fired += claim_ids(q)
    slots = slots_of(fired)
    assert len(slots) == 5
    assert all(ms >= (clock.now - 300) * 1000 for ms in slots)
    assert min(slots) > (start + 15 * 60) * 1000


def test_catchup_window_with_missed_latest_runs_the_latest_only_if_inside(make_queue, clock):
    q = make_queue("p")
    q.cron.add("d", "0 3 * * *", catchup_window=timedelta(hours=2))
    clock.now = q.cron.get("d").next_at.timestamp() + 5 * 3600  # five hours late
    assert claim_ids(q) == []
    clock.now = q.cron.get("d").next_at.timestamp() + 3600  # one hour late
    assert len(claim_ids(q)) == 1


def test_pause_after_failures_pauses_after_n_dead_and_resume_clears(make_queue, clock):
    q = make_queue("p", retry=dueq.RetryPolicy(max_attempts=1))
    q.cron.add("f", every=60, pause_after_failures=2)
    for _ in range(2):
        clock.advance(60)
        [d] = q.claim(limit=10)
        d.fail(RuntimeError("down"))
    definition = q.cron.get("f")
    assert definition.paused and definition.failures == 2
    assert "2 consecutive dead" in definition.paused_reason
    clock.advance(60)
    assert q.claim(limit=10) == []  # the pending occurrence does not run
    assert q.cron.get("f").paused_reason == "pause_after_failures reached"
    clock.advance(600)
    assert q.claim(limit=10) == []
    assert q.cron.resume("f") is True
    definition = q.cron.get("f")
    assert not definition.paused and definition.failures == 0
    clock.advance(60)
    [d] = q.claim(limit=10)
    d.ack()


def test_an_ack_resets_the_failure_count(make_queue, clock):
    q = make_queue("p", retry=dueq.RetryPolicy(max_attempts=1))
    q.cron.add("f", every=60, pause_after_failures=2)
    outcomes = [False, True, False, True]
    for ok in outcomes:
        clock.advance(60)
        [d] = q.claim(limit=10)
        d.ack() if ok else d.fail(RuntimeError("x"))
    definition = q.cron.get("f")
    assert not definition.paused and definition.failures == 0


def test_backfill_schedules_the_slots_once_and_counts_them(make_queue, clock):
    q = make_queue("p")
    q.cron.add("r", "0 * * * *")
    start, end = at(clock.now - 6 * 3600), at(clock.now - 3600)
    assert q.cron.backfill("r", start=start, end=end) == 5
    assert q.cron.backfill("r", start=start, end=end) == 0
    got = claim_ids(q)
    assert len(got) == 5
    assert q.cron.backfill("r", start=start, end=end) == 0  # run and gone: still not again
    assert q.cron.backfill("r", start=start - timedelta(hours=1), end=end) == 1
    with pytest.raises(dueq.CronError):
        q.cron.backfill("r", start=end, end=start)
    with pytest.raises(dueq.CronError):
        q.cron.backfill("r", start=at(0), end=end)  # more than 1000 slots
    with pytest.raises(dueq.CronNotFound):
        q.cron.backfill("nope", start=start, end=end)


def test_remove_forgets_backfilled_slots_and_runs(make_queue, clock, r):
    q = make_queue("p")
    q.cron.add("r", every=60, limit=2)
    assert q.cron.backfill("r", start=at(clock.now - 120), end=at(clock.now)) == 2
    assert q.cron.remove("r")
    assert r.exists("dueq:{p}:cron:filled") == 0
    assert r.hget("dueq:{p}:cron:runs", "r") is None


def test_policies_work_on_a_sharded_queue(r, clock):
    q = dueq.Queue("sh", r, clock=clock, shards=3, lease=600)
    q.cron.add("s", every=60, overlap="skip", limit=2)
    clock.advance(60)
    [running] = q.claim(limit=10)
    clock.advance(60)
    assert q.claim(limit=10) == []
    running.ack()
    clock.advance(60)
    [second] = q.claim(limit=10)
    second.ack()
    definition = q.cron.get("s")
    assert (definition.fired, definition.skipped, definition.finished) == (2, 1, "limit")
    assert q.cron.backfill("s", start=at(clock.now - 300), end=at(clock.now)) >= 1


def test_wrong_type_cron_runs_key_is_a_cron_error(make_queue, r):
    q = make_queue("p")
    r.set("dueq:{p}:cron:runs", "x")
    with pytest.raises((dueq.CronError, redis.ResponseError, dueq.DueqError)):
        q.cron.add("x", every=60, limit=1)


# -- fired counts every kind of definition (issue 37) --------------------------------------------

FIRED_KINDS = {
    "plain cron": (("* * * * *",), {}),
    "every=": ((), {"every": 60}),
    "every= with jitter": ((), {"every": 60, "jitter": timedelta(seconds=20)}),
    "every= with an end": ((), {"every": 60, "end": at(1_900_000_000)}),
    "every= with limit": ((), {"every": 60, "limit": 100}),
    "every= with overlap skip": ((), {"every": 60, "overlap": "skip"}),
    "every= with overlap buffer_one": ((), {"every": 60, "overlap": "buffer_one"}),
    "every= with pause_after_failures": ((), {"every": 60, "pause_after_failures": 3}),
}


@pytest.mark.parametrize("kind", FIRED_KINDS)
def test_fired_counts_every_started_occurrence_whatever_the_policies(make_queue, clock, kind):
    args, options = FIRED_KINDS[kind]
    clock.now = 1_800_000_000.0
    q = make_queue("p")
    q.cron.add("k", *args, **options)
    fired = run_every(q, clock, 300, 20)
    assert len(fired) >= 4  # five slots; a jittered fifth may be due after the window
    definition = q.cron.get("k")
    assert (definition.fired, definition.skipped) == (len(fired), 0)


def test_fired_counts_an_occurrence_once_across_its_retries_without_policies(make_queue, clock):
    q = make_queue("p", retry=dueq.RetryPolicy(max_attempts=3, wait=lambda s: 1.0))
    q.cron.add("k", every=60)
    clock.advance(60)
    [first] = q.claim(limit=10)
    first.fail("boom")
    clock.advance(2)
    [retry] = q.claim(limit=10)
    assert (retry.id, retry.attempt) == (first.id, 2)
    retry.ack()
    assert q.cron.get("k").fired == 1
    assert q.cron.run_now("k")
    claim_ids(q)  # a run-now occurrence is not a slot: it does not count
    assert q.cron.get("k").fired == 1
