"""``dueq demo`` runs to completion: every task it scheduled ends acked or dead."""

from __future__ import annotations

import re
import subprocess
import sys
import threading

import pytest
from click.testing import CliRunner
from waiting_support import WAIT_S, wait_for

import dueq
from dueq.cli import cli
from dueq.cli import demo as demo_module
from dueq.cli.connection import queue_names
from dueq.cli.demo_board import Board
from dueq.cli.demo_sources import demo_sources


def summary_numbers(out: str) -> dict[str, int]:
    """The counts of the demo's summary lines ("  acked    357")."""
    summary = out.split("dueq demo finished in ", 1)[1]
    return {k: int(v) for k, v in re.findall(r"^  (\w+) +(\d+)", summary, flags=re.MULTILINE)}


# The demo's own bound: Spark's start (--start-timeout, 120 s) and twice --timeout (55 s): a
# drain of at most --timeout after its last source finished. On a loaded 2-core machine
# Spark's JVM start alone took over 55 s.
DEMO_BOUND_S = 120 + 2 * 55 + 30


@pytest.mark.timeout(DEMO_BOUND_S + 30)
def test_the_default_demo_ends_on_its_own_with_every_task_acked_or_dead():
    pytest.importorskip("pyspark", reason="the default demo includes Spark when it is installed")
    done = subprocess.run(
        [sys.executable, "-m", "dueq", "demo"],
        capture_output=True,
        text=True,
        timeout=DEMO_BOUND_S,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    n = summary_numbers(done.stdout)
    # The orders, 4 occurrences of the recurring report and the Spark DataFrame's rows; the
    # report's pending occurrence is withdrawn when the demo removes its definition.
    assert "orders 300, cron 4, spark 60" in done.stdout
    assert n["scheduled"] == 300 + 4 + 60 + n["withdrawn"]
    assert n["acked"] + n["dead"] + n["withdrawn"] == n["scheduled"]
    assert n["withdrawn"] <= 1
    assert n["unsettled"] == 0
    # Each occurrence of the report times out once and is retried like any task.
    assert re.search(r"retried +cron:status-report:\d{8}T\d{6}Z attempt 1, next in", done.stdout)
    assert n["dead"] == 3  # the poison orders, after 5 attempts each
    assert done.stdout.count("after 5 attempts, last error KeyError: 'receipt-v0'") == 3
    assert n["retried"] >= 4 * 3  # at least the poison tasks' retries
    delays = re.search(r"#1 ([\d.]+) s, #2 ([\d.]+) s, #3 ([\d.]+) s, #4 ([\d.]+) s", done.stdout)
    assert delays is not None
    first, second, third, fourth = (float(x) for x in delays.groups())
    assert first < second < third < fourth  # the retry delays grow
    assert done.stderr == ""


def test_a_small_demo_on_a_given_redis_leaves_its_queue_to_look_at(r, redis_server):
    result = CliRunner().invoke(
        cli,
        ["demo", "--redis-url", redis_server.url, "--no-spark", "--tasks", "40", "--spread", "0.5"],
    )
    assert result.exit_code == 0, result.output
    n = summary_numbers(result.stdout)
    assert n["scheduled"] == 40 + 4 + n["withdrawn"]  # orders, the recurring report's runs
    assert (n["acked"] + n["dead"] + n["withdrawn"], n["unsettled"]) == (n["scheduled"], 0)
    assert "counts   scheduled=" in result.stdout  # plain lines, not a live view
    (name,) = queue_names(r)
    assert f"Look around: dueq stats {name} --redis-url {redis_server.url}" in result.stdout
    (poison,) = dueq.Queue(name, r).dead.list()
    assert poison.payload["template"] == "receipt-v0"
    assert [e.attempt for e in poison.errors] == [1, 2, 3, 4, 5]


def test_the_demo_drain_timeout_counts_from_when_its_last_source_finished(r, redis_server):
    # The recurring report alone takes 9 s or more (4 occurrences, every 3 s): a --timeout
    # shorter than that is the drain's bound, once the report's definition is removed.
    result = CliRunner().invoke(
        cli,
        [
            *("demo", "--redis-url", redis_server.url, "--no-spark", "--tasks", "20"),
            *("--spread", "0.5", "--timeout", "5"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "dueq demo finished in " in result.stdout
    n = summary_numbers(result.stdout)
    assert n["scheduled"] == 20 + 4 + n["withdrawn"]
    assert n["unsettled"] == 0


class NeverStarts:
    """A demo source whose start (a JVM, say) does not finish: it waits until the demo left it
    out, then asks whether it may still add tasks."""

    name = "stuck"

    def __init__(self) -> None:
        self.may_add: list[bool] = []

    def run(self, queue: dueq.Queue, board: Board) -> None:
        board.starting(self.name, "starting something slow")
        wait_for(lambda: board.snapshot()[0][self.name].failed, "the demo to leave it out")
        self.may_add.append(board.start_done(self.name))
        if self.may_add[-1]:
            queue.schedule(dueq.Task({"template": "receipt", "n": 0}, id="too-late"))


def test_a_source_that_does_not_start_in_time_is_left_out_and_the_demo_ends_with_the_rest(
    r, redis_server, monkeypatch
):
    stuck = NeverStarts()
    monkeypatch.setattr(demo_module, "demo_sources", lambda *args: [*demo_sources(*args), stuck])
    result = CliRunner().invoke(
        cli,
        [
            *("demo", "--redis-url", redis_server.url, "--no-spark", "--tasks", "20"),
            *("--spread", "0.5", "--start-timeout", "1"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "  note: stuck failed: did not start within 1 s, left out\n" in result.stdout
    assert stuck.may_add == [False]
    n = summary_numbers(result.stdout)
    assert n["scheduled"] == 20 + 4 + n["withdrawn"]
    assert n["unsettled"] == 0


class NeverEnds:
    """A demo source that never reports that it finished (until the test lets it go)."""

    name = "endless"

    def __init__(self) -> None:
        self.let_go = threading.Event()

    def run(self, queue: dueq.Queue, board: Board) -> None:
        board.source(self.name, "adding forever")
        self.let_go.wait(WAIT_S)


def test_a_source_that_never_finishes_stops_the_demo_at_its_overall_bound(
    r, redis_server, monkeypatch
):
    endless = NeverEnds()
    monkeypatch.setattr(demo_module, "demo_sources", lambda *args: [endless])
    try:
        result = CliRunner().invoke(
            cli,
            [
                *("demo", "--redis-url", redis_server.url, "--no-spark"),
                *("--start-timeout", "1", "--timeout", "1"),
            ],
        )
    finally:
        endless.let_go.set()
    assert result.exit_code == 1, result.output
    elapsed_s = float(
        re.findall(r"stopped before the queue drained in ([\d.]+) s", result.stdout)[0]
    )
    assert 3 <= elapsed_s < WAIT_S  # --start-timeout plus twice --timeout


def test_demo_redis_url_and_embedded_exclude_each_other():
    result = CliRunner().invoke(cli, ["demo", "--embedded", "--redis-url", "redis://x"])
    assert result.exit_code == 2
    assert "exclude each other" in result.stderr


def test_demo_dashboard_serves_the_demo_queue_while_it_runs(r, redis_server):
    import socket
    import threading

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    seen: list[dict] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set() and not seen:
            try:
                answer = httpx.get(f"http://127.0.0.1:{port}/api/overview", timeout=1)
                if answer.status_code == 200 and answer.json()["queues"]:
                    seen.append(answer.json())
            except httpx.HTTPError:  # not serving yet
                pass
            done.wait(0.1)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = CliRunner().invoke(
            cli,
            [
                "demo",
                "--redis-url",
                redis_server.url,
                "--no-spark",
                "--tasks",
                "40",
                "--spread",
                "2",
                "--dashboard",
                str(port),
            ],
        )
    finally:
        done.set()
        watcher.join()
    assert result.exit_code == 0, result.output
    (name,) = queue_names(r)
    assert f"Dashboard: http://127.0.0.1:{port}/" in result.stdout
    assert seen and list(seen[0]["queues"]) == [name]
    with pytest.raises(httpx.HTTPError):  # stopped with the demo
        httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
