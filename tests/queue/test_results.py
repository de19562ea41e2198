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
import time
from datetime import timedelta

import pytest
import redis
from conftest import async_mirror
from paths_support import FIXTURES
from waiting_support import wait_for

import dueq

CHILD = FIXTURES / "results_worker.py"


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
        wait_for(lambda: _ended_subscribers(r, q.keys.ended), "the waiter to subscribe")
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
    # (and the record of the claim, kept a while after its deadline: lua/include/claims.lua)
    assert keys <= {q.keys.stats, q.keys.history, q.keys.claims}
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
    from dueq._consume.wake import ended_ids

    packed = b"".join(len(x).to_bytes(2, "big") + x for x in (b"a", b"b\nc", "é".encode()))
    assert ended_ids(packed) == ["a", "b\nc", "é"]
    assert json.dumps(ended_ids(b"")) == "[]"


def test_list_tasks_lists_kept_done_and_cancelled_tasks_newest_first(make_queue, clock):
    q = keeping(make_queue)
    for i in range(3):
        q.schedule({"i": i}, id=f"d{i}")
        (d,) = q.claim()
        d.ack(result=i * 10)
        clock.advance(1)
    q.schedule("c", id="c1", delay=60)
    q.cancel("c1")
    page = q.list_tasks("done", limit=2)
    assert [(t.id, t.state, t.result) for t in page.tasks] == [
        ("d2", "done", 20),
        ("d1", "done", 10),
    ]
    rest = q.list_tasks("done", limit=2, cursor=page.cursor)
    assert [t.id for t in rest.tasks] == ["d0"]
    assert [t.id for t in q.list_tasks("cancelled").tasks] == ["c1"]
    assert [t.id for t in q.list_tasks("done", grep='"i":1').tasks] == ["d1"]


# -- the command line --------------------------------------------------------------------------


def finished_tasks(r):
    """Queue "jobs" keeping results an hour, with a done task (result {"sent": 3}) and a
    cancelled one."""
    q = dueq.Queue("jobs", r)
    q.configure(keep_results=3600)
    q.schedule({"to": "ann"}, id="done1")
    (d,) = q.claim()
    d.ack(result={"sent": 3})
    q.schedule({"to": "bob"}, id="gone1", delay=60)
    q.cancel("gone1")
    return q


def test_cli_configure_sets_keep_results(invoke, r):
    dueq.Queue("jobs", r).schedule({}, id="first", delay=3600)
    assert "keep_results off" in invoke("configure", "jobs").output
    result = invoke("configure", "jobs", "--keep-results", "3600")
    assert result.exit_code == 0, result.output
    assert "keep_results 1.0 h" in result.output
    assert dueq.Queue("jobs", r).settings().keep_results == timedelta(hours=1)
    assert "keep_results off" in invoke("configure", "jobs", "--keep-results", "0").output


def test_cli_show_and_list_show_finished_tasks_and_results(invoke, r):
    finished_tasks(r)
    shown = invoke("show", "jobs", "done1", "gone1")
    assert shown.exit_code == 0, shown.output
    assert "state: done" in shown.output and "state: cancelled" in shown.output
    assert '"sent": 3' in shown.output and "finished:" in shown.output
    listed = invoke("list", "jobs", "--state", "done")
    assert listed.exit_code == 0, listed.output
    assert "done1" in listed.output and '{"sent": 3}' in listed.output
    assert "gone1" in invoke("list", "jobs", "--state", "cancelled").output


def test_cli_json_carries_state_result_and_finished_at(invoke, r):
    finished_tasks(r)
    document = json.loads(invoke("list", "jobs", "--state", "done", "--json").output)
    (task,) = document["tasks"]
    assert (task["id"], task["state"], task["result"]) == ("done1", "done", {"sent": 3})
    assert task["finished_at"].endswith("Z")
    shown = json.loads(invoke("show", "jobs", "gone1", "--json").output)
    assert shown["tasks"][0]["state"] == "cancelled"


