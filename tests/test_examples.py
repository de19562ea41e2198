"""The examples run to completion and show what they promise."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(name: str, *args: str, timeout: float = 60) -> str:
    """Run an example to completion; its stdout."""
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )
    return result.stdout


def test_quickstart_retries_buries_and_replays(redis_server):
    out = run_example("quickstart.py", "--redis-url", redis_server.url)
    assert "added=0 existing=1" in out
    assert "acked    email:flaky  attempt 3" in out
    assert "dead     email:poison attempt 3" in out
    assert out.count("ValueError: mailbox does not exist") == 3
    assert "acked    email:poison attempt 1" in out  # replayed with attempts reset


def test_service_processes_retries_and_buries_through_the_observable(redis_server):
    out = run_example(
        "service.py", "--redis-url", redis_server.url, timeout=120
    )  # exits 0 once all 60 are acked or dead
    summary = ast.literal_eval(out.split("outcomes: ", 1)[1].splitlines()[0])
    assert summary["acked"] + summary["dead"] == 60
    assert summary["retried"] > 0  # 30% of attempts fail; none failing is a 1e-9 chance
    assert "dead: hook:13 after 1 attempt(s): unsupported scheme" in out
    assert "queue: scheduled=0 leased=0" in out


def test_cron_example_fires_each_slot_once_through_the_clock_change(redis_server):
    out = run_example("cron.py", "--redis-url", redis_server.url)  # exits 1 on a double run
    assert "ran cron:nightly-report:20260329T010000Z (attempt 1)" in out  # 02:30 -> 03:00 CEST
    assert "ran cron:sync:20260328T090000Z (attempt 3)" in out
    assert "288 sync runs in 72 hours" in out
    assert len(set(re.findall(r"worker (\d):", out))) > 1  # the three workers shared the work


def test_spark_reminders_are_due_at_nine_local_time_once(r, redis_server):
    pytest.importorskip("pyspark", reason="pyspark is not installed: pip install 'dueq[spark]'")
    out = run_example(
        "spark_reminders.py", "--redis-url", redis_server.url, "--date", "2030-01-15", timeout=120
    )
    assert "first run: added=5 existing=0 bad=1 {'due': 1}" in out
    assert "second run: added=0 existing=5 bad=1" in out
    assert "bo    2030-01-15 14:00 UTC = 09:00 America/New_York" in out
    assert "eli   2030-01-14 20:00 UTC = 09:00 Pacific/Auckland" in out
    assert "fay   no reminder" in out
