#!/usr/bin/env python
"""Bulk handlers against per-task handlers and raw Redis, in one run on one redis-server
(issue 41):

- **raw**: pipelined ``ZPOPMIN 1000`` + ``HMGET`` + ``HDEL`` (core.py's raw drain: no leases,
  no acks), the floor;
- **engine loop**: ``claim(1000)`` + ``ack_many`` by hand (core.py's drain);
- **per-task Worker**: the default ``Worker`` with a no-op handler;
- **bulk Worker**: ``Worker(q, noop_many, batch=BatchSpec(max=1000))``, and the same on an
  ``AsyncWorker``;

each draining ``--tasks`` tasks: tasks/s, the ratio to raw, and the redis-server process's CPU
microseconds per task (``INFO cpu``) with its ratio to raw's. Rounds alternate
(``--rounds``) and the best of each is printed, since this machine's speed moves between hours.

    PYTHONPATH=src .venv/bin/python scripts/bench/bulk.py [--tasks N] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
import redis.asyncio

import dueq
from dueq.server import RedisServer

PAYLOAD = {"user_id": 10_000_001, "action": "send_welcome_email", "locale": "en-GB"}


def server_usec(r: redis.Redis) -> float:
    """The redis-server process's CPU time so far (user + system, INFO cpu), in microseconds:
    what the server spent, scripts, parsing and networking together. (Summing ``INFO
    commandstats`` would count a script's commands twice: in EVALSHA's time and in their own
    entries.)"""
    info = r.info("cpu")
    return (float(info["used_cpu_user"]) + float(info["used_cpu_sys"])) * 1e6


def fill(r: redis.Redis, name: str, n: int) -> dueq.Queue:
    r.flushdb()
    q = dueq.Queue(name, r)
    for start in range(0, n, 10_000):
        q.schedule_many(dueq.Task(PAYLOAD) for _ in range(min(10_000, n - start)))
    q.check_server()
    r.config_resetstat()
    return q


def timed(r: redis.Redis, n: int, run: Callable[[], None]) -> dict[str, float]:
    cpu_us = server_usec(r)
    start = time.perf_counter()
    run()
    seconds = time.perf_counter() - start
    return {"rate": n / seconds, "usec": (server_usec(r) - cpu_us) / n}


def raw(r: redis.Redis, n: int) -> dict[str, float]:
    q = fill(r, "raw", n)
    due, tasks = q.keys.due, q.keys.tasks

    def run() -> None:
        moved = 0
        while moved < n:
            ids = [m for m, _ in r.zpopmin(due, 1000)]
            pipe = r.pipeline(transaction=False)
            pipe.hmget(tasks, ids)
            pipe.hdel(tasks, *ids)
            pipe.execute()
            moved += len(ids)

    return timed(r, n, run)


def engine(r: redis.Redis, n: int) -> dict[str, float]:
    q = fill(r, "engine", n)

    def run() -> None:
        while batch := q.claim(limit=1000):
            q.ack_many(batch)

    return timed(r, n, run)


def worker(r: redis.Redis, n: int, batch: dueq.BatchSpec | None) -> dict[str, float]:
    q = fill(r, "worker", n)
    handler: Any = (lambda items: None) if batch else (lambda d: None)
    w = dueq.Worker(q, handler, batch=batch, heartbeat=0.5)

    def run() -> None:
        thread = threading.Thread(target=w.run)
        thread.start()
        while w.outcomes["acked"] < n:
            time.sleep(0.002)
        w.stop()
        thread.join()

    return timed(r, n, run)


def async_worker(url: str, r: redis.Redis, n: int, batch: dueq.BatchSpec) -> dict[str, float]:
    fill(r, "aworker", n)

    async def noop_many(items: list[dueq.Item]) -> None:
        return None

    async def main() -> None:
        client = redis.asyncio.Redis.from_url(url)
        w = dueq.AsyncWorker(
            dueq.AsyncQueue("aworker", client), noop_many, batch=batch, handle_signals=False
        )
        running = asyncio.ensure_future(w.run())
        while w.outcomes["acked"] < n:
            await asyncio.sleep(0.002)
        w.stop()
        await running
        await client.aclose()

    return timed(r, n, lambda: asyncio.run(main()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    n = args.tasks
    server = RedisServer().start()
    try:
        r = redis.Redis.from_url(server.url)
        bulk = dueq.BatchSpec(max=1000)
        cases: dict[str, Callable[[], dict[str, float]]] = {
            "raw": lambda: raw(r, n),
            "engine loop": lambda: engine(r, n),
            "per-task Worker": lambda: worker(r, n, None),
            "bulk Worker (max 1000)": lambda: worker(r, n, bulk),
            "bulk AsyncWorker (max 1000)": lambda: async_worker(server.url, r, n, bulk),
        }
        best: dict[str, dict[str, float]] = {}
        for _ in range(args.rounds):
            for name, case in cases.items():
                got = case()
                kept = best.get(name)
                if kept is None or got["rate"] > kept["rate"]:
                    best[name] = got
        floor = best["raw"]
        print(f"{n} tasks, best of {args.rounds} alternating rounds (load {load()})")
        for name, got in best.items():
            print(
                f"{name:30} {got['rate']:9.0f} tasks/s  {got['rate'] / floor['rate']:5.2f}x raw  "
                f"{got['usec']:6.2f} us/task server CPU  {got['usec'] / floor['usec']:5.2f}x raw"
            )
        over = best["per-task Worker"]["rate"] / best["engine loop"]["rate"]
        print(f"per-task Worker over the engine loop: {over:.2f}x")
    finally:
        server.stop()


def load() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


if __name__ == "__main__":
    main()
