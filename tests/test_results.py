"""keep_results: finished tasks stay readable with their handler's return value, and
``q.wait`` returns a task once it has ended (issue 28).

Contract tests run on both front ends (``make_queue``); the scripts take the queue's manual
clock, so retention is tested by moving it, never by sleeping.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest
from conftest import async_mirror
from waiting import wait_for

import dueq

CHILD = Path(__file__).with_name("results_worker.py")


def keeping(make_queue, seconds=3600, **kwargs):
    q = make_queue(**kwargs)
    q.configure(keep_results=seconds)
    return q


def test_keep_results_is_a_queue_setting(make_queue):
    q = make_queue()
    assert q.settings().keep_results is None
    assert q.configure(keep_results=90).keep_results == timedelta(seconds=90)
    assert q.configure(keep_results=0).keep_results is None
    with pytest.raises(dueq.ConfigurationError):
        q.configure(keep_results=367 * 86400)


def test_wait_returns_the_result_the_ack_kept(make_queue, clock):
    q = keeping(make_queue)
    tid = q.schedule({"n": 2}, id="t1")
    (d,) = q.claim()
    d.ack(result={"doubled": 4})
    info = q.wait(tid, timeout=5)
    assert (info.state, info.result, info.attempt) == ("done", {"doubled": 4}, 1)
    assert info.payload == {"n": 2}
    assert info.finished_at.timestamp() == pytest.approx(clock.now)
    assert q.get(tid) == info


def test_wait_raises_wait_timeout_while_the_task_has_not_ended(make_queue):
    q = keeping(make_queue)
    q.schedule("x", id="t1")
    with pytest.raises(dueq.WaitTimeout) as caught:
        q.wait("t1", timeout=0.05)
    assert caught.value.task_id == "t1"
    assert isinstance(caught.value, TimeoutError)
    assert q.get("t1").state == "scheduled"  # untouched


def test_wait_wakes_when_another_client_acks(make_queue, r):
    """The waiter blocks on the ended channel; an ack from elsewhere wakes it."""
    q = keeping(make_queue)
    q.schedule("x", id="t1")
    seen: list[dueq.TaskInfo] = []
    other = dueq.Queue("q", r, clock=lambda: 1_800_000_000.0)

    def ack_when_someone_listens() -> None:
        wait_for(lambda: r.pubsub_shardnumsub(q.keys.ended)[0][1], "the waiter to subscribe")
        (d,) = other.claim()
        d.ack(result=[1, 2, 3])

    acker = threading.Thread(target=ack_when_someone_listens)
    acker.start()
    seen.append(q.wait("t1", timeout=30))
    acker.join()
    assert (seen[0].state, seen[0].result) == ("done", [1, 2, 3])


def test_dead_and_cancelled_tasks_are_visible_while_kept(make_queue, clock):
    q = keeping(make_queue)
    q.schedule("doomed", id="dead1", max_attempts=1)
    (d,) = q.claim()
    d.fail(RuntimeError("boom"))
    dead = q.wait("dead1", timeout=5)
    assert dead.state == "dead"
    assert dead.finished_at == dead.died_at
    assert dead.errors[0].type == "RuntimeError"

    q.schedule("later", id="c1", delay=60)
    assert q.cancel("c1")
    cancelled = q.wait("c1", timeout=5)
    assert (cancelled.state, cancelled.result, cancelled.payload) == ("cancelled", None, "later")
    assert cancelled.finished_at.timestamp() == pytest.approx(clock.now)


def test_a_task_that_dies_by_lease_expiry_ends_the_wait(make_queue, clock):
    q = keeping(make_queue, lease=10)
    q.schedule("x", id="t1", max_attempts=1)
    q.claim()
    clock.advance(11)
    q.claim()  # reclaims the expired lease: its last attempt, so dead
    assert q.wait("t1", timeout=5).state == "dead"


def test_records_are_trimmed_by_the_writing_scripts_after_the_retention(make_queue, clock, r):
    q = keeping(make_queue, seconds=60)
    q.schedule("a", id="a")
    q.ack_many(q.claim())
    clock.advance(30)
    q.schedule("b", id="b")
    q.ack_many(q.claim())
    clock.advance(31)  # a is 61 s old, b 31 s
    assert q.get("a").state == "done"  # reading trims nothing
    q.schedule("c", id="c")
    q.ack_many(q.claim())  # this ack trims what is past the retention
    assert q.get("a") is None
    assert q.get("b").state == "done"
    assert r.hlen(q.keys.results) == r.zcard(q.keys.finished) == 2


def test_cancel_trims_too_and_turning_keep_results_off_drops_leftovers(make_queue, clock, r):
    q = keeping(make_queue, seconds=60)
    q.schedule("a", id="a")
    q.ack_many(q.claim())
    q.configure(keep_results=0)
    q.schedule("b", id="b")
    q.cancel("b")
    assert q.get("a") is None and q.get("b") is None
    assert not r.exists(q.keys.results, q.keys.finished)


@pytest.mark.parametrize(
    ("value", "why"),
    [({"blob": "x" * 70_000}, "too big"), ({1, 2}, "not JSON"), (float("nan"), "not JSON")],
)
def test_a_result_that_cannot_be_kept_is_reported_and_the_task_still_acked(
    make_queue, caplog, value, why
):
    q = keeping(make_queue)
    q.schedule("x", id="t1")
    (d,) = q.claim()
    with caplog.at_level(logging.WARNING, logger="dueq.queue"):
        d.ack(result=value)
    info = q.get("t1")
    assert (info.state, info.result) == ("done", None)
    assert why in info.result_unstored
    assert any(why in m and "t1" in m for m in caplog.messages)
    assert q.stats().counters["results_unstored"] == 1


def test_a_value_that_cannot_be_kept_says_nothing_without_keep_results(make_queue, caplog):
    q = make_queue()
    q.schedule("x", id="t1")
    (d,) = q.claim()
    with caplog.at_level(logging.WARNING, logger="dueq.queue"):
        d.ack(result=object())
    assert q.get("t1") is None
    assert not caplog.messages


def test_without_keep_results_nothing_extra_is_stored(make_queue, r):
    q = make_queue()
    q.schedule("x", id="t1")
    (d,) = q.claim()
    d.ack(result={"big": "y" * 1000})
    q.schedule("y", id="t2")
    q.cancel("t2")
    assert q.get("t1") is None and q.get("t2") is None
    keys = {k.decode() for k in r.keys("*")}
    assert keys <= {q.keys.stats, q.keys.history}
    assert r.hlen(q.keys.results) == 0


def test_wait_without_keep_results_or_task_raises_typed_errors(make_queue):
    q = make_queue()
    with pytest.raises(dueq.TaskNotFound):
        q.wait("never", timeout=1)
    q.schedule("x", id="live")
    with pytest.raises(dueq.ConfigurationError, match="keep_results"):
        q.wait("live", timeout=1)
    q.schedule("x", id="doomed", max_attempts=1)
    (d,) = [d for d in q.claim() if d.id == "doomed"] or q.claim()
    d.fail(dueq.Unrecoverable("no"))
    assert q.wait("doomed", timeout=1).state == "dead"  # dead tasks stay readable anyway


def test_a_batch_ack_keeps_each_result_in_one_script_call(make_queue, r):
    q = keeping(make_queue)
    for i in range(3):
        q.schedule(i, id=f"t{i}")
    deliveries = q.claim(limit=10)
    for d in deliveries:
        d.result = {"i": d.payload}
    before = r.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    assert q.ack_many(deliveries) == 3
    after = r.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    assert after - before == 1
    assert [q.get(f"t{i}").result for i in range(3)] == [{"i": 0}, {"i": 1}, {"i": 2}]


def test_worker_keeps_the_handlers_return_value(r):
    q = dueq.Queue("p", r)
    q.configure(keep_results=600)
    tids = [q.schedule(n) for n in (1, 2)]
    worker = dueq.Worker(q, lambda d: {"answer": d.payload * 2}, concurrency=2)
    runner = threading.Thread(target=worker.run)
    runner.start()
    try:
        assert [q.wait(t, timeout=30).result for t in tids] == [{"answer": 2}, {"answer": 4}]
    finally:
        worker.stop()
        runner.join(30)


@pytest.mark.parametrize("kind", ["async def", "plain function"])
def test_async_worker_keeps_the_handlers_return_value(r, kind):
    async def doubled(d):
        return {"answer": d.payload * 2}

    handler = doubled if kind == "async def" else (lambda d: {"answer": d.payload * 2})

    async def main():
        client = async_mirror(r)
        q = dueq.AsyncQueue("ap", client)
        await q.configure(keep_results=600)
        tid = await q.schedule(21)
        worker = dueq.AsyncWorker(q, handler, concurrency=2)
        running = asyncio.create_task(worker.run())
        try:
            return await q.wait(tid, timeout=30)
        finally:
            worker.stop()
            await running
            await client.aclose()

    info = asyncio.run(main())
    assert (info.state, info.result) == ("done", {"answer": 42})


@pytest.mark.parametrize("child_front_end", ["sync", "async"])
def test_wait_across_processes(redis_server, r, front_end, child_front_end, make_queue):
    """A worker process acks; this process waits for the result."""
    q = make_queue("xproc", clock=None)
    q.configure(keep_results=600)
    child = subprocess.Popen(
        [
            *(sys.executable, str(CHILD), "--url", redis_server.url, "--queue", "xproc"),
            *("--front-end", child_front_end),
        ],
    )
    try:
        tid = q.schedule({"n": 5}, delay=0.2)
        info = q.wait(tid, timeout=30)
        assert (info.state, info.result) == ("done", {"squared": 25})
    finally:
        child.terminate()
        child.wait(30)


def test_ended_messages_carry_the_ids(r):
    from dueq.wake import ended_ids

    packed = b"".join(len(x).to_bytes(2, "big") + x for x in (b"a", b"b\nc", "é".encode()))
    assert ended_ids(packed) == ["a", "b\nc", "é"]
    assert json.dumps(ended_ids(b"")) == "[]"
