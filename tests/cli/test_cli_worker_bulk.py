"""``dueq worker --batch-max N --linger MS``: the plain handler as a bulk handler, in a real
worker subprocess, and the option values it refuses."""

from __future__ import annotations

import sys

import pytest
from cli_worker_support import WAIT_S, start_worker, wait_for
from click.testing import CliRunner
from paths_support import FIXTURES

import dueq
from dueq.cli import cli


@pytest.fixture
def invoke_here(monkeypatch, redis_server):
    """Run ``dueq worker`` in-process from the fixtures folder (imports come from there)."""
    monkeypatch.chdir(FIXTURES)
    monkeypatch.setattr(sys, "path", list(sys.path))

    def run(*args: str):
        return CliRunner().invoke(cli, ["worker", *args], env={"DUEQ_REDIS_URL": redis_server.url})

    return run


def test_a_worker_with_batch_max_drains_plain_tasks_in_calls_of_at_most_that_many(r, redis_server):
    q = dueq.Queue("wb", r)
    ids = q.schedule_many(dueq.Task({"n": n}) for n in range(230)).ids
    q.schedule({"fail": True}, id="bad")
    child = start_worker(
        redis_server,
        "wb",
        "cli_handlers:record_calls",
        "--batch-max",
        "50",
        "--linger",
        "20",
        "--max-attempts",
        "1",
    )
    try:
        wait_for(
            lambda: q.stats().counters.get("acked", 0) == 230 and q.dead.count() == 1,
            "230 acks and one dead task",
        )
    finally:
        child.terminate()
        _out, err = child.communicate(timeout=WAIT_S)
    assert child.returncode == 0, err
    assert "bulk calls of up to 50 (linger 20 ms)" in err
    sizes = [int(x) for x in r.lrange("call_sizes", 0, -1)]
    assert sum(sizes) == 231 and max(sizes) <= 50, sizes
    assert len(sizes) < 231 / 2  # calls of many items, not one by one
    assert {x.decode() for x in r.lrange("handled", 0, -1)} == {*ids, "bad"}
    assert q.get("bad").errors[0].message == "asked to fail"  # failed alone, the rest acked


def test_linger_without_batch_max_is_refused_in_one_line(invoke_here):
    result = invoke_here("wb", "cli_handlers:record_calls", "--linger", "20")
    assert result.exit_code == 2
    [line] = result.stderr.splitlines()
    assert line.startswith("error: --linger needs --batch-max"), line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--batch-max", "0"), "BatchSpec max"),
        (("--batch-max", "-5"), "BatchSpec max"),
        (("--batch-max", "10001"), "BatchSpec max"),
        (("--batch-max", "10", "--linger", "-1"), "BatchSpec linger"),
        (("--batch-max", "10", "--linger", "60001"), "BatchSpec linger must be at most 60 s"),
    ],
)
def test_bad_batch_values_give_the_batch_specs_error_in_one_line(invoke_here, args, message):
    result = invoke_here("wb", "cli_handlers:record_calls", *args)
    assert result.exit_code == 1  # as the worker's other refused settings (--max-in-flight)
    [line] = result.stderr.splitlines()
    assert line.startswith("error: ") and message in line, line


def test_batch_max_is_refused_for_a_worker_of_named_tasks_without_a_handler(invoke_here):
    result = invoke_here("cli_handlers:bulk_queue", "--batch-max", "10")
    assert result.exit_code == 2
    [line] = result.stderr.splitlines()
    assert "--batch-max makes the plain handler a bulk handler" in line
    assert "@q.task(batch=dueq.BatchSpec(...))" in line


def test_a_named_bulk_task_takes_its_own_batch_spec_in_a_worker_of_named_tasks(r, redis_server):
    q = dueq.Queue("bulk-named", r)
    q.schedule_many(dueq.Task({"n": n}, task="collect") for n in range(70))
    child = start_worker(redis_server, "cli_handlers:bulk_queue")
    try:
        wait_for(lambda: q.stats().counters.get("acked", 0) == 70, "70 acks")
    finally:
        child.terminate()
        _out, err = child.communicate(timeout=WAIT_S)
    assert child.returncode == 0, err
    sizes = [int(x) for x in r.lrange("named_call_sizes", 0, -1)]
    assert sum(sizes) == 70 and max(sizes) <= 20, sizes