def test_dashboard_task_page_shows_a_done_tasks_result(r, redis_server):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Starlette prefers the httpx2 fork (see test_dashboard)
        from starlette.testclient import TestClient

    from dueq.dashboard import DashboardSettings, create_app

    q = finished_tasks(r)
    q.schedule("x", id="big")
    (d,) = q.claim()
    d.ack(result="y" * 70_000)
    with TestClient(
        create_app(redis_server.url, DashboardSettings()), base_url="http://127.0.0.1"
    ) as client:
        html = client.get("/task", params={"queue": "jobs", "id": "done1"}).text
        assert 'id="result"' in html and "&quot;sent&quot;: 3" in html
        assert "finished" in html
        unkept = client.get("/task", params={"queue": "jobs", "id": "big"}).text
        assert "not kept: too big" in unkept
        api = client.get("/api/task", params={"queue": "jobs", "id": "done1"}).json()
        assert api["result"] == {"sent": 3}
        listed = client.get("/api/tasks", params={"queue": "jobs", "state": "done"}).json()
        assert {t["id"] for t in listed["tasks"]} == {"done1", "big"}
        cancelled = client.get("/task", params={"queue": "jobs", "id": "gone1"}).text
        assert "cancelled" in cancelled and 'id="result"' not in cancelled


def test_wait_and_results_on_a_sharded_queue(make_queue):
    q = make_queue("sharded", shards=3)
    q.configure(keep_results=600)
    ids = [q.schedule(i) for i in range(6)]
    deliveries = q.claim(limit=10)
    for d in deliveries:
        d.result = d.payload * 10
    assert q.ack_many(deliveries) == 6
    assert [q.wait(t, timeout=5).result for t in ids] == [0, 10, 20, 30, 40, 50]
    assert sorted(t.id for t in q.iter_tasks("done")) == sorted(ids)


def test_a_named_tasks_return_value_is_kept_and_waited_for(r):
    q = dueq.Queue("named", r)
    q.configure(keep_results=600)

    @q.task(name="add")
    def add(a: int, b: int) -> dict:
        return {"sum": a + b}

    tid = add.schedule(a=2, b=3)
    worker = dueq.Worker(q)
    runner = threading.Thread(target=worker.run)
    runner.start()
    try:
        info = q.wait(tid, timeout=30)
    finally:
        worker.stop()
        runner.join(30)
    assert (info.state, info.result, info.task_name) == ("done", {"sum": 5}, "add")


def test_an_async_named_tasks_return_value_is_kept(r):
    async def main():
        client = async_mirror(r)
        q = dueq.AsyncQueue("named-async", client)
        await q.configure(keep_results=600)

        @q.task(name="mul")
        async def mul(a: int, b: int) -> int:
            return a * b

        tid = await mul.schedule(a=6, b=7)
        worker = dueq.AsyncWorker(q)
        running = asyncio.create_task(worker.run())
        try:
            return await q.wait(tid, timeout=30)
        finally:
            worker.stop()
            await running
            await client.aclose()

    info = asyncio.run(main())
    assert (info.state, info.result) == ("done", 42)


def test_a_kept_record_keeps_the_failed_attempts_errors(make_queue, clock):
    q = keeping(make_queue)
    q.schedule("x", id="t1")
    (d,) = q.claim()
    d.fail(RuntimeError("first try"))
    clock.advance(60)
    (d,) = q.claim()
    d.ack(result="second try")
    info = q.get("t1")
    assert (info.state, info.attempt, info.result) == ("done", 2, "second try")
    assert [(e.attempt, e.type, e.message) for e in info.errors] == [
        (1, "RuntimeError", "first try")
    ]
    q.schedule("y", id="t2")
    (d,) = q.claim()
    d.fail(ValueError("nope"))
    q.cancel("t2")
    assert [e.type for e in q.get("t2").errors] == ["ValueError"]
    assert q.get("t2").attempt == 1


def test_wait_with_no_time_left_still_returns_a_task_that_has_ended(make_queue):
    q = keeping(make_queue)
    q.schedule("x", id="t1")
    (d,) = q.claim()
    d.ack(result=7)
    assert q.wait("t1", timeout=0).result == 7
    q.schedule("y", id="t2")
    with pytest.raises(dueq.WaitTimeout):
        q.wait("t2", timeout=0)


#: Concurrent waiters against a pool of redis-py's default size (100 connections).
MANY_WAITERS = 120
POOL_SIZE = 100


