"""Queue(remember_done=...): acked ids are remembered for a window and not scheduled again."""

from __future__ import annotations

from datetime import timedelta

import pytest

import dueq


def run_all(q: dueq.Queue) -> list[str]:
    deliveries = q.claim(limit=1000)
    q.ack_many(deliveries)
    return [d.id for d in deliveries]


def test_an_acked_id_within_the_window_counts_as_existing(make_queue, r):
    q = make_queue(remember_done=timedelta(hours=1))
    q.schedule({"n": 1}, id="a")
    assert run_all(q) == ["a"]
    again = q.schedule_many([dueq.Task({"n": 1}, id="a"), dueq.Task({"n": 2}, id="b")])
    assert (again.added, again.existing) == (1, 1)
    assert q.get("a") is None
    assert r.zcard(q.keys.done) == 1


def test_an_acked_id_is_scheduled_again_after_the_window(make_queue, clock):
    q = make_queue(remember_done=60)
    q.schedule("x", id="a")
    run_all(q)
    clock.advance(60)
    assert q.schedule_many([dueq.Task("x", id="a")]).existing == 1  # the window includes 60 s
    clock.advance(0.001)
    assert q.schedule_many([dueq.Task("x", id="a")]).added == 1


def test_replace_schedules_an_acked_id_again(make_queue):
    q = make_queue(remember_done=60)
    q.schedule("x", id="a")
    run_all(q)
    assert q.schedule_many([dueq.Task("y", id="a")], replace=True).added == 1
    assert q.get("a").payload == "y"


def test_without_the_window_acked_ids_are_forgotten(make_queue, r):
    q = make_queue()
    q.schedule("x", id="a")
    run_all(q)
    assert q.schedule_many([dueq.Task("x", id="a")]).added == 1
    assert not r.exists(q.keys.done)


def test_acks_trim_expired_entries_in_bounded_steps(make_queue, r, clock):
    q = make_queue(remember_done=60)
    q.schedule_many(dueq.Task(i, id=f"old-{i}") for i in range(2500))
    while run_all(q):
        pass
    assert r.zcard(q.keys.done) == 2500
    clock.advance(61)
    for i, old_left in enumerate((1499, 498, 0)):  # at most 1,000 + acked per call go
        q.schedule(i, id=f"new-{i}")
        run_all(q)
        assert r.zcard(q.keys.done) == old_left + i + 1


def test_remember_done_must_be_a_positive_duration(r):
    with pytest.raises(dueq.ConfigurationError, match="remember_done"):
        dueq.Queue("q", r, remember_done=0)
