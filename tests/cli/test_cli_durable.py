"""The operator side of durable tasks (issue 39) on the command line: ``dueq show`` lists a
task's steps, ``dueq signal`` wakes a task waiting for one (and says clearly why it cannot),
``dueq dead replay --from-start`` runs a dead durable task from its first step again. Tasks run
as a worker runs them (``step_runs_support.run_due``) against the test redis-server."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Collection
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from cli_support import one_error_line
from step_runs_support import run_due

import dueq

#: The id of the test's order (a generated id may begin with "-", which click would read as
#: an option unless "--" came first).
ORDER = "o-1"


def _queue(r: redis.Redis, **kwargs: Any) -> dueq.Queue:
    kwargs.setdefault("retry", dueq.RetryPolicy(max_attempts=3, wait=lambda s: 0.0))
    return dueq.Queue("jobs", r, **kwargs)


def _order(q: dueq.Queue, runs: Counter[str], fail_first: Collection[str] = ()) -> Any:
    """A durable task: steps ``charge`` and ``confirm`` (each failing on its first run when
    named in ``fail_first``), then a wait for signal ``shipped`` (a day at most)."""

    def body(name: str, value: Any) -> Any:
        runs[name] += 1
        if name in fail_first and runs[name] == 1:
            raise RuntimeError(f"{name} failed on run 1")
        return value

    @q.task(name="order", durable=True)
    def order(ctx: dueq.StepContext, cents: int) -> Any:
        charge = ctx.step("charge", body, "charge", {"charge_id": "ch_1", "note": "x" * 80})
        ctx.step("confirm", body, "confirm", cents)
        shipped = ctx.wait_for("shipped", timeout=timedelta(days=1))
        return {"charge": charge["charge_id"], "shipped": shipped}

    return order


def _step_lines(stdout: str) -> list[str]:
    """The lines of ``show``'s "steps (N):" section."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("steps ("))
    return [line for line in lines[start + 1 :] if line.startswith("  ")]


def test_show_lists_each_step_with_kind_state_runs_end_and_a_short_result(invoke, r):
    q = _queue(r)
    runs: Counter[str] = Counter()
    tid = _order(q, runs, fail_first={"confirm"}).schedule(cents=4200, id=ORDER)
    run_due(q)  # charge done, confirm failed
    failed = invoke("show", "jobs", tid)
    assert failed.exit_code == 0, failed.output
    assert "steps (2):" in failed.stdout
    charge, confirm = _step_lines(failed.stdout)
    assert charge.split()[:5] == ["0", "step", "charge", "done", "1"]
    assert "ended 20" in charge
    assert '{"charge_id": "ch_1", "note": "xxx' in charge and "…" in charge  # shortened
    assert confirm.split()[:5] == ["1", "step", "confirm", "failed", "1"]
    assert confirm.endswith("RuntimeError: confirm failed on run 1")
    run_due(q)  # confirm done on its second run, then the wait hands the task back
    assert q.get(tid).state == "waiting"
    shown = invoke("show", "jobs", tid)
    assert shown.exit_code == 0, shown.output
    assert "steps (3):" in shown.stdout
    assert "due: 20" in shown.stdout and "died:" not in shown.stdout  # due when the wait ends
    _, confirm, wait = _step_lines(shown.stdout)
    assert confirm.split()[:6] == ["1", "step", "confirm", "done", "2", "runs"]
    assert confirm.rstrip().endswith("4200")
    assert wait.split()[:5] == ["2", "wait", "shipped", "waiting", "1"]
    assert "deadline 20" in wait and "(in " in wait and "ended" not in wait


def test_show_escapes_control_characters_in_a_steps_result_and_error(invoke, r):
    q = _queue(r, retry=dueq.RetryPolicy(max_attempts=1))

    def clears_the_screen() -> None:
        raise RuntimeError("\x1b[2J gone")

    @q.task(name="rude", durable=True)
    def rude(ctx: dueq.StepContext) -> None:
        ctx.step("a", lambda: "\x1b]0;title\x07")
        ctx.step("b", clears_the_screen)

    tid = rude.schedule(id="rude-1")
    run_due(q)
    shown = invoke("show", "jobs", tid)
    assert shown.exit_code == 0, shown.output
    a, b = _step_lines(shown.stdout)
    assert a.endswith('"\\u001b]0;title\\u0007"')  # JSON escapes them already
    assert b.endswith("RuntimeError: \\x1b[2J gone")
    assert "\x1b" not in shown.stdout


def test_show_of_a_plain_task_has_no_steps_section(invoke, r):
    q = _queue(r)
    q.schedule({"n": 1}, id="plain")
    shown = invoke("show", "jobs", "plain")
    assert shown.exit_code == 0, shown.output
    assert "steps (" not in shown.stdout


def test_show_json_gives_the_steps_as_their_json_form(invoke, r):
    q = _queue(r)
    tid = _order(q, Counter()).schedule(cents=1, id=ORDER)
    run_due(q)
    result = invoke("show", "jobs", tid, "--json")
    assert result.exit_code == 0, result.output
    [task] = json.loads(result.stdout)["tasks"]
    assert task["steps"] == [s.to_json() for s in q.get(tid).steps]
    assert [(s["kind"], s["name"], s["state"]) for s in task["steps"]] == [
        ("step", "charge", "done"),
        ("step", "confirm", "done"),
        ("wait", "shipped", "waiting"),
    ]


