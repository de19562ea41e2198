"""What a new user tripped on in the command line (issue 15), one test each."""

from __future__ import annotations

import io
import json

import pytest
from cli_support import UNREACHABLE, bury, one_error_line
from click.testing import CliRunner

import dueq
from dueq.cli import cli


@pytest.fixture
def q(make_queue) -> dueq.Queue:
    return make_queue("jobs", clock=None, retry=dueq.RetryPolicy(max_attempts=2))


# -- ids as arguments or --id, in every dead command -------------------------------------------


@pytest.mark.parametrize("action", ["replay", "purge"])
def test_dead_replay_and_purge_take_ids_as_arguments_like_dead_show(invoke, q, action):
    bury(q, 3)
    result = invoke("dead", action, "jobs", "d0", "d1", "--yes")
    assert result.exit_code == 0, result.output
    assert q.dead.count() == 1 and q.dead.list()[0].id == "d2"


def test_dead_replay_takes_arguments_and_id_options_together(invoke, q):
    bury(q, 3)
    result = invoke("dead", "replay", "jobs", "d0", "--id", "d2", "--yes")
    assert result.exit_code == 0, result.output
    assert [info.id for info in q.dead.list()] == ["d1"]


def test_dead_show_takes_id_options_like_dead_replay(invoke, q):
    bury(q, 1)
    result = invoke("dead", "show", "jobs", "--id", "d0")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("id: d0 ")


def test_dead_show_without_ids_is_a_usage_error(invoke, q):
    bury(q, 1)
    result = invoke("dead", "show", "jobs")
    assert result.exit_code == 2
    assert "give the id" in one_error_line(result)


# -- group options on either side of the command -----------------------------------------------


def test_debug_after_the_command_shows_the_traceback(invoke):
    result = invoke("stats", "--debug", url=UNREACHABLE)
    assert result.exit_code == 1
    assert "Traceback (most recent call last)" in result.stderr


def test_debug_after_a_subcommand_of_a_group_shows_the_traceback(invoke):
    result = invoke("dead", "list", "q", "--debug", url=UNREACHABLE)
    assert "Traceback (most recent call last)" in result.stderr


def test_redis_url_before_the_command_is_used(redis_server, r):
    dueq.Queue("before", r).schedule({"x": 1})
    result = CliRunner().invoke(
        cli, ["--redis-url", redis_server.url, "stats", "before", "--json"], env={}
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["queues"][0]["queue"] == "before"


def test_redis_url_before_the_command_wins_over_the_environment(redis_server, r):
    dueq.Queue("env", r).schedule({"x": 1})
    result = CliRunner().invoke(
        cli,
        ["--redis-url", redis_server.url, "stats", "env"],
        env={"DUEQ_REDIS_URL": UNREACHABLE},
    )
    assert result.exit_code == 0, result.output


def test_two_different_redis_urls_are_a_usage_error(redis_server):
    result = CliRunner().invoke(
        cli, ["--redis-url", redis_server.url, "stats", "--redis-url", UNREACHABLE]
    )
    assert result.exit_code == 2
    assert "--redis-url given twice" in one_error_line(result)


def test_embedded_before_the_command_is_used(invoke):
    result = invoke("--embedded", "dashboard", "--host", "0.0.0.0", url=UNREACHABLE)
    assert result.exit_code == 2  # refused after the option was taken, not as unknown
    assert "token" in one_error_line(result)


def test_a_password_given_before_the_command_is_never_shown():
    result = CliRunner().invoke(cli, ["--redis-url", "redis://u:s3cret@127.0.0.1:1/0", "stats"])
    assert result.exit_code == 1
    assert "s3cret" not in result.output
    assert "redis://u:***@127.0.0.1:1/0" in one_error_line(result)


# -- stats --count without --watch -------------------------------------------------------------


@pytest.mark.parametrize("flag", [["--count", "3"], ["--interval", "2"]])
def test_stats_watch_options_without_watch_are_refused(invoke, make_queue, flag):
    make_queue("w").schedule({})
    result = invoke("stats", "w", *flag)
    assert result.exit_code == 2
    assert f"{flag[0]} applies only with --watch" in one_error_line(result)


# -- schedule --embedded -----------------------------------------------------------------------


@pytest.mark.parametrize("where", ["after", "before"])
def test_schedule_into_an_embedded_throwaway_redis_is_refused(where):
    args = ["schedule", "q", '{"a": 1}', "--embedded"]
    if where == "before":
        args = ["--embedded", "schedule", "q", '{"a": 1}']
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2
    line = one_error_line(result)
    assert "--embedded" in line and ("--redis-url" in line or "No such option" in line)
    assert result.stdout == ""


# -- Ctrl-C at a confirmation prompt -----------------------------------------------------------


class CtrlC(io.RawIOBase):
    """Standard input where the user presses Ctrl-C."""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if not len(buffer):  # click's check that this is a binary stream
            return 0
        raise KeyboardInterrupt


def test_ctrl_c_at_a_confirmation_prompt_exits_130_and_changes_nothing(invoke, q, redis_server):
    bury(q, 2)
    result = CliRunner().invoke(
        cli,
        ["dead", "purge", "jobs", "--all"],
        input=CtrlC(),
        env={"DUEQ_REDIS_URL": redis_server.url},
    )
    assert result.exit_code == 130, result.output
    assert result.stderr.splitlines()[-1] == "error: interrupted"
    assert q.dead.count() == 2


# -- one rule for names ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["two words", "tab\there", "x\u00a0y"])
def test_a_cron_name_with_spaces_is_refused_with_the_rule(r, name):
    with pytest.raises(dueq.CronError, match="must be printable, without spaces"):
        dueq.Queue("q", r).cron.add(name, "@daily")


@pytest.mark.parametrize("name", ["two words", "x\u00a0y"])
def test_a_queue_name_with_spaces_is_refused_like_a_cron_name(r, name):
    with pytest.raises(dueq.ConfigurationError, match="must be printable, without spaces"):
        dueq.Queue(name, r)


# -- a past --at -------------------------------------------------------------------------------


def test_a_past_at_warns_and_schedules_the_task_due_now(invoke, r):
    result = invoke("schedule", "q", "{}", "--at", "2001-02-03T04:05:06Z", "--id", "late")
    assert result.exit_code == 0, result.output
    assert result.stdout == "late\n"
    assert result.stderr == (
        "warning: --at 2001-02-03T04:05:06+00:00 is in the past; the task is due now\n"
    )
    assert dueq.Queue("q", r).stats().due_now == 1


def test_a_future_at_does_not_warn(invoke):
    result = invoke("schedule", "q", "{}", "--at", "2999-01-01T00:00:00Z")
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
