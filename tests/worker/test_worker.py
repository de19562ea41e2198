"""Worker processes that are killed, stopped and signalled; a Redis that restarts; idle traffic."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from paths_support import FIXTURES
from reactivex.testing import TestScheduler
from waiting_support import wait_for, when_still

import dueq
from dueq.server import RedisServer

WAIT_S = 30
CHILD = FIXTURES / "worker_process.py"


@pytest.fixture
def spawn(redis_server: RedisServer) -> Iterator[Any]:
    """Start worker processes (see worker_process.py); all are killed at the end."""
    children: list[subprocess.Popen[bytes]] = []

    def start(*args: str) -> subprocess.Popen[bytes]:
        child = subprocess.Popen([sys.executable, str(CHILD), "--url", redis_server.url, *args])
        children.append(child)
        return child

    yield start
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGCONT)
            child.kill()
        child.wait()


def started(r: redis.Redis, n: int = 1) -> list[str]:
    return wait_for(
        lambda: [x.decode() for x in r.lrange("started", 0, -1)] if r.llen("started") >= n else [],
        f"{n} handler(s) to start",
    )


def claim_one(q: dueq.Queue) -> dueq.Delivery:
    """Claim from this test process until a task comes (its lease elsewhere must run out)."""
    return wait_for(lambda: (q.claim(1) or [None])[0], "a task to be redelivered")


def test_a_worker_killed_mid_task_has_its_task_redelivered_as_attempt_2(
    r: redis.Redis, spawn: Any
) -> None:
    q = dueq.Queue("w", r, lease=1.0)
    tid = q.schedule({"job": 1})
    child = spawn("--lease", "1")
    assert started(r) == [f"{tid}:1"]
    child.kill()  # SIGKILL: no clean-up, the lease is left behind
    child.wait()
    d = claim_one(q)
    assert (d.id, d.attempt) == (tid, 2)
    d.ack()


def test_a_worker_stopped_past_its_lease_cannot_ack_after_it_resumes(
    r: redis.Redis, spawn: Any
) -> None:
    q = dueq.Queue("w", r, lease=1.0)
    tid = q.schedule({"job": 1})
    child = spawn("--lease", "1", "--sleep", "0.5")
    assert started(r) == [f"{tid}:1"]
    child.send_signal(signal.SIGSTOP)  # frozen: no lease extension, no ack
    d = claim_one(q)  # its lease ran out; another consumer takes over
    assert (d.id, d.attempt) == (tid, 2)
    d.ack()
    child.send_signal(signal.SIGCONT)  # its handler finishes; its ack must be refused
    outcomes = _stop(r, child)  # the grace period waits for that ack to be settled
    assert outcomes == {"lost": 1}
    assert q.stats().counters["acked"] == 1  # only the new holder's ack counted


def _stop(r: redis.Redis, child: subprocess.Popen[bytes]) -> dict[str, int]:
    child.send_signal(signal.SIGTERM)
    assert child.wait(WAIT_S) == 0
    raw = r.lpop("exited")
    assert raw is not None
    result: dict[str, int] = json.loads(raw)
    return result


@pytest.mark.parametrize("front_end", ["sync", "async"])
def test_sigterm_lets_the_running_handler_finish_and_releases_the_rest(
    r: redis.Redis, spawn: Any, front_end: str
) -> None:
    q = dueq.Queue("w", r, lease=5.0)
    ids = [q.schedule({"i": i}, id=f"t{i}") for i in range(4)]
    child = spawn(
        *("--lease", "5", "--sleep", "1", "--concurrency", "1", "--max-in-flight", "4"),
        *("--front-end", front_end),
    )
    (first,) = started(r)
    wait_for(lambda: q.stats().leased == 4, "the worker to hold all four")
    child.send_signal(signal.SIGTERM)
    assert child.wait(WAIT_S) == 0
    assert json.loads(r.lpop("exited") or b"{}") == {"acked": 1, "released": 3}
    running = first.split(":")[0]
    assert q.get(running) is None  # finished and acked within the grace period
    for tid in ids:
        if tid != running:
            info = q.get(tid)
            assert info is not None and info.state == "scheduled" and info.attempt == 0


def run_until_acked(worker: dueq.Worker, n: int) -> None:
    """Run the worker in a thread until it has acked ``n`` tasks, then stop it from here."""
    thread = threading.Thread(target=worker.run)
    thread.start()
    wait_for(lambda: worker.outcomes["acked"] == n, f"{n} acks")
    worker.stop()
    thread.join(WAIT_S)
    assert not thread.is_alive()


def test_worker_stop_from_another_thread_returns_cleanly(r: redis.Redis) -> None:
    q = dueq.Queue("w", r)
    q.schedule_many(dueq.Task({"i": i}) for i in range(100))
    worker = dueq.Worker(q, lambda d: None, concurrency=4)
    run_until_acked(worker, 100)
    assert q.stats().counters["acked"] == 100


def test_a_signal_that_lands_inside_the_run_loops_wait_does_not_deadlock(r: redis.Redis) -> None:
    # A signal handler runs on the main thread between two bytecodes, which can be inside
    # Event.wait while that thread holds the event's (non-reentrant) lock. The handler must
    # not take that lock (Event.set would wait forever: a worker that ignored SIGTERM in CI).
    worker = dueq.Worker(dueq.Queue("w", r), lambda d: None)
    handled = threading.Event()

    def signal_inside_the_wait() -> None:
        with worker._stop._cond:  # type: ignore[attr-defined]  # where the main thread may be
            worker._on_signal(signal.SIGTERM, None)
        handled.set()

    threading.Thread(target=signal_inside_the_wait, daemon=True).start()
    assert handled.wait(WAIT_S), "the signal handler blocked on the run loop's lock"
    thread = threading.Thread(target=worker.run)
    thread.start()  # the recorded signal stops it as stop() would
    thread.join(WAIT_S)
    assert not thread.is_alive()


def test_the_consumer_survives_a_redis_restart_and_delivers_what_came_after() -> None:
    with RedisServer(appendonly=True) as server:
        r = server.client()
        q = dueq.Queue("restart", r)
        before = q.schedule({"when": "before"}, delay=1.5)  # due while Redis is down
        acked: list[str] = []
        errors: list[Exception] = []
        stream = q.observe().pipe(dueq.operators.process(lambda d: None, concurrency=2))
        sub = stream.subscribe(on_next=lambda o: acked.append(o.id), on_error=errors.append)
        try:
            first = q.schedule({"when": "first"})
            wait_for(lambda: first in acked, "the first task")
            server.restart(kill=True)
            wait_for(lambda: before in acked, "the task scheduled before the restart")
            after = q.schedule({"when": "after"})
            wait_for(lambda: after in acked, "a task scheduled after the restart")
        finally:
            sub.dispose()
            r.close()
    assert errors == []
    assert sorted(acked) == sorted([first, before, after])


def _commands(r: redis.Redis) -> int:
    return int(r.info("stats")["total_commands_processed"])


def test_an_idle_consumer_sends_a_few_commands_per_minute(r: redis.Redis) -> None:
    ts = TestScheduler()
    ts.advance_to(1_800_000_000)
    q = dueq.Queue("idle", r, clock=lambda: ts.now.timestamp())
    sub = q.observe(scheduler=ts, wake=False).subscribe()
    ts.advance_by(0.001)  # the first claim and the server check
    before = _commands(r)
    ts.advance_by(60.0)  # one virtual minute with nothing to do
    spent = _commands(r) - before - 1  # minus the INFO that reads the counter
    sub.dispose()
    # 12 heartbeats (every 5 s) of one claim script each, the commands inside it included
    assert 12 <= spent <= 12 * 8, spent


def test_the_wake_listener_itself_sends_no_commands_while_idle(r: redis.Redis) -> None:
    q = dueq.Queue("idle", r)
    sub = q.observe(heartbeat=3600).subscribe()
    wait_for(lambda: r.pubsub_shardnumsub(q.keys.wake)[0][1] == 1, "the wake subscription")
    # the claims at the start and the one the listener asks for once subscribed done
    before = when_still(lambda: _commands(r), own=1)
    time.sleep(1.0)  # deliberate, a negative check: the listener polls its socket, not Redis
    spent = _commands(r) - before - 1
    sub.dispose()
    assert spent == 0


def test_worker_refuses_bad_arguments(r: redis.Redis) -> None:
    q = dueq.Queue("w", r)
    with pytest.raises(dueq.ConfigurationError):
        dueq.Worker([], lambda d: None)
    with pytest.raises(dueq.ConfigurationError):
        dueq.Worker(q, "nope")  # type: ignore[arg-type]
    with pytest.raises(dueq.ConfigurationError):
        dueq.Worker(q, lambda d: None, concurrency=0)
    with pytest.raises(dueq.ConfigurationError):
        dueq.Worker(q, lambda d: None, grace=-1)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"grace": 10**400},
        {"grace": float("nan")},
        {"grace": float("inf")},
        {"heartbeat": 10**400},
        {"heartbeat": float("nan")},
        {"heartbeat": 0},
        {"max_in_flight": 10**400},
        {"max_in_flight": 0},
        {"max_in_flight": float("nan")},
        {"concurrency": 10**400},
        {"concurrency": float("nan")},
    ],
)
def test_worker_refuses_huge_nan_and_zero_settings_with_a_configuration_error(
    r: redis.Redis, kwargs: dict[str, Any]
) -> None:
    with pytest.raises(dueq.ConfigurationError):
        dueq.Worker(dueq.Queue("w", r), lambda d: None, **kwargs)


def test_one_worker_serves_several_queues_with_an_async_handler(r: redis.Redis) -> None:
    queues = [dueq.Queue(name, r) for name in ("alpha", "beta")]
    for q in queues:
        q.schedule_many(dueq.Task({"queue": q.name, "i": i}) for i in range(50))
    seen: list[str] = []

    async def handle(d: dueq.Delivery) -> None:
        seen.append(d.payload["queue"])

    worker = dueq.Worker(queues, handle, concurrency=4)
    run_until_acked(worker, 100)
    assert sorted(seen) == ["alpha"] * 50 + ["beta"] * 50


def test_an_ack_during_a_redis_outage_is_retried_until_redis_is_back() -> None:
    with RedisServer(appendonly=True) as server:
        r = server.client()
        q = dueq.Queue("outage-ack", r, lease=60)
        tid = q.schedule({})
        running = threading.Event()
        proceed = threading.Event()

        def handle(d: dueq.Delivery) -> None:
            running.set()
            assert proceed.wait(WAIT_S)

        outcomes: list[dueq.Outcome] = []
        stream = q.observe().pipe(dueq.operators.process(handle, concurrency=1))
        sub = stream.subscribe(on_next=outcomes.append)
        try:
            assert running.wait(WAIT_S)
            server.kill()  # Redis is gone while the handler finishes
            proceed.set()
            time.sleep(0.5)  # the ack fails and is retried with backoff meanwhile
            assert outcomes == []
            server.restart()
            wait_for(lambda: outcomes, "the ack after the restart")
        finally:
            sub.dispose()
            r.close()
    assert [(o.id, o.kind, o.attempt) for o in outcomes] == [(tid, "acked", 1)]


def test_a_handler_that_stops_its_worker_still_has_its_task_acked(r: redis.Redis) -> None:
    q = dueq.Queue("w", r)
    tid = q.schedule({})
    worker: dueq.Worker

    def handle(d: dueq.Delivery) -> None:
        worker.stop()  # e.g. a handler that shuts the service down after one job

    worker = dueq.Worker(q, handle, grace=5)
    thread = threading.Thread(target=worker.run)
    thread.start()
    thread.join(WAIT_S)
    assert not thread.is_alive()
    assert q.get(tid) is None  # done, not released to run again
    assert dict(worker.outcomes) == {"acked": 1}


def test_a_worker_whose_claims_fail_for_good_stops_and_raises_that_error(
    r: redis.Redis,
) -> None:
    q = dueq.Queue("broken", r)
    r.set(q.keys.leased, "not a sorted set")  # every claim now fails (not an outage)
    worker = dueq.Worker(q, lambda d: None)
    raised: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:  # the test looks at what it was
            raised.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(WAIT_S)
    assert not thread.is_alive()
    assert len(raised) == 1 and isinstance(raised[0], redis.ResponseError), raised
    assert "WRONGTYPE" in str(raised[0])
    assert isinstance(raised[0], dueq.CorruptQueue)  # which names the key and its type
    assert q.keys.leased in str(raised[0])
