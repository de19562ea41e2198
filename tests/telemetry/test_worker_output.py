"""What a worker prints when the application configured no logging, and that it never prints a
line twice when it did (``dueq.logs.fallback``; docs/worker-output.md).

Each case runs a plain script in a subprocess (logging is per process): a worker whose handler
always fails, stopped once its one task is dead; the test reads the script's stderr.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cli_worker_support import WAIT_S, start_worker, wait_for
from paths_support import DOCS, SRC

import dueq

#: The script: argv[1] the Redis URL, argv[2] "sync" or "async"; CONFIGURE is replaced by each
#: case's logging set-up (nothing, for the plain script).
SCRIPT = """
import asyncio, logging, logging.config, sys, threading, time
import redis, redis.asyncio, tenacity
import dueq

CONFIGURE

url, mode = sys.argv[1], sys.argv[2]
policy = dueq.RetryPolicy(max_attempts=2, wait=tenacity.wait_fixed(0))


def fail(d):
    raise ValueError("boom")


def when_dead(stop):
    q = dueq.Queue("talk", redis.Redis.from_url(url))
    while q.dead.count() < 1:
        time.sleep(0.02)
    stop()


if mode == "sync":
    q = dueq.Queue("talk", redis.Redis.from_url(url), retry=policy)
    q.schedule({"x": 1}, id="bad-task")
    w = dueq.Worker(q, fail, concurrency=1)
    threading.Thread(target=when_dead, args=(w.stop,), daemon=True).start()
    w.run()
else:
    async def main():
        q = dueq.AsyncQueue("talk", redis.asyncio.Redis.from_url(url), retry=policy)
        await q.schedule({"x": 1}, id="bad-task")
        w = dueq.AsyncWorker(q, fail, concurrency=1)
        threading.Thread(target=when_dead, args=(w.stop,), daemon=True).start()
        await w.run()

    asyncio.run(main())
