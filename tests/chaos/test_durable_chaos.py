"""The durable tasks' chaos proof (scripts/chaos/durable.py, issue 39) at a small size, as tests.

100 runs of a ten-step durable task (a short sleep after the fifth step) through three worker
processes (``Worker``s, then ``AsyncWorker``s), one SIGKILLed about every second and restarted,
Redis SIGKILLed once half the runs have finished and restarted from its AOF. Every run must end
done with the right result, every step committed with its body run at least once, and no
committed step's body run again (a body run that started after its step's commit). The last
test is the check of the check: a task that calls a committed step's body once more must be
reported, run by run.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from paths_support import SCRIPTS

DURABLE = SCRIPTS / "chaos" / "durable.py"


def run_proof(*args: str, timeout_s: float) -> tuple[int, dict[str, int], str]:
    """The script's exit code, its table's rows by label (without a violation mark), and its
    output for the assertion messages."""
    run = subprocess.run(
        [sys.executable, str(DURABLE), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    output = run.stdout + "\n--- stderr ---\n" + run.stderr[-4000:]
    found = re.findall(
        r"^\| *([^|]+?)(?: \*\*\(violation\)\*\*)? *\| *(\d+) *\|$", run.stdout, re.M
    )
    return run.returncode, {label.strip(): int(count) for label, count in found}, output


@pytest.mark.slow
@pytest.mark.parametrize("front_end", ["sync", "async"])
def test_no_committed_steps_body_runs_again_under_worker_kills_and_a_redis_restart(front_end):
    code, rows, output = run_proof(
        *("--runs", "100", "--workers", "3", "--kill-every", "1", "--max-duration-s", "75"),
        *("--front-end", front_end),
        timeout_s=110,
    )
    assert "runs" in rows, output  # no table: the script itself failed (its traceback)
    assert rows["runs"] == 100, output
    assert rows["finished (state done)"] == 100, output
    assert rows["dead"] == rows["lost (gone, not kept)"] == 0, output
    assert rows["final result right"] == 100, output
    assert rows["steps committed"] == rows["steps"] == 1000, output
    assert rows["sleeps committed"] == 100, output
    assert rows["steps whose body never ran"] == 0, output
    assert rows["body runs per step (fewest)"] == 1, output
    assert rows["re-runs after commit"] == 0, output
    assert rows["steps whose log counts more runs than ran"] == 0, output
    # the chaos happened: planned failures, bodies cut by kills, so more runs than steps
    assert rows["beyond the first: failed on purpose"] > 0, output
    assert rows["body runs"] > 1000, output
    kills = re.search(r"worker SIGKILL (\d+), Redis SIGKILL \+ AOF restart (\d+)", output)
    assert kills is not None, output
    assert int(kills[1]) >= 3 and kills[2] == "1", output
    assert "violations: none" in output, output
    assert code == 0, output


@pytest.mark.slow
def test_the_proof_reports_a_committed_steps_body_run_again():
    code, rows, output = run_proof(
        *("--runs", "20", "--workers", "1", "--kill-every", "0", "--redis-restarts", "0"),
        *("--work-ms", "10", "--rerun-committed", "--max-duration-s", "60"),
        timeout_s=90,
    )
    assert rows["finished (state done)"] == 20, output
    # each run's s0 at the task's end (twice for a run whose ack was lost and that ran again)
    assert rows["re-runs after commit"] >= 20, output
    assert len(set(re.findall(r"^re-run after commit: (\S+) s0 ", output, re.M))) == 20, output
    assert "re-runs after commit **(violation)**" in output, output
    assert "violations: re-runs after commit" in output, output
    assert code == 1, output
