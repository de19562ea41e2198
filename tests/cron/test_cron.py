"""Cron: one firing per slot across processes, daylight-saving changes and downtime.

Time is frozen with freezegun and reaches dueq through the injected clock (``clock=time.time``),
so the Lua scripts and the cron arithmetic see the same simulated instant; Redis is real.
The tests run on both front ends (``make_queue``): ``q.cron`` of a ``Queue`` or an ``AsyncQueue``.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import tenacity
from freezegun import freeze_time
from freezegun.api import FrozenDateTimeFactory
from reactivex.testing import TestScheduler

import dueq
from dueq.server import RedisServer

BERLIN = ZoneInfo("Europe/Berlin")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=timezone.utc)  # type: ignore[misc]


@dataclass
class Firing:
    id: str
    slot: datetime
    claimed_at: datetime
    attempt: int


@pytest.fixture
def frozen() -> Iterator[FrozenDateTimeFactory]:
    with freeze_time(utc(2026, 1, 1)) as factory:
        yield factory


def frozen_queue(make_queue: Callable[..., Any], **kwargs: Any) -> Any:
    """Queue "cron" of the test's front end, on the frozen clock (``time.time`` is read here,
    under freezegun)."""
    kwargs.setdefault("retry", dueq.RetryPolicy(max_attempts=3, wait=lambda state: 300.0))
    return make_queue("cron", clock=time.time, **kwargs)


def claim_all(q: Any, fired: list[Firing], handle: Callable[[Any], bool] = lambda d: True) -> None:
    """Claim every due task; ack it when ``handle`` says so, else fail it."""
    now = datetime.now(timezone.utc)
    for d in q.claim(limit=1000):
        occurrence = dueq.Occurrence.from_id(d.id)
        assert occurrence is not None, d.id
        fired.append(Firing(d.id, occurrence.slot, now, d.attempt))
        if handle(d):
            d.ack()
        else:
            d.fail(RuntimeError(f"failed {d.id}"))


def run_for(
    frozen: FrozenDateTimeFactory,
    queues: list[Any],
    until: datetime,
    step: timedelta,
    handle: Callable[[Any], bool] = lambda d: True,
) -> list[Firing]:
    fired: list[Firing] = []
    while datetime.now(timezone.utc) < until:
        frozen.tick(step)
        for q in random.sample(queues, len(queues)):
            claim_all(q, fired, handle)
    return fired


# -- daylight saving ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "change_day", "fired_at_on_change_day"),
    [
        # 02:30 does not exist on 29 March: it runs when the clock jumps to 03:00 CEST.
        (utc(2026, 3, 25), date(2026, 3, 29), utc(2026, 3, 29, 1, 0)),
        # 02:30 happens twice on 25 October: it runs on the first, 02:30 CEST.
        (utc(2026, 10, 21), date(2026, 10, 25), utc(2026, 10, 25, 0, 30)),
    ],
    ids=["spring-forward", "fall-back"],
)
def test_daily_job_fires_once_a_day_across_daylight_saving_changes(
    make_queue, frozen, start, change_day, fired_at_on_change_day
):
    frozen.move_to(start)
    q = frozen_queue(make_queue)
    assert q.cron.add("report", "30 2 * * *", payload={"k": 1}, tz="Europe/Berlin") == "added"
    step = timedelta(minutes=5)
    fired = run_for(frozen, [q], start + timedelta(days=8), step)

    days = [f.slot.astimezone(BERLIN).date() for f in fired]
    assert days == [start.date() + timedelta(days=i) for i in range(8)]
    for f in fired:
        assert f.slot <= f.claimed_at < f.slot + step  # on time, never early
        local = f.slot.astimezone(BERLIN)
        if local.date() == change_day:
            assert f.slot == fired_at_on_change_day
        else:
            assert (local.hour, local.minute) == (2, 30)
    assert len({f.id for f in fired}) == 8


def test_every_15_minutes_through_both_changes_keeps_one_run_per_wall_clock_slot(
    make_queue, frozen
):
    frozen.move_to(utc(2026, 3, 28, 22, 50))
    q = frozen_queue(make_queue)
    q.cron.add("quarter", "*/15 * * * *", tz="Europe/Berlin")
    fired = run_for(frozen, [q], utc(2026, 3, 29, 2, 59), timedelta(minutes=1))
    # 00:00-01:45 CET every 15 min (8), the skipped 02:xx collapse into 03:00 CEST, then on.
    slots = [f.slot for f in fired]
    assert slots[:8] == [utc(2026, 3, 28, 23, 0) + timedelta(minutes=15 * i) for i in range(8)]
    assert slots[8:] == [utc(2026, 3, 29, 1, 0) + timedelta(minutes=15 * i) for i in range(8)]


# -- many processes keep one schedule ------------------------------------------------------------


@pytest.mark.parametrize("concurrently", [False, True], ids=["interleaved", "threads"])
def test_hourly_job_kept_by_three_queue_instances_fires_each_slot_once(
    redis_server: RedisServer, make_queue, front_end, frozen, concurrently
):
    if concurrently and front_end == "async":
        pytest.skip(
            "make_queue drives every AsyncQueue on one event loop, which threads cannot share"
        )
    start = utc(2026, 5, 4, 0, 10)
    frozen.move_to(start)
    clients = [redis_server.client() for _ in range(3)]
    queues = [frozen_queue(make_queue, client=c) for c in clients]
    results = [q.cron.add("hourly", "@hourly", payload={"n": 1}) for q in queues]
    assert results == ["added", "unchanged", "unchanged"]

    fired: list[Firing] = []
    if concurrently:
        lock = threading.Lock()

        def claim_in_thread(q: dueq.Queue, barrier: threading.Barrier) -> None:
            mine: list[Firing] = []
            barrier.wait()
            claim_all(q, mine)
            with lock:
                fired.extend(mine)

        while datetime.now(timezone.utc) < start + timedelta(days=2):
            frozen.tick(timedelta(minutes=7))
            barrier = threading.Barrier(3)
            threads = [threading.Thread(target=claim_in_thread, args=(q, barrier)) for q in queues]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    else:
        fired = run_for(frozen, queues, start + timedelta(days=2), timedelta(minutes=7))

    expected = [utc(2026, 5, 4, 1) + timedelta(hours=h) for h in range(48)]
    assert sorted(f.slot for f in fired) == expected
    assert len({f.id for f in fired}) == 48
    assert all(f.attempt == 1 for f in fired)
    pending = queues[0].stats()
    assert (pending.scheduled, pending.leased) == (1, 0)  # the next slot, and nothing else
    for c in clients:
        c.close()


# -- downtime --------------------------------------------------------------------------------------


def downtime(
    make_queue: Callable[..., Any], frozen: FrozenDateTimeFactory, **add: Any
) -> list[Firing]:
    """*/15 runs normally for an hour, nothing claims for 3 hours, then it runs again for an
    hour; returns the firings after the downtime."""
    start = utc(2026, 6, 1, 8, 0)
    frozen.move_to(start)
    q = frozen_queue(make_queue)
    q.cron.add("quarter", "*/15 * * * *", **add)
    before = run_for(frozen, [q], start + timedelta(hours=1), timedelta(minutes=1))
    assert [f.slot for f in before] == [start + timedelta(minutes=15 * i) for i in range(1, 5)]
    frozen.move_to(utc(2026, 6, 1, 12, 7))  # down from 09:01 to 12:07
    return run_for(frozen, [q], utc(2026, 6, 1, 13, 7), timedelta(minutes=1))


def regular_after_downtime() -> list[datetime]:
    return [utc(2026, 6, 1, 12, 15) + timedelta(minutes=15 * i) for i in range(4)]


def test_downtime_with_latest_runs_the_latest_missed_slot_once(make_queue, frozen):
    fired = downtime(make_queue, frozen)  # missed="latest" is the default
    assert [f.slot for f in fired] == [utc(2026, 6, 1, 12, 0), *regular_after_downtime()]
    # The claim at 12:08 drops the missed 09:15 slot and schedules 12:00; the next claim runs it.
    assert fired[0].claimed_at == utc(2026, 6, 1, 12, 9)
    q = frozen_queue(make_queue)
    (definition,) = q.cron.list()
    assert definition.last_fired_at == utc(2026, 6, 1, 13, 0)
    assert q.stats().counters.get("cron_skipped") == 1


def test_downtime_with_skip_runs_no_missed_slot(make_queue, frozen):
    fired = downtime(make_queue, frozen, missed="skip")
    assert [f.slot for f in fired] == regular_after_downtime()


@pytest.mark.parametrize("cap", [5, 100])
def test_downtime_with_all_runs_each_missed_slot_up_to_the_cap(make_queue, frozen, cap):
    fired = downtime(make_queue, frozen, missed="all", max_missed=cap)
    missed = [utc(2026, 6, 1, 9, 15) + timedelta(minutes=15 * i) for i in range(12)]  # to 12:00
    run = missed[:cap]
    assert [f.slot for f in fired] == [*run, *regular_after_downtime()]
    assert all(f.claimed_at <= utc(2026, 6, 1, 12, 9) for f in fired[: len(run)])


def test_a_claim_that_drops_a_missed_slot_says_the_latest_one_is_due_now(make_queue, frozen):
    frozen.move_to(utc(2026, 6, 1, 8, 1))
    q = frozen_queue(make_queue)
    q.cron.add("quarter", "*/15 * * * *")
    frozen.move_to(utc(2026, 6, 1, 11, 7))
    batch = q.claim_batch()
    assert batch.deliveries == []  # 08:15 was missed and dropped ...
    assert batch.next_due_ms == batch.now_ms - 7 * 60_000  # ... and 11:00 is due: claim again
    (d,) = q.claim()
    assert d.id == "cron:quarter:20260601T110000Z"


def test_an_observing_consumer_emits_each_occurrence_exactly_at_its_slot(r):
    ts = TestScheduler()
    ts.advance_to(utc(2026, 6, 1, 8, 0, 30).timestamp())
    q = dueq.Queue("cron", r, clock=lambda: ts.now.timestamp())
    q.cron.add("minutely", "* * * * *")
    emitted: list[tuple[float, str]] = []

    def on_next(d: dueq.Delivery) -> None:
        emitted.append((ts.now.timestamp(), d.id))
        d.ack()

    sub = q.observe(scheduler=ts, wake=False, heartbeat=7).subscribe(on_next=on_next)  # type: ignore[arg-type]
    for _ in range(600):  # ten virtual minutes, a second at a time
        ts.advance_by(1.0)
    sub.dispose()
    # Emitted exactly at each slot: the consumer sleeps until the next occurrence, not 7 s.
    slots = [utc(2026, 6, 1, 8, 1) + timedelta(minutes=i) for i in range(10)]
    assert emitted == [(s.timestamp(), f"cron:minutely:{s:%Y%m%dT%H%M%SZ}") for s in slots]


def test_add_reads_the_redis_server_clock_by_default(make_queue, r):
    q = make_queue("cron", clock=None)
    server_now = datetime.fromtimestamp(r.time()[0], timezone.utc)
    q.cron.add("hourly", "@hourly")
    definition = q.cron.get("hourly")
    assert definition is not None and definition.next_at is not None
    assert server_now < definition.next_at <= server_now + timedelta(hours=1)
    assert definition.next_at.minute == 0


# -- retries ---------------------------------------------------------------------------------------


def test_failing_occurrence_is_retried_with_backoff_and_the_next_one_fires_on_time(
    make_queue, frozen
):
    start = utc(2026, 2, 2, 10, 0)
    frozen.move_to(start)
    policy = dueq.RetryPolicy(max_attempts=3, wait=tenacity.wait_exponential(multiplier=300))
    q = frozen_queue(make_queue, retry=policy)
    q.cron.add("sync", "@hourly")
    failing = "cron:sync:20260202T110000Z"
    fired = run_for(
        frozen, [q], start + timedelta(hours=3), timedelta(minutes=1), lambda d: d.id != failing
    )
    timeline = [(f.id, f.attempt, f.claimed_at) for f in fired]
    assert timeline == [
        (failing, 1, utc(2026, 2, 2, 11, 0)),
        (failing, 2, utc(2026, 2, 2, 11, 5)),  # 300 s backoff
        (failing, 3, utc(2026, 2, 2, 11, 15)),  # 600 s backoff
        ("cron:sync:20260202T120000Z", 1, utc(2026, 2, 2, 12, 0)),  # next slot, on time
        ("cron:sync:20260202T130000Z", 1, utc(2026, 2, 2, 13, 0)),
    ]
    (dead,) = q.dead.list()
    assert dead.id == failing
    assert [e.attempt for e in dead.errors] == [1, 2, 3]


def test_a_redelivered_occurrence_runs_again_without_moving_the_schedule_twice(make_queue, frozen):
    start = utc(2026, 2, 2, 0, 30)
    frozen.move_to(start)
    q = frozen_queue(make_queue, lease=60, retry=dueq.RetryPolicy(max_attempts=5, wait=lambda s: 0))
    q.cron.add("sync", "@hourly")
    frozen.move_to(utc(2026, 2, 2, 1, 0))
    (crashed,) = q.claim()  # this claim advanced the schedule to 02:00; nobody acks it
    frozen.move_to(utc(2026, 2, 2, 3, 30))  # 02:00 and 03:00 were missed meanwhile
    fired: list[Firing] = []
    claim_all(q, fired)
    claim_all(q, fired)
    assert [(f.id, f.attempt) for f in fired] == [
        (crashed.id, 2),  # redelivered after its lease: it runs, it does not advance again
        ("cron:sync:20260202T030000Z", 1),  # the pending 02:00 was missed: latest runs once
    ]
    definition = q.cron.get("sync")
    assert definition is not None and definition.next_at == utc(2026, 2, 2, 4)
    assert q.stats().scheduled == 1


# -- definitions -----------------------------------------------------------------------------------


def test_list_shows_definitions_with_next_and_last_fired_slot(make_queue, frozen):
    frozen.move_to(utc(2026, 7, 1, 0, 0, 30))
    q = frozen_queue(make_queue)
    q.cron.add("b-minutely", "* * * * *", payload=[1, 2])
    q.cron.add("a-report", "0 3 * * 1-5", payload={"to": "ops"}, tz="America/New_York")
    a, b = q.cron.list()
    assert (a.name, a.expr, a.tz, a.missed, a.payload) == (
        "a-report",
        "0 3 * * 1-5",
        "America/New_York",
        "latest",
        {"to": "ops"},
    )
    assert a.next_at == utc(2026, 7, 1, 7, 0)  # 03:00 EDT
    assert a.last_fired_at is None
    assert b.next_at == utc(2026, 7, 1, 0, 1)
    frozen.tick(timedelta(minutes=1))
    (d,) = q.claim()
    assert d.payload == [1, 2]
    b = q.cron.get("b-minutely")
    assert b is not None
    assert (b.last_fired_at, b.next_at) == (utc(2026, 7, 1, 0, 1), utc(2026, 7, 1, 0, 2))
    assert q.cron.get("nope") is None


def test_re_adding_is_harmless_and_restores_a_cancelled_pending_occurrence(make_queue, frozen):
    q = frozen_queue(make_queue)
    assert q.cron.add("n", "0 3 * * *", payload={"a": 1, "b": 2}) == "added"
    assert q.cron.add("n", " 0  3 * * * ", payload={"b": 2, "a": 1}) == "unchanged"
    assert q.stats().scheduled == 1
    assert q.cancel("cron:n:20260101T030000Z")
    assert q.cron.add("n", "0 3 * * *", payload={"a": 1, "b": 2}) == "restored"
    assert q.get("cron:n:20260101T030000Z") is not None


def test_a_different_definition_is_refused_unless_replacing(make_queue, r, frozen):
    q = frozen_queue(make_queue)
    q.cron.add("n", "0 3 * * *", payload={"v": 1})
    before = {k: r.dump(k) for k in r.keys("*")}
    for change in [
        {"expr": "0 4 * * *"},
        {"payload": {"v": 2}},
        {"tz": "Europe/Berlin"},
        {"missed": "skip"},
    ]:
        args: dict[str, Any] = {"expr": "0 3 * * *", "payload": {"v": 1}, **change}
        with pytest.raises(dueq.CronConflict, match="replace=True"):
            q.cron.add("n", args.pop("expr"), **args)
    assert {k: r.dump(k) for k in r.keys("*")} == before  # nothing written

    assert q.cron.add("n", "0 4 * * *", payload={"v": 2}, replace=True) == "replaced"
    assert q.get("cron:n:20260101T030000Z") is None  # the old schedule's occurrence went
    new = q.get("cron:n:20260101T040000Z")
    assert new is not None and new.payload == {"v": 2}
    assert q.stats().scheduled == 1


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        (("n", "61 * * * *"), dueq.CronError, "invalid cron expression"),
        (("n", "0 0 3 * * * 2026"), dueq.CronError, "5 fields"),
        (("n", "every day"), dueq.CronError, "5 fields"),
        (("n", "@reboot"), dueq.CronError, "unknown cron alias"),
        (("n", 5), dueq.CronError, "must be a str"),
        (("n", "0 3 * * *", {"tz": "Mars/Olympus"}), dueq.CronError, "unknown time zone"),
        (("n", "0 3 * * *", {"tz": ""}), dueq.CronError, "IANA zone"),
        (("n", "0 3 * * *", {"missed": "some"}), dueq.CronError, "missed must be"),
        (
            ("n", "0 3 * * *", {"missed": "all", "max_missed": 0}),
            dueq.ConfigurationError,
            "max_missed",
        ),
        (("n", "0 3 * * *", {"payload": {1, 2}}), dueq.PayloadError, "not JSON"),
        (("n", "0 3 * * *", {"payload": float("nan")}), dueq.PayloadError, "not JSON"),
        (("", "0 3 * * *"), dueq.CronError, "non-empty"),
        (("two words", "0 3 * * *"), dueq.CronError, "without spaces"),
    ],
)
def test_bad_definitions_raise_typed_errors_and_write_nothing(
    make_queue, r, frozen, args, error, match
):
    q = frozen_queue(make_queue)
    name, expr, *rest = args
    with pytest.raises(error, match=match):
        q.cron.add(name, expr, **(rest[0] if rest else {}))
    assert r.dbsize() == 0


def test_remove_drops_the_definition_and_its_pending_occurrence(make_queue, frozen):
    q = frozen_queue(make_queue)
    q.cron.add("n", "*/5 * * * *")
    frozen.tick(timedelta(minutes=5))
    (running,) = q.claim()  # this claim scheduled 00:10
    assert q.cron.remove("n") is True
    assert q.cron.remove("n") is False
    assert q.cron.list() == []
    assert q.get("cron:n:20260101T001000Z") is None
    assert q.stats().counters["cancelled"] == 1
    running.ack()  # an occurrence already running finishes normally
    frozen.tick(timedelta(hours=1))
    assert q.claim() == []
    assert q.stats().scheduled == 0


def test_a_removed_definitions_retrying_occurrence_runs_without_rescheduling(make_queue, frozen):
    q = frozen_queue(make_queue)
    q.cron.add("n", "*/5 * * * *")
    frozen.tick(timedelta(minutes=5))
    (d,) = q.claim()
    d.fail(RuntimeError("boom"))  # retried in 300 s
    q.cron.remove("n")
    frozen.tick(timedelta(minutes=5))
    (again,) = q.claim()
    assert (again.id, again.attempt) == (d.id, 2)
    again.ack()
    assert q.stats().scheduled == 0


def test_a_corrupted_definition_never_stops_the_claim_of_others(make_queue, r, frozen, caplog):
    q = frozen_queue(make_queue)
    q.cron.add("good", "@hourly")
    q.cron.add("bad", "@hourly")
    r.hset(q.keys.cron, "bad", "{not json")  # edited by hand in Redis
    frozen.tick(timedelta(hours=1))
    claimed = sorted(d.id for d in q.claim())
    assert claimed == ["cron:bad:20260101T010000Z", "cron:good:20260101T010000Z"]
    assert "'cron:bad:20260101T010000Z' runs as an ordinary task" in caplog.text
    assert q.get("cron:good:20260101T020000Z") is not None  # the good one moved on
    assert q.get("cron:bad:20260101T020000Z") is None
    bad, good = q.cron.list()
    assert bad.problem is not None and "definition in Redis cannot be used" in bad.problem
    assert good.problem is None
    assert q.cron.remove("bad")
    assert [d.name for d in q.cron.list()] == ["good"]


def test_occurrence_ids_name_the_definition_and_slot():
    found = dueq.Occurrence.from_id("cron:a:b:20260329T010000Z")
    assert found == dueq.Occurrence("a:b", utc(2026, 3, 29, 1))
    for other in ["welcome:42", "cron:", "cron:x:2026", "cron::20260329T010000Z"]:
        assert dueq.Occurrence.from_id(other) is None


def test_an_occurrence_held_back_by_a_redis_error_advances_on_its_next_claim(
    redis_server: RedisServer, make_queue, admin, frozen
):
    q = frozen_queue(make_queue, lease=60, retry=dueq.RetryPolicy(max_attempts=3, wait=lambda s: 0))
    q.cron.add("n", "@hourly")
    frozen.tick(timedelta(hours=1))
    # A real Redis refusal after the claim: this user may run scripts but not HEXISTS, which
    # the script that advances schedules needs (the claim script never calls it).
    admin.acl_setuser(
        "nohget",
        enabled=True,
        passwords=["+pw"],
        keys=["*"],
        channels=["*"],
        commands=["+@all", "-hexists"],
    )
    refused = redis_server.client(username="nohget", password="pw")
    flaky = frozen_queue(make_queue, client=refused, lease=60)
    assert flaky.claim() == []  # claimed, then held back: its lease runs out
    assert q.stats().leased == 1
    frozen.tick(timedelta(seconds=61))
    (d,) = q.claim()  # back from the expired lease, and this time the schedule advances
    assert (d.id, d.attempt) == ("cron:n:20260101T010000Z", 2)
    d.ack()
    definition = q.cron.get("n")
    assert definition is not None and definition.next_at == utc(2026, 1, 1, 2)
    refused.close()
    admin.acl_deluser("nohget")
