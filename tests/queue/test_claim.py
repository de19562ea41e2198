"""Claiming and leases: never early (2), at-least-once (1), fenced leases (4)."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import dueq


def test_never_delivered_before_its_due_time(make_queue, clock):
    q = make_queue()
    q.schedule("later", delay=10)
    clock.advance(9.999)
    assert q.claim() == []
    clock.advance(0.001)
    [d] = q.claim()
    assert d.payload == "later" and d.attempt == 1


def test_never_early_by_the_server_clock(make_queue, r):
    q = make_queue(clock=None)
    seconds, micros = r.time()
    before_ms = seconds * 1000 + micros // 1000
    tid = q.schedule("later", delay=60)
    assert q.claim() == []
    score = r.zscore(q.keys.due, tid)
    assert before_ms + 60_000 <= score < before_ms + 120_000


def test_claims_in_due_order_and_bounded_batches(make_queue, clock):
    q = make_queue()
    for i in range(10):
        q.schedule(i, id=f"t{i}", delay=10 - i)
    clock.advance(10)
    first = q.claim(limit=4)
    assert [d.payload for d in first] == [9, 8, 7, 6]
    rest = q.claim(limit=100)
    assert [d.payload for d in rest] == [5, 4, 3, 2, 1, 0]


def test_each_delivery_reports_its_own_due_time_when_tasks_share_due_times(make_queue, clock):
    """The claim reads tasks that share a due time as one run of scores (a few runs, then the
    rest one by one): every delivery still carries its own task's due ms, in due order."""
    q = make_queue()
    start_ms = round(clock.now * 1000)
    runs = [3, 1, 2, 1, 4, 1, 2, 5]  # tasks per distinct due time: more runs than read as runs
    expected = []
    for r_index, size in enumerate(runs):
        for k in range(size):
            q.schedule(f"{r_index}-{k}", id=f"r{r_index}-{k}", delay=(r_index + 1) / 1000)
            expected.append((f"r{r_index}-{k}", start_ms + r_index + 1))
    clock.advance(1)
    batch = q.claim(limit=100)
    assert [(d.id, d.due_ms) for d in batch] == expected


def test_claim_batch_reports_next_due_and_next_lease_deadline(make_queue, clock):
    q = make_queue(lease=30)
    q.schedule("now")
    q.schedule("soon", delay=5)
    batch = q.claim_batch(10)
    now_ms = round(clock.now * 1000)
    assert [d.payload for d in batch.deliveries] == ["now"]
    assert batch.now_ms == now_ms
    assert batch.next_due_ms == now_ms + 5000
    assert batch.next_lease_deadline_ms == now_ms + 30_000
    assert batch.deliveries[0].lease_deadline_ms == now_ms + 30_000


def test_eight_threads_claiming_5000_tasks_get_each_exactly_once(redis_server, r, clock):
    setup = dueq.Queue("race", r, clock=clock)
    assert setup.schedule_many(dueq.Task(i) for i in range(5000)).added == 5000
    seen: list[list[str]] = [[] for _ in range(8)]

    def consume(slot: int) -> None:
        client = redis_server.client()
        q = dueq.Queue("race", client, clock=clock)
        while batch := q.claim(limit=37):
            seen[slot].extend(d.id for d in batch)
            q.ack_many(batch)
        client.close()

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = [i for part in seen for i in part]
    assert len(ids) == 5000
    assert len(set(ids)) == 5000
    assert sum(1 for part in seen if part) > 1  # the work really was shared
    stats = setup.stats()
    assert (stats.scheduled, stats.leased, stats.counters["acked"]) == (0, 0, 5000)


def test_expired_lease_is_delivered_again_as_the_next_attempt(make_queue, clock):
    q = make_queue(lease=30, retry=dueq.RetryPolicy(max_attempts=3, wait=lambda s: 0))
    tid = q.schedule("work")
    [first] = q.claim()
    assert first.attempt == 1
    clock.advance(29.999)
    assert q.claim() == []  # still leased
    clock.advance(0.001)
    [second] = q.claim()
    assert (second.id, second.attempt) == (tid, 2)
    [error] = q.get(tid).errors
    assert (error.type, error.attempt) == ("LeaseExpired", 1)


def test_expired_lease_waits_for_the_policy_backoff(make_queue, clock):
    q = make_queue(lease=30, retry=dueq.RetryPolicy(max_attempts=3, wait=lambda s: 7))
    tid = q.schedule("work")
    q.claim()
    clock.advance(30)
    assert q.claim() == []  # reclaimed, but due only after the 7 s backoff
    assert q.get(tid).state == "scheduled"
    clock.advance(7)
    assert [d.attempt for d in q.claim()] == [2]


