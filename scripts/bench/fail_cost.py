#!/usr/bin/env python
"""Redis server time per failed task: one ``fail`` call per failure against ``fail_many`` of
``--batch`` (default 100), in the same run on the same server, and their ratio.

Counted on the server (``INFO commandstats`` usec, reset before each phase, each command once:
``redis_cost.server_usec``),
so load from other processes moves the figures far less than a client-side rate. Each phase
schedules ``--tasks`` tasks and claims them all outside the measure, then fails every one
(``ValueError``: retried after the policy's delay, or buried with ``--dead``). Events are off
unless ``--events``. The best of ``--repeat`` runs is printed, then the figures as JSON.

    PYTHONPATH=src .venv/bin/python scripts/bench/fail_cost.py [--tasks N] [--batch B]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import redis
from redis_cost import server_usec

import dueq
from dueq import Queue, Task
from dueq.server import RedisServer

CLAIM = 1_000


def held_tasks(r: redis.Redis, n: int, events: bool) -> tuple[Queue, list[Any]]:
    """A fresh queue with ``n`` tasks scheduled and claimed (none of it measured)."""
    r.flushall()
    q = Queue("fail-cost", r, retry=dueq.RetryPolicy(max_attempts=5, wait=lambda state: 60.0))
    if events:
        q.configure(events=timedelta(hours=1))
    q.schedule_many([Task({"i": i}, id=f"t{i:06d}") for i in range(n)])
    held: list[Any] = []
    while batch := q.claim(CLAIM):
        held += batch
    assert len(held) == n, (len(held), n)
    return q, held


def measured(r: redis.Redis, n: int, fn: Callable[[], object]) -> float:
    """Server usec per task of ``fn()``."""
    r.config_resetstat()
    fn()
    return server_usec(r) / n


def run_once(r: redis.Redis, n: int, batch: int, dead: bool, events: bool) -> dict[str, float]:
    def error() -> BaseException:
        return dueq.Unrecoverable("bench") if dead else ValueError("bench")

    q, held = held_tasks(r, n, events)

    def one_by_one() -> None:
        for d in held:
            q.fail(d, error())

    single = measured(r, n, one_by_one)
    q, held = held_tasks(r, n, events)

    def in_batches() -> None:
        for start in range(0, n, batch):
            q.fail_many([(d, error()) for d in held[start : start + batch]])

    many = measured(r, n, in_batches)
    return {"single_usec": single, "many_usec": many}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tasks", type=int, default=5_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dead", action="store_true", help="fail with Unrecoverable: buried")
    parser.add_argument("--events", action="store_true", help="with outcome events kept")
    args = parser.parse_args(argv)
    with RedisServer() as server:
        r = redis.Redis.from_url(server.url)
        run_once(r, min(args.tasks, 200), args.batch, args.dead, args.events)  # scripts loaded
        runs = [
            run_once(r, args.tasks, args.batch, args.dead, args.events) for _ in range(args.repeat)
        ]
        r.close()
    best = {k: round(min(run[k] for run in runs), 2) for k in runs[0]}
    best["ratio"] = round(best["single_usec"] / best["many_usec"], 2)
    print(f"fail, 1 call per failure:      {best['single_usec']:8.2f} usec/task (server)")
    print(f"fail_many of {args.batch:<4}:             {best['many_usec']:8.2f} usec/task (server)")
    print(f"ratio:                         {best['ratio']:8.2f}x")
    print(json.dumps(best))
    return 0


if __name__ == "__main__":
    sys.exit(main())
