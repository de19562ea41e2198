"""The resharding soak (scripts/chaos/reshard.py) scaled down, as a test: 6,000 tasks through
3 -> 5 -> 2 shards on a local 3-primary Redis Cluster, drained by 4 worker processes that are
replaced by processes of the new count after each reshard, each resharding process SIGKILLed
once it has moved 200 tasks and started again. Nothing lost, run early, run past max_attempts
or run twice (only the resharder is killed, and a killed mover brings no finished task
back)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from paths_support import SCRIPTS

RESHARD = SCRIPTS / "chaos" / "reshard.py"


@pytest.mark.timeout(600)
def test_resharding_3_to_5_to_2_under_load_with_a_killed_resharder_loses_nothing() -> None:
    run = subprocess.run(
        [sys.executable, str(RESHARD), "--tasks", "6000", "--kill-after", "200", "--spread", "30"],
        capture_output=True,
        text=True,
        timeout=560,
    )
    output = run.stdout + "\n--- stderr ---\n" + run.stderr[-4000:]
    rows = {
        label: float(count)
        for label, count in re.findall(r"^\| *([^|]+?) *\| *([\d.]+) *\|$", run.stdout, re.M)
    }
    assert rows["tasks scheduled"] == 6000, output
    assert rows["acked"] + rows["dead"] == 6000, output
    # the first mover is killed mid-move (thousands to move); the second one is too unless the
    # workers drained the queue down to fewer than 200 misplaced tasks first (a loaded machine)
    assert rows["resharder SIGKILLs"] >= 1, output
    for row in ("lost", "run early", "over max_attempts"):
        assert rows[row] == 0, output
    assert rows["re-runs: ran again after an ok run"] == 0, output
    assert rows["re-runs: an attempt started twice"] == 0, output
    assert run.returncode == 0, output
