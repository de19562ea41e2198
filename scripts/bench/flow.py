#!/usr/bin/env python
"""Flow-control benchmark: what rate limits, per-key limits and priorities cost a drain, and
how exact the limits are.

Starts its own throwaway redis-server (``dueq.server.RedisServer``, free loopback port). Every
figure is measured in this run; throughput figures are the best of ``--repeat`` rounds, and
the rounds of all cases take turns so that outside load falls on each alike.

1. raw        pipelined ZPOPMIN 1000 + HMGET + HDEL of N due tasks (no leases, no acks)
2. drain      ``claim(1000)`` + ``ack_many`` of N due tasks, each case as a ratio to the
              unlimited drain (target >= 0.8x) and to the raw drain; and the CPU this process
              and Redis spent per task (the least of the rounds), whose inverse ratio to the
              unlimited case is the steadier figure when other work shares the machine:
              unlimited; a generous queue-wide ``rate`` (never binding); 10,000 limit keys with
              generous ``key_concurrency``/``key_rate`` (never binding); tasks spread over the
              ten priorities; and, for scale, 10,000 keys with ``key_concurrency=1`` (binding:
              most due tasks are parked and come back one at a time per key). Each timed
              drain (and the raw one) starts after a full ``gc.collect()``, so no case pays for
              the garbage of the untimed setup or of the case before it
3. accuracy   three consumer threads (each its own connection and Queue) claim while plenty is
              due: the most claims in any window of ``per`` against the queue-wide ``Rate``;
              and the smallest gap between two claims of one key against its ``key_rate``
4. server     Redis time per task in the claim and in the ack script of each drain case (INFO
              commandstats ``evalsha`` usec read between the calls, in untimed drains; the least
              of ``--repeat`` rounds)
5. memory     bytes per scheduled task (MEMORY USAGE of every key of the queue): plain, with a
              priority, with a limit key, and parked (the parked entry and its meta value)

    .venv/bin/python scripts/bench/flow.py [--quick] [--repeat N]

The table goes to stdout, then one JSON line with every figure; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from report import print_table

import dueq
from dueq import Queue, Task
from dueq.server import RedisServer

perf = time.perf_counter
Row = tuple[str, str, str, str]
KEYS = 10_000
TARGET_RATIO = 0.8


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def payload(i: int) -> dict[str, Any]:
    return {"k": "R", "tid": i, "payload": "x" * 100}


# -- 1. raw ----------------------------------------------------------------------------------


def raw_drain(r: redis.Redis, n: int) -> float:
    """Seconds for the raw drain of n tasks (loaded with pipelined ZADD + HSET first)."""
    r.flushdb()
    now_ms = int(time.time() * 1000)
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        pipe.zadd("raw:due", {f"t{i}": now_ms})
        pipe.hset("raw:tasks", f"t{i}", json.dumps(payload(i)))
        if i % 1000 == 999:
            pipe.execute()
    pipe.execute()
    settle_garbage()
    moved = 0
    start = perf()
    while moved < n:
        ids = [member for member, _ in r.zpopmin("raw:due", 1000)]
        pipe = r.pipeline(transaction=False)
        pipe.hmget("raw:tasks", ids)
        pipe.hdel("raw:tasks", *ids)
        pipe.execute()
        moved += len(ids)
    return perf() - start


# -- 2. drain --------------------------------------------------------------------------------

Setup = Callable[[Queue], None]
Make = Callable[[int], Task]


def plain(i: int) -> Task:
    return Task(payload(i))


def keyed(i: int) -> Task:
    return Task(payload(i), key=f"tenant:{i % KEYS}")


def prioritised(i: int) -> Task:
    return Task(payload(i), priority=i % 10)


def no_setup(q: Queue) -> None:
    pass


def generous_rate(q: Queue) -> None:
    q.configure(rate=dueq.Rate(1_000_000, per=1.0))


def generous_keys(q: Queue) -> None:
    q.configure(key_concurrency=1_000, key_rate=dueq.Rate(1_000_000, per=1.0))


def one_per_key(q: Queue) -> None:
    q.configure(key_concurrency=1)


CASES: dict[str, tuple[Setup, Make, str]] = {
    "unlimited": (no_setup, plain, "no limits"),
    "rate": (generous_rate, plain, "rate 1,000,000/s (not binding)"),
    "keys": (generous_keys, keyed, f"{KEYS:,} keys, key_concurrency 1000, key_rate 1M/s"),
    "priorities": (no_setup, prioritised, "tasks spread over priorities 0-9"),
    "keys_binding": (one_per_key, keyed, f"{KEYS:,} keys, key_concurrency 1 (parks)"),
}


def settle_garbage() -> None:
    """Collect what the untimed setup left (50,000 Tasks scheduled, the previous case's
    deliveries) before a timed drain, so that each case starts from the same collector state and
    pays only for the garbage its own drain makes. Without it a full collection (10-25 ms here)
    falls in whichever case happens to be running when the counters cross, by turns."""
    gc.collect()


def redis_cpu_s(r: redis.Redis) -> float:
    cpu = r.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def dueq_drain(r: redis.Redis, n: int, setup: Setup, make: Make) -> tuple[float, int, float]:
    """Seconds to claim + ack n due tasks, the claims it took, and the CPU microseconds per
    task this process and Redis spent together (steadier than seconds on a shared machine)."""
    r.flushdb()
    q = Queue("flow", r)
    setup(q)
    q.schedule_many(make(i) for i in range(n))
    settle_garbage()
    done = claims = 0
    redis_before = redis_cpu_s(r)
    cpu_start = time.process_time()
    start = perf()
    while done < n:
        batch = q.claim(1000)
        claims += 1
        if batch:
            done += q.ack_many(batch)
    elapsed = perf() - start
    cpu_s = time.process_time() - cpu_start + redis_cpu_s(r) - redis_before
    assert q.stats().scheduled == 0
    return elapsed, claims, cpu_s / n * 1e6


def server_us(r: redis.Redis) -> int:
    """Microseconds Redis has spent in EVALSHA so far (INFO commandstats)."""
    return int(r.info("commandstats").get("cmdstat_evalsha", {}).get("usec", 0))


def server_split(r: redis.Redis, n: int, setup: Setup, make: Make) -> tuple[float, float]:
    """Redis microseconds per task in claim.lua and in ack.lua over one drain of n tasks."""
    r.flushdb()
    q = Queue("flow", r)
    setup(q)
    q.schedule_many(make(i) for i in range(n))
    done = claim_us = ack_us = 0
    while done < n:
        before = server_us(r)
        batch = q.claim(1000)
        middle = server_us(r)
        if batch:
            done += q.ack_many(batch)
        claim_us += middle - before
        ack_us += server_us(r) - middle
    return claim_us / n, ack_us / n


# -- 3. accuracy -----------------------------------------------------------------------------


def consumers(server: RedisServer, seconds: float, setup: Setup, make: Make, n: int) -> list[Any]:
    """Three threads claim from one queue for ``seconds`` (sleeping until the next due time the
    claim reports); returns every delivery (its claimed_ms is the server's claim time)."""
    with server.client() as r:
        r.flushdb()
        q = Queue("acc", r)
        setup(q)
        q.schedule_many(make(i) for i in range(n))
    got: list[Any] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def run() -> None:
        with server.client() as client:
            q = Queue("acc", client)
            while time.monotonic() < stop:
                batch = q.claim_batch(100)
                if batch.deliveries:
                    q.ack_many(batch.deliveries)
                    with lock:
                        got.extend(batch.deliveries)
                elif batch.next_due_ms is not None:
                    wait_s = (batch.next_due_ms - batch.now_ms) / 1000
                    time.sleep(min(max(wait_s, 0.0), 0.05))
                else:
                    time.sleep(0.01)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got


def most_in_window(times_ms: list[int], window_ms: int) -> int:
    ordered = sorted(times_ms)
    best = start = 0
    for end, t in enumerate(ordered):
        while ordered[start] <= t - window_ms:
            start += 1
        best = max(best, end - start + 1)
    return best


# -- 4. memory -------------------------------------------------------------------------------


def stored_bytes(r: redis.Redis, q: Queue) -> int:
    """MEMORY USAGE (every element counted) of every key of the queue."""
    total = 0
    for key in q.keys.names():
        total += int(r.memory_usage(key, samples=0) or 0)
    return total


def memory_per_task(r: redis.Redis, n: int, make: Make, park: bool = False) -> float:
    """Bytes per task in the queue's keys: n scheduled tasks, or (``park``) n due tasks of one
    key with key_concurrency 1 after the claims that park all but one."""
    r.flushdb()
    q = Queue("mem", r)
    if park:
        q.configure(key_concurrency=1)
        q.schedule_many(Task(payload(i), key="one") for i in range(n + 1))
        while q.claim(1000):
            pass
        assert q.stats().leased == 1
        return (stored_bytes(r, q) - int(r.memory_usage(q.keys.config, samples=0) or 0)) / n
    q.schedule_many(make(i) for i in range(n))
    return stored_bytes(r, q) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="about 10x smaller")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per case (best counts)")
    args = parser.parse_args()
    n = 5_000 if args.quick else 50_000
    rows: list[Row] = []
    figures: dict[str, Any] = {"tasks": n, "keys": KEYS}
    with RedisServer() as server, server.client() as r:
        best: dict[str, float] = {}
        claims: dict[str, int] = {}
        cpu: dict[str, float] = {}
        for round_ in range(args.repeat):
            progress(f"round {round_ + 1}/{args.repeat}")
            best["raw"] = min(best.get("raw", 1e9), raw_drain(r, n))
            for name, (setup, make, _) in CASES.items():
                elapsed, calls, cpu_us = dueq_drain(r, n, setup, make)
                cpu[name] = min(cpu.get(name, 1e9), cpu_us)
                if elapsed < best.get(name, 1e9):
                    best[name], claims[name] = elapsed, calls
        rate = {name: n / s for name, s in best.items()}
        figures["tasks_per_s"] = rate
        figures["claims"] = claims
        figures["cpu_us_per_task"] = cpu
        rows.append(("raw", f"{rate['raw']:,.0f} tasks/s", "ZPOPMIN 1000 + HMGET + HDEL", ""))
        for name, (_, _, detail) in CASES.items():
            ratio = rate[name] / rate["unlimited"]
            vs_raw = rate[name] / rate["raw"]
            cpu_ratio = cpu["unlimited"] / cpu[name]
            figures[f"{name}_ratio"] = ratio
            figures[f"{name}_cpu_ratio"] = cpu_ratio
            target = "" if name in ("unlimited", "keys_binding") else f">= {TARGET_RATIO}x"
            rows.append(
                (
                    f"drain {name}",
                    f"{rate[name]:,.0f} tasks/s ({ratio:.2f}x unlimited, {vs_raw:.2f}x raw); "
                    f"CPU {cpu[name]:.1f} us/task ({cpu_ratio:.2f}x)",
                    f"{detail}; {claims[name]} claims",
                    target,
                )
            )

        progress("server time per script")
        split: dict[str, tuple[float, float]] = {}
        for _ in range(args.repeat):
            for name, (setup, make, _) in CASES.items():
                claim_us, ack_us = server_split(r, n, setup, make)
                old_claim, old_ack = split.get(name, (1e9, 1e9))
                split[name] = (min(old_claim, claim_us), min(old_ack, ack_us))
        figures["server_us_per_task"] = {
            name: {"claim": c, "ack": a} for name, (c, a) in split.items()
        }
        for name, (claim_us, ack_us) in split.items():
            rows.append(
                (
                    f"server {name}",
                    f"claim {claim_us:.1f} us + ack {ack_us:.1f} us per task",
                    "Redis time in claim.lua and ack.lua (commandstats)",
                    "",
                )
            )

        progress("accuracy: queue-wide rate")
        limit = dueq.Rate(200, per=0.5)
        got = consumers(
            server, 3.0, lambda q: q.configure(rate=limit), plain, 5_000 if args.quick else 20_000
        )
        times = [d.claimed_ms for d in got]
        most = most_in_window(times, limit.per_ms)
        first = min(times)
        windows = [0] * ((max(times) - first) // limit.per_ms + 1)
        for t in times:
            windows[(t - first) // limit.per_ms] += 1
        full = windows[:-1] or windows  # the last window was cut short by the end of the run
        figures["rate_most_in_window"] = most
        figures["rate_claims_per_window"] = full
        rows.append(
            (
                "rate accuracy",
                f"most {most} claims in any {limit.per_ms} ms window (limit {limit.n}); "
                f"windows from the first claim held {min(full)} to {max(full)}",
                f"3 consumer threads, {len(times)} claims in 3 s",
                f"<= {limit.n}",
            )
        )

        progress("accuracy: key_rate")
        key_limit = dueq.Rate(20, per=1.0)
        got = consumers(
            server,
            2.0,
            lambda q: q.configure(key_rate=key_limit),
            lambda i: Task(payload(i), key=f"k{i % 3}"),
            300,
        )
        gaps = []
        for key in ("k0", "k1", "k2"):
            times = sorted(d.claimed_ms for d in got if d.key == key)
            gaps += [b - a for a, b in itertools.pairwise(times)]
        smallest = min(gaps) if gaps else 0
        most_key = max(
            most_in_window([d.claimed_ms for d in got if d.key == key], key_limit.per_ms)
            for key in ("k0", "k1", "k2")
        )
        figures["key_rate_smallest_gap_ms"] = smallest
        figures["key_rate_most_in_window"] = most_key
        rows.append(
            (
                "key_rate accuracy",
                f"smallest gap {smallest} ms between claims of a key (limit spacing 50 ms); "
                f"most {most_key} per 1 s window",
                f"3 keys, 3 consumer threads, {len(got)} claims in 2 s",
                f">= 50 ms; <= {key_limit.n}",
            )
        )

        progress("memory")
        m = max(n // 5, 1000)
        mem = {
            "plain": memory_per_task(r, m, plain),
            "priority": memory_per_task(r, m, lambda i: Task(payload(i), priority=5)),
            "key": memory_per_task(r, m, lambda i: Task(payload(i), key=f"tenant:{i % KEYS}")),
            "parked": memory_per_task(r, m, plain, park=True),
        }
        figures["bytes_per_task"] = mem
        for name, value in mem.items():
            extra = value - mem["plain"]
            rows.append(
                (
                    f"memory {name}",
                    f"{value:,.0f} B per task ({extra:+,.0f} B vs plain)",
                    f"{m:,} tasks, MEMORY USAGE of the queue's keys",
                    "",
                )
            )
    print_table(rows)
    print(json.dumps(figures, sort_keys=True))


if __name__ == "__main__":
    main()
