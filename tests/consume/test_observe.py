"""Queue.observe: timing in virtual time (TestScheduler + real Redis), wake-ups, backpressure."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone

import pytest
import redis
from reactivex.testing import TestScheduler
from redis.backoff import NoBackoff
from redis.retry import Retry

import dueq
from dueq.server import RedisServer, free_port

START = 1_800_000_000.0


@pytest.fixture
def ts() -> TestScheduler:
    scheduler = TestScheduler()
    scheduler.advance_to(START)
    return scheduler


@pytest.fixture
def vq(r: redis.Redis, ts: TestScheduler) -> dueq.Queue:
    """A queue whose clock is the TestScheduler's virtual time."""
    return dueq.Queue(
        "v",
        r,
        clock=lambda: ts.now.timestamp(),
        retry=dueq.RetryPolicy(max_attempts=3, wait=lambda state: 10.0),
        lease=30,
    )


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(START + seconds, tz=timezone.utc)


def collect(
    ts: TestScheduler, q: dueq.Queue, *, ack: bool = False, **kwargs: object
) -> tuple[list, list, object]:
    """Subscribe on virtual time; returns (deliveries with emission time, errors, disposable).
    With ``ack`` each delivery is acked as it arrives."""
    got: list[tuple[float, dueq.Delivery]] = []
    errors: list[Exception] = []

    def on_next(d: dueq.Delivery) -> None:
        got.append((ts.now.timestamp(), d))
        if ack:
            d.ack()

    sub = q.observe(scheduler=ts, wake=False, **kwargs).subscribe(  # type: ignore[arg-type]
        on_next=on_next, on_error=errors.append
    )
    return got, errors, sub


def test_each_task_is_emitted_exactly_at_its_due_time_never_early(
    vq: dueq.Queue, ts: TestScheduler
) -> None:
    offsets = [0.25, 1.0, 1.0, 2.5, 7.125, 60.0]
    for i, offset in enumerate(offsets):
        vq.schedule({"i": i}, at=at(offset), id=f"t{i}")
    got, errors, sub = collect(ts, vq, ack=True)
    for _ in range(1300):  # 65 s a step at a time, so any early emission would be seen
        ts.advance_by(0.05)
    sub.dispose()  # type: ignore[attr-defined]
    assert errors == []
    assert sorted(d.id for _, d in got) == [f"t{i}" for i in range(len(offsets))]
    for emitted_at, d in got:
        assert emitted_at * 1000 >= d.due_ms  # never early
        # on time: the consumer slept exactly until the due time the claim script returned
        assert emitted_at == pytest.approx(START + offsets[int(d.id[1:])], abs=1e-6)


def test_an_idle_consumer_sleeps_until_the_heartbeat(vq: dueq.Queue, ts: TestScheduler) -> None:
    claims = []
    original = vq.claim_batch

    def counting(*args: object, **kwargs: object) -> dueq.ClaimBatch:
        claims.append(ts.now.timestamp() - START)
        return original(*args, **kwargs)  # type: ignore[arg-type]

    vq.claim_batch = counting  # type: ignore[method-assign]
    got, errors, sub = collect(ts, vq, heartbeat=5.0)
    ts.advance_by(16.0)
    sub.dispose()  # type: ignore[attr-defined]
    assert claims == [0.0, 5.0, 10.0, 15.0]
    assert got == [] and errors == []


def test_a_consumer_sleeping_until_a_far_task_is_woken_by_an_earlier_one(
    r: redis.Redis,
) -> None:
    q = dueq.Queue("wake", r)
    q.schedule({"far": True}, delay=3600)
    got: list[dueq.Delivery] = []
    arrived = threading.Event()
    sub = q.observe(heartbeat=3600).subscribe(on_next=lambda d: (got.append(d), arrived.set()))
    try:
        assert not arrived.wait(0.3)  # asleep: the only task is an hour away
        tid = q.schedule({"near": True})
        assert arrived.wait(10), "the schedule did not wake the consumer"
    finally:
        sub.dispose()
    assert [d.id for d in got] == [tid]


def test_no_more_than_max_in_flight_unsettled_deliveries(vq: dueq.Queue, ts: TestScheduler) -> None:
    vq.schedule_many(dueq.Task({"i": i}, id=f"t{i:02}") for i in range(20))
    got, errors, sub = collect(ts, vq, max_in_flight=5)
    ts.advance_by(1.0)
    assert len(got) == 5
    ts.advance_by(20.0)  # time passes, still nothing settled: no more claims
    assert len(got) == 5
    got[0][1].ack()
    got[1][1].fail(RuntimeError("x"))
    ts.advance_by(0.001)
    assert len(got) == 7  # exactly the two freed slots were claimed
    for _, d in got[2:7]:
        d.release()
    ts.advance_by(0.001)
    assert len(got) == 12
    sub.dispose()  # type: ignore[attr-defined]
    assert errors == []
    assert vq.stats().leased == 12 - 2 - 5