def _stale_and_live(make_queue, clock):
    """Task "a" claimed twice: its first lease expired and was taken over by a second claim."""
    q = make_queue(lease=10, retry=dueq.RetryPolicy(max_attempts=5, wait=lambda s: 0))
    q.schedule("x", id="a")
    [stale] = q.claim()
    clock.advance(10)
    [live] = q.claim()
    return q, stale, live


def test_stale_holder_is_fenced_after_takeover(make_queue, clock):
    q, stale, fresh = _stale_and_live(make_queue, clock)
    assert fresh.token != stale.token
    with pytest.raises(dueq.LeaseLost):
        stale.ack()
    with pytest.raises(dueq.LeaseLost):
        stale.fail(RuntimeError("late"))
    with pytest.raises(dueq.LeaseLost):
        stale.extend(60)
    with pytest.raises(dueq.LeaseLost):
        stale.release()
    assert q.get("a").state == "leased"
    fresh.ack()
    assert q.get("a") is None


def test_an_expired_lease_cannot_ack_even_before_anyone_reclaims_it(make_queue, clock):
    q = make_queue(lease=10)
    q.schedule("x", id="a")
    [d] = q.claim()
    clock.advance(10)
    with pytest.raises(dueq.LeaseLost) as caught:
        d.ack()
    assert caught.value.ids == ["a"]


def test_ack_many_judges_each_lease_when_one_of_them_ran_out(make_queue, clock):
    # ack.lua reads no deadline while every lease in the queue is live (the earliest one is
    # after now); once one ran out it reads each: the run-out one is lost, the rest acked
    q = make_queue(lease=10)
    q.schedule("x", id="old")
    [old] = q.claim()
    clock.advance(6)
    q.schedule("y", id="new")
    [new] = q.claim()
    clock.advance(5)  # old ran out 1 s ago, not reclaimed; new has 5 s left
    with pytest.raises(dueq.LeaseLost) as caught:
        q.ack_many([old, new])
    assert caught.value.ids == ["old"]
    assert q.get("new") is None
    assert q.get("old").state == "leased"


def test_an_ack_with_a_token_that_no_longer_leases_is_lost_while_other_leases_are_live(
    make_queue, clock
):
    q = make_queue(lease=10, retry=dueq.RetryPolicy(max_attempts=5, wait=lambda s: 0))
    q.schedule_many(dueq.Task(i, id=f"t{i}") for i in range(3))
    first = {d.id: d for d in q.claim(limit=3)}
    first["t0"].fail(ValueError("again"))  # back to due: its meta keeps no token
    first["t1"].release()
    [again] = q.claim(limit=1)  # t0 or t1 leased again, under a new token
    for stale in ("t0", "t1"):
        with pytest.raises(dueq.LeaseLost):
            first[stale].ack()
    first["t2"].ack()
    again.ack()
    assert q.get(again.id) is None and q.get("t2") is None


def test_extend_keeps_the_lease_past_its_first_deadline(make_queue, clock):
    q = make_queue(lease=10)
    q.schedule("x", id="a")
    [d] = q.claim()
    clock.advance(9)
    new_deadline = d.extend(10)
    assert new_deadline.timestamp() == pytest.approx(clock.now + 10)
    clock.advance(9)
    assert q.claim() == []  # nobody else gets it
    d.ack()


def test_release_gives_back_without_counting_an_attempt(make_queue, clock):
    q = make_queue()
    q.schedule("x", id="a")
    [d] = q.claim()
    outcome = d.release(delay=3)
    assert outcome.kind == "released"
    assert q.get("a").attempt == 0
    clock.advance(3)
    [again] = q.claim()
    assert again.attempt == 1


def test_ack_many_acks_held_leases_and_reports_lost_ones(make_queue, clock):
    q = make_queue(lease=10, retry=dueq.RetryPolicy(max_attempts=5, wait=lambda s: 0))
    q.schedule_many(dueq.Task(i, id=f"t{i}") for i in range(5))
    batch = q.claim(limit=5)
    assert q.cancel("t0")
    with pytest.raises(dueq.LeaseLost) as caught:
        q.ack_many(batch)
    assert caught.value.ids == ["t0"]
    assert q.stats().leased == 0
    assert all(q.get(f"t{i}") is None for i in range(1, 5))


@pytest.mark.parametrize(
    "stored",
    [b"\xff not json", b"1:{broken", b'{"v":9}', b""],
    ids=["bytes", "json", "v9", "empty"],
)
def test_undecodable_envelope_goes_dead_without_blocking_others(make_queue, r, stored):
    q = make_queue()
    q.schedule_many(dueq.Task(i, id=f"t{i}") for i in range(3))
    r.hset(q.keys.tasks, "t1", stored)
    got = q.claim(limit=10)
    assert [d.id for d in got] == ["t0", "t2"]
    info = q.get("t1")
    assert info.state == "dead"
    assert info.errors[0].type == "PayloadError"


