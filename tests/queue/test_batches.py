"""Batches (issue 30): members recorded by the schedule script, outcomes counted by the scripts
that end tasks, and the completion task scheduled exactly once when a closed batch has nothing
pending. Contract tests run on both front ends (``make_queue``) against real Redis, on a plain
queue and on a queue of 3 shards (issue 43: each shard counts its part, the batch's home shard
completes it; ``dueq.sharding.batches``)."""

from __future__ import annotations

import pytest
from durable_support import target

import dueq
from dueq._wire.keys import QueueKeys


@pytest.fixture(params=["plain", "shards"])
def make_queue(request, make_queue):
    if request.param == "plain":
        return make_queue

    def make(name="q", **kwargs):
        kwargs.setdefault("shards", 3)
        return make_queue(name, **kwargs)

    return make


def shard_keys(q):
    """The keys of each shard of ``q`` (the queue's own, for a plain queue)."""
    return [QueueKeys.for_queue(n) for n in target(q).shard_names]


def on_home(q, batch, name):
    """An id for ``batch``'s completion task: ``name``, or on a sharded queue the id that lies
    on the batch's home shard (``dueq.keyed_id``, as the refusal of another one says)."""
    return dueq.keyed_id(batch, name) if sharded(q) else name


def sharded(q):
    return target(q).shard_count > 1


def drain(q, limit=100):
    """Claim and ack every due task; returns the payloads acked."""
    seen = []
    while True:
        batch = q.claim(limit=limit)
        if not batch:
            return seen
        for d in batch:
            seen.append(d.payload)
            d.ack()


def test_a_batch_added_in_two_calls_runs_its_completion_once_after_every_member_ended(
    make_queue,
):
    q = make_queue()
    first = q.schedule_many([dueq.Task(i, id=f"m{i}") for i in range(3)], batch="imp")
    second = q.schedule_many([dueq.Task(i, id=f"m{i}") for i in range(2, 6)], batch="imp")
    assert (first.added, second.added, second.existing) == (3, 3, 1)  # m2 counted once
    done_id = on_home(q, "imp", "imp-done")
    info = q.close_batch("imp", on_complete=dueq.Task({"done": "imp"}, id=done_id))
    assert (info.total, info.pending, info.complete, info.closed) == (6, 6, False, True)

    deliveries = {d.id: d for d in q.claim(limit=10)}
    assert done_id not in deliveries and len(deliveries) == 6
    deliveries.pop("m0").fail(dueq.Unrecoverable("bad row"))  # dead
    q.cancel("m1")  # cancelled while leased
    for task_id in ["m2", "m3", "m4"]:
        deliveries.pop(task_id).ack()
    assert q.claim(limit=10) == [] and q.get(done_id) is None  # m5 still pending
    assert q.batch("imp").pending == 1
    deliveries.pop("m5").ack()  # the last member: its ack schedules the completion task (on
    # a sharded queue: its part's note, which the next claim takes to the home shard)

    assert drain(q) == [{"done": "imp"}]
    info = q.batch("imp")
    assert (info.total, info.acked, info.dead, info.cancelled, info.expired) == (6, 4, 1, 1, 0)
    assert (info.pending, info.complete) == (0, True)
    assert q.close_batch("imp", on_complete=dueq.Task("again")).complete
    assert drain(q) == []  # never twice


def test_closing_a_batch_whose_members_all_ended_schedules_its_completion_at_once(make_queue):
    q = make_queue()
    q.schedule("a", id="a", batch="b1")
    q.schedule("b", id="b", batch="b1")
    assert sorted(drain(q)) == ["a", "b"]
    assert q.batch("b1").pending == 0 and not q.batch("b1").complete
    info = q.close_batch("b1", on_complete=dueq.Task("finished", task=None))
    assert (info.acked, info.complete) == (2, True)
    # the default id of a completion task (on a sharded queue, on the batch's home shard)
    assert q.get(on_home(q, "b1", "batch:b1")).payload == "finished"
    assert drain(q) == ["finished"]


def test_a_closed_empty_batch_completes_at_once(make_queue):
    q = make_queue()
    info = q.close_batch("nothing", on_complete=dueq.Task("done", id=on_home(q, "nothing", "d")))
    assert (info.total, info.complete) == (0, True)
    assert drain(q) == ["done"]


