"""The worker registry with real worker processes: ``dueq worker`` and ``Worker`` /
``AsyncWorker`` subprocesses announce themselves, a SIGKILLed one expires, a clean stop leaves
at once; ``dueq workers --json`` and ``dueq top --once`` show what really runs."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from paths_support import FIXTURES
from waiting_support import wait_for

import dueq
from dueq.server import RedisServer

CHILD = FIXTURES / "worker_process.py"
WAIT_S = 30
#: Heartbeat of the workers these tests start: entries expire 3 beats after a kill.
BEAT = "0.2"


@pytest.fixture
def spawn(redis_server: RedisServer) -> Iterator[Any]:
    """Start processes; any still running at the end is killed."""
    children: list[subprocess.Popen[str]] = []

    def start(*argv: str, **kwargs: Any) -> subprocess.Popen[str]:
        child = subprocess.Popen(list(argv), text=True, **kwargs)
        children.append(child)
        return child

    yield start
    for child in children:
        if child.poll() is None:
            child.kill()
        child.communicate()


def worker_process(spawn: Any, redis_server: RedisServer, *args: str) -> subprocess.Popen[str]:
    return spawn(sys.executable, str(CHILD), "--url", redis_server.url, "--heartbeat", BEAT, *args)


def cli_worker(spawn: Any, redis_server: RedisServer, *args: str) -> subprocess.Popen[str]:
    """``python -m dueq worker ARGS`` in tests/fixtures (where cli_handlers.py lives)."""
    import os

    env = {**os.environ, "DUEQ_REDIS_URL": redis_server.url}
    argv = [sys.executable, "-m", "dueq", "worker", *args, "--heartbeat", BEAT]
    return spawn(*argv, cwd=FIXTURES, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def entry_of(q: dueq.Queue, pid: int) -> dueq.WorkerInfo | None:
    return next((w for w in q.workers() if w.pid == pid), None)


@pytest.mark.parametrize("front_end", ["sync", "async"])
def test_a_running_worker_shows_its_pid_queue_and_tasks_in_flight(
    r: redis.Redis, redis_server: RedisServer, spawn: Any, front_end: str
) -> None:
    q = dueq.Queue("w", r)
    q.schedule_many(dueq.Task(n) for n in range(3))
    child = worker_process(spawn, redis_server, "--concurrency", "2", "--front-end", front_end)
    w = wait_for(
        lambda: (e := entry_of(q, child.pid)) is not None and e.in_flight == 3 and e,
        "the worker to hold its 3 tasks",
    )
    assert w.queues == ("w",) and w.processed == 0 and w.failed == 0
    assert w.worker_id.split(":")[1] == str(child.pid)
    assert w.last_seen_at >= w.started_at


@pytest.mark.parametrize("front_end", ["sync", "async"])
def test_a_killed_workers_entry_expires_and_its_lost_leases_name_it(
    r: redis.Redis, redis_server: RedisServer, spawn: Any, front_end: str
) -> None:
    q = dueq.Queue("w", r)
    q.schedule("x", id="t")
    child = worker_process(spawn, redis_server, "--front-end", front_end, "--lease", "0.5")
    w = wait_for(lambda: entry_of(q, child.pid), "the worker's entry")
    wait_for(lambda: r.llen("started") == 1, "the handler to start")
    child.kill()
    child.wait()
    wait_for(lambda: q.workers() == [], "the killed worker's entry to expire")
    wait_for(lambda: (q.claim(), q.get("t").errors)[1], "the lost lease to be reclaimed")
    [record] = q.get("t").errors
    assert record.type == "LeaseExpired" and w.worker_id.endswith(record.worker)


@pytest.mark.parametrize("front_end", ["sync", "async"])
def test_a_clean_stop_removes_the_entry_at_once(
    r: redis.Redis, redis_server: RedisServer, spawn: Any, front_end: str
) -> None:
    q = dueq.Queue("w", r)
    child = worker_process(spawn, redis_server, "--front-end", front_end, "--heartbeat", "600")
    wait_for(lambda: entry_of(q, child.pid), "the worker's entry")
    child.send_signal(signal.SIGTERM)
    assert child.wait(WAIT_S) == 0
    assert q.workers() == []  # no waiting: its entry would have lived 30 minutes


def test_dueq_workers_json_and_top_show_a_real_worker(
    r: redis.Redis, redis_server: RedisServer, spawn: Any, invoke: Any
) -> None:
    q = dueq.Queue("w", r)
    q.schedule_many(dueq.Task({"n": n}) for n in range(20))
    q.schedule({"fail": True}, id="bad")
    child = cli_worker(spawn, redis_server, "w", "cli_handlers:record", "--max-attempts", "1")
    wait_for(
        lambda: (e := entry_of(q, child.pid)) is not None and e.processed == 21,
        "the worker to report 21 attempts",
    )
    result = invoke("workers", "--json")
    assert result.exit_code == 0, result.output
    [w] = json.loads(result.stdout)["workers"]
    assert (w["pid"], w["queues"], w["in_flight"]) == (child.pid, ["w"], 0)
    assert (w["processed"], w["failed"]) == (21, 1)
    assert w["worker_id"].endswith(q.get("bad").errors[0].worker)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", w["last_seen_at"])

    assert json.loads(invoke("workers", "w", "--json").stdout)["workers"] == [w]
    assert json.loads(invoke("workers", "nothing-here", "--json").stdout)["workers"] == []
    table = invoke("workers", "w")
    assert table.exit_code == 0 and str(child.pid) in table.stdout and "21" in table.stdout

    top = invoke("top", "w", "--once")
    assert top.exit_code == 0, top.output
    screen = top.stdout
    states, rates_part = screen.split("per minute")
    counts = dict(re.findall(r"^\s*(scheduled|leased|acked|retried|dead)\s+(\d+)", states, re.M))
    assert counts == {"scheduled": "0", "leased": "0", "acked": "20", "retried": "0", "dead": "1"}
    assert "(running; 0 due now)" in screen
    assert re.search(r"^\s*tasks(\s+0){12}\s*$", screen, re.M)  # nothing falls due
    assert "workers: 1 alive" in screen and str(child.pid) in screen
    rates = dict(
        re.findall(r"^\s*(acked|dead|scheduled)\s+\d+\s+\S*\s+(\d+)\s*$", rates_part, re.M)
    )
    assert rates == {"scheduled": "21", "acked": "20", "dead": "1"}
    assert f"recent failures by worker: {q.get('bad').errors[0].worker} 1" in screen
    assert "ValueError: asked to fail" in screen

    child.send_signal(signal.SIGTERM)
    child.communicate(timeout=WAIT_S)
    assert json.loads(invoke("workers", "--json").stdout)["workers"] == []
    assert "workers: none alive" in invoke("top", "--once").stdout


def test_the_heartbeat_survives_a_redis_outage_and_announces_the_worker_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import logging
    import threading

    server = RedisServer().start()
    try:
        q = dueq.Queue("outage", server.client())
        worker = dueq.Worker(q, lambda d: None, heartbeat=0.05)
        runner = threading.Thread(target=worker.run, daemon=True)
        runner.start()
        wait_for(lambda: q.workers(), "the worker's entry")
        with caplog.at_level(logging.WARNING, logger="dueq.registry"):
            server.kill()
            wait_for(
                lambda: any("heartbeat" in m and "failed" in m for m in caplog.messages),
                "a failed beat to be logged",
            )
            server.restart()
        wait_for(lambda: q.workers(), "the worker to announce itself again")
        worker.stop()
        runner.join(WAIT_S)
        assert not runner.is_alive()
        assert q.workers() == []
    finally:
        server.stop()


def test_dueq_top_exits_130_quietly_on_ctrl_c(
    r: redis.Redis, redis_server: RedisServer, spawn: Any
) -> None:
    import os

    dueq.Queue("w", r).schedule("x")
    env = {**os.environ, "DUEQ_REDIS_URL": redis_server.url}
    argv = [sys.executable, "-m", "dueq", "top", "w", "--interval", "0.1"]
    child = spawn(*argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(lambda: child.stdout.readline().startswith("dueq top at"), "the first frame")
    child.send_signal(signal.SIGINT)
    _out, err = child.communicate(timeout=WAIT_S)
    assert child.returncode == 130 and err == ""


def test_a_queue_with_only_a_worker_exists_for_stats_and_top(
    r: redis.Redis, redis_server: RedisServer, spawn: Any, invoke: Any
) -> None:
    child = worker_process(spawn, redis_server, "--queue", "fresh")
    wait_for(lambda: entry_of(dueq.Queue("fresh", r), child.pid), "the worker's entry")
    stats = invoke("stats", "fresh", "--json")
    assert stats.exit_code == 0, stats.output
    assert json.loads(stats.stdout)["queues"][0]["scheduled"] == 0
    assert "workers: 1 alive" in invoke("top", "fresh", "--once").stdout
