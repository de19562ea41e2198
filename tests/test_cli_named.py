"""``dueq worker module:queue`` runs a queue object's named tasks; ``dueq schedule --task``
schedules one by name."""

from __future__ import annotations

import signal
import sys

import pytest
from click.testing import CliRunner
from test_cli_worker import HERE, WAIT_S, start_worker, wait_for

import dueq
from dueq.cli import cli


def test_a_worker_for_a_queue_object_runs_its_named_tasks_by_name(r, redis_server, invoke):
    q = dueq.Queue("named", r)
    scheduled = invoke("schedule", "named", "--task", "greet", '{"who": "ada"}')
    assert scheduled.exit_code == 0, scheduled.output
    tid = scheduled.output.strip()
    assert q.get(tid).task_name == "greet" and q.get(tid).payload == {"who": "ada"}
    unknown = q.schedule({}, task="nobody_knows_me")
    child = start_worker(redis_server, "cli_handlers:named_queue")
    try:
        wait_for(lambda: r.lrange("greeted", 0, -1) == [b"ada"], "the named task to run")
        wait_for(lambda: q.dead.count() == 1, "the unknown name to end dead (max_attempts=1)")
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=WAIT_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, err
    assert out == ""  # the summary is the library's log line on stderr
    [stopped] = [line for line in err.splitlines() if "worker stopped" in line]
    assert "'acked': 1" in stopped and "'dead': 1" in stopped, stopped
    assert "worker on 'named' at " in err and "named tasks" in err
    [error] = q.get(unknown).errors
    assert error.type == "UnknownTask" and "'nobody_knows_me'" in error.message


@pytest.fixture
def invoke_here(monkeypatch, redis_server):
    monkeypatch.chdir(HERE)
    monkeypatch.setattr(sys, "path", list(sys.path))

    def run(*args: str, before: tuple[str, ...] = ()):
        # the URL from the environment, as a deployment sets it: only --redis-url is refused
        env = {"DUEQ_REDIS_URL": redis_server.url}
        return CliRunner().invoke(cli, [*before, "worker", *args], env=env)

    return run


def test_queue_settings_options_are_refused_with_a_queue_object(invoke_here):
    result = invoke_here("cli_handlers:named_queue", "--max-attempts", "3", "--lease", "9")
    assert result.exit_code == 2
    assert "--max-attempts, --lease set up a queue by name" in result.stderr


@pytest.mark.parametrize("where", ["command", "group"])
def test_a_redis_url_is_refused_with_a_queue_object_that_has_its_own_client(
    invoke_here, redis_server, where
):
    # The queue object brings its own client: a URL given on the command line would be ignored
    # silently (the worker serving another Redis than the one named), so it is refused.
    url = ("--redis-url", redis_server.url)
    if where == "command":
        result = invoke_here("cli_handlers:named_queue", *url)
    else:
        result = invoke_here("cli_handlers:named_queue", before=url)
    assert result.exit_code == 2, result.output
    assert "--redis-url set up a queue by name" in result.stderr
    assert "cli_handlers:named_queue is a queue object with its own" in result.stderr
    assert "Redis client" in result.stderr


def test_an_object_that_is_no_queue_is_one_line_and_exit_1(invoke_here):
    result = invoke_here("cli_handlers:record")
    assert result.exit_code == 1
    assert "'cli_handlers:record' is a function, not a dueq.Queue" in result.stderr


def test_a_queue_name_alone_is_a_usage_error(invoke_here):
    result = invoke_here("emails")
    assert result.exit_code == 2
    assert "give QUEUE MODULE:FUNCTION, or a queue object as MODULE:QUEUE" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--task", "bad name", "{}"], "task name 'bad name' may hold only"),
        (["--task", "greet", "[1]"], "must be a JSON object of its arguments"),
    ],
)
def test_schedule_refuses_a_bad_task_name_or_a_payload_that_is_no_object(invoke, r, args, message):
    result = invoke("schedule", "named", *args)
    assert result.exit_code == 2 and message in result.stderr
    assert r.dbsize() == 0


def test_a_task_file_line_may_name_its_task(invoke, r, tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"payload": {"who": "a"}}\n{"payload": {"x": 1}, "task": "other"}\n')
    result = invoke("schedule", "named", "--file", str(path), "--task", "greet")
    assert result.exit_code == 0, result.output
    names = sorted(t.task_name for t in dueq.Queue("named", r).iter_tasks("scheduled"))
    assert names == ["greet", "other"]