def _ended_subscribers(r, channel: str) -> int:
    """Clients listening on an ended channel (SSUBSCRIBE from Redis 7.0, else SUBSCRIBE)."""
    from dueq._consume.wake import sharded_pubsub
    from dueq.server import server_build

    if sharded_pubsub(server_build(r)[1]):
        return int(r.pubsub_shardnumsub(channel)[0][1])
    return int(r.pubsub_numsub(channel)[0][1])


def _waiting(client) -> int:
    """How many ``wait`` calls of this process are blocked on ``client``'s shared ended
    subscription (dueq._consume.ended)."""
    from dueq._consume import ended as _ended

    return _ended.waiting(client)


def test_many_threads_waiting_share_one_subscription_and_leave_the_client_working(r, redis_server):
    """Issue 37: each wait held a pooled connection of the queue's own client, so 120 waiters
    on a pool of 100 raised MaxConnectionsError and starved every other call on the client.
    Waiters share one subscription per client; the client's other calls keep working."""
    client = redis_server.client(max_connections=POOL_SIZE)  # as redis-py's default pool
    q = dueq.Queue("many-waiters", client)
    q.configure(keep_results=600)
    ids = [q.schedule(i, id=f"t{i}") for i in range(MANY_WAITERS)]
    results: dict[str, object] = {}
    errors: list[BaseException] = []

    def wait(tid: str) -> None:
        try:
            results[tid] = q.wait(tid, timeout=60).result
        except BaseException as exc:  # recorded: the test reports it
            errors.append(exc)

    threads = [threading.Thread(target=wait, args=(tid,)) for tid in ids]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: errors or _waiting(client) == MANY_WAITERS, "every waiter to wait")
        assert errors == []
        assert _ended_subscribers(r, q.keys.ended) == 1  # one subscription for all of them
        for _ in range(20):  # the queue's client keeps working meanwhile
            assert q.stats().scheduled == MANY_WAITERS
        assert client.ping()
        worker = dueq.Queue("many-waiters", r)  # another client ends the tasks
        for d in worker.claim(limit=MANY_WAITERS):
            d.ack(result=d.payload * 2)
    finally:
        for thread in threads:
            thread.join(60)
    assert errors == []
    assert results == {f"t{i}": i * 2 for i in range(MANY_WAITERS)}
    wait_for(lambda: _ended_subscribers(r, q.keys.ended) == 0, "the subscription to end")
    client.close()


def test_many_coroutines_waiting_share_one_subscription_and_leave_the_client_working(
    r, redis_server
):
    """As the threaded test, for ``await q.wait`` on one event loop."""

    async def main() -> None:
        client = async_mirror(r, max_connections=POOL_SIZE)  # as redis-py's default pool
        q = dueq.AsyncQueue("many-async-waiters", client)
        await q.configure(keep_results=600)
        ids = [await q.schedule(i, id=f"t{i}") for i in range(MANY_WAITERS)]
        waits = [asyncio.ensure_future(q.wait(tid, timeout=60)) for tid in ids]
        try:
            async with asyncio.timeout(60):
                while _waiting(client) < MANY_WAITERS:
                    failed = [w for w in waits if w.done()]
                    if failed:
                        await failed[0]  # raises what it raised
                    await asyncio.sleep(0.01)
            assert _ended_subscribers(r, q.keys.ended) == 1
            for _ in range(20):  # the queue's client keeps working meanwhile
                assert (await q.stats()).scheduled == MANY_WAITERS
            worker = dueq.Queue("many-async-waiters", r)  # another client ends the tasks
            for d in worker.claim(limit=MANY_WAITERS):
                d.ack(result=d.payload * 2)
            async with asyncio.timeout(60):
                infos = await asyncio.gather(*waits)
            assert [info.result for info in infos] == [i * 2 for i in range(MANY_WAITERS)]
        finally:
            for w in waits:
                w.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
        async with asyncio.timeout(30):
            while _ended_subscribers(r, q.keys.ended):
                await asyncio.sleep(0.01)
        await client.aclose()

    asyncio.run(main())


