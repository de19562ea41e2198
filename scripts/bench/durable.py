#!/usr/bin/env python
"""Durable steps against plain tasks, in one run on one redis-server (issue 39):

- **throughput**: ``--tasks`` plain named tasks drained by a ``Worker``, then ``--tasks`` / 10
  durable tasks of 10 steps each drained by the same kind of worker: plain tasks per second,
  steps per second, and what a step costs in plain tasks (the target: at most 1.5);
- **Redis time**: server microseconds per plain task and per step (``INFO commandstats``,
  every command), less moved by other load on the machine than the rates;
- **raw Redis**: the same client's round trips per second (``PING``, one at a time) measured
  in the same run, since a step commit is one round trip: steps/s over it is the share of the
  floor a step reaches;
- **asyncio**: the same two phases with an ``AsyncWorker`` (``--async-concurrency``, default
  64) on an ``AsyncQueue``;
- **memory**: 1,000 durable tasks each asleep for 30 days after two small steps, against
  1,000 plain tasks of the same payload due in 30 days: bytes per task beyond its payload, and
  beyond a plain task (``INFO memory`` used_memory, before and after).

    PYTHONPATH=src .venv/bin/python scripts/bench/durable.py [--tasks N] [--concurrency C]

Compare alternating runs in one sitting: this machine's speed moves between hours.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio

import dueq
from dueq.server import RedisServer

PAYLOAD = {"user_id": 10_000_001, "action": "send_welcome_email", "locale": "en-GB"}
STEPS = 10
SLEEPERS = 1000


def server_usec(r: redis.Redis) -> float:
    """Total server time spent in commands so far (INFO commandstats), in microseconds."""
    return float(sum(v["usec"] for v in r.info("commandstats").values()))


def drain(q: dueq.Queue, concurrency: int, done: Callable[[], bool], limit_s: float) -> float:
    """Run a Worker on ``q`` until ``done()``; the seconds it took."""
    worker = dueq.Worker(q, concurrency=concurrency)
    thread = threading.Thread(target=worker.run)
    start = time.perf_counter()
    thread.start()
    try:
        deadline = start + limit_s
        while not done():
            if time.perf_counter() > deadline:
                raise SystemExit(f"gave up after {limit_s:.0f} s: {q.stats()}")
            time.sleep(0.01)
        return time.perf_counter() - start
    finally:
        worker.stop()
        thread.join()


def pings_per_s(r: redis.Redis, n: int = 5000) -> float:
    start = time.perf_counter()
    for _ in range(n):
        r.ping()
    return n / (time.perf_counter() - start)


def memory_per_task(r: redis.Redis, url: str) -> dict[str, float]:
    """Bytes per task of SLEEPERS sleeping durable tasks and of SLEEPERS plain tasks due in
    30 days, and the payload's bytes (what 'beyond its payload' leaves out)."""
    plain_q = dueq.Queue.from_url(url, "bench-mem-plain")
    durable_q = dueq.Queue.from_url(url, "bench-mem-durable")

    @durable_q.task(name="sleeper", durable=True)
    def sleeper(ctx: dueq.StepContext, **payload: Any) -> None:
        ctx.step("load", lambda: {"ok": True})
        ctx.step("mark", lambda: 1)
        ctx.sleep(30 * 86400)

    payload_bytes = len(json.dumps(PAYLOAD, separators=(",", ":")))
    before = r.info("memory")["used_memory"]
    plain_q.schedule_many([dueq.Task(PAYLOAD, delay=30 * 86400) for _ in range(SLEEPERS)])
    plain = (r.info("memory")["used_memory"] - before) / SLEEPERS
    before = r.info("memory")["used_memory"]
    fn = durable_q.tasks["sleeper"]
    durable_q.schedule_many([fn.task(PAYLOAD) for _ in range(SLEEPERS)])

    def all_asleep() -> bool:
        stats = durable_q.stats()
        return (
            stats.leased == 0
            and stats.next_due_at is not None
            and (stats.next_due_at.timestamp() > time.time() + 86400)
        )

    drain(durable_q, 8, all_asleep, 120)
    durable = (r.info("memory")["used_memory"] - before) / SLEEPERS
    return {
        "payload_bytes": payload_bytes,
        "plain_task_bytes": plain,
        "durable_sleeping_bytes": durable,
        "durable_beyond_payload": durable - payload_bytes,
        "durable_beyond_plain": durable - plain,
    }


