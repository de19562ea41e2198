"""Redis refusing to serve for a while (no replicas, out of memory, loading, failing over) is an
outage that consumers wait out, against real redis-servers: a primary with a replica that is
killed and restarted, a server whose memory is full, an ACL user that lacks a permission."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis
import redis.asyncio
from internals_support import consume, prefetch
from redis._parsers.base import BaseParser
from waiting_support import wait_for

import dueq
from dueq._util.outage import is_outage, outage_reason
from dueq.server import RedisServer

WAIT_S = 30  # generous bound for things that happen in milliseconds when all is well


def refused(call: Callable[[], object]) -> Exception:
    """The error ``call`` raises (it must raise)."""
    try:
        call()
    except Exception as exc:
        return exc
    raise AssertionError("expected Redis to refuse the call")


# -- the table ---------------------------------------------------------------------------------

OUTAGE_REPLIES = [
    "NOREPLICAS Not enough good replicas to write.",
    # what redis 7.0 answers when a script's first write meets min-replicas-to-write
    "NOREPLICAS Not enough good replicas to write. script: 67ed14c1cb0, on @user_script:1.",
    "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
    "LOADING Redis is loading the dataset in memory",
    "READONLY You can't write against a read only replica.",
    "TRYAGAIN Multiple keys request during rehashing of slot",
    "CLUSTERDOWN The cluster is down",
    "OOM command not allowed when used memory > 'maxmemory'.",
    "OOM command not allowed when used memory > 'maxmemory'. script: c1e43c3, on @user_script:1.",
    "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
    "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist",
    # valkey 9.1 (for a while, valkey#3663) prefixes a script's error with ERR; redis-py strips
    # the ERR and raises a plain ResponseError, not its OutOfMemoryError / ReadOnlyError
    "ERR OOM command not allowed when used memory > 'maxmemory'. "
    "script: c1e43c3, on @user_script:1.",
    "ERR NOREPLICAS Not enough good replicas to write. script: 67ed14c1cb0, on @user_script:1.",
    "ERR READONLY You can't write against a read only replica. "
    "script: 67ed14c1cb0, on @user_script:1.",
    "ERR MISCONF Errors writing to the AOF file: No space left on device",
    # redis 6.2 wraps errors raised inside a script in an ERR reply
    "ERR Error running script (call to f_67ed14c1cb0): @user_script:1: "
    "NOREPLICAS Not enough good replicas to write.",
    "ERR Error running script (call to f_c1e43c3): @user_script:1: "
    "-OOM command not allowed when used memory > 'maxmemory'.",
]

NOT_OUTAGE_REPLIES = [
    "NOPERM this user has no permissions to run the 'info' command",
    "WRONGPASS invalid username-password pair or user is disabled.",
    "NOAUTH Authentication required.",
    "WRONGTYPE Operation against a key holding the wrong kind of value",
    "ERR unknown command 'FCALL'",
    "ERR Error running script (call to f_1): @user_script:12: user_script:12: "
    "attempt to compare nil with number",
    # a task id in a script's own error must not look like a reply code
    "ERR Error running script (call to f_1): @user_script:3: bad id OOM",
    "NOSCRIPT No matching script. Please use EVAL.",
    "EXECABORT Transaction discarded because of previous errors.",
]


@pytest.mark.parametrize("reply", OUTAGE_REPLIES)
def test_replies_of_a_server_that_cannot_serve_for_now_are_outages(reply: str) -> None:
    exc = BaseParser.parse_error(reply)  # the exception redis-py raises for this reply
    assert is_outage(exc), (type(exc), str(exc))
    assert outage_reason(exc)


@pytest.mark.parametrize("reply", NOT_OUTAGE_REPLIES)
def test_replies_about_the_request_or_the_caller_are_not_outages(reply: str) -> None:
    exc = BaseParser.parse_error(reply)
    assert not is_outage(exc), (type(exc), str(exc))


def test_connection_and_cluster_errors_are_outages_but_authentication_errors_are_not() -> None:
    assert is_outage(redis.ConnectionError("Connection refused"))
    assert is_outage(redis.TimeoutError("Timeout reading from socket"))
    assert is_outage(redis.exceptions.BusyLoadingError("Redis is loading"))
    assert is_outage(redis.exceptions.SlotNotCoveredError('Slot "7" is not covered'))
    assert not is_outage(redis.AuthenticationError("invalid password"))
    assert not is_outage(redis.exceptions.AuthorizationError("no"))
    assert not is_outage(ValueError("not Redis at all"))


# -- refusals from a real server -----------------------------------------------------------------


@pytest.fixture
def min_replicas(r: redis.Redis) -> Iterator[None]:
    """The test server (which has no replica) refuses writes: min-replicas-to-write 1."""
    r.config_set("min-replicas-to-write", 1)
    try:
        yield
    finally:
        r.config_set("min-replicas-to-write", 0)


def test_every_script_refused_for_missing_replicas_raises_an_outage(
    r: redis.Redis, min_replicas: None
) -> None:
    r.config_set("min-replicas-to-write", 0)
    q = dueq.Queue("norep", r, lease=30)
    q.schedule({}, id="claimed")
    q.schedule({}, id="due")
    d = q.claim(1)[0]
    r.config_set("min-replicas-to-write", 1)
    errors = {
        "claim": refused(lambda: q.claim(1)),
        "ack": refused(d.ack),
        "fail": refused(lambda: d.fail(ValueError("x"))),
        "extend": refused(lambda: d.extend(30)),
        "release": refused(d.release),
    }
    for what, exc in errors.items():
        assert "NOREPLICAS" in str(exc), (what, exc)
        assert is_outage(exc), (what, type(exc), exc)
        assert "NOREPLICAS" in outage_reason(exc)  # type: ignore[operator]


@pytest.fixture
def full_memory(r: redis.Redis) -> Iterator[Callable[[bool], None]]:
    """``fill(True)`` makes the test server refuse writes (OOM), ``fill(False)`` frees it."""

    def fill(full: bool) -> None:
        if full:
            r.set("ballast", b"x" * 8_000_000)  # most of the memory in use: half is below it
            r.config_set("maxmemory", int(r.info("memory")["used_memory"]) // 2)
        else:
            r.config_set("maxmemory", 0)
            r.delete("ballast")

    try:
        yield fill
    finally:
        fill(False)


def test_scripts_refused_for_memory_raise_an_outage_and_acks_still_go_through(
    r: redis.Redis, full_memory: Callable[[bool], None]
) -> None:
    q = dueq.Queue("oom", r, lease=30)
    for i in range(3):
        q.schedule({}, id=f"t{i}")
    acked, failed, extended = q.claim(3)
    full_memory(True)
    errors = {
        "fail": refused(lambda: failed.fail(ValueError("x"))),
        "extend": refused(lambda: extended.extend(30)),
    }
    for what, exc in errors.items():
        assert is_outage(exc), (what, type(exc), exc)
        assert outage_reason(exc), what
    acked.ack()  # an ack only removes data: Redis accepts it
    full_memory(False)
    assert q.get("t0") is None


# -- a primary that loses its replica ----------------------------------------------------------


@pytest.fixture
def replicated() -> Iterator[tuple[RedisServer, RedisServer]]:
    """A primary with one replica, and ``min-replicas-to-write 1`` as the README recommends."""
    with RedisServer(extra_args=["--repl-diskless-sync-delay", "0"]) as primary:
        replicaof = ["--replicaof", "127.0.0.1", str(primary.port)]
        with RedisServer(extra_args=replicaof) as replica:
            client = primary.client()
            try:
                wait_for(lambda: _good_replicas(client) == 1, "the replica to connect")
                client.config_set("min-replicas-to-write", 1)
                client.config_set("min-replicas-max-lag", 10)
                yield primary, replica
            finally:
                client.close()


def _good_replicas(client: redis.Redis) -> int:
    info = client.info("replication")
    return sum(
        1
        for key, value in info.items()
        if key.startswith("slave") and isinstance(value, dict) and value.get("state") == "online"
    )


def test_consumers_wait_out_a_missing_replica_and_lose_nothing(
    replicated: tuple[RedisServer, RedisServer], caplog: pytest.LogCaptureFixture
) -> None:
    primary, replica = replicated
    r = primary.client()
    q = dueq.Queue("replicated", r, lease=60)
    first = q.schedule({"n": "first"})
    blocked = q.schedule({"n": "blocked"})
    later = [q.schedule({"n": i}, delay=3.0) for i in range(5)]  # due during the outage
    runs: list[str] = []
    lock = threading.Lock()
    running = threading.Event()
    proceed = threading.Event()

    def handle(d: dueq.Delivery) -> None:
        with lock:
            runs.append(d.id)
        if d.id == blocked:
            running.set()
            assert proceed.wait(WAIT_S)  # finishes (and is acked) while the replica is gone

    outcomes: list[dueq.Outcome] = []
    errors: list[Exception] = []
    stream = q.observe(max_in_flight=8).pipe(dueq.operators.process(handle, concurrency=2))
    with caplog.at_level("WARNING"):
        sub = stream.subscribe(on_next=outcomes.append, on_error=errors.append)
        try:
            wait_for(lambda: running.is_set() and first in {o.id for o in outcomes}, "first")
            replica.kill()
            wait_for(lambda: _good_replicas(r) == 0, "the primary to notice")
            settled_before = {o.id for o in outcomes}
            proceed.set()
            time.sleep(3.5)  # the later tasks fall due; claims and the ack are refused meanwhile
            assert {o.id for o in outcomes} == settled_before  # nothing settles without replica
            replica.restart()
            wait_for(lambda: len(outcomes) == 7, "every outcome after the replica is back")
        finally:
            sub.dispose()
    assert errors == []
    assert sorted((o.id, o.kind, o.attempt) for o in outcomes) == sorted(
        (tid, "acked", 1) for tid in [first, blocked, *later]
    )
    assert sorted(runs) == sorted([first, blocked, *later])  # each ran once
    stats = q.stats()
    assert (stats.scheduled, stats.leased, stats.dead) == (0, 0, 0)
    assert any("NOREPLICAS" in rec.getMessage() for rec in caplog.records)
    r.close()


def test_a_worker_keeps_running_while_the_replica_is_gone_and_runs_what_fell_due(
    replicated: tuple[RedisServer, RedisServer],
) -> None:
    primary, replica = replicated
    r = primary.client()
    q = dueq.Queue("replicated-worker", r)
    due_later = [q.schedule({"n": i}, delay=2.0) for i in range(3)]
    worker = dueq.Worker(q, lambda d: None, concurrency=2)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:  # what used to end the worker: NOREPLICAS
            failure.append(exc)

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    try:
        replica.kill()
        wait_for(lambda: _good_replicas(r) == 0, "the primary to notice")
        time.sleep(2.5)  # the tasks fall due while writes are refused
        assert runner.is_alive() and worker.outcomes["acked"] == 0
        replica.restart()
        wait_for(lambda: worker.outcomes["acked"] == 3, "the tasks after the replica is back")
    finally:
        worker.stop()
        runner.join(WAIT_S)
        r.close()
    assert failure == [] and dict(worker.outcomes) == {"acked": 3}
    assert q.get(due_later[0]) is None


def test_a_replica_that_lost_its_primary_is_an_outage_for_its_readers(
    replicated: tuple[RedisServer, RedisServer],
) -> None:
    primary, replica = replicated
    client = replica.client()
    client.config_set("replica-serve-stale-data", "no")
    primary.kill()
    wait_for(lambda: client.info("replication")["master_link_status"] == "down", "the link to drop")
    q = dueq.Queue("stale", client)
    exc = refused(lambda: q.get("x"))
    assert "MASTER is down" in str(exc)
    assert is_outage(exc) and "MASTERDOWN" in outage_reason(exc)  # type: ignore[operator]
    write = refused(lambda: q.schedule({}))
    assert is_outage(write)
    client.close()


# -- settling under memory pressure ------------------------------------------------------------


def test_successes_settled_with_a_refused_failure_are_acked_once_and_run_once(
    r: redis.Redis, full_memory: Callable[[bool], None]
) -> None:
    # short leases: if the acks waited behind the refused failure they would run out
    lease_s = 3.0
    q = dueq.Queue(
        "pressure", r, lease=lease_s, retry=dueq.RetryPolicy(max_attempts=5, wait=lambda s: 0.0)
    )
    bad = q.schedule({"ok": False}, id="bad")
    good = [q.schedule({"ok": True}, id=f"good{i}") for i in range(4)]
    runs: list[tuple[str, int]] = []
    lock = threading.Lock()
    all_running = threading.Barrier(6)
    refuse_memory = threading.Event()

    def handle(d: dueq.Delivery) -> None:
        with lock:
            runs.append((d.id, d.attempt))
        if d.attempt == 1:
            all_running.wait(WAIT_S)  # all five run at once, then Redis fills up
            assert refuse_memory.wait(WAIT_S)
            if d.id != bad:
                time.sleep(0.2)  # the failure reaches the settler first
        if not d.payload["ok"] and d.attempt == 1:
            raise ValueError("refused while memory is full")

    outcomes: list[dueq.Outcome] = []
    errors: list[Exception] = []
    stream = q.observe(max_in_flight=5).pipe(dueq.operators.process(handle, concurrency=5))
    sub = stream.subscribe(on_next=outcomes.append, on_error=errors.append)
    try:
        all_running.wait(WAIT_S)
        full_memory(True)
        refuse_memory.set()
        wait_for(lambda: {o.id for o in outcomes} >= set(good), "the successes' acks")
        time.sleep(2 * lease_s)  # an unacked success would now be delivered again
        full_memory(False)
        wait_for(lambda: any(o.id == bad and o.kind == "acked" for o in outcomes), "the retry")
    finally:
        sub.dispose()
    assert errors == []
    for tid in good:
        assert [run for run in runs if run[0] == tid] == [(tid, 1)]
        assert [(o.kind, o.attempt) for o in outcomes if o.id == tid] == [("acked", 1)]
    assert q.get(bad) is None and q.stats().counters["acked"] == 5


# -- stopping during an outage -------------------------------------------------------------------


def _hold_and_refuse(
    r: redis.Redis, name: str
) -> tuple[dueq.Queue, Callable[[dueq.Delivery], None], threading.Event, threading.Event]:
    """A queue with three due tasks and a handler that blocks on the first until told."""
    q = dueq.Queue(name, r, lease=60)
    q.schedule_many(dueq.Task({"i": i}) for i in range(3))
    running, proceed = threading.Event(), threading.Event()

    def handle(d: dueq.Delivery) -> None:
        running.set()
        assert proceed.wait(WAIT_S)

    return q, handle, running, proceed


def _returns(call: Callable[[], None]) -> bool:
    """Run ``call`` on a thread; True if it returns within WAIT_S (it hangs otherwise)."""
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(WAIT_S)
    return not thread.is_alive()


def test_a_worker_stopped_during_an_outage_returns_after_its_grace(
    r: redis.Redis, min_replicas: None
) -> None:
    r.config_set("min-replicas-to-write", 0)
    q, handle, running, proceed = _hold_and_refuse(r, "stop-in-outage")
    worker = dueq.Worker(q, handle, concurrency=1, max_in_flight=3, grace=0.5)
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    try:
        assert running.wait(WAIT_S)
        r.config_set("min-replicas-to-write", 1)  # releases of the waiting two are refused now
        worker.stop()
        runner.join(WAIT_S)
        assert not runner.is_alive(), "Worker.run() did not return during the outage"
    finally:
        proceed.set()
        r.config_set("min-replicas-to-write", 0)
        runner.join(WAIT_S)
    assert worker.outcomes["lost"] == 3  # released nothing: their leases run out by themselves


def test_disposing_a_subscription_during_an_outage_does_not_block(
    r: redis.Redis, min_replicas: None
) -> None:
    r.config_set("min-replicas-to-write", 0)
    q, handle, running, proceed = _hold_and_refuse(r, "dispose-in-outage")
    stream = q.observe(max_in_flight=3).pipe(dueq.operators.process(handle, concurrency=1))
    outcomes: list[dueq.Outcome] = []
    sub = stream.subscribe(on_next=outcomes.append)
    try:
        assert running.wait(WAIT_S)
        r.config_set("min-replicas-to-write", 1)
        assert _returns(sub.dispose), "dispose() blocked releasing during the outage"
    finally:
        proceed.set()
        r.config_set("min-replicas-to-write", 0)
    # once Redis takes writes again, in the background, the waiting two are released and the
    # running one is acked (the subscriber, gone, sees no outcomes)
    wait_for(lambda: q.stats().counters.get("acked") == 1, "the ack in the background")
    stats = wait_for(lambda: (s := q.stats()).scheduled == 2 and s, "the releases")
    assert stats.leased == 0 and stats.counters.get("retried", 0) == 0


def test_the_lease_keeper_reports_an_outage_once_per_round_not_once_per_lease(
    r: redis.Redis, full_memory: Callable[[bool], None], caplog: pytest.LogCaptureFixture
) -> None:
    q = dueq.Queue("keeper-oom", r, lease=1.5)
    q.schedule_many(dueq.Task({"i": i}) for i in range(3))
    all_running = threading.Barrier(4)
    proceed = threading.Event()

    def handle(d: dueq.Delivery) -> None:
        all_running.wait(WAIT_S)
        assert proceed.wait(WAIT_S)

    def messages() -> list[str]:
        return [rec.getMessage() for rec in caplog.records]

    stream = q.observe(max_in_flight=3).pipe(dueq.operators.process(handle, concurrency=3))
    with caplog.at_level("WARNING", logger="dueq.operators"):
        sub = stream.subscribe()
        try:
            all_running.wait(WAIT_S)
            full_memory(True)  # every extend is refused now
            wait_for(
                lambda: any("OOM" in m and "3 lease(s) not extended" in m for m in messages()),
                "one warning naming the three leases",
            )
        finally:
            full_memory(False)
            proceed.set()
            sub.dispose()
    assert not [m for m in messages() if "could not extend the lease on" in m]


def test_both_consumers_log_the_same_line_for_the_same_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # the claim loop's decisions (and their log lines) are written once, for both front ends
    def first_warning() -> logging.LogRecord | None:
        return next((rec for rec in caplog.records if "unavailable" in rec.getMessage()), None)

    with RedisServer() as server:
        client = server.client()
        dueq.Queue("same-line", client).schedule({}, id="due")
        client.config_set("min-replicas-to-write", 1)  # no replica: each claim gets NOREPLICAS
        with caplog.at_level("WARNING", logger="dueq"):
            sub = dueq.Queue("same-line", client).observe(wake=False).subscribe()
            try:
                threaded = wait_for(first_warning, "the threaded consumer's warning")
            finally:
                sub.dispose()
            caplog.clear()

            async def main() -> logging.LogRecord:
                aclient = redis.asyncio.Redis(port=server.port)
                it = dueq.AsyncQueue("same-line", aclient).deliveries(wake=False)
                claiming = asyncio.ensure_future(anext(it))
                try:
                    async with asyncio.timeout(WAIT_S):
                        while (found := first_warning()) is None:
                            await asyncio.sleep(0.02)
                    return found
                finally:
                    claiming.cancel()
                    await asyncio.wait({claiming})
                    await it.aclose()
                    await aclient.aclose()

            asynced = asyncio.run(main())
        client.close()
    assert "NOREPLICAS" in threaded.getMessage()
    # the same words and values (the retry delay is jittered: left out)
    assert (asynced.name, asynced.levelno, asynced.msg) == (
        threaded.name,
        threaded.levelno,
        threaded.msg,
    )
    assert asynced.args[:3] == threaded.args[:3]  # type: ignore[index]


def test_the_claim_rules_back_off_on_an_outage_and_end_the_stream_on_anything_else(
    r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # the decisions both consumers drive (dueq._consume.rules): what a claim's error means
    q = dueq.Queue("rules", r)
    rules: consume.ClaimRules[dueq.Delivery] = consume.ClaimRules(
        q.name, prefetch.Prefetch.parse(8), 5000
    )
    with caplog.at_level("INFO", logger="dueq"):
        backoff_ms = rules.failed(redis.ConnectionError("gone"))
        assert backoff_ms is not None and backoff_ms > 0
        assert rules.claimed(q.claim_batch(rules.to_claim(0.0)), lambda d: None) == 5000
        assert rules.failed(ValueError("a bug")) is None
    assert [rec.getMessage().split(";")[0] for rec in caplog.records] == [
        "queue 'rules': Redis unavailable (try 1): ConnectionError: gone",
        "queue 'rules': Redis is back",
        "queue 'rules': consumer stopped by ValueError: a bug",
    ]