"""

CONFIGURATIONS = {
    "none": "",
    "basicConfig": "logging.basicConfig(level=logging.INFO)",
    "basicConfig-warning": "logging.basicConfig()",
    "dueq-handler": (
        "h = logging.StreamHandler(); h.setFormatter(logging.Formatter('own: %(message)s'))\n"
        "logging.getLogger('dueq').addHandler(h)\n"
        "logging.getLogger('dueq').setLevel(logging.INFO)"
    ),
    "silenced": "logging.getLogger('dueq').addHandler(logging.NullHandler())",
    "uvicorn": ("import uvicorn.config\nlogging.config.dictConfig(uvicorn.config.LOGGING_CONFIG)"),
}

STARTED = "worker started on talk with concurrency 1"
RETRIED = "queue 'talk': task 'bad-task' attempt 1 failed (retried): ValueError: boom"
DEAD = "queue 'talk': task 'bad-task' attempt 2 failed (dead): ValueError: boom"
STOPPED = "worker stopped: {'retried': 1, 'dead': 1}"


def run_script(tmp_path: Path, redis_url: str, mode: str, configure: str) -> str:
    """Run the script with ``configure``; its stderr."""
    script = tmp_path / "plain_worker.py"
    script.write_text(textwrap.dedent(SCRIPT).replace("CONFIGURE", configure))
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    result = subprocess.run(
        [sys.executable, str(script), redis_url, mode],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stderr


def lines_with(err: str, text: str) -> list[str]:
    return [line for line in err.splitlines() if text in line]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_plain_script_worker_prints_its_start_each_failed_attempt_and_its_stop(
    tmp_path, r, redis_server, mode
):
    err = run_script(tmp_path, redis_server.url, mode, CONFIGURATIONS["none"])
    for line in (STARTED, RETRIED, DEAD, STOPPED):
        assert len(lines_with(err, line)) == 1, err


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("configured", ["basicConfig", "dueq-handler", "uvicorn"])
def test_a_worker_in_a_configured_application_prints_each_line_exactly_once(
    tmp_path, r, redis_server, mode, configured
):
    err = run_script(tmp_path, redis_server.url, mode, CONFIGURATIONS[configured])
    for line in (STARTED, RETRIED, DEAD, STOPPED):
        assert len(lines_with(err, line)) == 1, err
    if configured == "dueq-handler":  # the application's own handler, not the fallback's
        assert all(line.startswith("own: ") for line in lines_with(err, "task 'bad-task'"))


def test_a_root_handler_at_warning_keeps_its_level_and_the_fallback_stays_out(
    tmp_path, r, redis_server
):
    err = run_script(tmp_path, redis_server.url, "sync", CONFIGURATIONS["basicConfig-warning"])
    assert lines_with(err, STARTED) == [] and lines_with(err, RETRIED) == []
    assert len(lines_with(err, DEAD)) == 1, err  # an error: WARNING lets it through, once


def test_a_null_handler_on_the_dueq_logger_silences_the_worker(tmp_path, r, redis_server):
    err = run_script(tmp_path, redis_server.url, "sync", CONFIGURATIONS["silenced"])
    assert "bad-task" not in err and "worker" not in err, err


def test_dueq_worker_prints_each_failed_attempt_once(r, redis_server):
    q = dueq.Queue("talk-cli", r)
    q.schedule({"fail": True}, id="bad-task")
    child = start_worker(redis_server, "talk-cli", "cli_handlers:record", "--max-attempts", "2")
    try:
        wait_for(lambda: q.dead.count() == 1, "the task to die")
        child.terminate()
        _, err = child.communicate(timeout=WAIT_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, err
    for line in (
        "worker started on talk-cli with concurrency 8",
        "task 'bad-task' attempt 1 failed (retried): ValueError: asked to fail",
        "task 'bad-task' attempt 2 failed (dead): ValueError: asked to fail",
        "worker stopped: {",
    ):
        assert len(lines_with(err, line)) == 1, err


def test_the_fallback_is_one_handler_shared_by_nested_blocks_and_gone_after_them():
    script = textwrap.dedent(
        """
        import logging
        from dueq.logs import stderr_fallback
        dueq = logging.getLogger("dueq")
        with stderr_fallback():
            with stderr_fallback():  # a second worker at the same time
                print(len(dueq.handlers), logging.getLevelName(dueq.level))
                logging.getLogger("dueq.worker").info("once \\x1b[2J")
            print(len(dueq.handlers))
        print(len(dueq.handlers), logging.getLevelName(dueq.level))
        with stderr_fallback():  # a worker run again later: one handler again
            print(len(dueq.handlers))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(SRC)},
        check=True,
    )
    assert result.stdout.split("\n") == ["1 INFO", "1", "0 NOTSET", "1", ""]
    assert result.stderr.endswith(" INFO dueq.worker: once \\x1b[2J\n"), result.stderr
    assert result.stderr.count("once") == 1


DOC = DOCS / "worker-output.md"


def run_doc_blocks(redis_url: str, *blocks: str) -> str:
    """Run ``blocks`` of docs/worker-output.md as one script; its stderr."""
    result = subprocess.run(
        [sys.executable, "-c", "\n".join(blocks)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(SRC), "DUEQ_REDIS_URL": redis_url},
        check=True,
    )
    return result.stderr


def test_the_worker_output_pages_blocks_do_what_it_says(r, redis_server):
    import re

    script, basic, dict_config, silence, warning = re.findall(
        r"```python\n(.*?)```", DOC.read_text(), flags=re.S
    )
    retried = "task 'welcome:ada' attempt 1 failed (retried): ConnectionError: mail server down"
    dead = "task 'welcome:ada' attempt 2 failed (dead): ConnectionError: mail server down"
    expectations = {
        (): {"worker started on emails": 1, retried: 1, dead: 1, "worker stopped: {": 1},
        (basic,): {"worker started on emails": 1, retried: 1, dead: 1, "worker stopped: {": 1},
        (dict_config,): {"INFO dueq.worker: worker started": 1, retried: 1, dead: 1},
        (silence,): {"emails": 0, "welcome:ada": 0},
        (warning,): {"worker started": 0, retried: 0, dead: 1},
    }
    for configure, counts in expectations.items():
        r.flushdb()
        err = run_doc_blocks(redis_server.url, *configure, script)
        assert {text: len(lines_with(err, text)) for text in counts} == counts, err
