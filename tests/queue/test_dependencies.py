"""Dependencies (issue 30): a task scheduled with ``after=[ids]`` waits (state "waiting") until
every parent is acked; the parent's settle script releases it, with no polling. Contract tests
on both front ends (``make_queue``) against real Redis."""

from __future__ import annotations

import pytest

import dueq
from dueq._wire.keys import QueueKeys


def run_all(q, fail=()):
    """Claim and settle every due task (ids in ``fail`` fail for good); returns the ids run."""
    order = []
    while deliveries := q.claim(limit=100):
        for d in deliveries:
            order.append(d.id)
            if d.id in fail:
                d.fail(dueq.Unrecoverable("no"))
            else:
                d.ack()
    return order


def test_a_child_with_two_parents_runs_only_after_both_are_acked(make_queue):
    q = make_queue()
    q.schedule("a", id="a")
    q.schedule("b", id="b")
    q.schedule("c", id="c", after=["a", "b"])
    assert q.get("c").state == "waiting"
    assert (q.stats().waiting, q.stats().scheduled, q.stats().missing) == (1, 2, 0)
    (da, db) = sorted(q.claim(limit=10), key=lambda d: d.id)  # c is not due
    da.ack()
    assert q.get("c").state == "waiting"
    assert q.claim() == []
    db.ack()  # the last parent: its ack releases c
    assert q.get("c").state == "scheduled"
    assert run_all(q) == ["c"]


def test_a_child_of_a_dead_parent_ends_dead_and_never_runs(make_queue):
    q = make_queue()
    q.schedule("p", id="p")
    q.schedule("c", id="c", after=["p"])
    q.schedule("g", id="g", after=["c"])  # a grandchild: buried in turn
    assert run_all(q, fail={"p"}) == ["p"]
    child, grandchild = q.get("c"), q.get("g")
    assert (child.state, grandchild.state) == ("dead", "dead")
    assert child.errors[-1].type == "ParentFailed"
    assert child.errors[-1].message == "parent p ended dead"
    assert grandchild.errors[-1].message == "parent c ended dead"
    assert q.dead.count() == 3


def test_after_policy_run_runs_the_child_whatever_its_parents_ended_as(make_queue):
    q = make_queue()
    q.schedule("p1", id="p1")
    q.schedule("p2", id="p2")
    q.schedule("c", id="c", after=["p1", "p2"], after_policy="run")
    q.cancel("p2")
    assert q.get("c").state == "waiting"
    assert run_all(q, fail={"p1"}) == ["p1", "c"]


def test_a_waiting_child_can_be_listed_and_cancelled(make_queue):
    q = make_queue()
    q.schedule("p", id="p")
    q.schedule("c", id="c", after=["p"], delay=30)
    page = q.list_tasks("waiting")
    assert [t.id for t in page.tasks] == ["c"]
    assert q.cancel("c")
    assert q.get("c") is None
    assert run_all(q) == ["p"]  # the parent's ack finds no child to release
    assert q.list_tasks("waiting").tasks == []


def test_a_parent_cancelled_ends_its_child_dead(make_queue):
    q = make_queue()
    q.schedule("p", id="p", delay=60)
    q.schedule("c", id="c", after=["p"])
    q.cancel("p")
    assert q.get("c").state == "dead"
    assert q.get("c").errors[-1].message == "parent p ended cancelled"


def test_a_released_child_keeps_its_own_due_time(make_queue, clock):
    q = make_queue()
    q.schedule("p", id="p")
    q.schedule("c", id="c", after=["p"], delay=100)
    assert q.get("c").due_at.timestamp() == pytest.approx(clock.now + 100)
    assert run_all(q) == ["p"]
    clock.advance(101)
    assert run_all(q) == ["c"]


def test_a_missing_parent_counts_as_done_and_a_dead_one_as_failed(make_queue):
    q = make_queue()
    q.schedule("c1", id="c1", after=["never-scheduled"])
    assert q.get("c1").state == "scheduled"
    q.schedule("p", id="p")
    assert sorted(run_all(q, fail={"p"})) == ["c1", "p"]  # p dies; c1 runs
    q.schedule("c2", id="c2", after=["p"])
    assert q.get("c2").state == "dead"  # its parent was dead already


def test_with_keep_results_a_parent_kept_as_cancelled_fails_its_child(make_queue):
    q = make_queue()
    q.configure(keep_results=3600)
    q.schedule("p", id="p")
    q.cancel("p")
    q.schedule("c", id="c", after=["p"])
    assert q.get("c").state == "dead"
    q.schedule("d", id="d")
    run_all(q)
    q.schedule("e", id="e", after=["d"])  # kept as done: e runs
    assert q.get("e").state == "scheduled"


def test_a_child_whose_parent_is_leased_is_released_by_the_ack(make_queue):
    q = make_queue()
    q.schedule("p", id="p")
    (d,) = q.claim()
    q.schedule("c", id="c", after=["p"])
    assert q.get("c").state == "waiting"
    d.ack()
    assert run_all(q) == ["c"]


