"""dueq.operators.process against a real Redis: acks, retries, dead letters, leases, dispose."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from reactivex import operators as ops
from reactivex.testing import TestScheduler

import dueq

WAIT_S = 30  # generous bound for things that happen in milliseconds when all is well


class Outcomes:
    """Collects outcomes from a subscription; ``wait(n)`` blocks until n have arrived."""

    def __init__(self) -> None:
        self.items: list[dueq.Outcome] = []
        self.errors: list[Exception] = []
        self._cond = threading.Condition()

    def on_next(self, outcome: dueq.Outcome) -> None:
        with self._cond:
            self.items.append(outcome)
            self._cond.notify_all()

    def on_error(self, error: Exception) -> None:
        self.errors.append(error)

    def wait(self, n: int) -> list[dueq.Outcome]:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.items) >= n, WAIT_S), self.items
            return list(self.items)

    def kinds(self, task_id: str) -> list[tuple[str, int]]:
        return [(o.kind, o.attempt) for o in self.items if o.id == task_id]


@pytest.fixture
def run(r: redis.Redis) -> Iterator[Callable[..., Outcomes]]:
    """Start observe + process on a queue; everything is disposed at the end of the test."""
    subs: list[Any] = []

    def start(q: dueq.Queue, handler: Any, concurrency: int = 4, **observe: Any) -> Outcomes:
        out = Outcomes()
        stream = q.observe(**observe).pipe(dueq.operators.process(handler, concurrency))
        subs.append(stream.subscribe(on_next=out.on_next, on_error=out.on_error))
        return out

    yield start
    for sub in subs:
        sub.dispose()


def queue(r: redis.Redis, name: str = "p", **kwargs: Any) -> dueq.Queue:
    kwargs.setdefault("retry", dueq.RetryPolicy(max_attempts=3, wait=lambda state: 0.0))
    return dueq.Queue(name, r, **kwargs)


def test_success_acks_failure_retries_then_buries_with_attempt_counts(
    r: redis.Redis, run: Callable[..., Outcomes]
) -> None:
    q = queue(r)
    ok = q.schedule({"fail": False}, id="ok")
    bad = q.schedule({"fail": True}, id="bad")

    def handle(d: dueq.Delivery) -> None:
        if d.payload["fail"]:
            raise ValueError(f"attempt {d.attempt} failed")

    out = run(q, handle)
    out.wait(4)
    assert out.kinds(ok) == [("acked", 1)]
    assert out.kinds(bad) == [("retried", 1), ("retried", 2), ("dead", 3)]
    assert out.errors == []
    dead = q.get(bad)
    assert dead is not None and dead.state == "dead"
    assert [(e.attempt, e.type, e.message) for e in dead.errors] == [
        (n, "ValueError", f"attempt {n} failed") for n in (1, 2, 3)
    ]
    assert q.get(ok) is None


def test_retried_outcome_carries_the_next_attempt_time(
    r: redis.Redis, run: Callable[..., Outcomes]
) -> None:
    q = queue(r, retry=dueq.RetryPolicy(max_attempts=2, wait=lambda state: 3600.0))
    q.schedule({}, id="t")

    def handle(d: dueq.Delivery) -> None:
        raise RuntimeError("later")

    out = run(q, handle)
    (outcome,) = out.wait(1)
    info = q.get("t")
    assert outcome.kind == "retried" and outcome.at is not None
    assert info is not None and info.state == "scheduled" and info.due_at == outcome.at
    assert outcome.error == "RuntimeError: later"


def test_unrecoverable_goes_straight_to_dead(r: redis.Redis, run: Callable[..., Outcomes]) -> None:
    q = queue(r)
    q.schedule({}, id="poison")

    def handle(d: dueq.Delivery) -> None:
        raise dueq.Unrecoverable("malformed order")

    out = run(q, handle)
    assert [(o.kind, o.attempt) for o in out.wait(1)] == [("dead", 1)]


def test_a_poison_task_never_stops_the_stream(r: redis.Redis, run: Callable[..., Outcomes]) -> None:
    q = queue(r, retry=dueq.RetryPolicy(max_attempts=1))
    q.schedule_many(dueq.Task({"i": i}, id=f"t{i}") for i in range(50))

    def handle(d: dueq.Delivery) -> None:
        if d.payload["i"] == 7:
            raise SystemExit("a handler that exits is a failed task, not a dead worker")
        if d.payload["i"] == 8:
            raise KeyError("missing")

    out = run(q, handle)
    items = out.wait(50)
    kinds = {o.id: o.kind for o in items}
    assert kinds.pop("t7") == "dead" and kinds.pop("t8") == "dead"
    assert set(kinds.values()) == {"acked"} and len(kinds) == 48
    assert out.errors == []
    late = q.schedule({"i": 100}, id="after")  # still consuming
    out.wait(51)
    assert out.kinds(late) == [("acked", 1)]


def test_async_handlers_run_concurrently_on_an_event_loop(
    r: redis.Redis, run: Callable[..., Outcomes]
) -> None:
    q = queue(r)
    q.schedule_many(dueq.Task({"i": i}) for i in range(20))
    running = 0
    peak = 0

    async def handle(d: dueq.Delivery) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.05)
        running -= 1
        if d.payload["i"] == 3:
            raise RuntimeError("async failure")

    out = run(q, handle, concurrency=5)
    items = out.wait(22)  # 19 acked, then task 3 retried twice and dead
    assert sum(o.kind == "acked" for o in items) == 19
    assert sorted(o.kind for o in items if o.kind != "acked") == ["dead", "retried", "retried"]
    assert 2 <= peak <= 5  # several at once, never more than the concurrency


def test_a_handler_may_settle_its_delivery_itself(
    r: redis.Redis, run: Callable[..., Outcomes]
) -> None:
    q = queue(r)
    q.schedule({"do": "retry_in"}, id="a")

    def handle(d: dueq.Delivery) -> None:
        if d.payload["do"] == "retry_in":
            d.fail("rate limited", retry_in=7200)

    out = run(q, handle)
    (outcome,) = out.wait(1)
    assert (outcome.id, outcome.kind, outcome.error) == ("a", "retried", "rate limited")
    info = q.get("a")
    assert info is not None and info.due_at == outcome.at
    assert outcome.at is not None and info.attempt == 1


def test_a_handler_slower_than_the_lease_keeps_it(
    r: redis.Redis, run: Callable[..., Outcomes]
) -> None:
    q = queue(r, lease=1.5)
    tid = q.schedule({})
    started = threading.Event()

    def handle(d: dueq.Delivery) -> None:
        started.set()
        time.sleep(4.5)  # three leases long

    out = run(q, handle)
    assert started.wait(WAIT_S)
    rival = dueq.Queue("p", r, lease=1.5)
    stolen = []
    while not out.items:  # a second consumer keeps trying to take it while the handler runs
        stolen += rival.claim(10)
        time.sleep(0.05)
    assert stolen == []
    assert out.kinds(tid) == [("acked", 1)]


def test_dispose_releases_deliveries_that_have_not_started(r: redis.Redis) -> None:
    q = queue(r)
    q.schedule_many(dueq.Task({"i": i}, id=f"t{i}") for i in range(5))
    started = threading.Event()
    proceed = threading.Event()

    def handle(d: dueq.Delivery) -> None:
        started.set()
        assert proceed.wait(WAIT_S)

    out = Outcomes()
    stream = q.observe(max_in_flight=5).pipe(dueq.operators.process(handle, concurrency=1))
    sub = stream.subscribe(on_next=out.on_next)
    assert started.wait(WAIT_S)
    sub.dispose()  # the unstarted ones are released in the background: wait for that
    deadline = time.monotonic() + WAIT_S
    while q.stats().scheduled < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    states = {i: q.get(f"t{i}") for i in range(5)}
    leased = [i for i, info in states.items() if info is not None and info.state == "leased"]
    assert len(leased) == 1  # the running one keeps its lease and finishes
    waiting = [info for i, info in states.items() if i not in leased]
    assert all(info is not None and info.state == "scheduled" for info in waiting)
    assert all(info is not None and info.attempt == 0 for info in waiting)  # not counted
    proceed.set()
    deadline = time.monotonic() + WAIT_S
    while q.get(f"t{leased[0]}") is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert q.get(f"t{leased[0]}") is None  # acked after dispose
    assert q.stats().scheduled == 4


def test_process_rejects_bad_arguments() -> None:
    with pytest.raises(dueq.ConfigurationError):
        dueq.operators.process("not callable")  # type: ignore[arg-type]
    with pytest.raises(dueq.ConfigurationError):
        dueq.operators.process(lambda d: None, concurrency=0)
    for concurrency in (10**400, float("nan"), float("inf"), True):
        with pytest.raises(dueq.ConfigurationError):
            dueq.operators.process(lambda d: None, concurrency=concurrency)  # type: ignore[arg-type]


def test_the_lease_keeper_extends_in_virtual_time(r: redis.Redis) -> None:
    ts = TestScheduler()
    ts.advance_to(1_800_000_000)
    clock = lambda: ts.now.timestamp()  # noqa: E731
    q = dueq.Queue("v", r, clock=clock, lease=30)
    rival = dueq.Queue("v", r, clock=clock, lease=30)
    tid = q.schedule({})
    running, proceed = threading.Event(), threading.Event()

    def handle(d: dueq.Delivery) -> None:
        running.set()
        assert proceed.wait(WAIT_S)

    out = Outcomes()
    stream = q.observe(scheduler=ts, wake=False).pipe(
        dueq.operators.process(handle, concurrency=1, scheduler=ts)
    )
    sub = stream.subscribe(on_next=out.on_next)
    ts.advance_by(0.001)
    assert running.wait(WAIT_S)
    deadlines = []
    for _ in range(300):  # five virtual minutes, ten leases long
        ts.advance_by(1.0)
        assert rival.claim(1) == []  # never taken over
        info = q.get(tid)
        assert info is not None and info.state == "leased"
        deadlines.append(info.lease_deadline)
    proceed.set()
    out.wait(1)
    sub.dispose()
    assert out.kinds(tid) == [("acked", 1)]
    assert len(set(deadlines)) >= 25  # extended every 10 s (a third of the lease)


def test_the_lease_keeper_keeps_a_lease_shorter_than_its_longest_tick(r: redis.Redis) -> None:
    # lease 0.6 s: the first extension is due after 0.2 s, well before the keeper's 1 s tick
    ts = TestScheduler()
    ts.advance_to(1_800_000_000)
    clock = lambda: ts.now.timestamp()  # noqa: E731
    q = dueq.Queue("v", r, clock=clock, lease=0.6)
    rival = dueq.Queue("v", r, clock=clock, lease=0.6)
    tid = q.schedule({})
    running, proceed = threading.Event(), threading.Event()

    def handle(d: dueq.Delivery) -> None:
        running.set()
        assert proceed.wait(WAIT_S)

    out = Outcomes()
    stream = q.observe(scheduler=ts, wake=False).pipe(
        dueq.operators.process(handle, concurrency=1, scheduler=ts)
    )
    sub = stream.subscribe(on_next=out.on_next)
    ts.advance_by(0.001)
    assert running.wait(WAIT_S)
    for _ in range(100):  # five virtual seconds, eight leases long
        ts.advance_by(0.05)
        assert rival.claim(1) == []  # never taken over
    proceed.set()
    out.wait(1)
    sub.dispose()
    assert out.kinds(tid) == [("acked", 1)]


def test_disposing_from_inside_the_outcome_stream_releases_the_rest(r: redis.Redis) -> None:
    q = queue(r)
    q.schedule_many(dueq.Task({"i": i}, id=f"t{i}") for i in range(65))
    done = threading.Event()
    outcomes: list[dueq.Outcome] = []
    stream = q.observe(max_in_flight=64).pipe(
        dueq.operators.process(lambda d: time.sleep(0.05), concurrency=4), ops.take(5)
    )
    sub = stream.subscribe(on_next=outcomes.append, on_completed=done.set)
    assert done.wait(WAIT_S)  # take(5) disposes the subscription from inside on_next
    deadline = time.monotonic() + WAIT_S
    while q.stats().leased and time.monotonic() < deadline:
        time.sleep(0.01)
    stats = q.stats()
    assert stats.leased == 0  # the rest were released, not left to run out
    assert len(outcomes) == 5 and stats.scheduled == 65 - stats.counters.get("acked", 0)
    waiting = [q.get(f"t{i}") for i in range(65)]
    assert all(info.attempt == 0 for info in waiting if info is not None)  # not counted
    sub.dispose()


def _held_in_virtual_time(
    r: redis.Redis, settle: Callable[[dueq.Queue, dueq.Delivery], None]
) -> list[str]:
    """Hold one delivery for two virtual minutes while ``settle`` changes its lease from the
    inside; returns the lease keeper's warnings about it."""
    ts = TestScheduler()
    ts.advance_to(1_800_000_000)
    q = dueq.Queue("v", r, clock=lambda: ts.now.timestamp(), lease=30)
    q.schedule({}, id="held")
    running, proceed = threading.Event(), threading.Event()

    def handle(d: dueq.Delivery) -> None:
        settle(q, d)
        running.set()
        assert proceed.wait(WAIT_S)

    out = Outcomes()
    stream = q.observe(scheduler=ts, wake=False).pipe(
        dueq.operators.process(handle, concurrency=1, scheduler=ts)
    )
    sub = stream.subscribe(on_next=out.on_next)
    ts.advance_by(0.001)
    assert running.wait(WAIT_S)
    for _ in range(120):
        ts.advance_by(1.0)
    proceed.set()
    out.wait(1)
    sub.dispose()
    return [o.kind for o in out.items]