async def async_rates(
    url: str, tasks: int, concurrency: int, limit_s: float
) -> tuple[float, float]:
    """Plain tasks/s and steps/s through an AsyncWorker, as the blocking phases measure them."""
    client = redis.asyncio.Redis.from_url(url)
    q = dueq.AsyncQueue("bench-durable-async", client)
    durable_n = max(tasks // STEPS, 1)

    @q.task(name="plain")
    async def plain(**payload: Any) -> None:
        return None

    @q.task(name="ten_steps", durable=True)
    async def ten_steps(ctx: dueq.AsyncStepContext, **payload: Any) -> int:
        total = 0
        for i in range(STEPS):
            total += await ctx.step(f"s{i}", int, i)
        return total

    async def drain_async() -> float:
        worker = dueq.AsyncWorker(q, concurrency=concurrency, handle_signals=False)
        running = asyncio.ensure_future(worker.run())
        start = time.perf_counter()
        try:
            while True:
                stats = await q.stats()
                if stats.scheduled == 0 and stats.leased == 0:
                    return time.perf_counter() - start
                if time.perf_counter() - start > limit_s:
                    raise SystemExit(f"gave up after {limit_s:.0f} s: {stats}")
                await asyncio.sleep(0.01)
        finally:
            worker.stop()
            await running

    await q.schedule_many([plain.task(PAYLOAD) for _ in range(tasks)])
    plain_rate = tasks / await drain_async()
    await q.schedule_many([ten_steps.task(PAYLOAD) for _ in range(durable_n)])
    step_rate = durable_n * STEPS / await drain_async()
    await client.aclose()
    return plain_rate, step_rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--limit-s", type=float, default=120.0, help="give up on a phase after")
    parser.add_argument("--async-concurrency", type=int, default=64)
    args = parser.parse_args()
    server = RedisServer().start()
    try:
        r = redis.Redis.from_url(server.url)
        q = dueq.Queue.from_url(server.url, "bench-durable")
        durable_n = max(args.tasks // STEPS, 1)

        @q.task(name="plain")
        def plain(**payload: Any) -> None:
            return None

        @q.task(name="ten_steps", durable=True)
        def ten_steps(ctx: dueq.StepContext, **payload: Any) -> int:
            total = 0
            for i in range(STEPS):
                total += ctx.step(f"s{i}", lambda i=i: i)
            return total

        def empty() -> bool:
            stats = q.stats()
            return stats.scheduled == 0 and stats.leased == 0

        raw = pings_per_s(r)
        q.schedule_many([plain.task(PAYLOAD) for _ in range(args.tasks)])
        usec = server_usec(r)
        plain_s = drain(q, args.concurrency, empty, args.limit_s)
        plain_usec = (server_usec(r) - usec) / args.tasks
        q.schedule_many([ten_steps.task(PAYLOAD) for _ in range(durable_n)])
        usec = server_usec(r)
        durable_s = drain(q, args.concurrency, empty, args.limit_s)
        step_usec = (server_usec(r) - usec) / (durable_n * STEPS)
        plain_rate = args.tasks / plain_s
        step_rate = durable_n * STEPS / durable_s
        print(f"raw Redis round trips (PING, one at a time): {raw:9.0f} /s")
        print(f"plain named tasks:                           {plain_rate:9.0f} /s")
        print(f"durable steps ({durable_n} tasks x {STEPS} steps):          {step_rate:9.0f} /s")
        print(f"a step costs {plain_rate / step_rate:.2f} plain tasks (target <= 1.5)")
        print(f"steps/s over raw round trips/s: {step_rate / raw:.2f}")
        print(f"server time: {plain_usec:.2f} us per plain task, {step_usec:.2f} us per step")
        plain_async, steps_async = asyncio.run(
            async_rates(server.url, args.tasks, args.async_concurrency, args.limit_s)
        )
        print(
            f"AsyncWorker({args.async_concurrency}): plain {plain_async:.0f} /s, steps "
            f"{steps_async:.0f} /s: a step costs {plain_async / steps_async:.2f} plain tasks"
        )
        mem = memory_per_task(r, server.url)
        print(
            f"memory: plain task due in 30 days {mem['plain_task_bytes']:.0f} B, durable task "
            f"asleep 30 days after 2 steps {mem['durable_sleeping_bytes']:.0f} B; "
            f"beyond its {mem['payload_bytes']} B payload {mem['durable_beyond_payload']:.0f} B, "
            f"beyond a plain task {mem['durable_beyond_plain']:.0f} B"
        )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
