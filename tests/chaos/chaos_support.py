"""The SIGKILL loop of the chaos tests (test_chaos.py, test_bulk_chaos.py): worker processes
drain a queue while one of them, picked at random, is killed and started again.

A kill waits for progress since the last one (``progress``: acks, calls begun): killing at a
fixed pace while a restarted process takes seconds to start (a loaded 2-core machine) stalled
the drain, 562 tasks still scheduled after 600 kills. The pace is the kills' rhythm, not a wait
for a condition.
"""

from __future__ import annotations

import random
import signal
import subprocess
import time
from collections.abc import Callable

import dueq


def kill_while_draining(
    q: dueq.Queue,
    spawn: Callable[[], subprocess.Popen[bytes]],
    *,
    workers: int,
    seed: int,
    pace_s: float,
    drain_s: float,
    progress: Callable[[dueq.QueueStats], int],
) -> int:
    """Run ``workers`` processes from ``spawn`` until ``q`` holds nothing scheduled or leased
    (or ``drain_s`` passed), SIGKILLing one at random every ``pace_s`` when ``progress`` (of the
    queue's stats) moved since the last kill and starting it again; every process is killed at
    the end. The count of kills."""
    rng = random.Random(seed)
    running = [spawn() for _ in range(workers)]
    kills = 0
    at_last_kill = 0
    deadline = time.monotonic() + drain_s
    try:
        while time.monotonic() < deadline:
            time.sleep(pace_s)  # the pace of the kills, not a wait for a condition
            stats = q.stats()
            if stats.scheduled == 0 and stats.leased == 0:
                break
            now = progress(stats)
            if now == at_last_kill:
                continue
            at_last_kill = now
            victim = rng.randrange(workers)
            running[victim].send_signal(signal.SIGKILL)
            running[victim].wait()
            running[victim] = spawn()
            kills += 1
    finally:
        for w in running:
            w.kill()
            w.wait()
    return kills
