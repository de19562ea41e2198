"""Task ids that begin with "-" on the command line (docs/cli-commands.md, "Ids that begin with
-"): the commands that take ids read a token that is none of their options as an id, and
anything after ``--`` as an argument; an unknown ``--name`` stays an error that says how to pass
such an id."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
from cli_support import bury, one_error_line

import dueq


@pytest.fixture
def q(r: redis.Redis) -> dueq.Queue:
    q = dueq.Queue("jobs", r, retry=dueq.RetryPolicy(max_attempts=2))
    q.schedule_many(dueq.Task({"n": i}, id=i) for i in ("-abc", "-5", "--json", "-y"))
    return q


def _ids(result: Any) -> list[str]:
    return [t["id"] for t in json.loads(result.stdout)["tasks"]]


def test_show_reads_an_id_that_begins_with_a_dash_as_an_id(invoke: Any, q: Any) -> None:
    result = invoke("show", "jobs", "-abc", "-5", "--json")
    assert result.exit_code == 0, result.output
    assert _ids(result) == ["-abc", "-5"]


def test_ids_after_a_double_dash_are_ids_even_when_they_look_like_options(
    invoke: Any, q: Any
) -> None:
    result = invoke("show", "jobs", "--json", "--", "--json", "-y")
    assert result.exit_code == 0, result.output
    assert _ids(result) == ["--json", "-y"]


def test_a_commands_own_short_option_stays_an_option(invoke: Any, q: Any) -> None:
    result = invoke("cancel", "jobs", "-y", "-abc")  # -y: no confirmation; -abc: the id
    assert result.exit_code == 0, result.output
    assert q.get("-abc") is None and q.get("-y") is not None
    assert invoke("cancel", "jobs", "-y", "--", "-y").exit_code == 0
    assert q.get("-y") is None


def test_reschedule_run_now_and_signal_take_dash_ids(invoke: Any, q: Any) -> None:
    assert invoke("reschedule", "jobs", "-abc", "--delay", "600").exit_code == 0
    assert q.get("-abc").state == "scheduled"
    assert invoke("run-now", "jobs", "-abc").exit_code == 0
    result = invoke("signal", "jobs", "-5", "go", "-1")  # the payload -1 is JSON too
    assert result.exit_code == 0, result.output


def test_dead_commands_take_dash_ids(invoke: Any, r: redis.Redis) -> None:
    dq = dueq.Queue("graves", r, retry=dueq.RetryPolicy(max_attempts=2))
    bury(dq, 2, prefix="-d")
    assert invoke("dead", "show", "graves", "-d0").exit_code == 0
    assert invoke("dead", "replay", "graves", "-d0", "--yes").exit_code == 0
    assert invoke("dead", "purge", "graves", "--yes", "--", "-d1").exit_code == 0
    assert dq.dead.count() == 0


def test_an_unknown_long_option_says_to_put_such_an_id_after_a_double_dash(
    invoke: Any, q: Any
) -> None:
    result = invoke("show", "jobs", "--abc")
    assert result.exit_code == 2
    line = one_error_line(result)
    assert "No such option '--abc'" in line and "after '--'" in line
    assert "show QUEUE -- --abc" in line
