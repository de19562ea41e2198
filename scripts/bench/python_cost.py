#!/usr/bin/env python
"""Python cost per task of the engine loop: ``claim(1000)``, a trivial handler, ``ack_many``.

Starts its own throwaway redis-server (``dueq.server.RedisServer``, free loopback port). For
each front end (``Queue``, ``AsyncQueue``) and, for reference, the raw loop of core.py section
3 (ZPOPMIN 1000 + pipelined HMGET + HDEL), it drains ``--tasks`` due tasks several times and
prints, per task:

- CPU µs of this process over the loop (``time.process_time``: the client's Python and the
  redis-py/hiredis work, not the time spent waiting for Redis); the best run, then all runs;
- function calls (cProfile's count over one more drain: exact, and the same under any load);
- gc collections per 1,000 tasks by generation (``gc.get_stats``).

The handler reads one field of the payload, as a real one would. On a shared machine the CPU
figures move with the load; the call counts do not.

    .venv/bin/python scripts/bench/python_cost.py [--tasks 20000] [--repeat 5] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import pstats
import sys
import time
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio

from dueq import AsyncQueue, Queue, Task
from dueq.server import RedisServer

#: Fields read from each delivery by the handler (kept to stop the work being optimised away).
seen: list[Any] = []


def payload(i: int) -> dict[str, Any]:
    """A task of about 100 bytes of JSON, as in issue 31's harness."""
    return {"user_id": 10_000_000 + i, "action": "send_welcome_email", "pad": "x" * 48}


def handler(d: Any) -> None:
    seen.append(d.payload["user_id"])


def engine_loop(q: Queue) -> int:
    done = 0
    while batch := q.claim(1000):
        for d in batch:
            handler(d)
        done += q.ack_many(batch)
    return done


async def async_engine_loop(q: AsyncQueue) -> int:
    done = 0
    while batch := await q.claim(1000):
        for d in batch:
            handler(d)
        done += await q.ack_many(batch)
    return done


def raw_loop(q: Queue) -> int:
    """core.py's raw drain: no leases, no acks, no decoding."""
    r, due, tasks, done = q.redis, q.keys.due, q.keys.tasks, 0
    while ids := [member for member, _ in r.zpopmin(due, 1000)]:
        pipe = r.pipeline(transaction=False)
        pipe.hmget(tasks, ids)
        pipe.hdel(tasks, *ids)
        pipe.execute()
        done += len(ids)
    return done


def drainer(server: RedisServer, loop_name: str) -> tuple[Callable[[], int], Callable[[], None]]:
    """One drain of the queue "cost" by ``loop_name``, and how to close what it opened."""
    if loop_name == "async":
        client = redis.asyncio.Redis(port=server.port)
        aq = AsyncQueue("cost", client)
        ev = asyncio.new_event_loop()
        ev.run_until_complete(aq.check_server())

        def close() -> None:
            ev.run_until_complete(client.aclose())
            ev.close()

        return lambda: ev.run_until_complete(async_engine_loop(aq)), close
    q = Queue("cost", server.client())
    q.check_server()
    return (lambda: raw_loop(q)) if loop_name == "raw" else (lambda: engine_loop(q)), q.close


def measure(
    server: RedisServer, loop_name: str, tasks: int, repeat: int, profile: bool
) -> dict[str, Any]:
    r = server.client()
    payloads = [payload(i) for i in range(tasks)]
    cpu_us: list[float] = []
    gcs: list[float] = []
    calls = 0.0
    for run in range(repeat + 1):
        r.flushdb()
        Queue("cost", r).schedule_many(Task(p) for p in payloads)
        drain, close = drainer(server, loop_name)
        seen.clear()
        if run == repeat:  # the last run: counted by cProfile
            prof = cProfile.Profile()
            prof.enable()
            done = drain()
            prof.disable()
            stats = pstats.Stats(prof)
            calls = stats.total_calls / done  # type: ignore[attr-defined]  # not in typeshed
            if profile:
                print(f"\n== {loop_name}: cProfile of one drain ==")
                stats.sort_stats("tottime").print_stats(20)
        else:
            before = [g["collections"] for g in gc.get_stats()]
            start = time.process_time()
            done = drain()
            cpu_us.append((time.process_time() - start) / done * 1e6)
            after = [g["collections"] for g in gc.get_stats()]
            gcs = [(b - a) * 1000 / done for a, b in zip(before, after, strict=True)]
        close()
        assert done == tasks, (done, tasks)
    return {"cpu_us": cpu_us, "calls": calls, "gc": gcs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20_000, help="tasks per drain")
    parser.add_argument("--repeat", type=int, default=5, help="timed drains per loop")
    parser.add_argument("--profile", action="store_true", help="print cProfile tables too")
    args = parser.parse_args(argv)
    with RedisServer() as server:
        for loop_name in ("raw", "sync", "async"):
            m = measure(server, loop_name, args.tasks, args.repeat, args.profile)
            runs = ", ".join(f"{x:.2f}" for x in m["cpu_us"])
            gc_text = "/".join(f"{x:.2f}" for x in m["gc"])
            print(
                f"{loop_name:>5}: CPU {min(m['cpu_us']):.2f} µs/task (runs {runs}); "
                f"{m['calls']:.2f} calls/task; gc per 1,000 tasks (gen 0/1/2) {gc_text}"
            )
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
