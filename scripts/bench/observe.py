#!/usr/bin/env python
"""Consumer benchmark: delivery lag, drain throughput through observe + process, idle traffic.

Starts its own throwaway redis-server (``dueq.server.RedisServer``, free loopback port) and
never touches any other server. Every figure is measured in this run. Sections:

1. lag       1,000 tasks due at 100 per second, consumed by ``observe`` + ``process`` (no-op
             handler, concurrency 8); lag = emission time minus due time (both on this host's
             clock, which is also the Redis server's), with the count emitted early. The raw
             Redis round trip (PING) in the same run is the floor any consumer pays.
2. drain     tasks due now drained through ``observe(max_in_flight)`` + ``process`` with a
             no-op handler, at concurrency 1 and 8; raw Redis baseline: one client moving the
             same number of tasks out with pipelined ZPOPMIN 1000 + HDEL (no leases, no acks)
3. idle      Redis commands per second (INFO total_commands_processed) while one consumer with
             the default heartbeat waits on an empty queue

    .venv/bin/python scripts/bench/observe.py [--quick] [--repeat N]

``--quick`` shrinks the drain and the idle window for a smoke run. The table goes to stdout,
then one JSON line with every figure; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time
from datetime import datetime, timezone
from typing import Any

import redis
from reactivex import operators as ops
from report import percentile, print_table

import dueq
from dueq import Queue, Task
from dueq.server import RedisServer

perf = time.perf_counter

LAG_TASKS = 1_000
LAG_RATE_PER_S = 100
LAG_LEAD_S = 1.0  # the first task is due this long after scheduling
DRAIN_CONCURRENCY = (1, 8)
DRAIN_MAX_IN_FLIGHT = 512
PING_ROUNDS = 2_000
TARGETS = {"lag_p99_ms_max": 2.0, "early_max": 0, "drain_c8_per_s_min": 25_000}


def log(message: str) -> None:
    print(f"[observe bench] {message}", file=sys.stderr, flush=True)


def wait_for(condition: threading.Event, what: str, timeout_s: float = 300) -> None:
    if not condition.wait(timeout_s):
        raise SystemExit(f"timed out waiting for {what}")


# -- 1. lag --------------------------------------------------------------------------------------


def run_ping(r: redis.Redis) -> dict[str, float]:
    samples = []
    for _ in range(PING_ROUNDS):
        start = perf()
        r.ping()
        samples.append((perf() - start) * 1000)
    return {"p50_ms": percentile(samples, 50), "p99_ms": percentile(samples, 99)}


def run_lag(r: redis.Redis) -> dict[str, Any]:
    r.flushdb()
    q = Queue("lag", r)
    first_s = time.time() + LAG_LEAD_S
    q.schedule_many(
        Task({"i": i}, at=datetime.fromtimestamp(first_s + i / LAG_RATE_PER_S, tz=timezone.utc))
        for i in range(LAG_TASKS)
    )
    lags_ms: list[float] = []
    outcomes: list[str] = []
    done = threading.Event()

    def emitted(d: dueq.Delivery) -> None:
        lags_ms.append(time.time() * 1000 - d.due_ms)

    def settled(outcome: dueq.Outcome) -> None:
        outcomes.append(outcome.kind)
        if len(outcomes) == LAG_TASKS:
            done.set()

    stream = q.observe(max_in_flight=64).pipe(
        ops.do_action(emitted), dueq.operators.process(lambda d: None, concurrency=8)
    )
    sub = stream.subscribe(on_next=settled)
    wait_for(done, "the lag run")
    sub.dispose()
    return {
        "tasks": LAG_TASKS,
        "rate_per_s": LAG_RATE_PER_S,
        "p50_ms": percentile(lags_ms, 50),
        "p99_ms": percentile(lags_ms, 99),
        "max_ms": max(lags_ms),
        "early": sum(lag < 0 for lag in lags_ms),
        "acked": outcomes.count("acked"),
    }


# -- 2. drain ------------------------------------------------------------------------------------


def run_raw_drain(r: redis.Redis, n: int) -> float:
    r.flushdb()
    q = Queue("raw", r)
    q.schedule_many(Task({"i": i}) for i in range(n))
    due, tasks = q.keys.due, q.keys.tasks
    moved = 0
    start = perf()
    while moved < n:
        popped = r.zpopmin(due, 1000)
        ids = [member for member, _ in popped]
        pipe = r.pipeline(transaction=False)
        pipe.hmget(tasks, ids)
        pipe.hdel(tasks, *ids)
        pipe.execute()
        moved += len(ids)
    return n / (perf() - start)


def run_drain(r: redis.Redis, n: int, concurrency: int) -> float:
    r.flushdb()
    q = Queue("drain", r)
    q.schedule_many(Task({"i": i}) for i in range(n))
    count = 0
    done = threading.Event()

    def settled(outcome: dueq.Outcome) -> None:
        nonlocal count
        count += 1
        if count == n:
            done.set()

    start = perf()
    stream = q.observe(max_in_flight=DRAIN_MAX_IN_FLIGHT).pipe(
        dueq.operators.process(lambda d: None, concurrency=concurrency)
    )
    sub = stream.subscribe(on_next=settled)
    wait_for(done, f"the drain at concurrency {concurrency}")
    elapsed = perf() - start
    sub.dispose()
    acked = q.stats().counters.get("acked", 0)
    if acked != n:
        raise SystemExit(f"drain acked {acked} of {n} tasks")
    return n / elapsed


# -- 3. idle -------------------------------------------------------------------------------------


def run_idle(r: redis.Redis, window_s: float) -> dict[str, float]:
    r.flushdb()
    q = Queue("idle", r)
    sub = q.observe().subscribe()
    time.sleep(1.0)  # let the first claim and the wake subscription happen
    before = int(r.info("stats")["total_commands_processed"])
    time.sleep(window_s)
    spent = int(r.info("stats")["total_commands_processed"]) - before - 1  # minus one INFO
    sub.dispose()
    return {"window_s": window_s, "commands": spent, "per_s": spent / window_s}


# -- report --------------------------------------------------------------------------------------


def measure(drain_n: int, idle_s: float, repeat: int) -> dict[str, Any]:
    with RedisServer() as server:
        r = server.client()
        env = {"redis_server": r.info("server")["redis_version"]}
        log("raw round trip (PING)")
        ping = run_ping(r)
        log(f"lag: {LAG_TASKS} tasks due at {LAG_RATE_PER_S}/s")
        lag = run_lag(r)
        log(f"drain: {drain_n:,} tasks, best of {repeat}")
        raw = max(run_raw_drain(r, drain_n) for _ in range(repeat))
        drains = {
            c: max(run_drain(r, drain_n, c) for _ in range(repeat)) for c in DRAIN_CONCURRENCY
        }
        log(f"idle: {idle_s:.0f} s")
        idle = run_idle(r, idle_s)
        r.close()
    return {"env": env, "ping": ping, "lag": lag, "raw_drain": raw, "drain": drains, "idle": idle}


def print_report(res: dict[str, Any], args: argparse.Namespace, wall_s: float) -> None:
    lag, ping, idle, raw = res["lag"], res["ping"], res["idle"], res["raw_drain"]
    print(f"\ndueq consumer benchmark ({'quick' if args.quick else 'full'}, wall {wall_s:.1f} s)")
    print(
        f"redis-server {res['env']['redis_server']}, redis-py {redis.__version__}, Python "
        f"{platform.python_version()}, {platform.platform()}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    ok_lag = lag["p99_ms"] <= TARGETS["lag_p99_ms_max"] and lag["early"] == 0
    rows = [
        (
            "1 lag (emitted - due)",
            f"p50 {lag['p50_ms']:.2f} / p99 {lag['p99_ms']:.2f} / max {lag['max_ms']:.2f} ms",
            f"{lag['early']} early; {lag['acked']}/{lag['tasks']} acked; raw PING p50 "
            f"{ping['p50_ms']:.3f} / p99 {ping['p99_ms']:.3f} ms",
            f"p99 <= 2 ms, 0 early: {'ok' if ok_lag else 'MISSED'}",
        ),
        (
            "2 drain, raw Redis",
            f"{raw:,.0f} tasks/s",
            "pipelined ZPOPMIN 1000 + HMGET + HDEL, no leases or acks",
            "",
        ),
    ]
    for c, rate in res["drain"].items():
        target = ""
        if c == 8:
            ok = rate >= TARGETS["drain_c8_per_s_min"]
            target = f">= 25k/s: {'ok' if ok else 'MISSED'}"
        rows.append(
            (
                f"2 drain, concurrency {c}",
                f"{rate:,.0f} tasks/s",
                f"{rate / raw:.2f}x raw; observe(max_in_flight={DRAIN_MAX_IN_FLIGHT}) + process",
                target,
            )
        )
    rows.append(
        (
            "3 idle consumer",
            f"{idle['per_s']:.2f} commands/s",
            f"{idle['commands']} commands in {idle['window_s']:.0f} s (heartbeat 5 s)",
            "",
        )
    )
    print_table(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller drain, shorter idle window")
    parser.add_argument("--repeat", type=int, default=3, help="runs per drain figure (best)")
    args = parser.parse_args(argv)
    drain_n, idle_s = (20_000, 5.0) if args.quick else (100_000, 15.0)
    start = perf()
    result = measure(drain_n, idle_s, max(1, args.repeat))
    wall_s = perf() - start
    print_report(result, args, wall_s)
    result["drain"] = {str(c): v for c, v in result["drain"].items()}
    print(json.dumps(result, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
