#!/usr/bin/env python
"""What the per-minute history and the lease holder cost: schedule and drain throughput with
and without them in one run, and the bytes they add.

Starts its own throwaway redis-server (``dueq.server.RedisServer``, free loopback port). Two
queues take turns, round after round, so outside load falls on both alike:

- ``with``: dueq as shipped: every counting script adds to its minute's bucket
  (``history_use`` in lua/include/stats.lua), and each claim names its holder ("<host>:<pid>") in
  the lease token.
- ``without``: the same scripts with ``history_use`` made a no-op, and claims naming no holder.

Throughput: ``schedule_many`` of N tasks, then ``claim(1000)`` + ``ack_many`` until drained;
the best of ``--repeat`` rounds, as wall-clock tasks per second, as server time in scripts
per task (INFO commandstats, wall time inside Redis) and as the CPU time of Redis's main thread
per task (INFO cpu): the one figure that a machine shared with other work barely moves, since a
process waiting for a core spends no CPU time.
Bytes: exact ``MEMORY USAGE`` (SAMPLES 0) of the meta hash with N tasks leased (the holder), per
task, and of the history hash after the run (per queue, not per task).

    PYTHONPATH=src .venv/bin/python scripts/bench/views.py [--tasks N] [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import redis
from bench_internals import replace_scripts

from dueq import Queue, Task
from dueq._util.checks import MAX_HOLDER_LENGTH
from dueq._wire.scripts import SCRIPT_NAMES, script_source
from dueq.server import RedisServer

HISTORY_ON = "history = {key = k_history, arg = now_arg}"


def without_views(q: Queue, r: redis.Redis) -> Queue:
    """``q`` running scripts whose history_use does nothing, claiming without a holder."""
    sources = {name: script_source(name) for name in SCRIPT_NAMES}
    assert (
        HISTORY_ON in sources["claim"] and HISTORY_ON in sources["ack"]
    )  # the scripts with stats.lua
    replace_scripts(
        q, {name: source.replace(HISTORY_ON, "history = nil") for name, source in sources.items()}
    )
    q.holder = ""  # "" names no holder (the constructor refuses it; the bench sets it)
    return q


def one_round(q: Queue, r: redis.Redis, n: int) -> dict[str, float]:
    for key in q.keys.names():
        r.delete(key)
    tasks = [Task({"n": i, "to": f"user{i}@example.com"}) for i in range(n)]
    r.config_resetstat()
    cpu_s = redis_cpu_s(r)
    start = time.perf_counter()
    q.schedule_many(tasks)
    schedule_s = time.perf_counter() - start
    schedule_cpu_s = redis_cpu_s(r) - cpu_s
    schedule_us = script_usec(r)
    r.config_resetstat()
    cpu_s = redis_cpu_s(r)
    start = time.perf_counter()
    done = 0
    while batch := q.claim(1000):
        done += q.ack_many(batch)
    drain_s = time.perf_counter() - start
    drain_cpu_s = redis_cpu_s(r) - cpu_s
    drain_us = script_usec(r)
    assert done == n
    return {
        "schedule_per_s": n / schedule_s,
        "drain_per_s": n / drain_s,
        # server time per task, negated so that "best" (the max) is the least time
        "schedule_server_us_per_task": -schedule_us / n,
        "drain_server_us_per_task": -drain_us / n,
        "schedule_redis_cpu_us_per_task": -schedule_cpu_s * 1e6 / n,
        "drain_redis_cpu_us_per_task": -drain_cpu_s * 1e6 / n,
    }


def redis_cpu_s(r: redis.Redis) -> float:
    """CPU seconds Redis's main thread has used (user + system; the INFO call's own share is
    the same for both variants)."""
    cpu = r.info("cpu")
    return float(cpu["used_cpu_user_main_thread"]) + float(cpu["used_cpu_sys_main_thread"])


def script_usec(r: redis.Redis) -> int:
    """Server microseconds spent in scripts since the last CONFIG RESETSTAT."""
    stats = r.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("usec", 0)) for c in ("evalsha", "eval"))


def meta_bytes_per_leased_task(q: Queue, r: redis.Redis, n: int, holder: str | None) -> float:
    for key in q.keys.names():
        r.delete(key)
    q.schedule_many(Task(i) for i in range(n))
    while q.claim_batch(1000, holder=holder).deliveries:
        pass
    return int(r.memory_usage(q.keys.meta, samples=0) or 0) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with RedisServer() as server:
        r = server.client()
        on = Queue("with", r)
        off = without_views(Queue("without", r), r)
        on.check_server()
        off.check_server()
        best: dict[str, dict[str, float]] = {"with": {}, "without": {}}
        for round_no in range(args.repeat):
            order = (("with", on), ("without", off))
            for label, q in order if round_no % 2 else order[::-1]:
                got = one_round(q, r, args.tasks)
                for metric, value in got.items():
                    best[label][metric] = max(best[label].get(metric, value), value)
            print(f"round {round_no + 1}/{args.repeat} done", file=sys.stderr)
        history_bytes = int(r.memory_usage(on.keys.history, samples=0) or 0)
        meta_on = meta_bytes_per_leased_task(on, r, args.tasks, None)
        holder = on.list_tasks("leased", limit=1).tasks[0].holder
        meta_off = meta_bytes_per_leased_task(off, r, args.tasks, None)
        meta_longest = meta_bytes_per_leased_task(on, r, args.tasks, "w" * MAX_HOLDER_LENGTH)
    figures: dict[str, Any] = {
        "tasks": args.tasks,
        "repeat": args.repeat,
        "best": best,
        # how much slower "with" is: fewer tasks per second, or more server time per task
        "cost_pct": {
            metric: round(100 * (1 - best["with"][metric] / best["without"][metric]), 1)
            if metric.endswith("_per_s")
            else round(100 * (best["with"][metric] / best["without"][metric] - 1), 1)
            for metric in best["with"]
        },
        "holder": holder,
        "meta_bytes_per_leased_task": {
            "with": round(meta_on, 1),
            "without": round(meta_off, 1),
            "with_longest_holder": round(meta_longest, 1),
        },
        "history_hash_bytes_after_run": history_bytes,
    }
    for label in ("with", "without"):
        b = best[label]
        print(
            f"{label:8} schedule {b['schedule_per_s']:10.0f}/s "
            f"({-b['schedule_server_us_per_task']:.2f} us/task in Redis)   "
            f"drain {b['drain_per_s']:10.0f}/s ({-b['drain_server_us_per_task']:.2f} us/task)"
        )
    cost = figures["cost_pct"]
    print(
        f"cost: schedule {cost['schedule_per_s']}% ({cost['schedule_server_us_per_task']}% in "
        f"Redis), drain {cost['drain_per_s']}% ({cost['drain_server_us_per_task']}% in Redis); "
        "meta bytes per leased task "
        f"{meta_on:.1f} vs {meta_off:.1f} (holder {holder!r}), {meta_longest:.1f} with a "
        f"{MAX_HOLDER_LENGTH}-character holder; history hash {history_bytes} B"
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