def test_a_lease_expired_on_the_last_attempt_buries_the_children(make_queue, clock):
    q = make_queue(retry=dueq.RetryPolicy(max_attempts=1))
    q.schedule("p", id="p")
    q.schedule("c", id="c", after=["p"])
    q.claim(lease=5)
    clock.advance(6)
    assert q.claim() == []
    assert q.get("c").state == "dead"


def test_a_waiting_batch_member_counts_once_it_ends(make_queue):
    q = make_queue()
    q.schedule("p", id="p")
    q.schedule("c", id="c", after=["p"], batch="b")
    q.close_batch("b", on_complete=dueq.Task("done", id="done"))
    assert run_all(q, fail={"p"}) == ["p", "done"]
    assert (q.batch("b").dead, q.batch("b").complete) == (1, True)


def test_after_must_be_a_list_of_ids(make_queue):
    q = make_queue()
    with pytest.raises(dueq.InvalidTaskError, match="list of task ids"):
        q.schedule("x", after="a")
    with pytest.raises(dueq.InvalidTaskError, match="after_policy"):
        q.schedule("x", after=["a"], after_policy="maybe")


def test_tasks_without_parents_store_nothing_more(make_queue, r):
    q = make_queue()
    q.schedule({"n": 1}, id="plain")
    keys = QueueKeys.for_queue("q")
    assert r.hget(keys.tasks, "plain") == b'1:{"n":1}'
    run_all(q)
    assert not r.exists(keys.waiting, keys.after, keys.children)


def test_a_sharded_queue_refuses_parents_on_another_shard(r, clock):
    q = dueq.Queue("sh", r, shards=4, clock=clock)
    ids = [f"t{i}" for i in range(40)]
    shard_of = {i: q.shard(i).name for i in ids}
    child = ids[0]
    same = next(i for i in ids[1:] if shard_of[i] == shard_of[child])
    other = next(i for i in ids[1:] if shard_of[i] != shard_of[child])
    q.schedule("p", id=same)
    q.schedule("c", id=child, after=[same])
    assert q.get(child).state == "waiting"
    with pytest.raises(dueq.InvalidTaskError, match="another shard"):
        q.schedule("c2", id=child, after=[other])
    with pytest.raises(dueq.InvalidTaskError, match="needs an id"):
        q.schedule("c3", after=[same])


def test_a_parent_that_expires_ends_its_child_dead(make_queue, clock):
    q = make_queue()
    q.schedule("p", id="p", delay=10, expires=5)
    q.schedule("c", id="c", after=["p"])
    clock.advance(11)
    assert run_all(q) == []
    assert q.get("c").errors[-1].message == "parent p ended expired"


def test_with_events_on_a_child_buried_by_its_parent_is_a_dead_event(make_queue, r):
    from dueq.events.stream import latest_events

    q = make_queue()
    q.configure(events=3600)
    q.schedule("p", id="p")
    q.schedule("c", id="c", after=["p"])
    run_all(q, fail={"p"})
    events = latest_events(r, dueq.Queue("q", r), 10)
    kinds = {(e.task_id, e.kind) for e in events}
    assert {("p", "dead"), ("c", "dead")} <= kinds
    (child,) = [e for e in events if e.task_id == "c"]
    assert child.error.type == "ParentFailed"


def test_replacing_a_waiting_task_applies_the_new_records_parents(make_queue):
    q = make_queue()
    q.schedule("p", id="p", delay=60)
    q.schedule("c", id="c", after=["p"])
    q.schedule("c2", id="c", replace=True)  # no parents now: scheduled, no longer waiting
    assert q.get("c").state == "scheduled"
    assert q.list_tasks("waiting").tasks == []
    q.schedule("c3", id="c", replace=True, after=["p"])
    assert q.get("c").state == "waiting" and q.get("c").payload == "c3"
    assert q.stats().scheduled == 1  # p only: c is in no due set
    q.cancel("p")
    assert q.get("c").state == "dead" and q.stats().scheduled == 0


def test_one_call_that_schedules_an_id_twice_leaves_it_in_one_state(make_queue):
    q = make_queue()
    q.schedule("p", id="p", delay=60)
    q.schedule_many(
        [dueq.Task("first", id="c"), dueq.Task("second", id="c", after=["p"])], replace=True
    )
    assert q.get("c").state == "waiting"
    assert q.stats().scheduled == 1


def test_a_replaced_child_no_longer_counts_a_parent_it_stopped_waiting_for(make_queue):
    q = make_queue()
    q.schedule("p1", id="p1")
    q.schedule("p2", id="p2", delay=60)
    q.schedule("c", id="c", after=["p1"])
    q.schedule("c", id="c", replace=True, after=["p2"])
    assert run_all(q) == ["p1"]  # p1's ack must not release c: it now waits for p2 only
    assert q.get("c").state == "waiting"


def test_cancelling_a_waiting_child_drops_its_edges(make_queue, r):
    q = make_queue()
    q.schedule("p", id="p", delay=60)
    q.schedule("c", id="c", after=["p"])
    q.cancel("c")
    assert not r.exists(QueueKeys.for_queue("q").children)


# -- issue 37: a replace never closes a dependency cycle ---------------------------------------


