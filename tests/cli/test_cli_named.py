"""``dueq worker module:queue`` runs a queue object's named tasks; ``dueq schedule --task``
schedules one by name."""

from __future__ import annotations

import signal
import sys
import threading

import pytest
from cli_worker_support import WAIT_S, start_worker, wait_for
from click.testing import CliRunner
from paths_support import FIXTURES

import dueq
from dueq.cli import cli


def test_a_worker_for_a_queue_object_runs_its_named_tasks_by_name(r, redis_server, invoke):
    q = dueq.Queue("named", r)
    scheduled = invoke("schedule", "named", "--task", "greet", '{"who": "ada"}')
    assert scheduled.exit_code == 0, scheduled.output
    assert "no live worker on 'named' runs task 'greet'" in scheduled.stderr  # (none runs yet)
    tid = scheduled.stdout.strip()
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
    monkeypatch.chdir(FIXTURES)
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


@pytest.fixture
def add_worker(r):
    """A live worker on queue "named" running task "add"(x, y=0), seen in the registry."""
    q = dueq.Queue("named", r)

    @q.task(name="add")
    def add(x: int, y: int = 0) -> int:
        return x + y

    worker = dueq.Worker(q, heartbeat=0.05)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_for(lambda: any("add" in w.tasks.get("named", {}) for w in q.workers()), "a beat")
        yield q
    finally:
        worker.stop()
        thread.join(WAIT_S)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ('{"y": 1}', "missing a required argument: 'x'"),
        ('{"x": 1, "yy": 2}', "unexpected keyword argument 'yy' (did you mean 'y'?)"),
        ('{"xx": 1}', "unexpected keyword argument 'xx' (did you mean 'x'?)"),
    ],
)
def test_schedule_by_name_refuses_arguments_a_live_workers_function_does_not_take(
    invoke, r, add_worker, payload, message
):
    result = invoke("schedule", "named", "--task", "add", payload)
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "nothing was scheduled" in result.stderr
    assert add_worker.stats().scheduled == 0 and add_worker.stats().leased == 0
    assert r.exists(add_worker.keys.tasks) == 0


def test_schedule_by_name_with_arguments_that_bind_is_scheduled(invoke, add_worker):
    result = invoke("schedule", "named", "--task", "add", '{"x": 1, "y": 2}')
    assert result.exit_code == 0, result.output
    assert result.stderr == ""


def test_a_task_file_line_whose_arguments_do_not_bind_rejects_the_file(
    invoke, r, add_worker, tmp_path
):
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"payload": {"x": 1}}\n{"payload": {"z": 1}, "task": "add"}\n')
    result = invoke("schedule", "named", "--file", str(path), "--task", "add")
    assert result.exit_code == 1, result.output
    assert "line 2: task 'add'" in result.stderr and "'z'" in result.stderr
    assert r.exists(add_worker.keys.tasks) == 0


def test_schedule_by_a_name_no_live_worker_runs_warns_that_the_arguments_are_unchecked(invoke, r):
    result = invoke("schedule", "named", "--task", "add", '{"anything": 1}')
    assert result.exit_code == 0, result.output
    assert "no live worker on 'named' runs task 'add'" in result.stderr
    assert dueq.Queue("named", r).stats().scheduled == 1
