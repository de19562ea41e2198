#!/usr/bin/env python
"""A rolling deploy: workers of an earlier release and of this tree drain one queue side by
side, with failures, and nothing is lost or run past ``max_attempts``.

The earlier release is a git revision (``--old``, default the last commit before issue 41's
bulk handlers and its batched fail.lua), exported with ``git archive`` into a temporary folder;
each worker is a process of its own (``--old-workers`` of it, ``--new-workers`` of this tree),
running the same plain handler: a task fails on the attempts its id and attempt pick (a
quarter of them). At the end every task must be acked or dead, each dead one after its
``max_attempts`` failures, and the counters must add up.

    .venv/bin/python scripts/chaos/rolling.py [--old REV] [--tasks N]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import time
from pathlib import Path

import redis

import dueq
from dueq.server import RedisServer

ROOT = Path(__file__).resolve().parents[2]
MAX_ATTEMPTS = 3

WORKER = textwrap.dedent("""
    import hashlib, sys, redis, dueq
    q = dueq.Queue("rolling", redis.Redis(port=int(sys.argv[1])), lease=5,
                   retry=dueq.RetryPolicy(max_attempts=%(max)d, wait=lambda state: 0))
    r = redis.Redis(port=int(sys.argv[1]))
    def handle(d):
        r.rpush("ran:" + sys.argv[2], d.id)
        if hashlib.sha256(f"{d.id}:{d.attempt}".encode()).digest()[0] %% 4 == 0:
            raise RuntimeError("planted")
    dueq.Worker(q, handle, concurrency=4).run()
""") % {"max": MAX_ATTEMPTS}


def export(rev: str, into: Path) -> Path:
    """``src`` of ``rev`` under ``into`` (git archive): the import path of that release."""
    archive = into / "old.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "archive", rev, "src"], cwd=ROOT, stdout=out, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", default="9561d48")
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--old-workers", type=int, default=2)
    parser.add_argument("--new-workers", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, RedisServer() as server:
        old_src = export(args.old, Path(tmp))
        r = redis.Redis.from_url(server.url)
        q = dueq.Queue("rolling", r)
        q.schedule_many(dueq.Task({"n": n}, id=f"t{n}") for n in range(args.tasks))
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", WORKER, str(server.port), kind],
                env={"PYTHONPATH": str(path), "PATH": "/usr/bin:/bin"},
                stderr=subprocess.DEVNULL,
            )
            for kind, path, n in (
                ("old", old_src, args.old_workers),
                ("new", ROOT / "src", args.new_workers),
            )
            for _ in range(n)
        ]
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                stats = q.stats()
                if stats.scheduled == 0 and stats.leased == 0:
                    break
                time.sleep(0.2)
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(30)
        stats = q.stats()
        ran = {k: r.llen(f"ran:{k}") for k in ("old", "new")}
        dead = q.dead.list(limit=args.tasks)
        short = [t.id for t in dead if t.attempt != MAX_ATTEMPTS or len(t.errors) != MAX_ATTEMPTS]
        print(f"old {args.old} x{args.old_workers}, new x{args.new_workers}: runs {ran}")
        print(f"counters {stats.counters}; scheduled {stats.scheduled}, leased {stats.leased}")
        acked, died = stats.counters.get("acked", 0), stats.dead
        ok = (stats.scheduled, stats.leased) == (0, 0) and acked + died == args.tasks
        ok = ok and not short and ran["old"] > 0 and ran["new"] > 0
        print(f"acked {acked} + dead {died} = {acked + died} of {args.tasks}; dead early: {short}")
        print("OK" if ok else "FAILED")
        sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