def chain(q, n, *, prefix="t"):
    """``t0`` scheduled, then ``t1`` after ``t0``, ... ``t<n>`` after ``t<n-1>``: all waiting."""
    q.schedule(f"{prefix}0", id=f"{prefix}0", delay=60)
    q.schedule_many(
        dueq.Task(f"{prefix}{i}", id=f"{prefix}{i}", after=[f"{prefix}{i - 1}"])
        for i in range(1, n + 1)
    )


def test_replacing_a_task_to_wait_for_its_own_descendant_is_refused_and_changes_nothing(
    make_queue,
):
    q = make_queue()
    chain(q, 2, prefix="c")  # c0; c1 after c0; c2 after c1
    with pytest.raises(dueq.DependencyCycle, match="cycle") as caught:
        q.schedule("new", id="c0", replace=True, after=["c2"])
    assert isinstance(caught.value, dueq.InvalidTaskError)
    assert (caught.value.ids, caught.value.unchecked) == (["c0"], [])
    old = q.get("c0")
    assert (old.state, old.payload) == ("scheduled", "c0")  # the record was not written
    assert [q.get(i).state for i in ("c1", "c2")] == ["waiting", "waiting"]
    q.reschedule("c0", delay=0)
    assert run_all(q) == ["c0", "c1", "c2"]


def test_a_cycle_refused_in_schedule_many_leaves_the_calls_other_records_written(make_queue):
    q = make_queue()
    chain(q, 2, prefix="c")
    with pytest.raises(dueq.DependencyCycle) as caught:
        q.schedule_many(
            [
                dueq.Task("x", id="x"),
                dueq.Task("loop", id="c1", after=["c2"]),  # c2 waits for c1
                dueq.Task("y", id="y", after=["c0"]),
            ],
            replace=True,
        )
    assert caught.value.ids == ["c1"]
    assert "the other 2 of the call were" in str(caught.value)
    assert q.get("x").state == "scheduled" and q.get("y").state == "waiting"
    assert q.get("c1").payload == "c1"


def test_one_schedule_many_cannot_build_a_cycle_record_by_record(make_queue):
    q = make_queue()
    with pytest.raises(dueq.DependencyCycle) as caught:
        q.schedule_many(
            [
                dueq.Task("a", id="a"),
                dueq.Task("b", id="b", after=["a"]),
                dueq.Task("c", id="c", after=["b"]),
                dueq.Task("a2", id="a", after=["c"]),  # the replace that would close it
            ],
            replace=True,
        )
    assert caught.value.ids == ["a"]
    assert run_all(q) == ["a", "b", "c"]


def test_a_replace_whose_parents_do_not_wait_for_it_still_waits_for_them(make_queue):
    q = make_queue()
    chain(q, 2, prefix="c")
    q.schedule("p", id="p")
    q.schedule("c0 again", id="c0", replace=True, after=["p", "c0"])  # itself: ignored
    assert q.get("c0").state == "waiting"
    assert run_all(q) == ["p", "c0", "c1", "c2"]


def test_a_cycle_check_past_its_bound_refuses_the_record_as_unchecked(make_queue):
    q = make_queue()
    chain(q, 2_001)  # t0 ... t2001: the walk from t2001 up to t0 follows 2,001 edges
    with pytest.raises(dueq.DependencyCycle, match="too many to check") as caught:
        q.schedule("t0", id="t0", replace=True, after=["t2001"])
    assert (caught.value.ids, caught.value.unchecked) == ([], ["t0"])
    with pytest.raises(dueq.DependencyCycle, match="a dependency cycle"):  # within the bound
        q.schedule("t0", id="t0", replace=True, after=["t1999"])
    assert q.get("t0").state == "scheduled"


def test_a_sharded_queue_refuses_a_cycle_and_writes_the_other_shards_records(make_queue):
    q = make_queue("sh", shards=4)
    ids = [f"s{i}" for i in range(40)]
    shard_of = {i: q.shard(i).name for i in ids}
    a, b = [i for i in ids if shard_of[i] == shard_of[ids[0]]][:2]
    elsewhere = next(i for i in ids if shard_of[i] != shard_of[a])
    q.schedule("a", id=a)
    q.schedule("b", id=b, after=[a])
    with pytest.raises(dueq.DependencyCycle) as caught:
        q.schedule_many(
            [dueq.Task("a2", id=a, after=[b]), dueq.Task("e", id=elsewhere)], replace=True
        )
    assert caught.value.ids == [a]
    assert q.get(elsewhere).state == "scheduled" and q.get(a).payload == "a"
    assert sorted(run_all(q)) == sorted([a, b, elsewhere])


def test_cli_schedule_of_a_replace_that_closes_a_cycle_fails_in_one_line(invoke, r):
    q = dueq.Queue("cq", r)
    chain(q, 2, prefix="c")
    result = invoke("schedule", "cq", '"loop"', "--id", "c0", "--replace", "--after", "c2")
    assert result.exit_code == 1, result.output
    assert "a dependency cycle" in result.output and "Traceback" not in result.output
    assert q.get("c0").payload == "c0"