def test_the_lease_keeper_reports_a_lost_lease_once_and_stops_extending_it(
    r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    def take_over(q: dueq.Queue, d: dueq.Delivery) -> None:
        # as if another holder had taken it over and given it back for an hour
        r.hset(q.keys.meta, d.id, f"{d.attempt}|someone-else|{d.due_ms}|{d.first_claimed_ms}")
        r.zrem(q.keys.leased, d.id)
        r.zadd(q.keys.due, {d.id: d.claimed_ms + 3_600_000})

    with caplog.at_level("WARNING", logger="dueq"):
        kinds = _held_in_virtual_time(r, take_over)
    lost = [rec for rec in caplog.records if "lost while held" in rec.getMessage()]
    assert len(lost) == 1 and kinds == ["lost"]


def test_cancelling_a_running_task_tells_the_handler_and_the_outcome_is_cancelled(
    r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[bool] = []

    def cancel_then_look(q: dueq.Queue, d: dueq.Delivery) -> None:
        assert q.cancel(d.id)
        seen.append(d.cancelled)  # not known yet: the lease keeper finds out

    with caplog.at_level("WARNING", logger="dueq"):
        kinds = _held_in_virtual_time(r, cancel_then_look)
    told = [rec for rec in caplog.records if "was cancelled while" in rec.getMessage()]
    assert len(told) == 1 and kinds == ["cancelled"] and seen == [False]
    assert not [rec for rec in caplog.records if "lost" in rec.getMessage()]  # never "lost"


def test_the_lease_keeper_leaves_alone_a_delivery_its_handler_already_acked(
    r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger="dueq"):
        kinds = _held_in_virtual_time(r, lambda q, d: d.ack())
    assert [rec.getMessage() for rec in caplog.records] == [] and kinds == ["acked"]


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for this error")


def test_a_handler_error_that_cannot_be_printed_still_follows_the_retry_policy(
    r: redis.Redis, run: Callable[..., Outcomes]
) -> None:
    q = queue(r, retry=dueq.RetryPolicy(max_attempts=2, wait=lambda state: 0.0))
    tid = q.schedule({})

    def handle(d: dueq.Delivery) -> None:
        raise Unprintable()

    out = run(q, handle)
    out.wait(2)
    assert out.kinds(tid) == [("retried", 1), ("dead", 2)]
    info = q.get(tid)
    assert info is not None and info.state == "dead"
    first = info.errors[0]
    assert first.type == "Unprintable" and "no text for this error" in first.message
