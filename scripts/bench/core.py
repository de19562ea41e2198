#!/usr/bin/env python
"""Core dueq benchmark: scheduling throughput, drain throughput, claim latency, memory per task.

Starts its own throwaway redis-server (``dueq.server.RedisServer``, free loopback port) and
never touches any other server. Every figure is measured in this run. Sections:

1. baseline   redis-py pipelined ZADD + HSET per task (transaction=False, executed every
              1,000 tasks); the loop also generates the id and JSON-encodes the payload, like
              ``schedule_many`` does, so both sides do the same client-side work
2. schedule   ``Queue.schedule_many`` (generated ids, and explicit ids), ratio to the baseline;
              ``Queue.schedule`` once per task, ratio to one ZADD + HSET pipeline per task
3. drain      ``claim(limit)`` + ``ack_many`` of due tasks in one process, limits 100/500/1000;
              ratio to a raw drain (pipelined ZPOPMIN 1000 + HMGET + HDEL, no leases or acks)
4. latency    one ``claim(limit=100)`` (and claim + ``ack_many``) with 1k vs 1M far-future
              tasks in the due set; server-side claim time from SLOWLOG as well
5. memory     INFO ``used_memory`` per task beyond the payload bytes (scheduled and leased),
              per key from ``MEMORY USAGE``, and the baseline layout for comparison
6. views     what the per-minute history and the lease holder cost: schedule_many and
              claim(1000) + ack_many throughput of one queue as shipped ("with") and one whose
              scripts have history_use made a no-op and whose claims name no holder
              ("without", scripts/bench/views.py's ``without_views``), taking turns in one run;
              bytes: the holder's share of each leased task's meta value (MEMORY USAGE of the
              meta hash, with and without), and MEMORY USAGE of the history hash after the
              run and after a full day (1,440 simulated minutes, all six counters in each)
7. redis cost  server time and server CPU per task (INFO commandstats, used_cpu) of claim +
              ack and schedule, plain, keyed and with each feature on (events, results, batch,
              priorities, key limits), next to the raw pipelines' in the same run
              (scripts/bench/redis_cost.py; its --redis-url runs the same under callgrind)
A1-A5         the same for the asyncio front end: ``AsyncQueue`` on a ``redis.asyncio`` client,
              every call awaited on one event loop, each ratio against the same raw pipelines
              on ``redis.asyncio`` in this run (server-side claim time and the memory sweep
              are the sync sections': the same scripts write the same data). Sync and async
              runs take turns (one of each per round), so that load from outside the
              benchmark falls on both alike

Throughput figures are the best of ``--repeat`` runs (like ``timeit``). ``--quick`` shrinks the
sizes about 10x for a smoke run; ``--profile`` adds cProfile tables of schedule_many and drain;
``--views-only`` runs section 6 alone (its rounds: ``--repeat``, at least 5).

    .venv/bin/python scripts/bench/core.py [--quick] [--repeat N] [--profile] [--views-only]

The table goes to stdout, followed by one JSON line with every figure; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import hashlib
import json
import os
import platform
import pstats
import statistics
import sys
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import asdict, dataclass
from datetime import timedelta
from functools import partial
from typing import Any, TypeVar

import redis
import redis.asyncio
from redis_cost import measure as measure_redis_cost
from redis_cost import print_table as print_redis_cost
from report import percentile, print_table
from views import meta_bytes_per_leased_task, one_round, without_views

import dueq
from dueq import AsyncQueue, Queue, Task
from dueq._util.checks import MAX_HOLDER_LENGTH
from dueq._wire.envelope import generated_ids
from dueq._wire.scripts import script_source
from dueq.server import RedisServer

perf = time.perf_counter
Row = tuple[str, str, str, str]

FAR_FUTURE = timedelta(days=365)  # future tasks are due in a year: never claimed here
PIPELINE_EVERY = 1000
FUTURE_BATCH = 50_000  # tasks per schedule_many call when loading the far-future tasks
DRAIN_LIMITS = (100, 500, 1000)
LATENCY_LIMIT = 100
LATENCY_WARMUP_ROUNDS = 20
SLOWLOG_ENTRIES_PER_ROUND = 50

TARGETS = {
    "schedule_ratio_min": 2.5,
    "drain_tasks_per_s_min": 40_000,
    "claim_latency_ratio_max": 1.3,
    "memory_bytes_per_task_max": 200,
    "views_cost_pct_max": 10.0,
    "views_bytes_per_task_max": 40.0,
}
#: Section 6: fewest rounds (each with and without), and minutes in the history's window.
VIEWS_MIN_ROUNDS = 5
HISTORY_DAY_MINUTES = 1440


@dataclass(frozen=True)
class Sizes:
    schedule: int
    schedule_one: int
    drain: int
    future_small: int
    future_big: int
    latency_rounds: int
    memory: int


FULL = Sizes(
    schedule=100_000,
    schedule_one=5_000,
    drain=50_000,
    future_small=1_000,
    future_big=1_000_000,
    latency_rounds=1_000,
    memory=100_000,
)
QUICK = Sizes(
    schedule=10_000,
    schedule_one=500,
    drain=5_000,
    future_small=1_000,
    future_big=100_000,
    latency_rounds=200,
    memory=10_000,
)


#: Payload JSON sizes (bytes) for the memory sweep.
MEMORY_SWEEP_BYTES = (16, 40, 64, 84, 100, 128, 160, 200, 256, 300, 400, 512)


def payload(i: int) -> dict[str, Any]:
    """A small JSON payload; the same encoded length for every i below 90 million."""
    return {
        "user_id": 10_000_000 + i,
        "action": "send_welcome_email",
        "locale": "en-GB",
        "retries_left": 3,
    }


_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
PAYLOAD_BYTES = len(_encode(payload(0)).encode("utf-8"))


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def sha1(source: str) -> str:
    return hashlib.sha1(source.encode("utf-8")).hexdigest()


def used_memory(r: redis.Redis) -> int:
    """Redis's used_memory, read on a new connection.

    Closing the old connections first frees their server-side query buffers (a 1,000-task
    batch leaves several hundred KB there), which would otherwise count as task memory.
    """
    r.connection_pool.disconnect()
    return int(r.info("memory")["used_memory"])


def server_usec(r: redis.Redis, commands: Iterable[str]) -> int:
    """Server time (µs) spent in these commands since the last CONFIG RESETSTAT."""
    stats = r.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("usec", 0)) for c in commands)


# -- 1. baseline ---------------------------------------------------------------------------------


def run_baseline(r: redis.Redis, payloads: list[dict[str, Any]]) -> dict[str, float]:
    r.flushdb()
    r.config_resetstat()
    due, tasks = "baseline:due", "baseline:tasks"
    now_ms = int(time.time() * 1000)
    pipe = r.pipeline(transaction=False)
    start = perf()
    fresh_ids = generated_ids()  # the same id source as schedule_many
    for i, p in enumerate(payloads, 1):
        task_id = next(fresh_ids)
        pipe.zadd(due, {task_id: now_ms})
        pipe.hset(tasks, task_id, _encode(p))
        if i % PIPELINE_EVERY == 0:
            pipe.execute()
    pipe.execute()
    elapsed = perf() - start
    assert r.zcard(due) == len(payloads) == r.hlen(tasks)
    return {"seconds": elapsed, "server_s": server_usec(r, ("zadd", "hset")) / 1e6}


# -- 2. schedule_many ----------------------------------------------------------------------------


def run_schedule(
    r: redis.Redis, payloads: list[dict[str, Any]], ids: list[str] | None
) -> dict[str, float]:
    r.flushdb()
    q = Queue("bench", r)
    r.config_resetstat()
    start = perf()
    if ids is None:
        result = q.schedule_many(Task(p) for p in payloads)
    else:
        result = q.schedule_many(Task(p, id=i) for p, i in zip(payloads, ids, strict=True))
    elapsed = perf() - start
    assert result.added == len(payloads) == r.zcard(q.keys.due)
    return {"seconds": elapsed, "server_s": server_usec(r, ("evalsha", "eval")) / 1e6}


def run_schedule_one(r: redis.Redis, payloads: list[dict[str, Any]]) -> dict[str, float]:
    """``Queue.schedule`` once per task: one round trip each, as a request handler does."""
    r.flushdb()
    q = Queue("bench", r)
    r.config_resetstat()
    start = perf()
    for p in payloads:
        q.schedule(p)
    elapsed = perf() - start
    assert r.zcard(q.keys.due) == len(payloads)
    return {"seconds": elapsed, "server_s": server_usec(r, ("evalsha", "eval")) / 1e6}


P = TypeVar("P", redis.client.Pipeline, redis.asyncio.client.Pipeline)
T = TypeVar("T")


def raw_add(pipe: P, task_id: str, body: dict[str, Any]) -> P:
    """Queue a ZADD + HSET of one task (due now) in the raw layout on ``pipe``."""
    pipe.zadd("baseline:due", {task_id: int(time.time() * 1000)})
    pipe.hset("baseline:tasks", task_id, _encode(body))
    return pipe


def run_baseline_one(r: redis.Redis, payloads: list[dict[str, Any]]) -> dict[str, float]:
    """The raw counterpart of ``run_schedule_one``: one ZADD + HSET pipeline per task."""
    r.flushdb()
    r.config_resetstat()
    fresh_ids = generated_ids()
    start = perf()
    for p in payloads:
        raw_add(r.pipeline(transaction=False), next(fresh_ids), p).execute()
    elapsed = perf() - start
    assert r.zcard("baseline:due") == len(payloads)
    return {"seconds": elapsed, "server_s": server_usec(r, ("zadd", "hset")) / 1e6}


# -- 3. drain ------------------------------------------------------------------------------------


def run_raw_drain(r: redis.Redis, payloads: list[dict[str, Any]]) -> dict[str, float]:
    """Raw baseline of the drain: pipelined ZPOPMIN 1000 + HMGET + HDEL (no leases, no acks)."""
    r.flushdb()
    q = Queue("raw", r)
    q.schedule_many(Task(p) for p in payloads)
    due, tasks = q.keys.due, q.keys.tasks
    r.config_resetstat()
    moved = 0
    start = perf()
    while moved < len(payloads):
        ids = [member for member, _ in r.zpopmin(due, 1000)]
        pipe = r.pipeline(transaction=False)
        pipe.hmget(tasks, ids)
        pipe.hdel(tasks, *ids)
        pipe.execute()
        moved += len(ids)
    elapsed = perf() - start
    return {"seconds": elapsed, "server_s": server_usec(r, ("zpopmin", "hmget", "hdel")) / 1e6}


def drain(q: Queue, limit: int) -> tuple[int, int]:
    done = rounds = 0
    while True:
        batch = q.claim(limit=limit)
        if not batch:
            return done, rounds
        done += q.ack_many(batch)
        rounds += 1


def run_drain(r: redis.Redis, payloads: list[dict[str, Any]], limit: int) -> dict[str, float]:
    r.flushdb()
    q = Queue("drain", r)
    q.schedule_many(Task(p) for p in payloads)  # delay 0: due now
    q.check_server()  # the one-off CONFIG GET of the first claim, outside the timing
    r.config_resetstat()
    start = perf()
    done, rounds = drain(q, limit)
    elapsed = perf() - start
    assert done == len(payloads), (done, len(payloads))
    return {
        "seconds": elapsed,
        "rounds": rounds,
        "server_s": server_usec(r, ("evalsha", "eval")) / 1e6,
    }


# -- 4. claim latency ----------------------------------------------------------------------------


def load_future(q: Queue, count: int) -> float:
    """Add ``count`` far-future tasks with ``schedule_many`` in batches; returns seconds."""
    body = payload(0)
    start = perf()
    for first in range(0, count, FUTURE_BATCH):
        size = min(FUTURE_BATCH, count - first)
        result = q.schedule_many(Task(body, delay=FAR_FUTURE) for _ in range(size))
        assert result.added == size
    elapsed = perf() - start
    assert q.redis.zcard(q.keys.due) == count
    return elapsed


def latency_spread(claim_s: list[float], round_s: list[float]) -> dict[str, float]:
    """Median and p99 (ms) of the claim times and of the claim + ack times."""
    return {
        "claim_median_ms": statistics.median(claim_s) * 1e3,
        "claim_p99_ms": percentile(claim_s, 99) * 1e3,
        "round_median_ms": statistics.median(round_s) * 1e3,
        "round_p99_ms": percentile(round_s, 99) * 1e3,
    }


def run_latency(r: redis.Redis, future: int, rounds: int) -> dict[str, Any]:
    r.flushdb()
    q = Queue("latency", r)
    load_s = load_future(q, future)
    due_count = (rounds + LATENCY_WARMUP_ROUNDS) * LATENCY_LIMIT
    q.schedule_many(Task(payload(i)) for i in range(due_count))
    q.check_server()
    claim_sha = sha1(script_source("claim"))
    for _ in range(LATENCY_WARMUP_ROUNDS):
        q.ack_many(q.claim(limit=LATENCY_LIMIT))
    # Log every command to read the server-side time of each claim call (restored below).
    old_slower = str(r.config_get("slowlog-log-slower-than")["slowlog-log-slower-than"])
    old_len = str(r.config_get("slowlog-max-len")["slowlog-max-len"])
    r.config_set("slowlog-log-slower-than", 0)
    # Commands run inside the scripts are logged too (about a dozen per claim + ack round).
    slowlog_len = SLOWLOG_ENTRIES_PER_ROUND * rounds + 1000
    r.config_set("slowlog-max-len", slowlog_len)
    r.slowlog_reset()
    claim_s: list[float] = []
    round_s: list[float] = []
    gc.collect()
    gc.disable()
    try:
        for _ in range(rounds):
            t0 = perf()
            batch = q.claim(limit=LATENCY_LIMIT)
            t1 = perf()
            q.ack_many(batch)
            t2 = perf()
            assert len(batch) == LATENCY_LIMIT, len(batch)
            claim_s.append(t1 - t0)
            round_s.append(t2 - t0)
    finally:
        gc.enable()
        entries = r.slowlog_get(slowlog_len)
        r.config_set("slowlog-log-slower-than", old_slower)
        r.config_set("slowlog-max-len", old_len)
    server_claim_us = [
        float(e["duration"])
        for e in entries
        if text(e["command"]).split(" ", 2)[:2] == ["EVALSHA", claim_sha]
    ]
    assert len(server_claim_us) == rounds, (len(server_claim_us), rounds)
    assert r.zcard(q.keys.due) == future
    return {
        "future": future,
        "load_s": load_s,
        **latency_spread(claim_s, round_s),
        "server_claim_median_us": statistics.median(server_claim_us),
        "server_claim_p99_us": percentile(server_claim_us, 99),
    }


# -- 5. memory -----------------------------------------------------------------------------------


def key_usage(r: redis.Redis, keys: dict[str, str]) -> dict[str, int]:
    return {name: int(r.memory_usage(key, samples=0) or 0) for name, key in keys.items()}


def run_memory(r: redis.Redis, n: int) -> dict[str, Any]:
    r.flushdb()
    q = Queue("memory", r)
    k = q.keys
    keys = {"due": k.due, "tasks": k.tasks, "meta": k.meta, "leased": k.leased, "stats": k.stats}
    before = used_memory(r)
    result = q.schedule_many(Task(payload(i)) for i in range(n))
    scheduled = used_memory(r)
    scheduled_keys = key_usage(r, keys)
    envelope = r.hget(k.tasks, result.ids[0]) or b""
    while q.claim(limit=1000):  # lease everything, no ack: the leased state
        pass
    assert r.zcard(k.leased) == n
    leased = used_memory(r)
    leased_keys = key_usage(r, keys)

    r.flushdb()
    base_before = used_memory(r)
    pipe = r.pipeline(transaction=False)
    now_ms = int(time.time() * 1000)
    fresh_ids = generated_ids()
    for i in range(n):
        task_id = next(fresh_ids)
        pipe.zadd("baseline:due", {task_id: now_ms})
        pipe.hset("baseline:tasks", task_id, _encode(payload(i)))
        if (i + 1) % PIPELINE_EVERY == 0:
            pipe.execute()
    pipe.execute()
    base_after = used_memory(r)
    base_keys = key_usage(r, {"due": "baseline:due", "tasks": "baseline:tasks"})

    def per_task(total: int) -> float:
        return total / n - PAYLOAD_BYTES

    return {
        "n": n,
        "payload_bytes": PAYLOAD_BYTES,
        "id_bytes": len(result.ids[0]),
        "envelope_bytes": len(envelope),
        "scheduled_beyond_payload": per_task(scheduled - before),
        "leased_beyond_payload": per_task(leased - before),
        "baseline_beyond_payload": per_task(base_after - base_before),
        "scheduled_keys_per_task": {name: b / n for name, b in scheduled_keys.items()},
        "leased_keys_per_task": {name: b / n for name, b in leased_keys.items()},
        "baseline_keys_per_task": {name: b / n for name, b in base_keys.items()},
    }


def run_memory_sweep(r: redis.Redis, n: int) -> dict[str, dict[str, float]]:
    """Bytes per scheduled task beyond its payload, dueq vs the raw ZADD+HSET layout, for a
    spread of payload sizes.

    Redis rounds every allocation up to a size class, so one payload size can land just under
    or just over a class boundary; both layouts pay that rounding, so compare them size by size.
    """
    out: dict[str, dict[str, float]] = {"dueq": {}, "baseline": {}}
    now_ms = int(time.time() * 1000)
    for size in MEMORY_SWEEP_BYTES:
        body = {"f": "x" * max(size - 8, 0)}  # {"f":""} is 8 bytes of JSON
        r.flushdb()
        before = used_memory(r)
        Queue("memory", r).schedule_many(Task(body) for _ in range(n))
        out["dueq"][str(size)] = (used_memory(r) - before) / n - size
        r.flushdb()
        before = used_memory(r)
        pipe = r.pipeline(transaction=False)
        fresh_ids = generated_ids()
        encoded = _encode(body)
        for i in range(n):
            task_id = next(fresh_ids)
            pipe.zadd("baseline:due", {task_id: now_ms})
            pipe.hset("baseline:tasks", task_id, encoded)
            if (i + 1) % PIPELINE_EVERY == 0:
                pipe.execute()
        pipe.execute()
        out["baseline"][str(size)] = (used_memory(r) - before) / n - size
    r.flushdb()
    return out


# -- 6. history and lease holder ---------------------------------------------------------------


def run_views(r: redis.Redis, n: int, rounds: int) -> dict[str, Any]:
    """Throughput with and without the history and the holder, taking turns (the order flips
    every round), best of ``rounds``; then the bytes they add."""
    r.flushdb()
    on = Queue("with", r)
    off = without_views(Queue("without", r), r)
    on.check_server()
    off.check_server()
    best_of: dict[str, dict[str, float]] = {"with": {}, "without": {}}
    for round_no in range(rounds):
        order = [("with", on), ("without", off)]
        for label, q in order if round_no % 2 else order[::-1]:
            for metric, value in one_round(q, r, n).items():
                best_of[label][metric] = max(best_of[label].get(metric, value), value)
    history_run = int(r.memory_usage(on.keys.history, samples=0) or 0)
    meta_on = meta_bytes_per_leased_task(on, r, n, None)
    holder = on.list_tasks("leased", limit=1).tasks[0].holder or ""
    meta_off = meta_bytes_per_leased_task(off, r, n, None)
    meta_longest = meta_bytes_per_leased_task(on, r, n, "w" * MAX_HOLDER_LENGTH)
    w, wo = best_of["with"], best_of["without"]
    r.flushdb()
    return {
        "tasks": n,
        "rounds": rounds,
        "with": {**w, **positive(w)},
        "without": {**wo, **positive(wo)},
        # how much slower "with" is: fewer tasks per second, or more server time per task
        "cost_pct": {k: 100 * (1 - w[f"{k}_per_s"] / wo[f"{k}_per_s"]) for k in SW},
        "server_cost_pct": {
            k: 100 * (w[f"{k}_server_us_per_task"] / wo[f"{k}_server_us_per_task"] - 1) for k in SW
        },
        "redis_cpu_cost_pct": {
            k: 100 * (w[f"{k}_redis_cpu_us_per_task"] / wo[f"{k}_redis_cpu_us_per_task"] - 1)
            for k in SW
        },
        "holder": holder,
        "meta_bytes_per_leased_task": {"with": meta_on, "without": meta_off},
        "holder_bytes_per_task": meta_on - meta_off,
        "longest_holder_bytes_per_task": meta_longest - meta_off,
        "history_bytes_after_run": history_run,
        "history_bytes_full_day": history_day_bytes(r),
    }


#: The two throughputs section 6 compares.
SW = ("schedule", "drain")


def positive(best_of: dict[str, float]) -> dict[str, dict[str, float]]:
    """The per-task times of one variant as positive numbers (``one_round`` negates them so
    that the best is the largest)."""
    return {
        name: {k: -best_of[f"{k}_{name}"] for k in SW}
        for name in ("server_us_per_task", "redis_cpu_us_per_task")
    }


def history_day_bytes(r: redis.Redis) -> int:
    """MEMORY USAGE of a history hash holding a full day: 1,440 minutes on a simulated clock,
    each counting all six events (scheduled, claimed, acked, retried, dead, expired)."""
    r.flushdb()
    now = [1_800_000_000.0]
    q = Queue("day", r, clock=lambda: now[0], lease=1, retry=dueq.RetryPolicy(max_attempts=2))
    for minute in range(HISTORY_DAY_MINUTES):
        q.schedule_many(Task(minute, id=f"{kind}{minute}") for kind in "abc")
        for d in q.claim(10):  # also reclaims the last minute's held lease: expired, dead
            if d.id.startswith("a"):
                d.ack()
            elif d.id.startswith("b"):
                q.fail(d, dueq.Unrecoverable("dead"))
            else:
                q.fail(d, "again", retry_in=1)  # retried
        now[0] += 2
        assert len(q.claim(10)) == 1  # c again; its lease (1 s) runs out unsettled
        now[0] += 58
    now[0] -= 60  # back in the last minute written: the window holds all 1,440
    points = q.history(HISTORY_DAY_MINUTES)
    assert all(p.scheduled == 3 and p.retried == 1 for p in points)
    assert all(p.expired == 1 for p in points[1:])  # the minute before's lease
    size = int(r.memory_usage(q.keys.history, samples=0) or 0)
    r.flushdb()
    return size


# -- the asyncio front end -----------------------------------------------------------------------
#
# The same sections on ``AsyncQueue`` and a ``redis.asyncio`` client, each against its raw
# counterpart on ``redis.asyncio`` (the same pipelines, awaited), all on one event loop.


async def async_server_usec(client: redis.asyncio.Redis, commands: Iterable[str]) -> int:
    stats = await client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("usec", 0)) for c in commands)


async def async_used_memory(client: redis.asyncio.Redis) -> int:
    """As ``used_memory``: on a new connection, after closing the old ones."""
    await client.connection_pool.disconnect()
    return int((await client.info("memory"))["used_memory"])


async def run_async_baseline(
    client: redis.asyncio.Redis, payloads: list[dict[str, Any]]
) -> dict[str, float]:
    await client.flushdb()
    await client.config_resetstat()
    due, tasks = "baseline:due", "baseline:tasks"
    now_ms = int(time.time() * 1000)
    pipe = client.pipeline(transaction=False)
    start = perf()
    fresh_ids = generated_ids()
    for i, p in enumerate(payloads, 1):
        task_id = next(fresh_ids)
        pipe.zadd(due, {task_id: now_ms})
        pipe.hset(tasks, task_id, _encode(p))
        if i % PIPELINE_EVERY == 0:
            await pipe.execute()
    await pipe.execute()
    elapsed = perf() - start
    assert await client.zcard(due) == len(payloads)
    return {"seconds": elapsed, "server_s": await async_server_usec(client, ("zadd", "hset")) / 1e6}


async def run_async_schedule(
    client: redis.asyncio.Redis, payloads: list[dict[str, Any]], ids: list[str] | None
) -> dict[str, float]:
    await client.flushdb()
    q = AsyncQueue("bench", client)
    await client.config_resetstat()
    start = perf()
    if ids is None:
        result = await q.schedule_many(Task(p) for p in payloads)
    else:
        result = await q.schedule_many(Task(p, id=i) for p, i in zip(payloads, ids, strict=True))
    elapsed = perf() - start
    assert result.added == len(payloads) == await client.zcard(q.keys.due)
    return {"seconds": elapsed, "server_s": await async_server_usec(client, ("evalsha",)) / 1e6}


async def run_async_schedule_one(
    client: redis.asyncio.Redis, payloads: list[dict[str, Any]]
) -> dict[str, float]:
    await client.flushdb()
    q = AsyncQueue("bench", client)
    await client.config_resetstat()
    start = perf()
    for p in payloads:
        await q.schedule(p)
    elapsed = perf() - start
    assert await client.zcard(q.keys.due) == len(payloads)
    return {"seconds": elapsed, "server_s": await async_server_usec(client, ("evalsha",)) / 1e6}


async def run_async_baseline_one(
    client: redis.asyncio.Redis, payloads: list[dict[str, Any]]
) -> dict[str, float]:
    await client.flushdb()
    await client.config_resetstat()
    fresh_ids = generated_ids()
    start = perf()
    for p in payloads:
        await raw_add(client.pipeline(transaction=False), next(fresh_ids), p).execute()
    elapsed = perf() - start
    assert await client.zcard("baseline:due") == len(payloads)
    return {"seconds": elapsed, "server_s": await async_server_usec(client, ("zadd", "hset")) / 1e6}


async def async_drain(q: AsyncQueue, limit: int) -> tuple[int, int]:
    done = rounds = 0
    while batch := await q.claim(limit=limit):
        done += await q.ack_many(batch)
        rounds += 1
    return done, rounds


async def run_async_drain(
    client: redis.asyncio.Redis, payloads: list[dict[str, Any]], limit: int
) -> dict[str, float]:
    await client.flushdb()
    q = AsyncQueue("drain", client)
    await q.schedule_many(Task(p) for p in payloads)
    await q.check_server()
    await client.config_resetstat()
    start = perf()
    done, rounds = await async_drain(q, limit)
    elapsed = perf() - start
    assert done == len(payloads), (done, len(payloads))
    return {
        "seconds": elapsed,
        "rounds": rounds,
        "server_s": await async_server_usec(client, ("evalsha",)) / 1e6,
    }


async def run_async_raw_drain(
    client: redis.asyncio.Redis, payloads: list[dict[str, Any]]
) -> dict[str, float]:
    await client.flushdb()
    q = AsyncQueue("raw", client)
    await q.schedule_many(Task(p) for p in payloads)
    due, tasks = q.keys.due, q.keys.tasks
    await client.config_resetstat()
    moved = 0
    start = perf()
    while moved < len(payloads):
        ids = [member for member, _ in await client.zpopmin(due, 1000)]
        pipe = client.pipeline(transaction=False)
        pipe.hmget(tasks, ids)
        pipe.hdel(tasks, *ids)
        await pipe.execute()
        moved += len(ids)
    elapsed = perf() - start
    raw_commands = ("zpopmin", "hmget", "hdel")
    return {"seconds": elapsed, "server_s": await async_server_usec(client, raw_commands) / 1e6}


async def run_async_latency(
    client: redis.asyncio.Redis, future: int, rounds: int
) -> dict[str, Any]:
    """Client-side claim latency on the async front end (the server-side time of the claim
    script is the sync section's: the same script on the same data)."""
    await client.flushdb()
    q = AsyncQueue("latency", client)
    body = payload(0)
    start = perf()
    for first in range(0, future, FUTURE_BATCH):
        size = min(FUTURE_BATCH, future - first)
        await q.schedule_many(Task(body, delay=FAR_FUTURE) for _ in range(size))
    load_s = perf() - start
    due_count = (rounds + LATENCY_WARMUP_ROUNDS) * LATENCY_LIMIT
    await q.schedule_many(Task(payload(i)) for i in range(due_count))
    await q.check_server()
    for _ in range(LATENCY_WARMUP_ROUNDS):
        await q.ack_many(await q.claim(limit=LATENCY_LIMIT))
    claim_s: list[float] = []
    round_s: list[float] = []
    gc.collect()
    gc.disable()
    try:
        for _ in range(rounds):
            t0 = perf()
            batch = await q.claim(limit=LATENCY_LIMIT)
            t1 = perf()
            await q.ack_many(batch)
            t2 = perf()
            assert len(batch) == LATENCY_LIMIT, len(batch)
            claim_s.append(t1 - t0)
            round_s.append(t2 - t0)
    finally:
        gc.enable()
    assert await client.zcard(q.keys.due) == future
    return {
        "future": future,
        "load_s": load_s,
        "load_tasks_per_s": future / load_s,
        **latency_spread(claim_s, round_s),
    }


async def run_async_memory(client: redis.asyncio.Redis, n: int) -> dict[str, Any]:
    """Bytes per task beyond the payload, scheduled and leased through ``AsyncQueue``."""
    await client.flushdb()
    q = AsyncQueue("memory", client)
    before = await async_used_memory(client)
    await q.schedule_many(Task(payload(i)) for i in range(n))
    scheduled = await async_used_memory(client)
    while await q.claim(limit=1000):  # lease everything, no ack: the leased state
        pass
    assert await client.zcard(q.keys.leased) == n
    leased = await async_used_memory(client)
    return {
        "n": n,
        "scheduled_beyond_payload": (scheduled - before) / n - PAYLOAD_BYTES,
        "leased_beyond_payload": (leased - before) / n - PAYLOAD_BYTES,
    }


# -- profiling -----------------------------------------------------------------------------------


def profile(title: str, fn: Callable[[], object], top: int = 18) -> None:
    print(f"\n== cProfile: {title} (sorted by tottime) ==")
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    pstats.Stats(prof, stream=sys.stdout).strip_dirs().sort_stats("tottime").print_stats(top)


def run_profiles(r: redis.Redis, sizes: Sizes) -> None:
    payloads = [payload(i) for i in range(sizes.schedule)]
    r.flushdb()
    q = Queue("profile", r)
    profile(
        f"schedule_many of {sizes.schedule:,} tasks",
        lambda: q.schedule_many(Task(p) for p in payloads),
    )
    r.flushdb()
    q.schedule_many(Task(p) for p in payloads[: sizes.drain])
    q.check_server()
    profile(f"drain of {sizes.drain:,} tasks, limit 1000", lambda: drain(q, 1000))


# -- report --------------------------------------------------------------------------------------


def hiredis_state() -> str:
    try:
        import hiredis  # type: ignore[import-not-found]
    except ImportError:
        return "no (pure-Python RESP parser and packer)"
    used = "used by redis-py" if redis.utils.HIREDIS_AVAILABLE else "NOT used by redis-py"
    return f"yes ({getattr(hiredis, '__version__', '?')}, {used})"


def best(runs: list[dict[str, float]], n: int) -> dict[str, Any]:
    """The fastest of several runs of ``n`` tasks, with every run's rate."""
    top = min(runs, key=lambda run: run["seconds"])
    return {
        "tasks_per_s": n / top["seconds"],
        "seconds": top["seconds"],
        "server_us_per_task": top["server_s"] / n * 1e6,
        "all_tasks_per_s": [n / run["seconds"] for run in runs],
    }


def summary(runs: dict[str, Any], sizes: Sizes) -> dict[str, Any]:
    """Best runs and ratios to the raw baselines of one front end (the same keys for both)."""
    n, n_one, n_drain = sizes.schedule, sizes.schedule_one, sizes.drain
    base = best(runs["baseline"], n)
    gen = best(runs["schedule_generated"], n)
    exp = best(runs["schedule_explicit"], n)
    gen["ratio"] = gen["tasks_per_s"] / base["tasks_per_s"]
    exp["ratio"] = exp["tasks_per_s"] / base["tasks_per_s"]
    base_one = best(runs["baseline_one"], n_one)
    one = best(runs["schedule_one"], n_one)
    one["ratio"] = one["tasks_per_s"] / base_one["tasks_per_s"]
    raw_drain = best(runs["raw_drain"], n_drain)
    drains = {}
    for limit, limit_runs in runs["drain"].items():
        d = {**best(limit_runs, n_drain), "rounds": limit_runs[0]["rounds"]}
        d["ratio"] = d["tasks_per_s"] / raw_drain["tasks_per_s"]
        drains[str(limit)] = d
    best_limit = max(drains, key=lambda limit: drains[limit]["tasks_per_s"])
    lat_small, lat_big = runs["latency_small"], runs["latency_big"]
    lat_big["load_tasks_per_s"] = lat_big["future"] / lat_big["load_s"]
    ratios = {
        name: lat_big[key] / lat_small[key]
        for name, key in (
            ("claim_median", "claim_median_ms"),
            ("claim_p99", "claim_p99_ms"),
            ("round_median", "round_median_ms"),
            ("round_p99", "round_p99_ms"),
            ("server_claim_median", "server_claim_median_us"),
        )
        if key in lat_big
    }
    t = TARGETS
    return {
        "baseline": base,
        "schedule_generated": gen,
        "schedule_explicit": exp,
        "baseline_one": base_one,
        "schedule_one": one,
        "raw_drain": raw_drain,
        "drain": drains,
        "drain_best": {"limit": int(best_limit), "tasks_per_s": drains[best_limit]["tasks_per_s"]},
        "latency_small": lat_small,
        "latency_big": lat_big,
        "latency_ratio": ratios,
        "memory": runs["memory"],
        "targets": t,
        "met": {
            "schedule_ratio": gen["ratio"] >= t["schedule_ratio_min"],
            "drain": drains[best_limit]["tasks_per_s"] >= t["drain_tasks_per_s_min"],
            "claim_latency_ratio": ratios["claim_median"] <= t["claim_latency_ratio_max"],
            "memory": runs["memory"]["scheduled_beyond_payload"] <= t["memory_bytes_per_task_max"],
        },
    }


class Turns:
    """Runs of both front ends, taking turns: each round runs the sync variant, then the async
    one, so that load from outside this benchmark (a shared machine) falls on both alike.
    The async calls run on one event loop (with one ``redis.asyncio`` client) kept for the
    whole benchmark."""

    def __init__(self, server: RedisServer, repeat: int) -> None:
        self.repeat = repeat
        self.loop = asyncio.new_event_loop()
        self.client = redis.asyncio.Redis(**server.connection_kwargs())
        self.sync: dict[str, Any] = {}
        self.aio: dict[str, Any] = {}

    def wait(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def both(
        self,
        name: str | tuple[str, int],
        sync_run: Callable[[], dict[str, float]],
        async_run: Callable[[], Coroutine[Any, Any, dict[str, float]]],
    ) -> None:
        """``repeat`` rounds of one sync run and one async run, filed under ``name`` (or
        ``(name, key)`` for a dict of runs, such as the drain limits)."""
        for _ in range(self.repeat):
            for runs, result in ((self.sync, sync_run()), (self.aio, self.wait(async_run()))):
                if isinstance(name, tuple):
                    runs.setdefault(name[0], {}).setdefault(name[1], []).append(result)
                else:
                    runs.setdefault(name, []).append(result)

    def close(self) -> None:
        self.wait(self.client.aclose())
        self.loop.close()


#: Section 7's cases: plain, keyed, and each feature on (redis_cost.py's CASES).
REDIS_COST_CASES = (
    "plain",
    "spread",
    "keyed",
    "priorities",
    "events",
    "results",
    "batch",
    "key_limits",
)


def measure(sizes: Sizes, repeat: int, env: dict[str, Any], with_profile: bool) -> dict[str, Any]:
    """Run every section against a throwaway redis-server; returns the summary."""
    with RedisServer() as server:
        r = server.client()
        env["redis_server"] = str(r.info("server")["redis_version"])
        env["redis_server_binary"] = server.binary
        env["redis_port"] = server.port
        log(
            f"redis-server {env['redis_server']} on 127.0.0.1:{server.port}; hiredis: "
            f"{env['hiredis']}; sizes: {asdict(sizes)}"
        )
        payloads = [payload(i) for i in range(sizes.schedule)]
        ids = [f"task-{i:07d}" for i in range(sizes.schedule)]  # 12 chars, like generated ids
        one, drained = payloads[: sizes.schedule_one], payloads[: sizes.drain]
        turns = Turns(server, repeat)
        c = turns.client
        try:
            # Warm up: load the Lua scripts and run each code path once.
            run_baseline(r, payloads[:2000])
            run_schedule(r, payloads[:2000], None)
            run_drain(r, payloads[:2000], 1000)
            turns.wait(run_async_baseline(c, payloads[:2000]))
            turns.wait(run_async_schedule(c, payloads[:2000], None))
            turns.wait(run_async_drain(c, payloads[:2000], 1000))

            log("1. baseline (sync and asyncio taking turns) ...")
            turns.both(
                "baseline",
                partial(run_baseline, r, payloads),
                partial(run_async_baseline, c, payloads),
            )
            log("2. schedule_many, schedule ...")
            for name, given in (("schedule_generated", None), ("schedule_explicit", ids)):
                turns.both(
                    name,
                    partial(run_schedule, r, payloads, given),
                    partial(run_async_schedule, c, payloads, given),
                )
            turns.both(
                "baseline_one",
                partial(run_baseline_one, r, one),
                partial(run_async_baseline_one, c, one),
            )
            turns.both(
                "schedule_one",
                partial(run_schedule_one, r, one),
                partial(run_async_schedule_one, c, one),
            )
            log("3. drain ...")
            turns.both(
                "raw_drain",
                partial(run_raw_drain, r, drained),
                partial(run_async_raw_drain, c, drained),
            )
            for limit in DRAIN_LIMITS:
                turns.both(
                    ("drain", limit),
                    partial(run_drain, r, drained, limit),
                    partial(run_async_drain, c, drained, limit),
                )
            log("4. claim latency ...")
            for name, future in (
                ("latency_small", sizes.future_small),
                ("latency_big", sizes.future_big),
            ):
                turns.sync[name] = run_latency(r, future, sizes.latency_rounds)
                turns.aio[name] = turns.wait(run_async_latency(c, future, sizes.latency_rounds))
            log("5. memory ...")
            mem = run_memory(r, sizes.memory)
            mem["sweep"] = run_memory_sweep(r, max(sizes.memory // 5, 2000))
            mem["sweep_mean"] = statistics.fmean(mem["sweep"]["dueq"].values())
            mem["sweep_baseline_mean"] = statistics.fmean(mem["sweep"]["baseline"].values())
            turns.sync["memory"] = mem
            turns.aio["memory"] = turns.wait(run_async_memory(c, sizes.memory))
            log("6. history and lease holder ...")
            views = run_views(r, sizes.drain, max(repeat, VIEWS_MIN_ROUNDS))
            log("7. Redis cost per task, each feature on and off (redis_cost.py) ...")
            redis_cost = measure_redis_cost(
                server.url, list(REDIS_COST_CASES), sizes.drain, repeat, None, None
            )
            if with_profile:
                run_profiles(r, sizes)
            r.flushdb()
        finally:
            turns.close()
            r.close()
    return {
        "env": env,
        "sizes": asdict(sizes),
        **summary(turns.sync, sizes),
        "views": views_summary(views),
        "async": summary(turns.aio, sizes),
        "redis_cost": redis_cost,
    }


def measure_views(sizes: Sizes, repeat: int, env: dict[str, Any]) -> dict[str, Any]:
    """Section 6 alone (``--views-only``)."""
    with RedisServer() as server:
        r = server.client()
        env["redis_server"] = str(r.info("server")["redis_version"])
        env["redis_server_binary"] = server.binary
        log(f"6. history and lease holder on 127.0.0.1:{server.port} ...")
        try:
            views = run_views(r, sizes.drain, max(repeat, VIEWS_MIN_ROUNDS))
        finally:
            r.close()
    return {"env": env, "sizes": asdict(sizes), "views": views_summary(views)}


def views_summary(views: dict[str, Any]) -> dict[str, Any]:
    """Section 6 with its targets: each cost at most 10%, the holder at most 40 B a task."""
    t = TARGETS
    return {
        **views,
        "met": {
            "cost": all(pct <= t["views_cost_pct_max"] for pct in views["cost_pct"].values()),
            "bytes": views["holder_bytes_per_task"] <= t["views_bytes_per_task_max"],
        },
    }


def slower(pct: float) -> str:
    """A cost in tasks per second as people say it: ``3.5% slower`` (or faster: noise)."""
    return f"{abs(pct):.1f}% {'slower' if pct >= 0 else 'faster'}"


def views_rows(v: dict[str, Any]) -> list[Row]:
    t, met = TARGETS, v["met"]
    w, wo = v["with"], v["without"]
    rows: list[Row] = []
    for k in SW:
        rows.append(
            (
                f"6 {k}: history + holder cost",
                slower(v["cost_pct"][k]),
                f"with {w[f'{k}_per_s']:,.0f}/s, without {wo[f'{k}_per_s']:,.0f}/s "
                f"({w[f'{k}_per_s'] / wo[f'{k}_per_s']:.3f}x); server "
                f"{w['server_us_per_task'][k]:.2f} vs {wo['server_us_per_task'][k]:.2f} µs/task "
                f"({v['server_cost_pct'][k]:+.1f}%); Redis CPU "
                f"{w['redis_cpu_us_per_task'][k]:.2f} vs {wo['redis_cpu_us_per_task'][k]:.2f} "
                f"µs/task ({v['redis_cpu_cost_pct'][k]:+.1f}%)",
                goal(
                    f"<= {t['views_cost_pct_max']:.0f}%",
                    v["cost_pct"][k] <= t["views_cost_pct_max"],
                ),
            )
        )
    meta = v["meta_bytes_per_leased_task"]
    rows += [
        (
            "6 bytes: holder per leased task",
            f"{v['holder_bytes_per_task']:.1f} B/task",
            f"meta {meta['with']:.1f} vs {meta['without']:.1f} B/task (holder {v['holder']!r}, "
            f"{len(v['holder'])} chars); {v['longest_holder_bytes_per_task']:.1f} B with a "
            f"{MAX_HOLDER_LENGTH}-char holder",
            goal(f"<= {t['views_bytes_per_task_max']:.0f}", met["bytes"]),
        ),
        (
            "6 bytes: history hash",
            f"{v['history_bytes_full_day']:,} B full day",
            f"per queue, not per task (1,440 minutes x 6 counters at most); "
            f"{v['history_bytes_after_run']:,} B after this run's {v['rounds']} x "
            f"{v['tasks']:,} tasks",
            "",
        ),
    ]
    return rows


def goal(text: str, ok: bool) -> str:
    return f"{text} {'ok' if ok else 'MISS'}"


def front_rows(res: dict[str, Any], sync: dict[str, Any] | None) -> list[Row]:
    """Sections 1 to 4 of one front end: the sync one (``sync`` None) or the async one, whose
    rows start with A, name ``redis.asyncio`` and compare each figure with the sync one."""
    t, met = res["targets"], res["met"]
    tag, raw = ("", "") if sync is None else ("A", " (redis.asyncio)")

    def vs_sync(*path: str, key: str = "tasks_per_s", fmt: str = "{:,.0f}/s") -> str:
        """The same figure of the sync front end, for the async rows."""
        if sync is None:
            return ""
        theirs = sync
        for step in path:
            theirs = theirs[step]
        return "; sync " + fmt.format(theirs[key])

    base, gen, exp = res["baseline"], res["schedule_generated"], res["schedule_explicit"]
    rows: list[Row] = [
        (
            f"{tag}1 baseline ZADD+HSET pipeline{raw}",
            f"{base['tasks_per_s']:,.0f} tasks/s",
            f"server {base['server_us_per_task']:.2f} µs/task" + vs_sync("baseline"),
            "",
        ),
    ]
    for label, key, sched in (
        ("generated", "schedule_generated", gen),
        ("explicit", "schedule_explicit", exp),
    ):
        ok = sched["ratio"] >= t["schedule_ratio_min"]
        rows.append(
            (
                f"{tag}2 schedule_many, {label} ids",
                f"{sched['tasks_per_s']:,.0f} tasks/s",
                f"{sched['ratio']:.2f}x baseline; server {sched['server_us_per_task']:.2f} µs/task"
                + vs_sync(key),
                goal(f">= {t['schedule_ratio_min']}x", ok),
            )
        )
    base_one, one = res["baseline_one"], res["schedule_one"]
    rows += [
        (
            f"{tag}2 baseline, one pipeline a task{raw}",
            f"{base_one['tasks_per_s']:,.0f} tasks/s",
            "ZADD+HSET, one round trip per task" + vs_sync("baseline_one"),
            "",
        ),
        (
            f"{tag}2 schedule, one call a task",
            f"{one['tasks_per_s']:,.0f} tasks/s",
            f"{one['ratio']:.2f}x baseline; server {one['server_us_per_task']:.2f} µs/task"
            + vs_sync("schedule_one"),
            "",
        ),
        (
            f"{tag}3 drain, raw pipelines{raw}",
            f"{res['raw_drain']['tasks_per_s']:,.0f} tasks/s",
            "ZPOPMIN 1000 + HMGET + HDEL, no leases or acks" + vs_sync("raw_drain"),
            "",
        ),
    ]
    for limit, d in res["drain"].items():
        rows.append(
            (
                f"{tag}3 drain claim({limit})+ack_many",
                f"{d['tasks_per_s']:,.0f} tasks/s",
                f"{d['ratio']:.2f}x raw; {d['rounds']} rounds; server "
                f"{d['server_us_per_task']:.2f} µs/task" + vs_sync("drain", limit),
                "",
            )
        )
    drain_best = res["drain_best"]
    rows.append(
        (
            f"{tag}3 drain, best limit",
            f"{drain_best['tasks_per_s']:,.0f} tasks/s",
            f"limit {drain_best['limit']}" + vs_sync("drain_best"),
            goal(f">= {t['drain_tasks_per_s_min']:,}", met["drain"]),
        )
    )
    small, big = res["latency_small"], res["latency_big"]
    for key, lat in (("latency_small", small), ("latency_big", big)):
        server = (
            f"; server median {lat['server_claim_median_us']:.0f} / p99 "
            f"{lat['server_claim_p99_us']:.0f} µs"
            if "server_claim_median_us" in lat
            else ""
        )
        rows.append(
            (
                f"{tag}4 claim(100), {lat['future']:,} future",
                f"median {lat['claim_median_ms']:.3f} ms",
                f"p99 {lat['claim_p99_ms']:.3f} ms; +ack median {lat['round_median_ms']:.3f} / "
                f"p99 {lat['round_p99_ms']:.3f} ms"
                + server
                + vs_sync(key, key="claim_median_ms", fmt="median {:.3f} ms"),
                "",
            )
        )
    big_label = f"{big['future'] // 1000:,}k"
    ratio = res["latency_ratio"]
    server_ratio = (
        f"; server {ratio['server_claim_median']:.2f}x" if "server_claim_median" in ratio else ""
    )
    rows += [
        (
            f"{tag}4 load {big_label} future (schedule_many)",
            f"{big['load_tasks_per_s']:,.0f} tasks/s",
            f"batches of {FUTURE_BATCH:,}, due in {FAR_FUTURE.days} days"
            + vs_sync("latency_big", key="load_tasks_per_s"),
            "",
        ),
        (
            f"{tag}4 claim latency ratio {big_label}/1k",
            f"{ratio['claim_median']:.2f}x median",
            f"p99 {ratio['claim_p99']:.2f}x; claim+ack {ratio['round_median']:.2f}x" + server_ratio,
            goal(f"<= {t['claim_latency_ratio_max']}", met["claim_latency_ratio"]),
        ),
    ]
    return rows


def memory_rows(res: dict[str, Any]) -> list[Row]:
    t, met, mem = res["targets"], res["met"], res["memory"]
    sk, lk, bk = (mem[f"{s}_keys_per_task"] for s in ("scheduled", "leased", "baseline"))
    return [
        (
            "5 memory, scheduled task",
            f"{mem['scheduled_beyond_payload']:.0f} B/task beyond payload",
            f"payload {mem['payload_bytes']} B, envelope {mem['envelope_bytes']} B, "
            f"id {mem['id_bytes']} B; MEMORY USAGE due {sk['due']:.0f} + tasks {sk['tasks']:.0f}",
            goal(f"<= {t['memory_bytes_per_task_max']}", met["memory"]),
        ),
        (
            "5 memory, payload size sweep",
            f"{mem['sweep_mean']:.0f} B/task mean",
            f"raw layout {mem['sweep_baseline_mean']:.0f} B mean; by payload bytes dueq/raw: "
            + ", ".join(
                f"{k}: {v:.0f}/{mem['sweep']['baseline'][k]:.0f}"
                for k, v in mem["sweep"]["dueq"].items()
            ),
            "",
        ),
        (
            "5 memory, leased task",
            f"{mem['leased_beyond_payload']:.0f} B/task beyond payload",
            f"MEMORY USAGE leased {lk['leased']:.0f} + tasks {lk['tasks']:.0f} "
            f"+ meta {lk['meta']:.0f}",
            "",
        ),
        (
            "5 memory, baseline layout",
            f"{mem['baseline_beyond_payload']:.0f} B/task beyond payload",
            f"MEMORY USAGE due {bk['due']:.0f} + tasks {bk['tasks']:.0f}",
            "",
        ),
    ]


def async_memory_rows(res: dict[str, Any], sync: dict[str, Any]) -> list[Row]:
    t, met, mem, base = res["targets"], res["met"], res["memory"], sync["memory"]
    return [
        (
            "A5 memory, scheduled task",
            f"{mem['scheduled_beyond_payload']:.0f} B/task beyond payload",
            f"sync {base['scheduled_beyond_payload']:.0f} B; baseline layout "
            f"{base['baseline_beyond_payload']:.0f} B",
            goal(f"<= {t['memory_bytes_per_task_max']}", met["memory"]),
        ),
        (
            "A5 memory, leased task",
            f"{mem['leased_beyond_payload']:.0f} B/task beyond payload",
            f"sync {base['leased_beyond_payload']:.0f} B",
            "",
        ),
    ]


def table_rows(res: dict[str, Any]) -> list[Row]:
    return [
        *front_rows(res, None),
        *memory_rows(res),
        *views_rows(res["views"]),
        *front_rows(res["async"], res),
        *async_memory_rows(res["async"], res),
    ]


def print_report(res: dict[str, Any]) -> None:
    env, sizes = res["env"], res["sizes"]
    mode, repeat, wall = env["mode"], env["repeat"], res["wall_s"]
    print(f"\ndueq core benchmark ({mode}, best of {repeat}, wall {wall:.1f} s)")
    print(
        f"redis-server {env['redis_server']} ({env['redis_server_binary']}), "
        f"redis-py {env['redis_py']}, hiredis: {env['hiredis']}, Python {env['python']}, "
        f"{env['platform']}, {env['cpus']} CPUs, load average {env['loadavg_1m_before']:.2f} "
        f"before / {env['loadavg_1m_after']:.2f} after (other CPU load skews every figure)"
    )
    print(
        f"sizes: schedule {sizes['schedule']:,}, drain {sizes['drain']:,}, latency future "
        f"{sizes['future_small']:,} vs {sizes['future_big']:,} x {sizes['latency_rounds']:,} "
        f"rounds, memory {sizes['memory']:,}, one call a task {sizes['schedule_one']:,}; "
        f"payload {PAYLOAD_BYTES} B of JSON"
    )
    rows = table_rows(res)
    print_table(rows)
    print(
        "notes: baseline and schedule_many both make a 12-char random id and JSON-encode the "
        "payload per task; throughput is the best run; claim latency runs with Python's gc "
        "disabled; server times come from INFO commandstats and SLOWLOG (EVALSHA time "
        "includes the commands the script runs); rows A* are the asyncio front end "
        "(AsyncQueue on redis.asyncio, one loop), their ratios against the same raw pipelines "
        "on redis.asyncio"
    )
    if "redis_cost" in res:
        print(
            "\n7. Redis cost per task (server time from INFO commandstats, server CPU from INFO "
            "used_cpu; claim(1000) + ack_many drain and schedule_many; raw: the pipelines of "
            "sections 1 and 3, same run; callgrind: scripts/bench/redis_cost.py --redis-url)"
        )
        print_redis_cost(res["redis_cost"])


def print_views_report(res: dict[str, Any]) -> None:
    env, v = res["env"], res["views"]
    print(
        f"\ndueq core benchmark, section 6 ({env['mode']}, best of {v['rounds']} rounds of "
        f"{v['tasks']:,} tasks each way, wall {res['wall_s']:.1f} s)"
    )
    print(
        f"redis-server {env['redis_server']}, redis-py {env['redis_py']}, Python "
        f"{env['python']}, {env['cpus']} CPUs, load average {env['loadavg_1m_before']:.2f} "
        f"before / {env['loadavg_1m_after']:.2f} after (other CPU load skews every figure)"
    )
    print_table(views_rows(v))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="~10x smaller sizes (smoke run)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per throughput figure")
    parser.add_argument("--profile", action="store_true", help="print cProfile tables too")
    parser.add_argument(
        "--views-only", action="store_true", help="section 6 alone: history and holder cost"
    )
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    env: dict[str, Any] = {
        "redis_py": redis.__version__,
        "hiredis": hiredis_state(),
        "python": platform.python_version(),
        "dueq": dueq.__version__,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg_1m_before": os.getloadavg()[0],
        "mode": "quick" if args.quick else "full",
        "repeat": max(1, args.repeat),
        "payload_bytes": PAYLOAD_BYTES,
    }
    start = perf()
    if args.views_only:
        result = measure_views(sizes, env["repeat"], env)
    else:
        result = measure(sizes, env["repeat"], env, args.profile)
    result["wall_s"] = perf() - start
    env["loadavg_1m_after"] = os.getloadavg()[0]
    if args.views_only:
        print_views_report(result)
    else:
        print_report(result)
    print(json.dumps(result, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
