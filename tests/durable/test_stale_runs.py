"""A durable task's run on a stale delivery (a lease that ran out, taken over by another
consumer) after the task ended elsewhere (issue 39's chaos proof, scripts/chaos/durable.py):
no committed step's body may run again. Contract tests on both front ends, the test's manual
clock."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from durable_support import run_due

import dueq


@pytest.mark.xfail(
    strict=True,
    reason=(
        "a stale delivery's run reads its step log with a plain HGET of the steps hash, not "
        "under the lease: once the task has ended (acked, its log dropped or moved into the "
        "kept result) it reads no steps and runs the first step's body again before its commit "
        "is refused with LeaseLost"
    ),
)
@pytest.mark.parametrize("keep_results", [False, True], ids=["dropped", "kept"])
def test_a_stale_delivery_run_after_its_task_ended_runs_no_committed_step_again(
    make_queue: Any, clock: Any, keep_results: bool
) -> None:
    q = make_queue("q", lease=5, retry=dueq.RetryPolicy(max_attempts=5, wait=lambda s: 0.0))
    if keep_results:
        q.configure(keep_results=timedelta(hours=1))
    runs: list[str] = []

    @q.task(name="two", durable=True)
    def two(ctx: dueq.StepContext) -> str:
        a = ctx.step("a", lambda: runs.append("a") or "A")
        b = ctx.step("b", lambda: runs.append("b") or "B")
        return a + b

    tid = two.schedule()
    stale = q.claim()  # a worker holds it, then stalls past its lease (a pause, an outage)
    clock.advance(6)
    (fresh,) = q.claim()  # another worker takes it over and finishes it
    (done,) = run_due(q, [fresh])
    assert done.value == "AB" and runs == ["a", "b"]
    info = q.get(tid)
    assert info is None if not keep_results else info.state == "done"
    (ran,) = run_due(q, stale)  # the stalled worker goes on with the delivery it held
    assert isinstance(ran.error, dueq.LeaseLost)
    assert runs == ["a", "b"]  # a was committed: its body must not run again
