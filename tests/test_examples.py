"""The examples run to completion and show what they promise."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(name: str, redis_url: str) -> str:
    """Run an example against the test's Redis; its stdout (a non-zero exit fails the test)."""
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / name), "--redis-url", redis_url],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return result.stdout


def test_quickstart_retries_buries_and_replays(redis_server):
    out = run_example("quickstart.py", redis_server.url)
    assert "added=0 existing=1" in out
    assert "acked    email:flaky  attempt 3" in out
    assert "dead     email:poison attempt 3" in out
    assert out.count("ValueError: mailbox does not exist") == 3
    assert "acked    email:poison attempt 1" in out  # replayed with attempts reset


def test_service_processes_retries_and_buries_through_the_observable(redis_server):
    out = run_example("service.py", redis_server.url)  # exits 0 once all 60 are acked or dead
    summary = ast.literal_eval(out.split("outcomes: ", 1)[1].splitlines()[0])
    assert summary["acked"] + summary["dead"] == 60
    assert summary["retried"] > 0  # 30% of attempts fail; none failing is a 1e-9 chance
    assert "dead: hook:13 after 1 attempt(s): unsupported scheme" in out
    assert "queue: scheduled=0 leased=0" in out