@pytest.mark.parametrize(
    ("stored", "payload"),
    [
        (b'1: {"a": [1, 2]}\n', {"a": [1, 2]}),
        (b"1:\t[1, 2.5, null] ", [1, 2.5, None]),
        (b'1:"x"', "x"),
        (b"1:NaN", "nan"),
        (b"1:1e400", "inf"),
        (b'1:{"a":1,"a":2}', {"a": 2}),
    ],
    ids=["spaces", "tab", "string", "nan", "huge", "repeated-key"],
)
def test_a_stored_payload_reads_as_json_loads_reads_it(make_queue, r, stored, payload):
    """Payloads are read with the JSON scanner directly (no json.loads per task); white space
    around the value, and what json.loads accepts, read the same."""
    q = make_queue()
    q.schedule("placeholder", id="t")
    r.hset(q.keys.tasks, "t", stored)
    [d] = q.claim()
    got = d.payload
    if payload in ("nan", "inf"):
        assert math.isnan(got) if payload == "nan" else math.isinf(got)
    else:
        assert got == payload


@pytest.mark.parametrize(
    ("stored", "why"),
    [
        (b"1:{} x", "not valid JSON"),
        (b"1:[1]]", "not valid JSON"),
        (b"1:", "not valid JSON"),
        (b"1: ", "not valid JSON"),
        (b'1:{"a":}', "not valid JSON"),
        (b"1:\xef\xbb\xbf{}", "not valid JSON"),
        (b"1:" + b"[" * 129 + b"]" * 129, "nests deeper"),
        (b"1:" + b"[" * 200, "nests deeper"),  # unbalanced, shorter than a balanced one
    ],
    ids=["trailing", "extra-bracket", "empty", "blank", "no-value", "bom", "deep", "unbalanced"],
)
def test_a_stored_payload_json_loads_refuses_goes_dead(make_queue, r, stored, why):
    q = make_queue()
    q.schedule_many(dueq.Task(i, id=f"t{i}") for i in range(3))
    r.hset(q.keys.tasks, "t1", stored)
    assert [d.id for d in q.claim(limit=10)] == ["t0", "t2"]
    info = q.get("t1")
    assert info.state == "dead"
    assert info.errors[0].type == "PayloadError"
    assert why in info.errors[0].message


def test_a_worker_killed_with_sigkill_loses_nothing(redis_server, make_queue):
    """A real process claims a task and is killed -9; the task is delivered again (attempt 2),
    here through either front end."""
    retry = dueq.RetryPolicy(max_attempts=3, wait=lambda s: 0)
    q = make_queue("killed", clock=None, lease=0.3, retry=retry)
    tid = q.schedule({"job": 1})
    child = textwrap.dedent(f"""
        import sys, time, redis, dueq
        q = dueq.Queue("killed", redis.Redis.from_url({redis_server.url!r}), lease=0.3)
        [d] = q.claim()
        print(d.id, d.attempt, flush=True)
        time.sleep(60)
    """)
    with subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().split() == [tid, "1"]
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    redelivered: list[dueq.Delivery] = []
    for _ in range(200):  # bounded wait for the 0.3 s lease to run out on the server clock
        redelivered = q.claim()
        if redelivered:
            break
        time.sleep(0.02)
    assert [(d.id, d.attempt) for d in redelivered] == [(tid, 2)]
    assert redelivered[0].payload == {"job": 1}


def test_claim_of_nothing_is_empty(make_queue):
    q = make_queue()
    batch = q.claim_batch(10)
    assert batch.deliveries == [] and batch.next_due_ms is None
    assert batch.next_lease_deadline_ms is None


def test_works_with_a_decode_responses_client(redis_server, make_queue):
    client = redis_server.client(decode_responses=True)  # mirrored as such for AsyncQueue
    q = make_queue("text", client=client, retry=dueq.RetryPolicy(max_attempts=1))
    q.schedule({"ü": "ñ"}, id="a")
    q.schedule({"n": 2}, id="b")
    a, b = q.claim(limit=2)
    assert (a.payload, a.token) == ({"ü": "ñ"}, b.token)
    a.ack()
    b.fail(RuntimeError("x"))
    assert [t.id for t in q.dead.list()] == ["b"]
    assert q.stats().counters["acked"] == 1
    client.close()


def test_a_repeated_delivery_in_ack_many_counts_once(make_queue):
    q = make_queue()
    q.schedule("x", id="a")
    [d] = q.claim()
    assert q.ack_many([d, d]) == 1
    assert q.stats().counters["acked"] == 1


def test_ack_many_judges_a_stale_and_a_live_delivery_of_one_task_apart(make_queue, clock):
    q, stale, live = _stale_and_live(make_queue, clock)
    with pytest.raises(dueq.LeaseLost) as caught:
        q.ack_many([stale, live])
    assert caught.value.ids == ["a"]
    assert q.get("a") is None  # the live holder's ack went through
