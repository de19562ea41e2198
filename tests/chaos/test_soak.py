"""The chaos soak (scripts/chaos/soak.py) in its quick forms, as tests.

Single server: 6,000 tasks through 4 worker processes while workers are SIGKILLed, Redis is
SIGKILLed and restarted from its AOF and SIGSTOPped for 5 s. Failover: a primary with two
replicas and three Sentinels, the primary SIGKILLed, with ``wait_replicas=1``. Each must end with
nothing lost, nothing early, no task run more than max_attempts times and every duplicate run
explained by a fault.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from paths_support import SCRIPTS

SOAK = SCRIPTS / "chaos" / "soak.py"


def table(output: str) -> dict[str, int]:
    """The soak's rows by label (Markdown: ``| label | count |``)."""
    rows = re.findall(r"^\| *([^|]+?) *\| *(\d+) *\|$", output, flags=re.MULTILINE)
    return {label: int(count) for label, count in rows}


def run_soak(*args: str) -> tuple[int, str]:
    run = subprocess.run(
        [sys.executable, str(SOAK), "--quick", *args],
        capture_output=True,
        text=True,
        timeout=560,
    )
    return run.returncode, run.stdout + "\n--- stderr ---\n" + run.stderr[-4000:]


def check_held(code: int, output: str, tasks: int) -> dict[str, int]:
    rows = table(output)
    assert rows["scheduled (acknowledged)"] == tasks, output
    assert rows["lost"] == 0, output
    assert rows["early"] == 0, output
    assert rows["over max_attempts"] == 0, output
    assert rows["unexplained duplicates"] == 0, output
    assert rows["still queued"] == 0, output
    assert rows["acked"] + rows["dead"] == tasks, output
    assert rows["dead"] >= rows["of which poison (always raise)"] > 0, output  # dead letters
    assert rows["handler runs"] > tasks, output  # retries happened
    assert code == 0, output
    return rows


@pytest.mark.timeout(600)
def test_quick_soak_with_worker_and_redis_kills_loses_nothing_and_runs_nothing_early():
    code, output = run_soak()
    check_held(code, output, tasks=6000)
    faults = re.search(
        r"worker SIGKILL (\d+), Redis SIGKILL \+ AOF restart (\d+), Redis SIGSTOP \(5 s\) (\d+)",
        output,
    )
    assert faults is not None and faults.groups() == ("4", "1", "1"), output


@pytest.mark.timeout(600)
def test_quick_failover_soak_with_wait_loses_no_acknowledged_schedule():
    code, output = run_soak("--failover", "--wait-replicas", "1")
    check_held(code, output, tasks=3000)
    assert "primary SIGKILL + Sentinel failover 1" in output, output
    assert "schedule() calls/s" in output, output