def test_a_lease_that_expires_on_the_last_attempt_counts_dead(make_queue, clock):
    q = make_queue(retry=dueq.RetryPolicy(max_attempts=1))
    q.schedule("x", id="x", batch="b")
    after = on_home(q, "b", "after")
    q.close_batch("b", on_complete=dueq.Task("after", id=after))
    assert [d.id for d in q.claim(lease=5)] == ["x"]
    clock.advance(6)
    # the first claim buries x, and schedules "after" as it ends (a sharded queue's may also
    # take its part's note and claim "after" in the same call)
    assert [d.id for d in q.claim() + q.claim()] == [after]
    assert (q.batch("b").dead, q.batch("b").complete) == (1, True)


def test_scheduling_into_a_completed_batch_raises_and_writes_nothing(make_queue):
    q = make_queue()
    q.close_batch("b")
    with pytest.raises(dueq.BatchCompleted) as caught:
        q.schedule_many([dueq.Task("late", id="late")], batch="b")
    assert caught.value.ids == ["late"]
    assert q.get("late") is None
    assert q.batch("b").total == 0


def test_members_added_after_close_still_count_until_the_batch_completes(make_queue):
    q = make_queue()
    if sharded(q):
        pytest.skip("a sharded queue refuses them once their shard's part has completed")
    q.schedule("a", id="a", batch="b")
    q.close_batch("b", on_complete=dueq.Task("end", id="end"))
    q.schedule("c", id="c", batch="b")
    assert drain(q, limit=1) == ["a", "c", "end"]
    assert q.batch("b").acked == 2


def test_tasks_without_a_batch_store_nothing_more(make_queue, r):
    q = make_queue()
    q.schedule({"n": 1}, id="plain")
    keys = target(q).shard("plain").keys
    assert r.hget(keys.tasks, "plain") == b'1:{"n":1}'
    drain(q)
    for k in shard_keys(q):
        batch_keys = [k.batches, k.batch_of, k.batch_on, k.batch_ended, k.gather, k.gather_on]
        assert not r.exists(*batch_keys, k.gather_ended)


def test_batches_lists_open_batches_first_with_their_counts(make_queue, clock):
    q = make_queue()
    q.schedule("x", id="x", batch="old")
    clock.advance(1)
    q.schedule("y", id="y", batch="new")
    q.close_batch("old")
    drain(q)
    listed = q.batches()
    assert [(b.id, b.complete) for b in listed] == [("new", False), ("old", True)]
    assert listed[0].to_json()["pending"] == 0 and listed[1].to_json()["acked"] == 1
    assert q.batch("missing") is None


def test_completed_batch_records_are_trimmed_a_week_later_by_the_next_completion(make_queue, clock):
    q = make_queue()
    q.close_batch("old")
    clock.advance(8 * 86400)
    # on a sharded queue, the next completion on the old batch's home shard (every shard's part)
    new = on_home(q, "old", "new")
    q.close_batch(new)
    assert q.batch("old") is None and q.batch(new).complete


def test_batch_ids_follow_the_rules_of_task_ids(make_queue):
    q = make_queue()
    with pytest.raises(dueq.InvalidTaskError, match="batch id"):
        q.schedule("x", batch="")
    with pytest.raises(dueq.InvalidTaskError):
        q.close_batch("b", on_complete=dueq.Task("x", batch="other"))


def test_a_member_that_expires_counts_expired(make_queue, clock):
    q = make_queue()
    q.schedule("late", id="late", batch="b", delay=10, expires=5)
    q.schedule("ok", id="ok", batch="b")
    q.close_batch("b", on_complete=dueq.Task("end", id=on_home(q, "b", "end")))
    clock.advance(11)
    assert sorted(drain(q)) == ["end", "ok"]  # the claim ended "late" expired
    info = q.batch("b")
    assert (info.acked, info.expired, info.complete) == (1, 1, True)


def test_a_generated_id_drawn_again_keeps_the_batch_and_parents_of_its_record():
    from dueq._wire.envelope import FLAG_DEBOUNCE, pack_task, record_extras, repack_with_id

    flags, extra = record_extras("b1", ["p1", "p2"], True)
    record = pack_task(FLAG_DEBOUNCE | flags, 5, "old-id", b"1:{}", 900, extra)
    again = repack_with_id(record, "a-new-longer-id")
    assert again == pack_task(FLAG_DEBOUNCE | flags, 5, "a-new-longer-id", b"1:{}", 900, extra)


def test_a_member_whose_generated_id_was_taken_joins_under_its_new_id(make_queue, r, monkeypatch):
    q = make_queue()
    if sharded(q):
        pytest.skip("a sharded queue draws generated ids per shard (tests/sharding)")
    q.schedule("first", id="dup")
    ids = iter(["dup", "fresh"])  # the first id drawn is taken: the script asks for another
    monkeypatch.setattr("dueq._flows.schedule.generated_ids", lambda: ids)
    result = q.schedule_many([dueq.Task("x")], batch="b")
    assert result.ids == ["fresh"]
    assert r.hget(QueueKeys.for_queue("q").batch_of, "fresh") == b"b"
    assert q.batch("b").total == 1