def test_slots_of_deliveries_whose_lease_ran_out_are_freed(
    vq: dueq.Queue, ts: TestScheduler
) -> None:
    vq.schedule_many(dueq.Task({"i": i}, id=f"t{i}") for i in range(3))
    got, _, sub = collect(ts, vq, max_in_flight=2)
    ts.advance_by(1.0)
    assert [d.id for _, d in got] == ["t0", "t1"]
    ts.advance_by(30.5)  # the leases (30 s) expire unsettled: their slots are free again
    assert [(d.id, d.attempt) for _, d in got] == [("t0", 1), ("t1", 1), ("t2", 1)]
    ts.advance_by(10.0)  # the expired ones are due again after the 10 s backoff; one slot left
    sub.dispose()  # type: ignore[attr-defined]
    assert len(got) == 4
    assert got[3][1].id in {"t0", "t1"} and got[3][1].attempt == 2


def test_dispose_stops_claiming(vq: dueq.Queue, ts: TestScheduler) -> None:
    got, _, sub = collect(ts, vq)
    ts.advance_by(1.0)
    sub.dispose()  # type: ignore[attr-defined]
    vq.schedule({"late": True}, id="late")
    ts.advance_by(60.0)
    assert got == []
    info = vq.get("late")
    assert info is not None and info.state == "scheduled"
    assert vq.stats().counters.get("claimed", 0) == 0


def test_a_redis_outage_is_retried_with_backoff_and_never_reaches_on_error(
    ts: TestScheduler, caplog: pytest.LogCaptureFixture
) -> None:
    # nothing listens there; no redis-py retries, so each claim fails at once
    dead_end = redis.Redis(port=free_port(), retry=Retry(NoBackoff(), 0))
    q = dueq.Queue("down", dead_end, clock=lambda: ts.now.timestamp())
    got, errors, sub = collect(ts, q)
    with caplog.at_level("WARNING"):
        ts.advance_by(30.0)
    sub.dispose()  # type: ignore[attr-defined]
    assert errors == [] and got == []
    tries = [rec for rec in caplog.records if "Redis unavailable" in rec.getMessage()]
    # backoff: 50 ms doubling (with jitter) up to 5 s; a fixed 50 ms poll would try 600 times
    assert 6 <= len(tries) <= 20


def test_an_undecodable_task_goes_dead_and_the_stream_goes_on(
    vq: dueq.Queue, ts: TestScheduler, r: redis.Redis
) -> None:
    vq.schedule({"ok": 1}, id="a")
    vq.schedule({"ok": 2}, id="b", delay=1)
    r.hset(vq.keys.tasks, "a", b"9:not an envelope")
    got, errors, sub = collect(ts, vq)
    ts.advance_by(2.0)
    sub.dispose()  # type: ignore[attr-defined]
    assert errors == []
    assert [d.id for _, d in got] == ["b"]
    dead = vq.get("a")
    assert dead is not None and dead.state == "dead" and dead.errors[0].type == "PayloadError"


def test_two_subscriptions_share_the_work_without_duplicates(r: redis.Redis) -> None:
    q = dueq.Queue("shared", r)
    q.schedule_many(dueq.Task({"i": i}) for i in range(2000))
    seen: list[str] = []
    lock = threading.Lock()
    finished = threading.Event()

    def take(d: dueq.Delivery) -> None:
        d.ack()
        with lock:
            seen.append(d.id)
            if len(seen) == 2000:
                finished.set()

    subs = [q.observe(max_in_flight=50).subscribe(on_next=take) for _ in range(2)]
    try:
        assert finished.wait(60)
    finally:
        for sub in subs:
            sub.dispose()
    assert len(seen) == len(set(seen)) == 2000


def test_observe_rejects_bad_arguments(vq: dueq.Queue) -> None:
    bad: list[Callable[[], object]] = [
        lambda: vq.observe(max_in_flight=0),
        lambda: vq.observe(max_in_flight=1.5),  # type: ignore[arg-type]
        lambda: vq.observe(heartbeat=0),
    ]
    for call in bad:
        with pytest.raises(dueq.ConfigurationError):
            call()


def test_heartbeat_accepts_a_timedelta(vq: dueq.Queue, ts: TestScheduler) -> None:
    got, errors, sub = collect(ts, vq, ack=True, heartbeat=timedelta(seconds=2))
    vq.schedule({}, id="x", delay=10)
    ts.advance_by(10.0)  # no wake channel here: found by the heartbeat at 10 s
    sub.dispose()  # type: ignore[attr-defined]
    assert [d.id for _, d in got] == ["x"] and errors == []