def _end_before_subscribing(q, other) -> None:
    """Make ``q``'s next wait end its task (from ``other``, another client) right after the
    wait's first look, before it subscribes: the window a waiter must not miss."""
    inner = getattr(q, "_target", q)  # (the AsyncQueue inside the Blocking wrapper)
    flow = type(inner).ended_subscription_flow

    def racing(task_id):
        for d in other.claim():
            d.ack(result="raced")
        return (yield from flow(inner, task_id))

    inner.ended_subscription_flow = racing


def test_a_wait_hears_an_end_between_its_look_and_its_subscription(make_queue, r, clock):
    """The task ends after the wait looked and before its subscription is confirmed: the
    confirmation wakes the wait to look again (not its timeout's last look)."""
    q = keeping(make_queue)
    q.schedule(5, id="t1")
    _end_before_subscribing(q, dueq.Queue(q.name, r, clock=clock))
    started_s = time.monotonic()
    assert q.wait("t1", timeout=60).result == "raced"
    assert time.monotonic() - started_s < 30  # a bound: woken by the confirmation, not at 60 s


def test_a_wait_joining_a_shared_subscription_hears_an_end_before_it_joined(r, clock):
    """Another wait holds the shared subscription already (confirmed): a new wait on that
    channel looks at once after joining, so an end just before it joined is seen."""
    q = dueq.Queue("joined", r, clock=clock)
    q.configure(keep_results=600)
    q.schedule(1, id="first", delay=3600)
    q.schedule(2, id="second")
    first: list[object] = []
    holder = threading.Thread(target=lambda: first.append(q.wait("first", timeout=60)))
    holder.start()
    try:
        wait_for(lambda: _waiting(r) == 1, "the first wait to hold the subscription")
        _end_before_subscribing(q, dueq.Queue("joined", r, clock=clock))
        started_s = time.monotonic()
        assert q.wait("second", timeout=60).result == "raced"
        assert time.monotonic() - started_s < 30  # a bound: it looked at once after joining
    finally:
        q.cancel("first")
        holder.join(60)
    assert [info.state for info in first] == ["cancelled"]


def test_a_wait_outlives_its_shared_subscriptions_connection_being_killed(
    make_queue, r, admin, clock
):
    """The server drops the shared subscription's connection while a wait waits, and the task
    ends meanwhile: the listener subscribes again and its confirmation makes the wait look."""
    q = keeping(make_queue)
    q.schedule(5, id="t1")
    client = getattr(q, "_target", q).redis
    other = dueq.Queue(q.name, r, clock=clock)

    def kill_then_end() -> None:
        wait_for(lambda: _waiting(client) == 1, "the wait to subscribe")
        wait_for(lambda: _ended_subscribers(r, q.keys.ended) == 1, "the subscription")
        assert admin.client_kill_filter(_type="pubsub") >= 1
        for d in other.claim():
            d.ack(result="after the kill")

    killer = threading.Thread(target=kill_then_end)
    killer.start()
    try:
        started_s = time.monotonic()
        assert q.wait("t1", timeout=60).result == "after the kill"
        assert time.monotonic() - started_s < 30  # a bound: not the timeout's last look
    finally:
        killer.join(60)


def test_a_wait_whose_user_may_not_subscribe_gets_the_servers_refusal(
    make_queue, redis_server, admin
):
    """The shared listener's refused subscription ends each wait on it with the server's
    NoPermissionError (not a hang until the timeout), and the next wait is refused as well."""
    from dueq._consume.wake import sharded_pubsub
    from dueq.server import server_build

    refused = ["-subscribe", "-ssubscribe"] if sharded_pubsub(server_build(admin)[1]) else []
    admin.acl_setuser(
        "no-subscribe",
        enabled=True,
        passwords=["+no-subscribe-pw"],
        keys=["*"],
        channels=["*"],
        commands=["+@all", *(refused or ["-subscribe"])],  # (6.2 has no SSUBSCRIBE)
    )
    try:
        client = redis_server.client(username="no-subscribe", password="no-subscribe-pw")
        q = keeping(make_queue, client=client)
        q.schedule(1, id="t1")
        for _ in range(2):
            started_s = time.monotonic()
            with pytest.raises(redis.exceptions.NoPermissionError):
                q.wait("t1", timeout=60)
            assert time.monotonic() - started_s < 30  # a bound: refused, not timed out
        client.close()
    finally:
        admin.acl_deluser("no-subscribe")
