#!/usr/bin/env python
"""Cron benchmark: what keeping many schedules costs, against raw Redis in the same run.

Starts its own throwaway redis-server on a free loopback port. Queues run on a simulated
clock so that every definition's slot comes due at once. Sections:

1. baseline  redis-py pipelined ZADD + HSET of N tasks (transaction=False, flushed every
             1,000), the raw cost of putting N tasks into a sorted set
2. add       ``q.cron.add`` of N definitions ("* * * * *" in Europe/Berlin), one at a time
3. advance   N occurrences due in the same minute: ``claim(1000)`` until empty (each claimed
             occurrence reads its definition and schedules the next slot) + ``ack_many``
4. plain     the same claim + ``ack_many`` loop over N ordinary tasks, for the share of the
             cost that is cron's own

Figures are the best of ``--repeat`` runs.

    .venv/bin/python scripts/bench/cron.py [--definitions N] [--repeat R]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import redis
from report import print_table

import dueq
from dueq.server import RedisServer

perf = time.perf_counter
START = 1_800_000_000.0  # a whole minute


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


def best_rate(count: int, repeat: int, run: Callable[[], None], reset: Callable[[], None]) -> float:
    """Best items per second of ``repeat`` timed runs of ``run`` (``reset`` before each)."""
    best = 0.0
    for _ in range(repeat):
        reset()
        began = perf()
        run()
        best = max(best, count / (perf() - began))
    return best


def drain(q: dueq.Queue) -> int:
    done = 0
    while batch := q.claim(limit=1000):
        done += q.ack_many(batch)
    return done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--definitions", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    n, repeat = args.definitions, args.repeat

    with RedisServer() as server:
        r: redis.Redis = server.client()
        clock = Clock()
        q = dueq.Queue("bench-cron", r, clock=clock)

        def baseline() -> None:
            pipe = r.pipeline(transaction=False)
            for i in range(n):
                pipe.zadd("raw:due", {f"t{i}": START})
                pipe.hset("raw:tasks", f"t{i}", '1:{"n":1}')
                if i % 1000 == 999:
                    pipe.execute()
            pipe.execute()

        def reset() -> None:
            r.flushall()
            clock.now = START

        def add_all() -> None:
            for i in range(n):
                q.cron.add(f"job-{i}", "* * * * *", payload={"n": i}, tz="Europe/Berlin")

        raw = best_rate(n, repeat, baseline, reset)
        added = best_rate(n, repeat, add_all, reset)

        def add_then_move_on() -> None:
            reset()
            add_all()
            clock.now = START + 60  # every definition's first slot is due

        advanced_counts: list[int] = []
        advance = best_rate(n, repeat, lambda: advanced_counts.append(drain(q)), add_then_move_on)
        pending = q.stats().scheduled

        def schedule_plain() -> None:
            reset()
            q.schedule_many(dueq.Task({"n": i}, id=f"t{i}") for i in range(n))

        plain = best_rate(n, repeat, lambda: advanced_counts.append(drain(q)), schedule_plain)
        r.close()

    assert all(c == n for c in advanced_counts), advanced_counts
    assert pending == n, pending  # each definition's next slot, once
    rows = [
        ("baseline", f"{raw:,.0f} tasks/s", f"pipelined ZADD+HSET, {n:,} tasks", ""),
        ("add", f"{added:,.0f} definitions/s", f"ratio to baseline {added / raw:.3f}", ""),
        (
            "advance",
            f"{advance:,.0f} occurrences/s",
            f"claim + next slot + ack; ratio to baseline {advance / raw:.3f}",
            "",
        ),
        ("plain", f"{plain:,.0f} tasks/s", f"claim + ack; cron costs {plain / advance:.1f}x", ""),
    ]
    print_table(rows)
    figures = {"n": n, "raw": raw, "add": added, "advance": advance, "plain": plain}
    print(json.dumps({k: round(v, 1) for k, v in figures.items()}))


if __name__ == "__main__":
    main()
