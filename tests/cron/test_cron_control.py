"""Cron definitions paused, resumed and run now, on both front ends against a real Redis.

Time is frozen with freezegun and reaches dueq through the injected clock, as in
``test_cron.py``; corrupted values are written by hand with HSET, as in
``test_cron_corruption.py``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from conftest import async_mirror
from freezegun import freeze_time
from freezegun.api import FrozenDateTimeFactory

import dueq
from dueq.cron.flows import occurrence_id, parse_occurrence_id, run_now_id
from dueq.server import RedisServer


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=timezone.utc)  # type: ignore[misc]


START = utc(2026, 5, 4, 0, 10)


@pytest.fixture
def frozen() -> Iterator[FrozenDateTimeFactory]:
    with freeze_time(START) as factory:
        yield factory


def frozen_queue(make_queue: Callable[..., Any], **kwargs: Any) -> Any:
    kwargs.setdefault("retry", dueq.RetryPolicy(max_attempts=3, wait=lambda state: 300.0))
    return make_queue("cron", clock=time.time, **kwargs)


def run_for(
    frozen: FrozenDateTimeFactory,
    queues: list[Any],
    duration: timedelta,
    step: timedelta = timedelta(minutes=7),
    handle: Callable[[Any], bool] = lambda d: True,
) -> list[tuple[str, int, datetime]]:
    """Tick the clock by ``step`` for ``duration``; each queue in turn claims everything due
    and acks it (or fails it when ``handle`` says so). Returns (id, attempt, claimed at)."""
    fired: list[tuple[str, int, datetime]] = []
    until = datetime.now(timezone.utc) + duration
    while datetime.now(timezone.utc) < until:
        frozen.tick(step)
        for q in queues:
            for d in q.claim(limit=100):
                fired.append((d.id, d.attempt, datetime.now(timezone.utc)))
                if handle(d):
                    d.ack()
                else:
                    d.fail(RuntimeError("boom"))
    return fired


def hourly_ids(first: datetime, count: int, name: str = "hourly") -> list[str]:
    return [
        occurrence_id(name, int((first + timedelta(hours=h)).timestamp() * 1000))
        for h in range(count)
    ]


# -- pause and resume --------------------------------------------------------------------------


def test_pause_stops_firings_in_every_process_and_resume_fires_the_next_slot_not_missed_ones(
    redis_server: RedisServer, make_queue, frozen
):
    clients = [redis_server.client() for _ in range(3)]
    queues = [frozen_queue(make_queue, client=c) for c in clients]
    for q in queues:
        q.cron.add("hourly", "@hourly", payload={"n": 1}, missed="all")
    before = run_for(frozen, queues, timedelta(hours=3))
    assert [f[0] for f in before] == hourly_ids(utc(2026, 5, 4, 1), 3)

    assert queues[1].cron.pause("hourly") is True
    assert queues[2].cron.pause("hourly") is False  # already paused, seen by every process
    paused = queues[0].cron.get("hourly")
    assert paused is not None and paused.paused and paused.next_at is None
    assert paused.last_fired_at == utc(2026, 5, 4, 3)
    assert queues[0].stats().scheduled == 0
    assert queues[0].stats().counters["cancelled"] == 1  # the withdrawn 04:00
    # Every process restarting meanwhile adds its definition again: it stays paused.
    assert [q.cron.add("hourly", "@hourly", payload={"n": 1}, missed="all") for q in queues] == [
        "unchanged"
    ] * 3
    assert run_for(frozen, queues, timedelta(days=3)) == []
    assert queues[0].stats().scheduled == 0

    now = datetime.now(timezone.utc)
    assert queues[2].cron.resume("hourly") is True
    assert queues[0].cron.resume("hourly") is False  # not paused any more
    resumed = queues[1].cron.get("hourly")
    next_slot = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    assert resumed is not None and not resumed.paused and resumed.next_at == next_slot
    after = run_for(frozen, queues, timedelta(hours=3))
    # missed="all" runs missed slots after downtime, but slots of a pause are not missed ones.
    assert [f[0] for f in after] == hourly_ids(next_slot, 3)
    assert all(
        next_slot <= claimed < next_slot + timedelta(minutes=7) for _, _, claimed in after[:1]
    )
    for c in clients:
        c.close()


def test_pause_lets_a_running_occurrence_finish_and_schedules_nothing_after_it(make_queue, frozen):
    q = frozen_queue(make_queue)
    q.cron.add("hourly", "@hourly")
    frozen.move_to(utc(2026, 5, 4, 1))
    (running,) = q.claim()  # this claim scheduled 02:00
    assert q.cron.pause("hourly")
    assert q.get(occurrence_id("hourly", int(utc(2026, 5, 4, 2).timestamp() * 1000))) is None
    frozen.tick(timedelta(seconds=5))
    running.ack()  # it finishes normally
    assert run_for(frozen, [q], timedelta(days=1)) == []
    assert q.stats().scheduled == 0 and q.stats().leased == 0


def test_a_retry_of_an_occurrence_running_at_the_pause_still_runs_and_nothing_follows(
    make_queue, frozen
):
    q = frozen_queue(make_queue)
    q.cron.add("hourly", "@hourly")
    frozen.move_to(utc(2026, 5, 4, 1))
    (running,) = q.claim()
    q.cron.pause("hourly")
    running.fail(RuntimeError("boom"))  # retried in 300 s with the queue's policy
    fired = run_for(frozen, [q], timedelta(days=1))
    assert [(i, a) for i, a, _ in fired] == [(running.id, 2)]
    assert q.stats().scheduled == 0


def test_an_occurrence_claimed_before_the_pause_but_not_yet_advanced_schedules_nothing(
    redis_server: RedisServer, make_queue, admin, frozen
):
    """The claim that races a pause: claimed, but its schedule not yet moved on (here because
    Redis refused the advance) when the pause lands. Its next claim runs it and, paused, adds
    nothing."""
    q = frozen_queue(make_queue, lease=60, retry=dueq.RetryPolicy(max_attempts=3, wait=lambda s: 0))
    q.cron.add("hourly", "@hourly")
    frozen.move_to(utc(2026, 5, 4, 1))
    admin.acl_setuser(
        "nohget-ctl",
        enabled=True,
        passwords=["+pw"],
        keys=["*"],
        channels=["*"],
        commands=["+@all", "-hexists"],
    )
    refused = redis_server.client(username="nohget-ctl", password="pw")
    flaky = frozen_queue(make_queue, client=refused, lease=60)
    assert flaky.claim() == []  # claimed, advance refused: held back until the lease ends
    assert q.cron.pause("hourly")
    assert q.stats().leased == 1  # a claimed occurrence is not withdrawn
    frozen.tick(timedelta(seconds=61))
    (d,) = q.claim()
    assert (d.id, d.attempt) == (
        occurrence_id("hourly", int(utc(2026, 5, 4, 1).timestamp() * 1000)),
        2,
    )
    d.ack()
    assert q.stats().scheduled == 0
    definition = q.cron.get("hourly")
    assert definition is not None and definition.paused and definition.next_at is None
    assert definition.last_fired_at == utc(2026, 5, 4, 1)
    assert q.cron.resume("hourly")
    assert q.cron.get("hourly").next_at == utc(2026, 5, 4, 2)
    refused.close()
    admin.acl_deluser("nohget-ctl")


def test_replacing_a_paused_definition_keeps_it_paused_and_resume_uses_the_new_one(
    make_queue, frozen
):
    q = frozen_queue(make_queue)
    q.cron.add("job", "@hourly", payload={"v": 1})
    q.cron.pause("job")
    assert q.cron.add("job", "*/15 * * * *", payload={"v": 2}, replace=True) == "replaced"
    assert q.stats().scheduled == 0
    definition = q.cron.get("job")
    assert definition is not None and definition.paused and definition.expr == "*/15 * * * *"
    assert run_for(frozen, [q], timedelta(hours=2)) == []
    q.cron.resume("job")
    fired = run_for(frozen, [q], timedelta(minutes=30), step=timedelta(minutes=1))
    assert len(fired) == 2
    assert all(q.get(i) is None for i, _, _ in fired)  # acked and gone


def test_remove_forgets_the_pause_and_a_new_add_runs(make_queue, frozen):
    q = frozen_queue(make_queue)
    q.cron.add("job", "@hourly")
    q.cron.pause("job")
    assert q.cron.remove("job")
    assert q.cron.add("job", "@hourly") == "added"
    definition = q.cron.get("job")
    assert definition is not None and not definition.paused
    assert definition.next_at == utc(2026, 5, 4, 1)
    assert q.stats().scheduled == 1


def test_concurrent_resumes_schedule_exactly_one_pending_occurrence(redis_server, r, frozen):
    clients = [redis_server.client() for _ in range(8)]
    queues = [dueq.Queue("cron", c, clock=time.time) for c in clients]
    queues[0].cron.add("job", "* * * * *")
    for _ in range(5):
        queues[0].cron.pause("job")
        barrier = threading.Barrier(len(queues))
        results: list[bool] = []

        def resume(q: dueq.Queue, barrier: threading.Barrier, results: list[bool]) -> None:
            barrier.wait()
            results.append(q.cron.resume("job"))

        threads = [threading.Thread(target=resume, args=(q, barrier, results)) for q in queues]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results) == [False] * 7 + [True]
        assert queues[0].stats().scheduled == 1
    for c in clients:
        c.close()


def test_concurrent_async_resumes_schedule_exactly_one_pending_occurrence(r, frozen):
    async def resume_together() -> list[bool]:
        clients = [async_mirror(r) for _ in range(6)]
        queues = [dueq.AsyncQueue("cron", c, clock=time.time) for c in clients]
        await queues[0].cron.add("job", "* * * * *")
        await queues[0].cron.pause("job")
        results = await asyncio.gather(*(q.cron.resume("job") for q in queues))
        assert (await queues[0].stats()).scheduled == 1
        for c in clients:
            await c.aclose()
        return list(results)

    assert sorted(asyncio.run(resume_together())) == [False] * 5 + [True]


# -- run now -----------------------------------------------------------------------------------


def test_run_now_fires_once_with_the_payload_without_moving_the_schedule(make_queue, frozen):
    q = frozen_queue(make_queue)
    q.cron.add("hourly", "@hourly", payload={"report": "daily"})
    task_id = q.cron.run_now("hourly")
    assert task_id.startswith("cron:hourly:now:20260504T001000Z:")
    assert dueq.Occurrence.from_id(task_id) == dueq.Occurrence("hourly", START, run_now=True)
    (d,) = q.claim()
    assert (d.id, d.payload) == (task_id, {"report": "daily"})
    d.ack()
    definition = q.cron.get("hourly")
    assert definition is not None
    assert (definition.next_at, definition.last_fired_at) == (utc(2026, 5, 4, 1), None)
    fired = run_for(frozen, [q], timedelta(hours=3))
    assert [f[0] for f in fired] == hourly_ids(utc(2026, 5, 4, 1), 3)
    assert q.stats().scheduled == 1  # the next slot only


def test_run_now_works_while_paused_and_leaves_it_paused(make_queue, frozen):
    q = frozen_queue(make_queue)
    q.cron.add("hourly", "@hourly")
    q.cron.pause("hourly")
    first, second = q.cron.run_now("hourly"), q.cron.run_now("hourly")
    assert first != second  # two asks, two occurrences
    claimed = q.claim()
    assert sorted(d.id for d in claimed) == sorted([first, second])
    q.ack_many(claimed)
    assert q.cron.pause("hourly") is False
    assert run_for(frozen, [q], timedelta(days=1)) == []


def test_a_failing_run_now_occurrence_is_retried_with_the_queue_policy(make_queue, frozen):
    q = frozen_queue(make_queue)
    q.cron.add("daily", "@daily")
    task_id = q.cron.run_now("daily")
    fired = run_for(
        frozen, [q], timedelta(hours=1), step=timedelta(minutes=1), handle=lambda d: False
    )
    assert [(i, a) for i, a, _ in fired] == [(task_id, 1), (task_id, 2), (task_id, 3)]
    (dead,) = q.dead.list()
    assert dead.id == task_id
    assert q.cron.get("daily").next_at == utc(2026, 5, 5)


def test_run_now_ids_never_collide_with_slot_ids_or_move_a_schedule():
    for name in ["n", "a:b", "x:now", "n:now:20260101T000000Z"]:
        task_id = run_now_id(name, 1_800_000_000_000)
        assert parse_occurrence_id(task_id) is None  # not taken for a slot by on_claim
        assert dueq.Occurrence.from_id(task_id) == dueq.Occurrence(
            name, datetime.fromtimestamp(1_800_000_000, timezone.utc), run_now=True
        )
    slot = "cron:n:now:20260101T000000Z:20260102T000000Z"  # a slot of a definition so named
    assert dueq.Occurrence.from_id(slot) == dueq.Occurrence(
        "n:now:20260101T000000Z", utc(2026, 1, 2)
    )
    for other in ["cron:n:now:20260101T000000Z:xyz", "cron:n:now:x:3fa2c1d0", "cron::now:"]:
        assert dueq.Occurrence.from_id(other) is None


# -- errors ------------------------------------------------------------------------------------


def test_unknown_names_raise_cron_not_found_and_write_nothing(make_queue, r, frozen):
    q = frozen_queue(make_queue)
    for call in (q.cron.pause, q.cron.resume, q.cron.run_now):
        with pytest.raises(dueq.CronNotFound, match="no cron definition named 'nope'"):
            call("nope")
        with pytest.raises(dueq.CronError, match="without spaces"):
            call("two words")
    assert r.dbsize() == 0
    assert issubclass(dueq.CronNotFound, LookupError)


def test_a_definition_that_cannot_be_read_can_be_paused_but_not_resumed_or_run(
    make_queue, r, frozen
):
    q = frozen_queue(make_queue)
    q.cron.add("bad", "@hourly")
    r.hset(q.keys.cron, "bad", "{not json")
    assert q.cron.pause("bad")
    before = {k: r.dump(k) for k in r.keys("*")}
    for call in (q.cron.resume, q.cron.run_now):
        with pytest.raises(dueq.CronError, match="replace=True"):
            call("bad")
    assert {k: r.dump(k) for k in r.keys("*")} == before
    q.cron.add("bad", "@hourly", replace=True)  # the repair keeps it paused
    assert q.cron.resume("bad")
    assert q.stats().scheduled == 1


# -- corrupted data ----------------------------------------------------------------------------


@pytest.mark.parametrize("mark", ["", "garbage", b"\xff\xfe"])
def test_any_paused_mark_counts_as_paused(make_queue, r, frozen, mark):
    q = frozen_queue(make_queue)
    q.cron.add("job", "@hourly")
    q.cron.pause("job")
    r.hset(q.keys.cron_paused, "job", mark)
    assert q.cron.add("job", "@hourly") == "unchanged"
    (definition,) = q.cron.list()
    assert definition.paused and definition.problem is None
    assert run_for(frozen, [q], timedelta(hours=3)) == []
    assert q.cron.resume("job")
    assert q.stats().scheduled == 1


@pytest.mark.parametrize("state", ["garbage", "", "1|2|plain", b"\xff"])
def test_a_state_rebuilt_while_paused_schedules_nothing(make_queue, r, frozen, state):
    """A corrupted state is rebuilt by the next claim of an occurrence; paused, that claim
    writes a readable state and adds no occurrence."""
    q = frozen_queue(make_queue)
    q.cron.add("job", "@hourly")
    frozen.move_to(utc(2026, 5, 4, 1))
    (d,) = q.claim()
    d.fail(RuntimeError("boom"))  # retried at 01:05
    q.cron.pause("job")
    r.hset(q.keys.cron_state, "job", state)
    fired = run_for(frozen, [q], timedelta(hours=3))
    assert [(i, a) for i, a, _ in fired] == [(d.id, 2)]
    assert q.stats().scheduled == 0
    assert q.stats().counters["cron_state_rebuilt"] == 1
    definition = q.cron.get("job")
    assert definition is not None and definition.paused and definition.problem is None
    assert q.cron.resume("job")
    assert q.stats().scheduled == 1


def test_a_paused_definition_with_a_broken_state_is_not_a_problem_until_resumed(
    make_queue, r, frozen
):
    q = frozen_queue(make_queue)
    q.cron.add("job", "@hourly")
    q.cron.pause("job")
    r.hset(q.keys.cron_state, "job", "garbage")
    assert q.cron.get("job").problem is None  # resume writes it anew
    assert q.cron.add("job", "@hourly") == "unchanged"
    assert q.cron.resume("job")
    definition = q.cron.get("job")
    assert definition is not None and definition.problem is None
    assert definition.next_at == utc(2026, 5, 4, 1)


def test_a_paused_key_of_the_wrong_type_is_a_cron_error_and_never_stops_claims(
    make_queue, r, frozen
):
    q = frozen_queue(make_queue)
    q.cron.add("job", "@hourly")
    q.schedule({"plain": True}, id="plain", delay=60)
    r.set(q.keys.cron_paused, "not a hash")
    for call in (
        q.cron.list,
        lambda: q.cron.get("job"),
        lambda: q.cron.add("job", "@hourly"),
        lambda: q.cron.pause("job"),
        lambda: q.cron.resume("job"),
        lambda: q.cron.run_now("job"),
    ):
        with pytest.raises(dueq.CronError, match="wrong type"):
            call()
    frozen.move_to(utc(2026, 5, 4, 1))
    assert sorted(d.id for d in q.claim()) == [
        occurrence_id("job", int(utc(2026, 5, 4, 1).timestamp() * 1000)),
        "plain",
    ]
