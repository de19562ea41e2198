"""Bulk handlers under SIGKILL (issue 41): calls of up to 200 items in worker processes that are
killed at random, with items failing at random (decided by a hash of their id and attempt, so
the test knows which attempts were to fail, each attempt independently of the others). Every
task ends acked or dead exactly as its own attempts say: each failure recorded is that item's
planted failure on that attempt or a lease that a kill let run out, a dead task used all its
attempts, an acked one ended on an attempt that was not to fail, nothing ran past
``max_attempts``, nothing was lost."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap

import pytest
from chaos_support import kill_while_draining

import dueq

TASKS = 10000
WORKERS = 3
MAX_ATTEMPTS = 4
#: share of (task, attempt) pairs whose item the handler fails
FAIL_SHARE = 0.25
DRAIN_S = 300

BULK_WORKER = textwrap.dedent("""
    import hashlib, sys, time, redis, dueq
    r = redis.Redis(port=int(sys.argv[1]))
    q = dueq.Queue("bulk-chaos", r, lease=0.5,
                   retry=dueq.RetryPolicy(max_attempts=%(max)d, wait=lambda state: 0))

    class Planted(Exception):
        pass

    @q.task(name="work", batch=dueq.BatchSpec(max=200, linger=0.01))
    def work(items):
        r.rpush("ran", *(f"{i.id}:{i.attempt}" for i in items))
        time.sleep(0.05)  # the work; a kill lands mid-call most of the time
        for i in items:
            if hashlib.sha256(f"{i.id}:{i.attempt}".encode()).digest()[0] < %(fail)d:
                i.fail(Planted(f"planted on attempt {i.attempt}"))

    dueq.Worker(q, concurrency=2).run()
""") % {"max": MAX_ATTEMPTS, "fail": int(FAIL_SHARE * 256)}


def planted(task_id: str, attempt: int) -> bool:
    """Whether the handler fails this task on this attempt (a hash: independent attempts)."""
    return hashlib.sha256(f"{task_id}:{attempt}".encode()).digest()[0] < int(FAIL_SHARE * 256)


@pytest.mark.timeout(DRAIN_S + 60)
def test_bulk_calls_under_sigkills_end_each_item_as_its_own_attempts_say(redis_server, r):
    q = dueq.Queue("bulk-chaos", r)
    q.configure(keep_results=3600)  # acked tasks stay readable, with their error records
    ids = q.schedule_many(dueq.Task({"n": n}, task="work", id=f"t{n}") for n in range(TASKS)).ids

    def spawn() -> subprocess.Popen[bytes]:
        return subprocess.Popen(  # (a line per failed item on stderr: not wanted here)
            [sys.executable, "-c", BULK_WORKER, str(redis_server.port)],
            stderr=subprocess.DEVNULL,
        )

    kills = kill_while_draining(
        q,
        spawn,
        workers=WORKERS,
        seed=41,
        pace_s=0.2,
        drain_s=DRAIN_S,
        progress=lambda _stats: r.llen("ran"),  # a kill waits for a call since the last one
    )
    stats = q.stats()
    print(f"kills={kills} counters={stats.counters} dead={stats.dead}")
    assert kills >= 3, "the drain finished before any worker was killed"
    assert (stats.scheduled, stats.leased) == (0, 0)
    ran = {}
    for entry in r.lrange("ran", 0, -1):
        task_id, attempt = entry.decode().rsplit(":", 1)
        ran.setdefault(task_id, set()).add(int(attempt))
    assert max(a for attempts in ran.values() for a in attempts) <= MAX_ATTEMPTS
    expired = 0
    ends = {"done": 0, "dead": 0}
    for tid in ids:
        info = q.get(tid)
        assert info is not None and info.state in ends, (tid, info)
        ends[info.state] += 1
        for e in info.errors:
            if e.type == "LeaseExpired":
                expired += 1
            else:  # a failure the handler gave: only the planted one of that attempt
                assert e.type.endswith("Planted") and planted(tid, e.attempt), (tid, e)
        if info.state == "dead":
            assert info.attempt == MAX_ATTEMPTS and len(info.errors) == MAX_ATTEMPTS, info
        else:  # acked on an attempt that was not to fail, every earlier one recorded failed
            assert not planted(tid, info.attempt), info
            assert len(info.errors) == info.attempt - 1, info
    assert ends["done"] + ends["dead"] == TASKS
    assert expired > 0  # the kills' leases really ran out
    assert ends["dead"] > 0 and ends["done"] > 0
