"""The examples run to completion and show what they promise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_quickstart_retries_buries_and_replays(redis_server):
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py"), "--redis-url", redis_server.url],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    out = result.stdout
    assert "added=0 existing=1" in out
    assert "acked    email:flaky  attempt 3" in out
    assert "dead     email:poison attempt 3" in out
    assert out.count("ValueError: mailbox does not exist") == 3
    assert "acked    email:poison attempt 1" in out  # replayed with attempts reset