def test_a_replayed_dead_member_does_not_rejoin_its_batch(make_queue):
    """A member is counted once, when it ends: a dead member that is replayed runs again as a
    plain task, and neither its replay nor its later ack changes its batch (docs/batches.md),
    so a completed batch never completes twice and an open one does not wait for it."""
    q = make_queue()
    q.schedule("x", id="x", batch="done-b")
    q.schedule("y", id="y", batch="open-b")
    q.schedule("z", id="z", batch="open-b")
    end = on_home(q, "done-b", "done-b:end")
    q.close_batch("done-b", on_complete=dueq.Task("completed", id=end))
    for d in q.claim(limit=10):
        if d.id in ("x", "y"):
            d.fail(dueq.Unrecoverable("bad"))
    assert drain(q) == ["completed"]  # x ended dead: done-b completed; z is still leased
    before = {b: q.batch(b) for b in ("done-b", "open-b")}
    assert (before["done-b"].dead, before["done-b"].complete) == (1, True)
    assert (before["open-b"].dead, before["open-b"].pending) == (1, 1)

    assert q.dead.replay(["x", "y"]) == 2
    assert {b: q.batch(b) for b in ("done-b", "open-b")} == before  # no member again
    assert sorted(drain(q)) == ["x", "y"]  # they run again, acked
    assert {b: q.batch(b) for b in ("done-b", "open-b")} == before  # still counted dead
    assert q.get(end) is None and drain(q) == []  # never a second completion


# -- a completion id taken by another task (issue 37) --------------------------------------------


def batch_state(r, q):
    """Everything close_batch may write, to compare before and after a refused call."""
    return [
        (r.hgetall(k.batches), r.hgetall(k.batch_on), r.hgetall(k.tasks), r.hgetall(k.gather))
        for k in shard_keys(q)
    ]


@pytest.mark.parametrize("taken_as", ["scheduled", "leased", "dead"])
def test_close_batch_refuses_a_completion_id_that_a_task_has_and_writes_nothing(
    make_queue, r, taken_as
):
    q = make_queue()
    taken = on_home(q, "imp", "imp-done")
    q.schedule("member", id="m", batch="imp")
    q.schedule("someone else's", id=taken, delay=3600 if taken_as == "scheduled" else 0)
    if taken_as != "scheduled":
        [holder] = [d for d in q.claim(limit=10) if d.id == taken]
        if taken_as == "dead":
            holder.fail(dueq.Unrecoverable("gone"))
    before = batch_state(r, q)
    with pytest.raises(dueq.BatchCompletionTaken) as caught:
        q.close_batch("imp", on_complete=dueq.Task({"done": 1}, id=taken))
    assert caught.value.id == taken and taken in str(caught.value)
    assert isinstance(caught.value, dueq.InvalidTaskError)
    assert batch_state(r, q) == before
    info = q.batch("imp")
    assert (info.closed, info.complete) == (False, False)
    other = on_home(q, "imp", "imp-done-2")
    info = q.close_batch("imp", on_complete=dueq.Task({"done": 1}, id=other))
    assert info.closed and not info.completion_taken


def test_a_completion_id_taken_after_close_is_reported_on_the_batch(make_queue):
    q = make_queue()
    done_id = on_home(q, "imp", "imp-done")
    q.schedule("member", id="m", batch="imp")
    q.close_batch("imp", on_complete=dueq.Task({"done": 1}, id=done_id))
    q.schedule("someone else's", id=done_id, delay=3600)  # taken between close and the end
    [member] = [d for d in q.claim(limit=10) if d.id == "m"]
    member.ack()
    assert q.claim(limit=10) == []  # (a sharded queue's takes the part's note home)
    info = q.batch("imp")
    assert (info.complete, info.completion_taken) == (True, True)
    assert info.to_json()["completion_taken"] is True
    assert q.get(done_id).payload == "someone else's"  # untouched, and not the completion


def test_a_completion_scheduled_as_usual_is_not_reported_taken(make_queue):
    q = make_queue()
    q.schedule("member", id="m", batch="imp")
    q.close_batch("imp", on_complete=dueq.Task({"done": 1}, id=on_home(q, "imp", "imp-done")))
    drain(q)
    info = q.batch("imp")
    assert (info.complete, info.completion_taken) == (True, False)
