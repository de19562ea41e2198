"""Durable tasks (issue 39): steps committed under the lease, runs that go on from the first
unfinished step, sleeps and waits that hold no worker, signals taken once and in order, and the
determinism check. Contract tests: both front ends (``make_queue``), tasks run as a worker runs
them (``durable_support.run_due``) on the test's manual clock."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import redis
from durable_support import keys_of, run_due, target

import dueq
from dueq._flows import steps as step_flows

DAY_S = 86400.0


# Every durable-task contract test runs on a plain queue and on a queue of 3 shards (on the
# suite's single Redis, where every shard shares the server: their keys and scripts are a
# Cluster's), each on both front ends: this ``make_queue`` wraps the root conftest's.
@pytest.fixture(params=["plain", "shards"])
def make_queue(
    request: pytest.FixtureRequest, make_queue: Callable[..., Any]
) -> Callable[..., Any]:
    if request.param == "plain":
        return make_queue

    def make(name: str = "q", **kwargs: Any) -> Any:
        kwargs.setdefault("shards", 3)
        return make_queue(name, **kwargs)

    return make


class Bodies:
    """Step bodies that count their runs (outside Redis) and fail on the runs asked."""

    def __init__(self) -> None:
        self.runs: Counter[str] = Counter()
        self.fail_on: dict[str, set[int]] = {}

    def __call__(self, name: str, value: Any) -> Any:
        self.runs[name] += 1
        if self.runs[name] in self.fail_on.get(name, set()):
            raise RuntimeError(f"{name} failed on run {self.runs[name]}")
        return {"step": name, "value": value}


def test_a_committed_steps_body_never_runs_again_and_later_runs_get_its_stored_result(
    make_queue: Any, clock: Any
) -> None:
    q = make_queue("q")
    bodies = Bodies()
    bodies.fail_on["b"] = {1}

    @q.task(name="two", durable=True)
    def two(ctx: dueq.StepContext, x: int) -> list[Any]:
        a = ctx.step("a", bodies, "a", x)
        b = ctx.step("b", bodies, "b", a["value"] + 1)
        return [a, b]

    tid = two.schedule(x=1)
    (first,) = run_due(q)
    assert isinstance(first.error, RuntimeError)  # b failed: the task's policy retries it
    assert [(s.name, s.state, s.runs) for s in q.get(tid).steps] == [
        ("a", "done", 1),
        ("b", "failed", 1),
    ]
    clock.advance(10)
    (second,) = run_due(q)
    assert second.value == [{"step": "a", "value": 1}, {"step": "b", "value": 2}]
    assert bodies.runs == {"a": 1, "b": 2}  # a committed: not run again
    assert q.get(tid) is None  # acked, no results kept: its steps went with it


def test_a_stale_holders_commit_is_refused_with_lease_lost_and_its_result_discarded(
    make_queue: Any, clock: Any
) -> None:
    q = make_queue("q", lease=5, retry=dueq.RetryPolicy(max_attempts=5, wait=lambda s: 0.0))
    seen: list[str] = []

    def slow_body() -> str:
        seen.append("run")
        if len(seen) == 1:  # the first run outlives its lease (no lease keeper here)
            clock.advance(6)
        return f"v{len(seen)}"

    @q.task(name="slow", durable=True)
    def slow(ctx: dueq.StepContext) -> str:
        return str(ctx.step("s", slow_body))

    tid = slow.schedule()
    (ran,) = run_due(q)
    assert isinstance(ran.error, dueq.LeaseLost)
    assert q.get(tid).steps == ()  # the stale holder's result was not committed
    (ran,) = run_due(q)  # the next claim takes the expired lease over
    assert ran.value == "v2"  # the new holder's run, committed once
    assert len(seen) == 2  # the body ran twice (at least once), its result committed once


def test_a_holder_whose_lease_was_taken_over_runs_no_body_at_all(
    make_queue: Any, clock: Any
) -> None:
    q = make_queue("q", lease=5, retry=dueq.RetryPolicy(max_attempts=5, wait=lambda s: 0.0))
    seen: list[str] = []

    @q.task(name="once", durable=True)
    def once(ctx: dueq.StepContext) -> str:
        return str(ctx.step("s", lambda: seen.append("run") or "v"))

    once.schedule()
    stale = q.claim()
    clock.advance(6)  # its lease ran out before it began: reclaimed by the next claim
    fresh = q.claim()
    (ran,) = run_due(q, stale)
    assert isinstance(ran.error, dueq.LeaseLost) and seen == []  # it read its log under the lease
    (ran,) = run_due(q, fresh)
    assert ran.value == "v" and seen == ["run"]


def test_a_sleep_hands_the_task_back_for_its_duration_holding_no_lease_and_no_attempt(
    make_queue: Any, clock: Any
) -> None:
    q = make_queue("q")
    bodies = Bodies()

    @q.task(name="sleepy", durable=True)
    def sleepy(ctx: dueq.StepContext) -> str:
        ctx.step("before", bodies, "before", 0)
        ctx.sleep(timedelta(days=30))
        ctx.step("after", bodies, "after", 0)
        return "woke"

    tid = sleepy.schedule()
    (ran,) = run_due(q)
    assert ran.outcome is not None and ran.outcome.kind == "released"
    info = q.get(tid)
    assert info.state == "scheduled" and info.attempt == 0
    assert info.due_at.timestamp() == pytest.approx(clock.now + 30 * DAY_S)
    assert q.stats().leased == 0
    assert [(s.kind, s.state) for s in info.steps] == [("step", "done"), ("sleep", "done")]
    clock.advance(30 * DAY_S - 1)
    assert run_due(q) == []  # not before its wake time
    clock.advance(1)
    (ran,) = run_due(q)
    assert ran.value == "woke"
    assert bodies.runs == {"before": 1, "after": 1}


def test_wait_for_takes_a_signal_sent_before_during_or_after_the_wait_exactly_once(
    make_queue: Any, clock: Any
) -> None:
    q = make_queue("q")
    got: list[Any] = []

    @q.task(name="waiter", durable=True)
    def waiter(ctx: dueq.StepContext) -> list[Any]:
        first = ctx.wait_for("go", timeout=3600)
        got.append(first)
        second = ctx.wait_for("go", timeout=3600)
        got.append(second)
        third = ctx.wait_for("go", timeout=3600)
        got.append(third)
        return [first, second, third]

    tid = waiter.schedule()
    assert q.signal(tid, "go", {"n": 1}) == 1  # before the first wait
    (ran,) = run_due(q)  # takes 1, then waits for the second: handed back
    assert ran.outcome.kind == "released"
    info = q.get(tid)
    assert info.state == "waiting" and info.steps[-1].state == "waiting"
    assert info.steps[-1].deadline.timestamp() == pytest.approx(clock.now + 3600)
    assert run_due(q) == []  # waiting: no worker takes it
    assert q.signal(tid, "other", 0) == 1  # another name does not wake it
    assert run_due(q) == []
    q.signal(tid, "go", {"n": 2})  # during the wait: due at once
    (ran,) = run_due(q)
    assert ran.outcome.kind == "released"  # took 2, waits for the third
    clock.advance(3600)  # the third times out
    (ran,) = run_due(q)
    assert ran.value == [{"n": 1}, {"n": 2}, None]
    # each signal was delivered to the run once: the re-runs got them from the log
    assert got.count({"n": 1}) == 3 and got.count({"n": 2}) == 2 and got.count(None) == 1


def test_signals_of_one_name_are_taken_in_the_order_they_were_sent(
    make_queue: Any,
) -> None:
    q = make_queue("q")

    @q.task(name="reader", durable=True)
    def reader(ctx: dueq.StepContext) -> list[Any]:
        return [ctx.wait_for("n", timeout=60) for _ in range(3)]

    tid = reader.schedule()
    for n in range(3):
        q.signal(tid, "n", n)
    (ran,) = run_due(q)
    assert ran.value == [0, 1, 2]


def test_a_renamed_step_ends_the_task_dead_with_non_deterministic_never_a_silent_rerun(
    make_queue: Any, clock: Any
) -> None:
    q = make_queue("q")
    bodies = Bodies()
    bodies.fail_on["b"] = {1}
    names = ["a", "b"]

    @q.task(name="changing", durable=True)
    def changing(ctx: dueq.StepContext) -> None:
        for name in names:
            ctx.step(name, bodies, name, 0)

    tid = changing.schedule()
    run_due(q)  # a committed, b failed
    names[0] = "a2"  # a deploy renamed the first step
    clock.advance(10)
    (ran,) = run_due(q)
    assert isinstance(ran.error, dueq.NonDeterministic)
    assert ran.error.position == 0
    assert "step 'a2'" in str(ran.error) and "step 'a'" in str(ran.error)
    info = q.get(tid)
    assert info.state == "dead" and info.errors[-1].type == "NonDeterministic"
    assert bodies.runs == {"a": 1, "b": 1}  # nothing ran under the new name


def test_a_run_that_returns_before_its_committed_steps_is_non_deterministic(
    make_queue: Any, clock: Any
) -> None:
    q = make_queue("q")
    steps, fail = ["a", "b"], [True]

    @q.task(name="shrinking", durable=True)
    def shrinking(ctx: dueq.StepContext) -> None:
        for name in steps:
            ctx.step(name, lambda: 1)
        if fail:
            fail.pop()
            raise RuntimeError("after its steps")

    tid = shrinking.schedule()
    run_due(q)  # a, b committed, then the run failed
    steps.pop()  # a deploy took b out
    clock.advance(10)
    (ran,) = run_due(q)
    assert isinstance(ran.error, dueq.NonDeterministic)
    assert ran.error.found == "return" and q.get(tid).state == "dead"


def test_signal_refuses_what_it_cannot_keep_with_typed_errors_and_writes_nothing(
    make_queue: Any, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = make_queue("q")
    tid = q.schedule({"x": 1})
    with pytest.raises(dueq.TaskNotFound):
        q.signal("no-such-task", "go", 1)
    with pytest.raises(dueq.InvalidTaskError):
        q.signal(tid, "bad name", 1)
    with pytest.raises(dueq.PayloadError):
        q.signal(tid, "go", {1, 2})
    monkeypatch.setattr(step_flows, "MAX_PENDING_SIGNALS", 2)
    q.signal(tid, "go", 1)
    q.signal(tid, "go", 2)
    with pytest.raises(dueq.SignalRefused):
        q.signal(tid, "go", 3)
    assert r.hget(keys_of(q, tid).steps, f"{tid}\0s").count(b"\n") == 1  # two kept


def test_an_ended_tasks_steps_and_signals_are_dropped_and_kept_with_its_result(
    make_queue: Any, r: redis.Redis
) -> None:
    q = make_queue("q")

    @q.task(name="one", durable=True)
    def one(ctx: dueq.StepContext) -> int:
        return int(ctx.step("s", lambda: 7))

    acked = one.schedule()
    q.signal(acked, "unused", 1)
    run_due(q)
    assert r.exists(keys_of(q, acked).steps) == 0  # nothing left of it
    q.configure(keep_results=3600)
    kept = one.schedule()
    run_due(q)
    info = q.get(kept)
    assert info.state == "done" and info.result == 7
    assert [(s.name, s.result) for s in info.steps] == [("s", 7)]
    cancelled = one.schedule(delay=60)
    q.signal(cancelled, "unused", 1)
    assert q.cancel(cancelled)
    assert r.hlen(keys_of(q, cancelled).steps) == 0


def test_a_replayed_dead_task_goes_on_from_its_first_unfinished_step_or_from_the_start(
    make_queue: Any, clock: Any
) -> None:
    q = make_queue("q", retry=dueq.RetryPolicy(max_attempts=1))
    bodies = Bodies()
    bodies.fail_on["b"] = {1, 3}

    @q.task(name="twice", durable=True)
    def twice(ctx: dueq.StepContext) -> str:
        ctx.step("a", bodies, "a", 0)
        ctx.step("b", bodies, "b", 0)
        return "ok"

    tid = twice.schedule()
    run_due(q)
    assert q.get(tid).state == "dead"
    assert [s.state for s in q.get(tid).steps] == ["done", "failed"]  # dead keeps its steps
    q.dead.replay([tid])
    run_due(q)
    assert bodies.runs == {"a": 1, "b": 2}  # a not again
    done_twice = twice.schedule()
    run_due(q)  # a (run 2), b fails (run 3): dead
    q.dead.replay([done_twice], from_start=True)
    run_due(q)
    assert bodies.runs == {"a": 3, "b": 4}  # from the start: a ran again


def test_a_steps_own_retry_hands_the_task_back_without_using_its_attempts_then_ends_it_dead(
    make_queue: Any, clock: Any
) -> None:
    q = make_queue("q", retry=dueq.RetryPolicy(max_attempts=2))
    bodies = Bodies()
    bodies.fail_on["flaky"] = {1, 2, 3, 4}
    policy = dueq.RetryPolicy(max_attempts=4, wait=lambda s: 5.0)

    @q.task(name="own", durable=True)
    def own(ctx: dueq.StepContext) -> str:
        ctx.step("flaky", bodies, "flaky", 0, retry=policy)
        return "ok"

    tid = own.schedule()
    for run in range(3):
        (ran,) = run_due(q)
        assert ran.outcome.kind == "released", run  # back in 5 s, no attempt counted
        info = q.get(tid)
        assert info.attempt == 0 and info.steps[0].runs == run + 1
        clock.advance(5)
    (ran,) = run_due(q)  # the fourth run: the step's policy gives up
    assert isinstance(ran.error, dueq.Unrecoverable)
    assert q.get(tid).state == "dead" and bodies.runs["flaky"] == 4


def test_a_step_result_that_is_not_json_ends_the_task_dead(make_queue: Any) -> None:
    q = make_queue("q")

    @q.task(name="bad", durable=True)
    def bad(ctx: dueq.StepContext) -> None:
        ctx.step("s", lambda: {1, 2})

    tid = bad.schedule()
    (ran,) = run_due(q)
    assert isinstance(ran.error, dueq.Unrecoverable)
    assert q.get(tid).state == "dead" and q.get(tid).steps == ()


def test_step_id_is_the_same_on_every_run_of_a_step(make_queue: Any, clock: Any) -> None:
    q = make_queue("q")
    keys: list[str] = []

    def charge(ctx: dueq.StepContext) -> None:
        keys.append(ctx.step_id)
        if len(keys) == 1:
            raise RuntimeError("provider timeout")

    @q.task(name="pay", durable=True)
    def pay(ctx: dueq.StepContext) -> None:
        ctx.step("charge", charge, ctx)

    tid = pay.schedule()
    run_due(q)
    clock.advance(10)
    run_due(q)
    assert keys == [f"{tid}/0/charge", f"{tid}/0/charge"]


def test_an_async_def_durable_task_awaits_its_steps_on_either_front_end(
    make_queue: Any, clock: Any
) -> None:
    q = make_queue("q")
    runs: Counter[str] = Counter()

    async def fetch(x: int) -> int:
        runs["fetch"] += 1
        return x * 2

    @q.task(name="aio", durable=True)
    async def aio(ctx: dueq.AsyncStepContext, x: int) -> list[Any]:
        doubled = await ctx.step("fetch", fetch, x)
        await ctx.sleep(30)
        reply = await ctx.wait_for("ok", timeout=60)
        return [doubled, reply]

    tid = aio.schedule(x=4)
    (ran,) = run_due(q)
    assert ran.outcome.kind == "released"
    clock.advance(30)
    run_due(q)  # slept; now waiting
    assert q.get(tid).state == "waiting"
    q.signal(tid, "ok", "yes")
    (ran,) = run_due(q)
    assert ran.value == [8, "yes"] and runs["fetch"] == 1


def test_a_durable_task_ends_its_batch_and_releases_its_children_only_when_it_finishes(
    make_queue: Any, clock: Any
) -> None:
    q = make_queue("q")
    shards = len(target(q).shard_names)

    @q.task(name="napper", durable=True)
    def napper(ctx: dueq.StepContext) -> str:
        ctx.step("a", lambda: 1)
        ctx.sleep(60)
        return "done"

    # a parent and its child share a shard (docs/sharding.md): ids of one workflow by keyed_id
    parent = napper.schedule(batch="b1", id=dueq.keyed_id("wf", "parent", shards))
    child_id = dueq.keyed_id("wf", "child", shards)
    child = q.schedule({"after": "parent"}, id=child_id, after=[parent])
    q.close_batch("b1")
    run_due(q)  # the parent sleeps: not ended
    assert q.batch("b1").completed_at is None
    assert q.get(child).state == "waiting"
    clock.advance(60)
    run_due(q)  # the parent finishes: the child is due, the batch completes
    assert q.get(child).state == "scheduled"
    run_due(q)  # (a sharded queue's batch completes as this claim takes its parts' notes home)
    assert q.batch("b1").completed_at is not None


def test_a_durable_task_due_after_its_expiry_ends_expired_with_its_steps_dropped(
    make_queue: Any, clock: Any, r: redis.Redis
) -> None:
    q = make_queue("q")

    @q.task(name="late", durable=True)
    def late(ctx: dueq.StepContext) -> None:
        ctx.step("a", lambda: 1)
        ctx.sleep(120)

    tid = late.schedule(expires=60)
    run_due(q)
    assert q.get(tid).steps  # asleep, with its step
    clock.advance(120)
    assert run_due(q) == []  # its next run would start after its expiry
    assert q.get(tid) is None and r.hlen(keys_of(q, tid).steps) == 0


def test_a_signal_sent_after_a_wait_timed_out_is_kept_for_the_next_wait_not_the_ended_one(
    make_queue: Any, clock: Any
) -> None:
    q = make_queue("q")

    @q.task(name="two_waits", durable=True)
    def two_waits(ctx: dueq.StepContext) -> list[Any]:
        first = ctx.wait_for("ping", timeout=10)
        ctx.sleep(30)
        second = ctx.wait_for("ping", timeout=10)
        return [first, second]

    tid = two_waits.schedule()
    run_due(q)  # waits
    clock.advance(10)
    run_due(q)  # the first wait timed out; asleep
    q.signal(tid, "ping", "late")  # after the first wait ended
    clock.advance(30)
    (ran,) = run_due(q)
    assert ran.value == [None, "late"]


def test_a_task_past_the_most_steps_a_task_may_commit_ends_dead_with_the_reason(
    make_queue: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dueq.durable import _run

    monkeypatch.setattr(_run, "MAX_STEPS", 3)
    q = make_queue("q")

    @q.task(name="endless", durable=True)
    def endless(ctx: dueq.StepContext) -> None:
        for i in range(10):
            ctx.step(f"s{i}", int, i)

    tid = endless.schedule()
    (ran,) = run_due(q)
    assert isinstance(ran.error, dueq.Unrecoverable) and "at most 3 steps" in str(ran.error)
    assert q.get(tid).state == "dead" and len(q.get(tid).steps) == 3


def test_a_durable_task_cancelled_while_it_runs_learns_it_at_its_next_step(
    make_queue: Any,
) -> None:
    q = make_queue("q")
    ran: list[str] = []

    @q.task(name="cancelled", durable=True)
    def cancelled(ctx: dueq.StepContext) -> None:
        ctx.step("a", ran.append, "a")

    tid = cancelled.schedule()
    deliveries = q.claim()
    assert q.cancel(tid)
    (ran_once,) = run_due(q, deliveries)
    assert isinstance(ran_once.error, dueq.TaskCancelled)
    assert ran_once.outcome.kind == "cancelled" and q.get(tid) is None
    assert ran == []  # it read its log under the lease: no body ran for a cancelled task


def test_a_wait_without_a_timeout_has_no_deadline_and_waits_until_its_signal(
    make_queue: Any, clock: Any
) -> None:
    q = make_queue("q")

    @q.task(name="patient", durable=True)
    def patient(ctx: dueq.StepContext) -> Any:
        return ctx.wait_for("go")

    tid = patient.schedule()
    run_due(q)
    info = q.get(tid)
    assert info.state == "waiting" and info.steps[-1].deadline is None
    clock.advance(365 * DAY_S)
    assert run_due(q) == []  # a year later, still waiting
    q.signal(tid, "go", [1])
    (ran,) = run_due(q)
    assert ran.value == [1]


def test_ctx_progress_reaches_the_tasks_followers_on_every_run_that_reaches_it(
    make_queue: Any, clock: Any
) -> None:
    q = make_queue("q")

    @q.task(name="reporting", durable=True)
    def reporting(ctx: dueq.StepContext) -> str:
        ctx.progress({"stage": "start"})
        ctx.step("work", lambda: 1)
        ctx.sleep(10)
        ctx.progress({"stage": "done"})
        return "ok"

    tid = reporting.schedule()
    run_due(q)  # asleep after its first entry
    assert [(p.seq, p.body) for p in q.progress(tid, timeout=0)] == [(1, {"stage": "start"})]
    clock.advance(10)
    (ran,) = run_due(q)  # the second run reports "start" again, then "done"
    assert ran.value == "ok"
    assert list(q.progress(tid, timeout=0)) == []  # ended: its entries went with its steps


def test_a_debounced_durable_tasks_follow_up_starts_from_its_first_step(
    make_queue: Any, clock: Any
) -> None:
    q = make_queue("q", retry=dueq.RetryPolicy(max_attempts=1))
    bodies = Bodies()
    bodies.fail_on["b"] = {1}

    @q.task(name="debounced", durable=True)
    def debounced(ctx: dueq.StepContext, n: int) -> int:
        ctx.step("a", bodies, "a", n)
        ctx.step("b", bodies, "b", n)
        return n

    debounced.schedule(n=1, id="reindex", debounce=5)
    clock.advance(5)
    running = q.claim()
    debounced.schedule(n=2, id="reindex", debounce=5)  # a follow-up, after the running one
    (ran,) = run_due(q, running)  # a committed, b failed: dead, the follow-up takes its id
    assert isinstance(ran.error, RuntimeError)
    clock.advance(5)
    (ran,) = run_due(q)
    assert ran.value == 2
    assert bodies.runs == {"a": 2, "b": 2}  # the follow-up ran a again: a new task's steps


def test_step_results_past_the_logs_bound_end_the_task_dead_with_the_reason(
    make_queue: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dueq.durable import _run

    monkeypatch.setattr(_run, "MAX_LOG_BYTES", 400)
    q = make_queue("q")

    @q.task(name="hoarder", durable=True)
    def hoarder(ctx: dueq.StepContext) -> None:
        for i in range(10):
            ctx.step(f"s{i}", str, "x" * 100)

    tid = hoarder.schedule()
    (ran,) = run_due(q)
    assert isinstance(ran.error, dueq.Unrecoverable) and "past 400 bytes" in str(ran.error)
    assert q.get(tid).state == "dead" and len(q.get(tid).steps) == 2
