"""Workers killed at random (SIGKILL) while draining: nothing is lost, nothing acked twice."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from chaos_support import kill_while_draining

import dueq

TASKS = 2000
WORKERS = 4

CLAIM_LOOP = textwrap.dedent("""
    import sys, time, redis, dueq
    q = dueq.Queue("chaos", redis.Redis(port=int(sys.argv[1])), lease=0.5,
                   retry=dueq.RetryPolicy(max_attempts=50, wait=lambda state: 0))
    while True:
        batch = q.claim(limit=10)
        if not batch:
            time.sleep(0.01)
        for d in batch:
            time.sleep(0.002)  # the work; a kill lands mid-task most of the time
            try:
                d.ack()
            except dueq.LeaseLost:
                pass
""")

REACTIVE = textwrap.dedent("""
    import sys, time, redis, dueq
    q = dueq.Queue("chaos", redis.Redis(port=int(sys.argv[1])), lease=0.5,
                   retry=dueq.RetryPolicy(max_attempts=50, wait=lambda state: 0))
    dueq.Worker(q, lambda d: time.sleep(0.02), concurrency=2).run()
""")


#: The drain's bound. Unloaded it takes seconds; on a loaded 2-core machine a worker process
#: took seconds to start, so a kill waits for progress (chaos_support) and the drain takes
#: minutes.
DRAIN_S = 300


@pytest.mark.timeout(DRAIN_S + 60)
@pytest.mark.parametrize("worker", [CLAIM_LOOP, REACTIVE], ids=["claim-loop", "worker"])
def test_random_sigkills_lose_nothing_and_ack_nothing_twice(redis_server, r, worker):
    q = dueq.Queue("chaos", r)
    assert q.schedule_many(dueq.Task({"n": i}) for i in range(TASKS)).added == TASKS

    def spawn() -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-c", worker, str(redis_server.port)])

    kills = kill_while_draining(
        q,
        spawn,
        workers=WORKERS,
        seed=7,
        pace_s=0.3,
        drain_s=DRAIN_S,
        progress=lambda stats: stats.counters.get("acked", 0),  # a kill waits for an ack
    )
    stats = q.stats()
    print(f"kills={kills} counters={stats.counters} dead={stats.dead}")
    assert kills >= 3, "the drain finished before any worker was killed"
    assert (stats.scheduled, stats.leased) == (0, 0)
    assert stats.counters["acked"] + stats.dead == TASKS
    assert stats.counters.get("expired", 0) > 0  # killed workers' leases really expired
