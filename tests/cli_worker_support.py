"""``dueq worker`` in a child process, for the tests of several folders that run one (the CLI,
logs, metrics, worker output, sharded queues): started in tests/fixtures, where the handler
modules it is given by name (``cli_handlers:record``) live, on the suite's Redis."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from paths_support import FIXTURES

from dueq.server import RedisServer

WAIT_S = 30


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def start_worker(redis_server: RedisServer | str, *args: str) -> subprocess.Popen[str]:
    """``python -m dueq worker ARGS`` in tests/fixtures, where cli_handlers.py lives, on
    ``redis_server`` (or a Redis URL)."""
    url = redis_server if isinstance(redis_server, str) else redis_server.url
    env = {**os.environ, "DUEQ_REDIS_URL": url}
    return subprocess.Popen(
        [sys.executable, "-m", "dueq", "worker", *args],
        cwd=FIXTURES,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
