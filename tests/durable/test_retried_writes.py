"""A step write that Redis applied but whose reply was lost (the connection dropped, as when
Redis is killed right after the write reached its AOF) and that the client sends again is
done, not a second writer: the chaos proof's Redis restart ended three tasks dead with a false
NonDeterministic before step.lua and park.lua answered such a repeat as the first call."""

from __future__ import annotations

from typing import Any

import pytest
import redis

import dueq


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
