#!/usr/bin/env python
"""Resharding under load (issue 43): a sharded queue goes 3 -> 5 -> 2 shards on a local
3-primary Redis Cluster while a producer schedules its tasks and worker processes drain them;
each resharding process is SIGKILLed once mid-move and started again, and the workers are
replaced one by one (a rolling deploy) with processes opened with the new count.

A producer thread schedules ``--tasks`` tasks (explicit ids, due times spread over
``--spread`` seconds, the due time also in the payload); ``--workers`` worker processes (opened
with ``shards=3``) run them, failing attempt 1 of a tenth of them (so retries move between
shards as they go back to due). The handler appends a line when it starts (``S id attempt
start_ms due_ms``) and when it ends (``E id attempt ok|fail``) to a per-process log, one
write(2) each. Then:

1. ``q.reshard(5)`` in a process of its own, SIGKILLed once its reshard HASH counts
   ``--kill-after`` moved tasks, started again and run to the end;
2. each worker in turn stopped (SIGTERM: it finishes what it holds) and replaced by one opened
   with ``shards=5``;
3. the same for ``q.reshard(2)`` and ``shards=2``.

At the end (the queue drained, bounded) it prints one table. Judged: lost (scheduled, neither
acked, dead nor still queued), early (a start before the task's due time, 1 ms slack for the
script's whole milliseconds), over max_attempts (an attempt above it), re-runs (a run after an
``ok`` run or a second start of one attempt; each must be explained by a SIGKILLed process:
only the resharder is killed here, so there should be none). Exit code 1 when any is not 0.

    .venv/bin/python scripts/chaos/reshard.py               # 200,000 tasks, 4 workers
    .venv/bin/python scripts/chaos/reshard.py --tasks 20000 # quicker
"""

from __future__ import annotations

import argparse
import hashlib
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections import defaultdict
from pathlib import Path

from redis.cluster import RedisCluster

import dueq
from dueq._wire.keys import layout_key, reshard_key
from dueq.server import local_cluster

MAX_ATTEMPTS = 3
NAME = "resharded"

WORKER = textwrap.dedent("""
    import hashlib, os, sys, time
    from redis.cluster import RedisCluster
    import dueq
    port, log, shards = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    q = dueq.Queue("%(name)s", RedisCluster(host="127.0.0.1", port=port), shards=shards,
                   lease=10, retry=dueq.RetryPolicy(max_attempts=%(max)d, wait=lambda s: 0.5))
    out = open(log, "a", buffering=1)
    def handle(d):
        out.write(f"S {d.id} {d.attempt} {int(time.time() * 1000)} {d.payload['due_ms']}\\n")
        flaky = hashlib.sha256(d.id.encode()).digest()[0] < 26 and d.attempt == 1
        out.write(f"E {d.id} {d.attempt} {'fail' if flaky else 'ok'}\\n")
        if flaky:
            raise RuntimeError("planted on attempt 1")
    dueq.Worker(q, handle, concurrency=8).run()
""") % {"name": NAME, "max": MAX_ATTEMPTS}

