"""``dueq worker``: a handler found by name, run in a subprocess and stopped with a signal."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
from cli_worker_support import WAIT_S, start_worker, wait_for
from click.testing import CliRunner
from paths_support import FIXTURES

import dueq
from dueq.cli import cli
from dueq.server import RedisServer


@contextlib.contextmanager
def running_worker(redis_server: RedisServer | str, *args: str) -> Iterator[subprocess.Popen[str]]:
    """``start_worker``, killed on the way out if the test did not stop it (``stop``)."""
    child = start_worker(redis_server, *args)
    try:
        yield child
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def stop(child: subprocess.Popen[str], sig: int = signal.SIGTERM) -> tuple[str, str]:
    """Send ``sig`` and wait for the worker to exit: its stdout and stderr."""
    child.send_signal(sig)
    return child.communicate(timeout=WAIT_S)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_worker_runs_the_handler_and_exits_0_on_a_signal(r, redis_server, sig):
    q = dueq.Queue("w", r)
    ids = q.schedule_many(dueq.Task({"n": n}) for n in range(20)).ids
    q.schedule({"fail": True}, id="bad")
    with running_worker(
        redis_server, "w", "cli_handlers:record", "--concurrency", "3", "--max-attempts", "1"
    ) as child:
        wait_for(
            lambda: q.stats().counters.get("acked", 0) == 20 and q.dead.count() == 1,
            "20 acks and one dead task",
        )
        out, err = stop(child, sig)
    assert child.returncode == 0, err
    assert out == ""  # the summary is said once: the library's log line on stderr
    [stopped] = [line for line in err.splitlines() if "worker stopped" in line]
    assert "'acked': 20" in stopped and "'dead': 1" in stopped, stopped
    assert "worker on 'w' at redis://127.0.0.1:" in err
    handled = {x.decode() for x in r.lrange("handled", 0, -1)}
    assert handled == {f"{i}:1" for i in ids} | {"bad:1"}
    assert q.get("bad").errors[0].message == "asked to fail"


def test_the_worker_keeps_what_it_set_up_out_of_the_collectors_walks(r, redis_server):
    """``dueq worker`` freezes the objects of its start-up (gc.freeze), so a full collection
    while tasks run walks only what the handlers made since."""
    q = dueq.Queue("w", r)
    q.schedule({})
    with running_worker(redis_server, "w", "cli_handlers:freeze_count") as child:
        wait_for(lambda: r.llen("frozen") == 1, "the handler")
        _, err = stop(child)
    assert child.returncode == 0, err
    # redis-py, reactivex, click and dueq alone are more than 20,000 objects
    assert int(r.lindex("frozen", 0)) > 20_000


@pytest.fixture
def invoke_here(monkeypatch, r, redis_server):
    """Run ``dueq worker`` in-process from the tests folder (imports come from there)."""
    monkeypatch.chdir(FIXTURES)
    monkeypatch.setattr(sys, "path", list(sys.path))

    def run(*args: str):
        return CliRunner().invoke(cli, ["worker", *args, "--redis-url", redis_server.url])

    return run


@pytest.mark.parametrize(
    ("handler", "message"),
    [
        ("no_such_module:handle", "cannot import 'no_such_module:handle': ModuleNotFoundError"),
        ("cli_handlers:missing", "cannot import 'cli_handlers:missing': no attribute 'missing'"),
        ("cli_handlers:NOT_CALLABLE", "'cli_handlers:NOT_CALLABLE' is a int, not a function"),
        ("cli_broken_handler:run", "RuntimeError: this module fails at import"),
    ],
)
def test_a_handler_that_cannot_be_imported_is_one_line_and_exit_1(invoke_here, r, handler, message):
    dueq.Queue("w", r).schedule({}, id="untouched")
    result = invoke_here("w", handler)
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1 and message in result.stderr
    assert "Traceback" not in result.stderr
    assert dueq.Queue("w", r).get("untouched").state == "scheduled"


@pytest.mark.parametrize("handler", ["cli_handlers", "cli_handlers:", ":record"])
def test_a_handler_without_module_and_function_is_a_usage_error(invoke_here, handler):
    result = invoke_here("w", handler)
    assert result.exit_code == 2
    assert "is not module:function" in result.stderr


def test_debug_shows_the_import_error_traceback(monkeypatch, redis_server):
    monkeypatch.chdir(FIXTURES)
    monkeypatch.setattr(sys, "path", list(sys.path))
    result = CliRunner().invoke(cli, ["--debug", "worker", "w", "cli_broken_handler:run"])
    assert result.exit_code == 1
    assert "Traceback" in result.stderr and 'raise RuntimeError("this module' in result.stderr


def test_the_handler_is_checked_before_connecting(invoke_here):
    result = CliRunner().invoke(
        cli, ["worker", "w", "cli_handlers:missing", "--redis-url", "redis://127.0.0.1:1/0"]
    )
    assert result.exit_code == 1
    assert "no attribute 'missing'" in result.stderr


def test_worker_logs_show_escape_sequences_from_handler_errors_escaped(r, redis_server):
    q = dueq.Queue("w", r)
    q.schedule({}, id="evil\x1b[31m")
    with running_worker(redis_server, "w", "cli_handlers:hostile", "--max-attempts", "1") as child:
        wait_for(lambda: q.dead.count() == 1, "the task to go dead")
        _out, err = stop(child)
    assert child.returncode == 0, err
    assert "\x1b" not in err and "\x9b" not in err and "\x07" not in err
    assert "title \\x1b]0;pwned\\x07 clear \\x1b[2J" in err


@pytest.mark.parametrize(
    ("value", "code", "message"),
    [
        ("soon", 2, "'soon' is not a whole number or 'auto'"),
        ("0", 1, "max_in_flight must be an int from 1 to 100000, got 0"),
    ],
)
def test_a_bad_max_in_flight_is_refused_before_anything_is_claimed(
    invoke_here, r, value, code, message
):
    dueq.Queue("w", r).schedule({}, id="untouched")
    result = invoke_here("w", "cli_handlers:record", "--max-in-flight", value)
    assert result.exit_code == code and message in result.stderr
    assert dueq.Queue("w", r).get("untouched").state == "scheduled"


def test_a_worker_started_with_shards_before_any_producer_serves_every_shard(r, redis_server):
    with running_worker(redis_server, "fresh", "cli_handlers:record", "--shards", "3") as child:
        # the worker has claimed (and found nothing) before the queue exists in Redis
        wait_for(lambda: r.exists("dueq:{fresh#}:shards"), "the worker to record the layout")
        q = dueq.Queue("fresh", r, shards=3)
        ids = q.schedule_many(dueq.Task({"n": n}) for n in range(30)).ids
        wait_for(lambda: r.llen("handled") == 30, "30 handled")
        out, err = stop(child)
    assert child.returncode == 0, err
    assert out == ""
    [stopped] = [line for line in err.splitlines() if "worker stopped" in line]
    assert stopped.endswith("worker stopped: {'acked': 30}"), stopped
    assert {x.decode() for x in r.lrange("handled", 0, -1)} == {f"{i}:1" for i in ids}


def test_a_shard_count_that_disagrees_with_the_recorded_one_is_refused(
    invoke_here, r, redis_server
):
    dueq.Queue("three", r, shards=3).schedule("x", id="x")
    result = invoke_here("three", "cli_handlers:record", "--shards", "2")
    assert result.exit_code == 1, result.output
    assert "queue 'three' has 3 shards in Redis" in result.output
    assert "shards=3" in result.output
    scheduled = CliRunner().invoke(
        cli, ["schedule", "three", '{"a": 1}', "--shards", "1", "--redis-url", redis_server.url]
    )
    assert scheduled.exit_code == 1 and "has 3 shards in Redis" in scheduled.output
    assert dueq.Queue("three", r, shards=3).stats().scheduled == 1  # nothing added