def _check_server_logs(
    q: dueq.Queue, admin: redis.Redis, caplog: pytest.LogCaptureFixture, policy: str
) -> list[logging.LogRecord]:
    """What ``check_server`` logs (INFO and up) with ``maxmemory-policy`` set to ``policy``."""
    admin.config_set("maxmemory-policy", policy)
    try:
        with caplog.at_level("INFO", logger="dueq"):
            q.check_server()
    finally:
        admin.config_set("maxmemory-policy", "noeviction")
    return [rec for rec in caplog.records if rec.name.startswith("dueq")]


@pytest.mark.parametrize("policy", ["allkeys-lru", "allkeys-lfu", "allkeys-random"])
def test_a_policy_that_may_evict_any_key_warns_that_tasks_can_be_lost(
    vq: dueq.Queue, admin: redis.Redis, caplog: pytest.LogCaptureFixture, policy: str
) -> None:
    warnings = [
        rec
        for rec in _check_server_logs(vq, admin, caplog, policy)
        if rec.levelno >= logging.WARNING
    ]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert policy in message and "lose tasks" in message and "noeviction" in message


@pytest.mark.parametrize(
    "policy", ["volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl"]
)
def test_a_policy_that_evicts_only_keys_with_a_ttl_does_not_warn_of_loss(
    vq: dueq.Queue, admin: redis.Redis, caplog: pytest.LogCaptureFixture, policy: str
) -> None:
    records = _check_server_logs(vq, admin, caplog, policy)
    assert [rec for rec in records if rec.levelno >= logging.WARNING] == []
    notes = [rec.getMessage() for rec in records if rec.levelno == logging.INFO]
    assert len(notes) == 1 and policy in notes[0] and "refuse" in notes[0]
    assert "lose" not in notes[0]


def test_noeviction_logs_nothing(
    vq: dueq.Queue, admin: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    assert _check_server_logs(vq, admin, caplog, "noeviction") == []


def test_a_consumer_warns_at_start_when_redis_may_evict_keys(
    vq: dueq.Queue, ts: TestScheduler, admin: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    admin.config_set("maxmemory-policy", "allkeys-lru")
    try:
        with caplog.at_level("WARNING"):
            _, errors, sub = collect(ts, vq)
            ts.advance_by(0.001)  # the first claim checks the server
            sub.dispose()  # type: ignore[attr-defined]
    finally:
        admin.config_set("maxmemory-policy", "noeviction")
    assert errors == []
    assert any("noeviction" in rec.getMessage() for rec in caplog.records)


@pytest.fixture
def least_privileged(redis_server: RedisServer, admin: redis.Redis) -> Iterator[redis.Redis]:
    """A client for an ACL user that may run dueq's scripts but not INFO or CONFIG."""
    admin.acl_setuser(
        "no-info",
        enabled=True,
        passwords=["+pw"],
        keys=["*"],
        channels=["*"],
        commands=["+@all", "-info", "-config"],
    )
    client = redis_server.client(username="no-info", password="pw")
    try:
        yield client
    finally:
        client.close()
        admin.acl_deluser("no-info")


def test_a_consumer_without_info_or_config_permission_checks_the_server_and_claims(
    least_privileged: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(redis.exceptions.NoPermissionError):
        least_privileged.info("server")  # the user really lacks INFO
    q = dueq.Queue("limited", least_privileged)
    tid = q.schedule({"x": 1})
    with caplog.at_level("DEBUG", logger="dueq"):
        q.check_server()
        deliveries = q.claim()
    assert [d.id for d in deliveries] == [tid]
    deliveries[0].ack()
    assert not [rec for rec in caplog.records if rec.levelno >= logging.WARNING]


def test_a_worker_without_info_or_config_permission_runs_its_tasks(
    least_privileged: redis.Redis,
) -> None:
    q = dueq.Queue("limited", least_privileged)
    q.schedule_many(dueq.Task({"i": i}) for i in range(10))
    outcomes: list[dueq.Outcome] = []
    errors: list[Exception] = []
    done = threading.Event()

    def count(outcome: dueq.Outcome) -> None:
        outcomes.append(outcome)
        if len(outcomes) == 10:
            done.set()

    stream = q.observe().pipe(dueq.operators.process(lambda d: None, concurrency=2))
    sub = stream.subscribe(on_next=count, on_error=errors.append)
    try:
        assert done.wait(30) or errors, outcomes
    finally:
        sub.dispose()
    assert errors == []
    assert sorted(o.kind for o in outcomes) == ["acked"] * 10


def test_observe_refuses_huge_and_nan_settings_with_a_configuration_error(
    vq: dueq.Queue,
) -> None:
    for kwargs in (
        {"heartbeat": 10**400},
        {"heartbeat": float("nan")},
        {"heartbeat": float("inf")},
        {"max_in_flight": 10**400},
        {"max_in_flight": float("nan")},
    ):
        with pytest.raises(dueq.ConfigurationError):
            vq.observe(**kwargs)  # type: ignore[arg-type]