MOVER = textwrap.dedent("""
    import sys
    from redis.cluster import RedisCluster
    import dueq
    q = dueq.Queue("%(name)s", RedisCluster(host="127.0.0.1", port=int(sys.argv[1])), shards=3)
    q.reshard(int(sys.argv[2]), batch=200)
""") % {"name": NAME}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--spread", type=float, default=60.0, help="due times over this (s)")
    parser.add_argument("--kill-after", type=int, default=5000, help="moved tasks, then SIGKILL")
    parser.add_argument("--max-duration", type=float, default=900.0)
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, local_cluster(3) as nodes:
        port = nodes[0].port
        client = RedisCluster(host="127.0.0.1", port=port)
        q = dueq.Queue(NAME, client, shards=3)
        q.stats()  # records the layout: 3 shards
        logs: list[Path] = []
        kills: list[str] = []

        def worker(shards: int) -> subprocess.Popen[bytes]:
            log = Path(tmp) / f"worker-{len(logs)}.log"
            logs.append(log)
            cmd = [sys.executable, "-c", WORKER, str(port), str(log), str(shards)]
            return subprocess.Popen(cmd, stderr=subprocess.DEVNULL)

        workers = [worker(3) for _ in range(args.workers)]
        scheduled: list[str] = []
        produced = threading.Event()

        def produce() -> None:
            p = dueq.Queue(NAME, RedisCluster(host="127.0.0.1", port=port), shards=3)
            rng = random.Random(43)
            begin_ms = int(time.time() * 1000) + 2000
            for start in range(0, args.tasks, 1000):
                tasks = []
                for n in range(start, min(start + 1000, args.tasks)):
                    due_ms = begin_ms + int(rng.random() * args.spread * 1000)
                    at = due_ms / 1000
                    tasks.append(dueq.Task({"due_ms": due_ms}, id=f"t{n}", at=at_datetime(at)))
                p.schedule_many(tasks)
                scheduled.extend(t.id for t in tasks if t.id is not None)
            produced.set()

        producer = threading.Thread(target=produce)
        producer.start()

        def reshard(to: int) -> float:
            t0 = time.monotonic()
            mover = subprocess.Popen([sys.executable, "-c", MOVER, str(port), str(to)])
            migrating = f">{to}".encode()
            while not (client.get(layout_key(NAME)) or b"").endswith(migrating):  # started
                if mover.poll() is not None:
                    break
                time.sleep(0.01)
            while int(client.hget(reshard_key(NAME), "moved") or 0) < args.kill_after:
                if mover.poll() is not None:
                    break
                time.sleep(0.01)
            if mover.poll() is None:
                mover.send_signal(signal.SIGKILL)
                mover.wait()
                kills.append(f"resharder to {to} at {client.get(layout_key(NAME))!r}")
                mover = subprocess.Popen([sys.executable, "-c", MOVER, str(port), str(to)])
            if mover.wait(args.max_duration) != 0:
                raise SystemExit(f"the resharder to {to} failed")
            return time.monotonic() - t0

        def roll(shards: int) -> None:
            for i, w in enumerate(workers):
                w.send_signal(signal.SIGTERM)  # finishes what it holds, then exits
                w.wait(60)
                workers[i] = worker(shards)

        time.sleep(3)
        took5 = reshard(5)
        roll(5)
        took2 = reshard(2)
        roll(2)
        producer.join()
        deadline = time.monotonic() + args.max_duration
        while time.monotonic() < deadline:
            stats = q.stats()
            if produced.is_set() and stats.scheduled + stats.leased == 0:
                break
            time.sleep(1)
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            w.wait(60)
        stats = q.stats()
        dead = {i.id for i in q.dead.list(limit=100_000)}
        return judge(args, scheduled, logs, dead, stats, kills, took5, took2, started)


def at_datetime(epoch_s: float) -> object:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(epoch_s, tz=timezone.utc)


def judge(
    args: argparse.Namespace,
    scheduled: list[str],
    logs: list[Path],
    dead: set[str],
    stats: dueq.QueueStats,
    kills: list[str],
    took5: float,
    took2: float,
    started: float,
) -> int:
    starts: dict[str, list[int]] = defaultdict(list)
    oks: dict[str, int] = defaultdict(int)
    early = over = 0
    for log in logs:
        if not log.exists():  # a worker that ran no task
            continue
        for line in log.read_text().splitlines():
            parts = line.split()
            if parts[0] == "S":
                task_id, attempt, start_ms, due_ms = parts[1], int(parts[2]), *map(int, parts[3:])
                starts[task_id].append(attempt)
                early += start_ms < due_ms - 1
                over += attempt > MAX_ATTEMPTS
            elif parts[0] == "E" and parts[3] == "ok":
                oks[parts[1]] += 1
    acked = {i for i, n in oks.items() if n}
    still = stats.scheduled + stats.leased
    unended = sum(1 for i in scheduled if i not in acked and i not in dead)
    lost = max(unended - still, 0)  # (a task still queued has not ended: not lost)
    after_ok = sum(n - 1 for n in oks.values() if n > 1)  # an acked task ran again
    twice = sum(len(a) - len(set(a)) for a in starts.values())  # an attempt started twice
    reruns = after_ok + twice
    flaky = sum(1 for i in scheduled if hashlib.sha256(i.encode()).digest()[0] < 26)
    rows = [
        ("tasks scheduled", len(scheduled)),
        ("acked", len(acked)),
        ("dead", len(dead)),
        ("still queued", still),
        ("lost", lost),
        ("run early", early),
        ("over max_attempts", over),
        ("re-runs: ran again after an ok run", after_ok),
        ("re-runs: an attempt started twice", twice),
        ("retried (planted failures)", flaky),
        ("resharder SIGKILLs", len(kills)),
        ("3 -> 5 took (s)", round(took5, 1)),
        ("5 -> 2 took (s)", round(took2, 1)),
        ("whole run (s)", round(time.monotonic() - started, 1)),
    ]
    print("| what | count |\n|---|---|")
    for what, n in rows:
        print(f"| {what} | {n} |")
    for kill in kills:
        print(f"- killed: {kill}")
    bad = lost or early or over or reruns
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