def test_signal_wakes_a_waiting_durable_task_with_the_json_payload(invoke, r):
    q = _queue(r)
    tid = _order(q, Counter()).schedule(cents=1, id=ORDER)
    run_due(q)
    assert q.get(tid).state == "waiting"
    result = invoke("signal", "jobs", tid, "shipped", '{"tracking": "1Z999"}')
    assert result.exit_code == 0, result.output
    assert result.stdout == f"signalled {tid} of 'jobs' with 'shipped': 1 signal(s) not yet taken\n"
    assert q.get(tid).due_at <= datetime.now(UTC)  # due at once
    (value,) = run_due(q)
    assert value == {"charge": "ch_1", "shipped": {"tracking": "1Z999"}}


def test_signal_without_a_payload_sends_null_and_counts_the_signals_not_yet_taken(invoke, r):
    q = _queue(r)
    tid = _order(q, Counter()).schedule(
        cents=1, id=ORDER
    )  # not run yet: the signals wait for the wait
    assert invoke("signal", "jobs", tid, "shipped").stdout.endswith(": 1 signal(s) not yet taken\n")
    again = invoke("signal", "jobs", tid, "other", "[1, 2]")
    assert again.exit_code == 0 and again.stdout.endswith(": 2 signal(s) not yet taken\n")
    (value,) = run_due(q)
    assert value == {"charge": "ch_1", "shipped": None}  # the first shipped signal: null


def test_signal_to_a_task_that_is_not_live_is_an_error(invoke, r):
    q = _queue(r)
    q.schedule({}, id="other")
    result = invoke("signal", "jobs", "ghost", "shipped")
    assert result.exit_code == 1
    assert one_error_line(result) == (
        "error: no live task 'ghost' in 'jobs' to signal (never scheduled, ended, or dead)"
    )


def test_signal_refused_past_the_most_signals_a_task_may_hold_is_an_error(invoke, r):
    q = _queue(r)
    tid = _order(q, Counter()).schedule(cents=1, id=ORDER)
    for _ in range(dueq.durable.MAX_PENDING_SIGNALS):
        q.signal(tid, "shipped")
    result = invoke("signal", "jobs", tid, "shipped")
    assert result.exit_code == 1
    line = one_error_line(result)
    assert f"holds {dueq.durable.MAX_PENDING_SIGNALS} signals not yet taken" in line


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["bad name!"], "a signal name is 1 to 200 letters"),
        (["shipped", "{nope"], "not valid JSON"),
        (["shipped", "NaN"], "NaN is not JSON"),
    ],
)
def test_a_bad_signal_name_or_json_is_a_usage_error_and_sends_nothing(invoke, r, args, says):
    q = _queue(r)
    tid = _order(q, Counter()).schedule(cents=1, id=ORDER)
    result = invoke("signal", "jobs", tid, *args)
    assert result.exit_code == 2
    assert says in one_error_line(result)
    assert q.signal(tid, "shipped") == 1  # nothing was kept before


def test_signal_on_an_unknown_queue_is_an_error(invoke, r):
    _queue(r).schedule({})
    result = invoke("signal", "jbos", "t1", "shipped")
    assert result.exit_code == 1
    assert "no queue named 'jbos'" in one_error_line(result)


def test_signal_reaches_a_task_on_a_sharded_queue(invoke, r):
    q = _queue(r, shards=3)
    tid = _order(q, Counter()).schedule(cents=1, id=ORDER)
    run_due(q)
    assert q.get(tid).state == "waiting"
    result = invoke("signal", "jobs", tid, "shipped", '"1Z"')
    assert result.exit_code == 0, result.output
    (value,) = run_due(q)
    assert value == {"charge": "ch_1", "shipped": "1Z"}


def _dead_after_charge(r: redis.Redis, runs: Counter[str]) -> tuple[dueq.Queue, str]:
    """A durable task that died (one attempt) in ``confirm`` after ``charge`` committed."""
    q = _queue(r, retry=dueq.RetryPolicy(max_attempts=1))
    tid = _order(q, runs, fail_first={"confirm"}).schedule(cents=1, id=ORDER)
    run_due(q)
    info = q.get(tid)
    assert info.state == "dead" and [s.name for s in info.steps] == ["charge", "confirm"]
    return q, tid


def test_dead_replay_goes_on_from_the_first_unfinished_step(invoke, r):
    runs: Counter[str] = Counter()
    q, tid = _dead_after_charge(r, runs)
    result = invoke("dead", "replay", "jobs", tid, "--yes")
    assert result.exit_code == 0, result.output
    assert [s.name for s in q.get(tid).steps] == ["charge", "confirm"]
    run_due(q)
    assert runs == {"charge": 1, "confirm": 2}  # charge was committed: not run again


@pytest.mark.parametrize("which", [["--id", "ID"], ["--all"], ["--error-type", "RuntimeError"]])
def test_dead_replay_from_start_drops_the_steps_and_runs_the_first_step_again(invoke, r, which):
    runs: Counter[str] = Counter()
    q, tid = _dead_after_charge(r, runs)
    which = [tid if arg == "ID" else arg for arg in which]
    result = invoke("dead", "replay", "jobs", *which, "--from-start", "--yes")
    assert result.exit_code == 0, result.output
    assert "replayed 1 dead task(s) of 'jobs'" in result.stdout
    info = q.get(tid)
    assert (info.state, info.steps) == ("scheduled", ())
    run_due(q)
    assert runs == {"charge": 2, "confirm": 2}  # from its first step again


def test_dead_replay_from_start_asks_in_its_own_words(invoke, r):
    _, tid = _dead_after_charge(r, Counter())
    result = invoke("dead", "replay", "jobs", tid, "--from-start", input="n\n")
    assert result.exit_code == 1
    assert "from their first step" in result.stderr


def test_dead_purge_has_no_from_start(invoke, r):
    _, tid = _dead_after_charge(r, Counter())
    assert invoke("dead", "purge", "jobs", tid, "--from-start", "--yes").exit_code == 2
