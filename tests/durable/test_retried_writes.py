"""A step write that Redis applied but whose reply was lost (the connection dropped, as when
Redis is killed right after the write reached its AOF) and that the client sends again is
done, not a second writer: the chaos proof's Redis restart ended three tasks dead with a false
NonDeterministic before step.lua and park.lua answered such a repeat as the first call.

A hand-back (a sleep, a wait that parks the task) sent again finds its lease gone, since the first
call gave the task back: the flow reads the step log and, when the record this very call writes is
there, settles the delivery as released, as the first reply would have, not as lost."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
import redis
from durable_support import run_due

import dueq
from dueq._util.clock import ms_datetime
from dueq._wire import protocol
from dueq._wire.scripts import script_source


@pytest.fixture
def held(r: redis.Redis, clock: Any) -> tuple[dueq.Queue, Any]:
    q = dueq.Queue("q", r, clock=clock, lease=60)
    q.schedule({})
    (d,) = q.claim()
    return q, d


def test_a_commit_sent_again_after_it_was_applied_is_done(held: tuple[dueq.Queue, Any]) -> None:
    q, d = held
    head = '{"n":"a","t0":1'
    first = q.drive(q.step_flow(d, "commit", 0, head, '{"v":1}'))
    again = q.drive(q.step_flow(d, "commit", 0, head, '{"v":1}'))  # the same call, repeated
    assert first == again == (dueq._wire.protocol.Status.OK, "")
    assert [s.name for s in q.drive(q.step_log_flow(d))] == ["a"]  # written once


def test_another_commit_at_a_committed_position_is_still_refused(
    held: tuple[dueq.Queue, Any],
) -> None:
    q, d = held
    q.drive(q.step_flow(d, "commit", 0, '{"n":"a","t0":1', "1"))
    with pytest.raises(dueq.NonDeterministic):
        q.drive(q.step_flow(d, "commit", 0, '{"n":"b","t0":2', "2"))


def test_a_wait_sent_again_after_it_took_a_signal_answers_the_same_payload(
    held: tuple[dueq.Queue, Any],
) -> None:
    q, d = held
    q.signal(d.id, "go", {"x": [1, 2]})
    head = '{"n":"go","t0":1'
    first = q.drive(q.step_flow(d, "wait", 0, head, "60000", "go"))
    again = q.drive(q.step_flow(d, "wait", 0, head, "60000", "go"))
    assert first.value == again.value == '={"x":[1,2]}'


def park_once(
    q: dueq.Queue, d: Any, op: protocol.ParkOp, head: str, value: str, extra: str = ""
) -> Any:
    """park.lua's ``op`` applied once, its reply not seen by the delivery (as when the
    connection dropped before the reply came back)."""

    def flow() -> protocol.Flow[protocol.StepReply]:
        call = protocol.park(q.keys, q.now_arg(), d.id, d.token, op, 0, head, value, extra)
        reply: protocol.StepReply = yield call
        return reply

    return q.drive(flow())


def test_a_sleep_sent_again_after_it_handed_the_task_back_is_released_not_lost(
    held: tuple[dueq.Queue, Any],
) -> None:
    q, d = held
    head = '{"t0":1'
    first = park_once(q, d, "sleep", head, "60000")
    again = q.drive(q.step_flow(d, "sleep", 0, head, "60000"))  # no LeaseLost
    assert again == first
    assert d.outcome.kind == "released" and d.outcome.at == ms_datetime(int(first.value))
    info = q.get(d.id)
    assert info.state == "scheduled" and [s.kind for s in info.steps] == ["sleep"]


def test_a_sleep_over_at_once_sent_again_goes_on_instead_of_failing_nondeterministic(
    held: tuple[dueq.Queue, Any],
) -> None:
    q, d = held
    first = park_once(q, d, "sleep", '{"t0":1', "0")
    assert first.value == "-1"  # over at once: the task stays leased and goes on
    assert q.drive(q.step_flow(d, "sleep", 0, '{"t0":1', "0")) == first
    assert not d.settled


def test_a_wait_sent_again_after_it_handed_the_task_back_is_released_not_lost(
    held: tuple[dueq.Queue, Any],
) -> None:
    q, d = held
    head = '{"n":"go","t0":1'
    first = park_once(q, d, "wait", head, "60000", "go")
    again = q.drive(q.step_flow(d, "wait", 0, head, "60000", "go"))
    assert again == first and first.value.startswith("P")
    assert d.outcome.kind == "released" and d.outcome.at == ms_datetime(int(first.value[1:]))


def test_a_hand_back_another_run_wrote_at_that_position_is_still_lost(
    held: tuple[dueq.Queue, Any],
) -> None:
    q, d = held
    park_once(q, d, "sleep", '{"t0":1', "60000")
    with pytest.raises(dueq.LeaseLost):  # not this call's record: this delivery lost its lease
        q.drive(q.step_flow(d, "sleep", 0, '{"t0":2', "60000"))
    assert d.outcome.kind == "lost"


class ResendingRedis(redis.Redis):
    """A client whose park.lua calls reach Redis twice, the first reply dropped: what a client
    that retries a call after a lost connection does when Redis had applied it."""

    PARK_SHA = hashlib.sha1(script_source("park").encode()).hexdigest()

    def execute_command(self, *args: Any, **options: Any) -> Any:
        if args[:2] == ("EVALSHA", self.PARK_SHA):
            super().execute_command(*args, **options)
        return super().execute_command(*args, **options)


def test_a_durable_sleep_whose_call_was_sent_twice_settles_its_delivery_as_released(
    r: redis.Redis, clock: Any
) -> None:
    kw = r.connection_pool.connection_kwargs
    client = ResendingRedis(
        **{k: kw[k] for k in ("host", "port", "username", "password") if k in kw}
    )
    q = dueq.Queue("q", client, clock=clock, lease=60)

    @q.task(name="nap", durable=True)
    def nap(ctx: dueq.StepContext) -> str:
        ctx.sleep(30)
        return "woke"

    tid = nap.schedule()
    (ran,) = run_due(q)
    assert ran.error is None and ran.outcome.kind == "released"
    assert ran.outcome.at == ms_datetime(round(clock() * 1000) + 30_000)
    clock.advance(30)
    (ran,) = run_due(q)
    assert ran.value == "woke" and q.get(tid) is None
    client.close()
