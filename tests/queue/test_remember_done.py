"""remember_done: acked ids are remembered for a window and not scheduled again.

The window is a queue setting in Redis (``q.configure(remember_done=...)``), so producers and
consumers can never disagree; the old constructor keyword still works, deprecated, as a
fallback while the queue has no setting.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

import dueq


def remembering(make_queue, window, **kwargs):
    """A queue whose remember_done window is set in Redis."""
    q = make_queue(**kwargs)
    q.configure(remember_done=window)
    return q


def run_all(q: dueq.Queue) -> list[str]:
    deliveries = q.claim(limit=1000)
    q.ack_many(deliveries)
    return [d.id for d in deliveries]


def test_an_acked_id_within_the_window_counts_as_existing(make_queue, r):
    q = remembering(make_queue, timedelta(hours=1))
    q.schedule({"n": 1}, id="a")
    assert run_all(q) == ["a"]
    again = q.schedule_many([dueq.Task({"n": 1}, id="a"), dueq.Task({"n": 2}, id="b")])
    assert (again.added, again.existing) == (1, 1)
    assert q.get("a") is None
    assert r.zcard(q.keys.done) == 1


def test_an_acked_id_is_scheduled_again_after_the_window(make_queue, clock):
    q = remembering(make_queue, 60)
    q.schedule("x", id="a")
    run_all(q)
    clock.advance(60)
    assert q.schedule_many([dueq.Task("x", id="a")]).existing == 1  # the window includes 60 s
    clock.advance(0.001)
    assert q.schedule_many([dueq.Task("x", id="a")]).added == 1


def test_replace_schedules_an_acked_id_again(make_queue):
    q = remembering(make_queue, 60)
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
    q = remembering(make_queue, 60)
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


def test_a_window_set_once_is_honoured_by_processes_constructed_without_it(make_queue, r):
    producer, consumer = make_queue("shared"), make_queue("shared")  # neither names a window
    producer.configure(remember_done=3600)
    producer.schedule("x", id="a")
    assert run_all(consumer) == ["a"]
    assert r.zcard(consumer.keys.done) == 1  # the consumer's ack remembered it
    assert producer.schedule_many([dueq.Task("x", id="a")]).existing == 1
    assert consumer.settings().remember_done == timedelta(hours=1)
    assert consumer.stats().settings.remember_done == timedelta(hours=1)


def test_turning_the_window_off_forgets_acked_ids_from_then_on(make_queue, r):
    q = remembering(make_queue, 3600)
    q.configure(remember_done=0)
    assert q.settings().remember_done is None
    q.schedule("x", id="a")
    run_all(q)
    assert q.schedule_many([dueq.Task("x", id="a")]).added == 1


def test_the_deprecated_keyword_warns_and_applies_only_without_a_setting(r, clock):
    with pytest.warns(DeprecationWarning, match=r"q.configure\(remember_done=...\)"):
        legacy = dueq.Queue("legacy", r, clock=clock, remember_done=3600)
    legacy.schedule("x", id="a")
    run_all(legacy)
    assert legacy.schedule_many([dueq.Task("x", id="a")]).existing == 1  # its own window
    plain = dueq.Queue("legacy", r, clock=clock)
    plain.configure(remember_done=60)  # the queue's setting now wins over the keyword
    clock.advance(61)
    assert legacy.schedule_many([dueq.Task("x", id="a")]).added == 1


def test_a_bad_window_is_refused_before_anything_is_written(make_queue, r):
    q = make_queue()
    for bad in (-1, float("nan"), "1h", True):
        with pytest.raises(dueq.ConfigurationError):
            q.configure(remember_done=bad, paused=True)
    assert not r.exists(q.keys.config)
