"""The dead-letter queue: list, count, replay, purge, caps by count and age."""

from __future__ import annotations

import pytest

import dueq
import dueq.dead


@pytest.fixture
def buried(make_queue):
    """A queue with five dead tasks d0..d4 (died in that order) and one scheduled task."""
    q = make_queue(retry=dueq.RetryPolicy(max_attempts=1))
    for i in range(5):
        q.schedule({"n": i}, id=f"d{i}")
        [d] = q.claim()
        d.fail(RuntimeError(f"failure {i}"))
        q.clock.advance(1)
    q.schedule("alive", id="alive", delay=1000)
    return q


def test_dead_list_is_newest_first_with_error_history(buried):
    listed = buried.dead.list(limit=3)
    assert [t.id for t in listed] == ["d4", "d3", "d2"]
    assert all(t.state == "dead" and t.died_at is not None for t in listed)
    assert listed[0].errors[0].message == "failure 4"
    assert [t.id for t in buried.dead.list(limit=10, offset=3)] == ["d1", "d0"]
    assert buried.dead.count() == 5


def test_replay_by_id_resets_attempts_and_is_due_now(buried):
    assert buried.dead.replay(["d1", "d3"]) == 2
    assert buried.dead.count() == 3
    info = buried.get("d1")
    assert info.state == "scheduled" and info.attempt == 0 and info.errors == []
    claimed = buried.claim(limit=10)
    assert sorted(d.id for d in claimed) == ["d1", "d3"]
    assert all(d.attempt == 1 for d in claimed)


def test_replay_with_an_unknown_id_changes_nothing(buried):
    with pytest.raises(dueq.TaskNotFound) as caught:
        buried.dead.replay(["d0", "alive", "ghost"])
    assert caught.value.ids == ["alive", "ghost"]
    assert isinstance(caught.value, LookupError)
    assert buried.dead.count() == 5


def test_replay_all_and_purge_all(buried):
    assert buried.dead.replay() == 5
    assert buried.dead.count() == 0 and buried.stats().scheduled == 6
    for d in buried.claim(limit=10):
        d.fail(dueq.Unrecoverable("again"))
    assert buried.dead.purge() == 5
    assert buried.dead.count() == 0
    assert buried.get("d0") is None
    assert buried.get("alive").state == "scheduled"


def test_purge_by_id_deletes_for_good(buried):
    assert buried.dead.purge(["d0"]) == 1
    assert buried.get("d0") is None
    assert buried.dead.count() == 4


def test_dead_set_is_capped_by_count(make_queue, r):
    q = make_queue(retry=dueq.RetryPolicy(max_attempts=1), dead_max_count=3)
    for i in range(6):
        q.schedule(i, id=f"t{i}")
        [d] = q.claim()
        d.fail(RuntimeError("x"))
        q.clock.advance(1)
    assert [t.id for t in q.dead.list()] == ["t5", "t4", "t3"]
    assert r.hlen(q.keys.tasks) == 3  # trimmed tasks leave nothing behind
    assert r.hlen(q.keys.errors) == 3


def test_dead_set_is_capped_by_age(make_queue, r):
    q = make_queue(retry=dueq.RetryPolicy(max_attempts=1), dead_max_age=60)
    q.schedule("old", id="old")
    [d] = q.claim()
    d.fail(RuntimeError("x"))
    q.clock.advance(61)
    q.schedule("new", id="new")
    [d] = q.claim()
    d.fail(RuntimeError("y"))
    assert [t.id for t in q.dead.list()] == ["new"]
    assert q.get("old") is None and not r.hexists(q.keys.meta, "old")


@pytest.mark.parametrize("bad", [-1, 1.5, "3"])
def test_bad_list_arguments_are_configuration_errors(buried, bad):
    with pytest.raises(dueq.ConfigurationError):
        buried.dead.list(limit=bad)


def test_repeated_ids_are_replayed_and_purged_once(buried):
    assert buried.dead.replay(["d0", "d0"]) == 1
    assert buried.dead.purge(["d1", "d1", "d2"]) == 2
    stats = buried.stats()
    assert (stats.counters["replayed"], stats.counters["purged"]) == (1, 2)
    assert (stats.scheduled, stats.dead) == (2, 2)


def test_a_dead_task_exactly_at_the_age_limit_is_kept(make_queue):
    q = make_queue(retry=dueq.RetryPolicy(max_attempts=1), dead_max_age=60)

    def bury(task_id):
        q.schedule(task_id, id=task_id)
        [d] = q.claim()
        d.fail(RuntimeError("x"))

    bury("first")
    q.clock.advance(60)
    bury("second")  # "first" is exactly 60 s dead: kept
    assert q.dead.count() == 2
    q.clock.advance(0.001)
    bury("third")  # now "first" is older than 60 s: trimmed
    assert [t.id for t in q.dead.list()] == ["third", "second"]


@pytest.mark.parametrize("action", ["replay", "purge"])
@pytest.mark.parametrize("ids", ["d0", "d0d1", b"d0", bytearray(b"d0")])
def test_a_bare_string_of_ids_is_refused_not_split_into_characters(buried, action, ids):
    with pytest.raises(dueq.InvalidTaskError, match="not a") as info:
        getattr(buried.dead, action)(ids)
    assert isinstance(info.value, ValueError)
    if isinstance(ids, str):
        assert f"ids=[{ids!r}]" in str(info.value)
    assert buried.dead.count() == 5


@pytest.mark.parametrize("ids", [5, 1.5, object()])
def test_ids_that_are_not_iterable_are_refused(buried, ids):
    with pytest.raises(dueq.InvalidTaskError, match="iterable of task ids"):
        buried.dead.purge(ids)
    assert buried.dead.count() == 5


def bury_many(q: dueq.Queue, count: int) -> list[str]:
    ids = [f"t{i}" for i in range(count)]
    q.schedule_many([dueq.Task(i, id=i) for i in ids])
    while batch := q.claim(limit=1000):
        for d in batch:
            d.fail(dueq.Unrecoverable("x"))
    return ids


@pytest.mark.parametrize("action", ["replay", "purge"])
def test_more_ids_than_one_batch_are_all_or_nothing(make_queue, action):
    q = make_queue(retry=dueq.RetryPolicy(max_attempts=1))
    ids = bury_many(q, 2 * dueq.dead.DEAD_BATCH + 5)
    with pytest.raises(dueq.TaskNotFound) as info:
        getattr(q.dead, action)([*ids, "missing"])  # the unknown id is in the last batch
    assert info.value.ids == ["missing"]
    assert q.dead.count() == len(ids)  # nothing moved
    assert getattr(q.dead, action)(ids) == len(ids)
    assert q.dead.count() == 0


def test_an_id_repeated_across_batches_counts_once(make_queue):
    q = make_queue(retry=dueq.RetryPolicy(max_attempts=1))
    ids = bury_many(q, 3)
    repeated = [ids[0]] * (dueq.dead.DEAD_BATCH + 1) + ids[1:]
    assert q.dead.replay(repeated) == 3
    assert q.stats().counters["replayed"] == 3
