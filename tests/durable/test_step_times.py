"""A durable step's times (``StepInfo.started_at``, ``ended_at``; docs/durable.md "Seeing the
steps"): when its body started and when its run ended, both on the queue's clock. Contract
tests on both front ends, the test's manual clock."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from durable_support import run_due


def test_a_steps_started_at_is_when_its_body_started_on_the_queues_clock(
    make_queue: Any, clock: Any
) -> None:
    q = make_queue("q")
    q.configure(keep_results=timedelta(hours=1))  # the finished task keeps its steps
    began: list[float] = []

    def body() -> str:
        began.append(clock.now)
        clock.advance(10)  # the body works ten seconds
        return "done"

    @q.task(name="one", durable=True)
    def one(ctx: Any) -> str:
        return str(ctx.step("work", body))

    tid = one.schedule()
    (done,) = run_due(q)
    assert done.value == "done"
    (ran,) = q.get(tid).steps
    assert ran.ended_at.timestamp() == pytest.approx(began[0] + 10)
    assert ran.started_at.timestamp() == pytest.approx(began[0])


def test_a_retried_steps_end_is_when_its_last_run_ended_and_its_start_its_first_runs(
    make_queue: Any, clock: Any
) -> None:
    q = make_queue("q")
    q.configure(keep_results=timedelta(hours=1))
    began: list[float] = []

    def body() -> str:
        began.append(clock.now)
        clock.advance(2)
        if len(began) == 1:
            raise RuntimeError("first run fails")
        return "ok"

    @q.task(name="twice", durable=True)
    def twice(ctx: Any) -> str:
        return str(ctx.step("work", body))

    tid = twice.schedule()
    run_due(q)
    clock.advance(10)  # the task's retry wait
    run_due(q)
    (step,) = q.get(tid).steps
    assert step.runs == 2
    assert step.started_at.timestamp() == pytest.approx(began[0])
    assert step.ended_at.timestamp() == pytest.approx(began[1] + 2)
