"""Lease extension, one and many at a time, on both front ends: every lease is judged by its
own token, so a batch never extends a lease its holder lost."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis

import dueq


def test_extend_many_moves_every_held_lease_in_one_call(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue("x", lease=30)
    q.schedule_many(dueq.Task({"i": i}, id=f"t{i}") for i in range(5))
    held = q.claim(10)
    clock.advance(20)
    deadline = q.extend_many(held, 30)
    assert deadline.timestamp() == pytest.approx(clock.now + 30)
    assert all(d.lease_deadline.timestamp() == pytest.approx(clock.now + 30) for d in held)
    clock.advance(25)  # past the first deadline, before the new one
    assert q.claim(10) == []  # still held
    q.ack_many(held)


def test_extend_many_refuses_stale_tokens_per_task_and_extends_the_rest(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue("x", lease=60)
    q.schedule_many(dueq.Task({"i": i}, id=f"t{i}") for i in range(3))
    (t0,) = q.claim(1, lease=10)  # a short lease that will run out
    t1, t2 = q.claim(2)
    clock.advance(11)
    assert q.claim(0) == []  # t0's lease ran out: a failed attempt, retried in 10 s
    clock.advance(10)
    (takeover,) = q.claim(1)  # a second consumer holds t0 now, under a new token
    assert takeover.id == "t0"
    q.cancel("t2")  # and t2 is gone
    with pytest.raises(dueq.LeaseLost) as caught:
        q.extend_many([t0, t1, t2], 60)
    assert sorted(caught.value.ids) == ["t0", "t2"]  # the stale token and the cancelled task
    info = q.get("t0")
    assert info is not None and info.lease_deadline == takeover.lease_deadline  # untouched
    held = q.get("t1")
    assert held is not None and held.lease_deadline.timestamp() == pytest.approx(clock.now + 60)
    assert t1.lease_deadline == held.lease_deadline
    with pytest.raises(dueq.LeaseLost):
        t0.ack()  # the stale holder still cannot ack
    q.ack_many([takeover, t1])


def test_extend_of_one_lease_names_the_task_when_it_was_lost(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue("x", lease=30)
    q.schedule({}, id="only")
    (d,) = q.claim(1)
    clock.advance(31)
    with pytest.raises(dueq.LeaseLost, match="'only'") as caught:
        d.extend(30)
    assert caught.value.ids == ["only"]


def test_extend_many_splits_batches_over_a_thousand(
    make_queue: Callable[..., Any], r: redis.Redis, clock: Any
) -> None:
    q = make_queue("x", lease=30)
    q.schedule_many(dueq.Task({"i": i}, id=f"t{i}") for i in range(2500))
    held = []
    while len(held) < 2500:
        held += q.claim(1000)
    clock.advance(20)
    q.extend_many(held, 30)
    deadlines = {score for _, score in r.zrange("dueq:{x}:leased", 0, -1, withscores=True)}
    assert deadlines == {(clock.now + 30) * 1000}
    assert q.extend_many([], 30) is not None  # nothing to extend is not an error
    q.ack_many(held)


def test_extend_many_refuses_a_bad_duration_before_writing(
    make_queue: Callable[..., Any],
) -> None:
    q = make_queue("x")
    q.schedule({}, id="a")
    held = q.claim(1)
    for bad in (0, -1, float("nan"), float("inf"), "soon"):
        with pytest.raises(dueq.ConfigurationError):
            q.extend_many(held, bad)
