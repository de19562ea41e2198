"""``dueq dead list|show|replay|purge`` against the test redis-server."""

from __future__ import annotations

import pytest
from cli_support import bury

import dueq


@pytest.fixture
def q(make_queue) -> dueq.Queue:
    return make_queue("jobs", clock=None, retry=dueq.RetryPolicy(max_attempts=2))


def test_list_shows_each_dead_task_with_attempts_and_last_error(invoke, q):
    bury(q, 3)
    result = invoke("dead", "list", "jobs")
    assert result.exit_code == 0, result.output
    assert "dead tasks of 'jobs': 3" in result.stdout
    for n in range(3):
        row = next(line for line in result.stdout.splitlines() if line.startswith(f"│ d{n} "))
        cells = [c.strip() for c in row.split("│")[1:-1]]
        assert cells[2] == "2"  # id, died, attempt, last error: as list --state dead
        assert cells[3] == f"ValueError: second try of d{n}"


def test_list_limit_says_how_many_are_not_shown(invoke, q):
    bury(q, 5)
    result = invoke("dead", "list", "jobs", "--limit", "2")
    assert "showing 2 of 5" in result.stdout


def test_list_of_a_queue_without_dead_tasks_says_so(invoke, q):
    q.schedule({})
    result = invoke("dead", "list", "jobs")
    assert result.exit_code == 0
    assert "no dead tasks in 'jobs'" in result.stdout


def test_show_prints_the_payload_and_every_error_with_its_traceback(invoke, q):
    bury(q, 1)
    result = invoke("dead", "show", "jobs", "d0")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert '"n": 0' in out
    assert "errors (2):" in out
    assert "attempt 1 at " in out and "ValueError: first try of d0" in out
    assert "attempt 2 at " in out and "ValueError: second try of d0" in out
    assert out.count("raise ValueError(") == 2  # the tracebacks


def test_show_of_a_task_that_is_not_dead_is_an_error(invoke, q):
    bury(q, 1)
    q.schedule({}, id="alive")
    result = invoke("dead", "show", "jobs", "d0", "alive", "ghost")
    assert result.exit_code == 1
    assert result.stderr == "error: not in the dead-letter queue of 'jobs': alive, ghost\n"


def test_replay_by_id_after_confirmation_resets_attempts(invoke, q):
    bury(q, 3)
    result = invoke("dead", "replay", "jobs", "--id", "d1", "--id", "d2", input="y\n")
    assert result.exit_code == 0, result.output
    assert "Replay 2 dead task(s) of 'jobs'?" in result.stderr
    assert "replayed 2 dead task(s) of 'jobs'" in result.stdout
    assert q.dead.count() == 1
    info = q.get("d1")
    assert (info.state, info.attempt, info.errors) == ("scheduled", 0, [])


def test_replay_all_moves_more_than_one_batch(invoke, q):
    bury(q, 2500)
    result = invoke("dead", "replay", "jobs", "--all", "--yes")
    assert result.exit_code == 0, result.output
    assert "replayed 2500 dead task(s)" in result.stdout
    assert (q.dead.count(), q.stats().scheduled) == (0, 2500)


def test_purge_declined_changes_nothing(invoke, q):
    bury(q, 2)
    result = invoke("dead", "purge", "jobs", "--all", input="n\n")
    assert result.exit_code == 1
    assert "Delete 2 dead task(s) of 'jobs' for good?" in result.stderr
    assert result.stderr.splitlines()[-1] == "error: aborted"
    assert q.dead.count() == 2


def test_purge_without_an_answer_on_stdin_aborts(invoke, q):
    bury(q, 1)
    result = invoke("dead", "purge", "jobs", "--all")
    assert result.exit_code == 1
    assert q.dead.count() == 1


def test_purge_confirmed_deletes_them_for_good(invoke, q):
    bury(q, 3)
    result = invoke("dead", "purge", "jobs", "--id", "d0", input="y\n")
    assert result.exit_code == 0
    assert q.get("d0") is None and q.dead.count() == 2
    assert invoke("dead", "purge", "jobs", "--all", "-y").exit_code == 0
    assert q.dead.count() == 0


def test_replay_of_an_id_that_is_not_dead_changes_nothing(invoke, q):
    bury(q, 2)
    result = invoke("dead", "replay", "jobs", "--id", "d0", "--id", "nope", "--yes")
    assert result.exit_code == 1
    assert result.stderr == "error: not in the dead-letter queue of 'jobs': nope\n"
    assert q.dead.count() == 2


@pytest.mark.parametrize("extra", [[], ["--id", "d0", "--all"], ["d0", "--all"]])
def test_replay_needs_exactly_one_of_id_and_all(invoke, q, extra):
    bury(q, 1)
    result = invoke("dead", "replay", "jobs", *extra)
    assert result.exit_code == 2
    assert "give the ids (ID... or --id ID), --error-type NAME or --all" in result.stderr
    assert q.dead.count() == 1


@pytest.mark.parametrize("command", ["list", "show", "replay", "purge"])
def test_dead_commands_on_an_unknown_queue_are_an_error(invoke, q, command):
    bury(q, 1)
    extra = {"show": ["d0"], "replay": ["--all", "-y"], "purge": ["--all", "-y"]}.get(command, [])
    result = invoke("dead", command, "jbos", *extra)
    assert result.exit_code == 1
    assert result.stderr.startswith("error: no queue named 'jbos' at redis://127.0.0.1:")
    assert q.dead.count() == 1
