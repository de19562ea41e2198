"""The features chaos soak (scripts/chaos/features.py) in a small form, as a test.

Events on, every task in a batch closed with a completion task, chains and fan-ins with
``after=`` (some parents poison, cancelled or expired), two event groups (``audit``: one
member, ``billing``: two) following in processes of their own. Workers and followers are
SIGKILLed at random and restarted (a follower under the same name), and one billing member is
killed for good while it holds unacked events, and the worker running a completion task is
killed once. Each group must see every event and every
task's final outcome, each batch's completion must be scheduled once and run after its
members ended, with the right counts, and no child may run before its parents were acked, nor
at all when a parent failed.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from paths_support import SCRIPTS

FEATURES = SCRIPTS / "chaos" / "features.py"


def table(output: str) -> dict[str, int]:
    """The soak's rows by label (Markdown: ``| label | count |``)."""
    rows = re.findall(r"^\| *([^|]+?) *\| *(-?\d+) *\|$", output, flags=re.MULTILINE)
    return {label.replace(" **(violation)**", ""): int(count) for label, count in rows}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_events_batches_and_dependencies_keep_their_guarantees_under_worker_and_follower_kills():
    run = subprocess.run(
        [sys.executable, str(FEATURES), "--quick", "--units", "200", "--spread-s", "20"],
        capture_output=True,
        text=True,
        timeout=280,
    )
    output = run.stdout + "\n--- stderr ---\n" + run.stderr[-4000:]
    rows = table(output)
    assert "settled" in rows, output  # no table: the soak itself failed (its traceback)
    assert rows["settled"] == 1, output
    assert rows["not ended"] == 0, output
    tasks = rows["tasks"]
    ended = sum(rows[f"ended {s}"] for s in ("done", "dead", "cancelled", "expired"))
    assert ended == tasks > 200, output
    assert min(rows[f"ended {s}"] for s in ("done", "dead", "cancelled", "expired")) > 0, output
    # no event lost for either group; every event of the stream seen by both
    for group in ("audit", "billing"):
        assert rows[f"{group}: lost stream entries"] == 0, output
        assert rows[f"{group}: lost outcomes"] == 0, output
        assert rows[f"{group}: distinct events"] == rows["events on the stream"] >= tasks, output
    assert rows["billing-1: events"] > 0 and rows["billing-2: events"] > 0, output
    # what the member killed for good held went to the other member
    assert rows["member killed for good: unacked events it held"] > 0, output
    assert rows["events held by the gone member never seen by the other"] == 0, output
    # each batch complete, its completion scheduled once, after its members, right counts
    assert rows["batches complete"] == 5, output  # four batches and the first one
    assert rows["schedule_many calls per batch (fewest)"] >= 2, output
    assert rows["first batch closed after all its members ended"] == 1, output
    assert rows["completion runs that returned"] >= 5, output
    # the worker running a completion was killed: re-run as attempt 2, never scheduled again
    firsts = rows["completion runs as attempt 1 (one per batch at most)"]
    assert rows["completion runs"] > firsts, output
    assert firsts <= 5, output
    assert rows.get("completion scheduled more or less than once", 0) == 0, output
    assert rows.get("completion acked events per group not 1", 0) == 0, output
    assert rows.get("completion before a member ended", 0) == 0, output
    assert rows.get("batch counts wrong", 0) == 0, output
    # dependencies
    assert rows["children"] > rows["children of a failed parent"] > 0, output
    assert rows.get("child ran before its parents were acked", 0) == 0, output
    assert rows.get("failed parent's child not dead (ParentFailed)", 0) == 0, output
    assert rows.get("failed parent's child ran", 0) == 0, output
    kills = re.search(r"kills: worker SIGKILL (\d+), follower SIGKILL .*? (\d+), member", output)
    assert kills is not None and kills.groups() == ("6", "4"), output
    assert "worker SIGKILL mid-completion 1" in output, output
    assert run.returncode == 0, output
