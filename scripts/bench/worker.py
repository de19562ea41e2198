#!/usr/bin/env python
"""Worker benchmark: how fast a worker with default settings drains a queue, and bytes per task.

The workload of the peer comparison: 20,000 tasks due now, each payload
``{"k": "R", "tid": <int>, "due": <float>, "payload": <100 random letters>}``, and a handler
whose first statement appends one line to a file. Starts its own throwaway redis-server
(``dueq.server.RedisServer``, free loopback port). Every figure is measured in this run:

1. raw        a hand-written consumer on redis-py, pipelined ZPOPMIN(1000) + HMGET + HDEL
              with the same JSON decode and file append per task: the speed of Redis and
              Python without dueq's guarantees (leases, fencing, retries), the ratio's base
2. threaded   ``dueq worker QUEUE bench_handler:handle`` as a subprocess, defaults only
3. named      ``dueq worker bench_handler:q``: the same tasks scheduled as the named task
              ``bench_task`` (``@q.task``), run by a worker without a handler that dispatches
              by name (``docs/named-tasks.md``); the function writes the same line
4. asyncio    ``dueq.AsyncWorker(q, ahandle)`` as a subprocess, defaults only
   engine     dueq's own loop in this process, one thread (``claim(1000)``, the same work per
              task, ``ack_many``): what the engine gives; each worker's drain is also shown as
              a ratio to it (a default worker should keep >= 0.7x of it)
   bulk       bulk handlers (``BatchSpec``, issue 41), in this process: raw loop, engine loop,
              per-task ``Worker``, bulk ``Worker`` and bulk ``AsyncWorker`` (max 1000), tasks/s
              and Redis server us per task (commandstats), each against raw (``bulk.py``)
   linger     a bulk ``Worker`` with linger 0.05 s: handover lateness of partial batches, and
              the commands an idle worker makes with and without a linger (``bulk.py``)
5. memory     bytes per scheduled task (INFO used_memory before/after scheduling, and
              MEMORY USAGE per key), where they go (id, envelope, dict entries, bucket
              tables, skiplist nodes), next to the raw ZSET + HASH layout of the same tasks
              and a single ZSET of id+JSON without the by-id hash

For the workers, start-up is the time from spawning the process to the first ack, and drain
is tasks per second from the first ack to the last (the parent polls the queue's counters
every 5 ms). Each worker runs ``--repeat`` times (default 2); all runs are printed.

    .venv/bin/python scripts/bench/worker.py [--tasks N] [--repeat N] [--quick]
        [--workers threaded,named,asyncio] [--no-memory]
        [--sections workers,bulk,linger,memory] [--bulk-tasks N] [--linger-rounds N] [--idle-s S]

The table goes to stdout, followed by one JSON line with every figure; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import string
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import redis
from bulk import add_arguments as add_bulk_arguments
from bulk import log, payloads
from bulk import run_sections as run_bulk_sections
from report import print_table

import dueq
from dueq.server import RedisServer

perf = time.perf_counter
QUEUE = "bench"
POLL_S = 0.005
TIMEOUT_S = 300.0
TARGET_DRAIN = 40_000
#: bytes per task at most this times the bare ZSET + HASH layout of the same tasks (issue 31;
#: the earlier "< 286 B", huey's layout with no index by id, is retired: docs/benchmarks.md)
TARGET_BYTES_RATIO = 1.05
MEMORY_TASKS = 20_000  # fewest tasks the bytes per task are measured over

HANDLERS = """
import os

_out = open(os.environ["BENCH_OUT"], "a", buffering=1)


def handle(d):
    _out.write(f"{d.id}\\n")


async def ahandle(d):
    _out.write(f"{d.id}\\n")


import dueq

q = dueq.Queue.from_url(os.environ["BENCH_URL"], "bench", retry=dueq.RetryPolicy(max_attempts=5))


@q.task(name="bench_task")
def bench_task(k, tid, due, payload):
    _out.write(f"{tid}\\n")
"""

ASYNC_WORKER = """
import asyncio, os, sys
import redis.asyncio
import dueq
from bench_handler import ahandle


async def main():
    client = redis.asyncio.Redis.from_url(os.environ["BENCH_URL"])
    worker = dueq.AsyncWorker(dueq.AsyncQueue(sys.argv[1], client), ahandle)
    await worker.run()
    await client.aclose()


asyncio.run(main())
"""


def used_memory(r: redis.Redis) -> int:
    """INFO used_memory less the clients' buffers: a bulk call's query buffer (hundreds of kB
    for one schedule_many of 2,000 tasks) stays allocated for a while after the call, and is
    not the tasks' memory."""
    info = r.info("memory")
    return int(info["used_memory"]) - int(info.get("mem_clients_normal", 0))


def schedule(
    r: redis.Redis, items: list[dict[str, Any]], task: str | None = None
) -> dict[str, float]:
    """Schedule the tasks with dueq (as the named task ``task`` if given); bytes per task
    from used_memory and MEMORY USAGE."""
    q = dueq.Queue(QUEUE, r)
    # load the scripts first: the server's script cache is in used_memory, not the tasks'
    q.schedule_many(dueq.Task(p, task=task) for p in items[:1])
    r.flushall()
    before = used_memory(r)
    q.schedule_many(dueq.Task(p, task=task) for p in items)
    after = used_memory(r)
    keys = {k.decode(): r.memory_usage(k, samples=0) or 0 for k in r.scan_iter("dueq:*")}
    return {
        "bytes_per_task": (after - before) / len(items),
        "keys_bytes_per_task": sum(keys.values()) / len(items),
        **{f"key {k}": v / len(items) for k, v in keys.items()},
    }


def raw_layout_bytes(r: redis.Redis, items: list[dict[str, Any]], *, by_id: bool = True) -> float:
    """Bytes per task of the plainest layout: ZSET id -> due, HASH id -> JSON; or, with
    ``by_id=False``, one ZSET whose member is id + JSON (no index by id: what a layout without
    the tasks hash would cost, every guarantee that needs it aside)."""
    r.flushall()
    before = used_memory(r)
    ids = dueq_ids(len(items))
    pipe = r.pipeline(transaction=False)
    for i, (tid, p) in enumerate(zip(ids, items, strict=True)):
        if by_id:
            pipe.zadd("raw:due", {tid: p["due"] * 1000})
            pipe.hset("raw:tasks", tid, json.dumps(p))
        else:
            pipe.zadd("raw:due", {tid + json.dumps(p): p["due"] * 1000})
        if i % 1000 == 999:
            pipe.execute()
    pipe.execute()
    return (used_memory(r) - before) / len(items)


def sds_bytes(length: int) -> int:
    """What Redis 7 allocates for a string of ``length`` bytes (sds header + NUL), before
    the allocator rounds it up."""
    header = 1 if length < 32 else 3 if length < 256 else 5 if length < 65536 else 9
    return header + length + 1


def size_class(size: int) -> int:
    """jemalloc's size class for ``size`` bytes (x86-64: 8, 16, then steps of 16 up to 128,
    then four classes per doubling: 160, 192, 224, 256, 320, ...)."""
    if size <= 8:
        return 8
    step = 16 if size <= 128 else 2 ** ((size - 1).bit_length() - 3)
    return -(-size // step) * step


def breakdown(r: redis.Redis, n: int) -> list[tuple[str, float]]:
    """Where the bytes of one scheduled task go, as MEMORY USAGE counts them: the id and
    envelope as stored (from a sample of the tasks hash), rounded to their allocation class,
    the entries, and each dict's bucket table (8 B per bucket, a power of two >= entries)."""
    tasks, due = f"dueq:{{{QUEUE}}}:tasks", f"dueq:{{{QUEUE}}}:due"
    sample = r.hrandfield(tasks, 1000, withvalues=True)
    fields, values = sample[0::2], sample[1::2]
    id_len = sum(map(len, fields)) / len(fields)
    value_len = sum(map(len, values)) / len(values)
    id_class = sum(size_class(sds_bytes(len(f))) for f in fields) / len(fields)
    value_class = sum(size_class(sds_bytes(len(v))) for v in values) / len(values)
    buckets = 2 ** max(n - 1, 1).bit_length() * 8 / n
    hash_total = (r.memory_usage(tasks, samples=0) or 0) / n
    zset_total = (r.memory_usage(due, samples=0) or 0) / n
    dict_entry = 24  # key, value, next (jemalloc rounds it to 32; MEMORY USAGE counts 24)
    node = zset_total - id_class - dict_entry - buckets
    return [
        (f"tasks hash: envelope ({value_len:.0f} B, its allocation class)", value_class),
        (f"tasks hash: id ({id_len:.0f} B)", id_class),
        ("tasks hash: dict entry", dict_entry),
        (f"tasks hash: bucket table ({n:,} entries)", buckets),
        (
            "tasks hash: rest (MEMORY USAGE minus the above)",
            hash_total - value_class - id_class - dict_entry - buckets,
        ),
        ("due set: id", id_class),
        ("due set: dict entry", dict_entry),
        ("due set: bucket table", buckets),
        ("due set: skiplist node and its levels (the rest)", node),
    ]


def dueq_ids(n: int) -> list[str]:
    """Ids of the length dueq generates (12 characters), so both layouts store the same."""
    rnd = random.Random(2)
    alphabet = string.ascii_letters + string.digits
    return ["".join(rnd.choices(alphabet, k=12)) for _ in range(n)]


def raw_drain(r: redis.Redis, items: list[dict[str, Any]], out_path: str) -> tuple[float, float]:
    """Tasks per second of a pipelined ZPOPMIN + HMGET + HDEL consumer doing the same work,
    and its CPU microseconds per task."""
    raw_layout_bytes(r, items)
    n = len(items)
    done = 0
    with open(out_path, "a", buffering=1) as out:
        start, cpu_start = perf(), time.process_time()
        while done < n:
            popped = r.zpopmin("raw:due", 1000)
            if not popped:
                break
            ids = [member for member, _ in popped]
            pipe = r.pipeline(transaction=False)
            pipe.hmget("raw:tasks", ids)
            pipe.hdel("raw:tasks", *ids)
            bodies, _ = pipe.execute()
            for tid, body in zip(ids, bodies, strict=True):
                json.loads(body)
                out.write(f"{tid.decode()}\n")
            done += len(ids)
        elapsed, cpu_s = perf() - start, time.process_time() - cpu_start
    return done / elapsed, cpu_s / max(done, 1) * 1e6


def engine_drain(r: redis.Redis, items: list[dict[str, Any]], out_path: str) -> tuple[float, float]:
    """Tasks per second of dueq's own engine loop in this process, one thread: ``claim(1000)``,
    the same work per task as the raw consumer (the payload decoded, one line appended), then
    ``ack_many``; and its CPU microseconds per task. The ceiling a worker can reach."""
    schedule(r, items)
    q = dueq.Queue(QUEUE, r)
    n = len(items)
    done = 0
    with open(out_path, "a", buffering=1) as out:
        start, cpu_start = perf(), time.process_time()
        while done < n:
            batch = q.claim(limit=1000)
            if not batch:
                break
            for d in batch:
                d.payload  # noqa: B018 (decoded, as the raw consumer's json.loads)
                out.write(f"{d.id}\n")
            done += q.ack_many(batch)
        elapsed, cpu_s = perf() - start, time.process_time() - cpu_start
    return done / elapsed, cpu_s / max(done, 1) * 1e6


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far (Linux ``/proc``; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def redis_cpu_s(r: redis.Redis) -> float:
    cpu = r.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def run_worker(command: list[str], env: dict[str, str], r: redis.Redis, n: int) -> dict[str, float]:
    """Spawn a worker, wait for ``n`` acks, stop it; start-up, drain and CPU figures (the
    worker's and Redis's CPU from the first ack to the last, in microseconds per task)."""
    q = dueq.Queue(QUEUE, r)
    spawned = perf()
    child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    first = last = None
    cpu_first = cpu_last = redis_first = redis_last = 0.0
    acked_first = 0
    try:
        while perf() - spawned < TIMEOUT_S:
            acked = int(q.stats().counters.get("acked", 0))
            now = perf()
            if acked and first is None:
                first, acked_first = now, acked
                cpu_first, redis_first = process_cpu_s(child.pid), redis_cpu_s(r)
            if acked >= n:
                last = now
                cpu_last, redis_last = process_cpu_s(child.pid), redis_cpu_s(r)
                break
            if child.poll() is not None:
                raise RuntimeError(f"worker exited early: {child.stderr.read().decode()[-2000:]}")
            time.sleep(POLL_S)
    finally:
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        if child.stderr is not None:
            child.stderr.close()
    if first is None or last is None:
        raise RuntimeError("the worker did not drain the queue in time")
    drained = max(n - acked_first, 1)
    return {
        "startup_s": first - spawned,
        "drain_per_s": n / max(last - first, 1e-9),
        "worker_cpu_us_per_task": (cpu_last - cpu_first) / drained * 1e6,
        "redis_cpu_us_per_task": (redis_last - redis_first) / drained * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="2,000 tasks, one run each")
    parser.add_argument(
        "--workers", default="threaded,named,asyncio", help="which workers to run (comma list)"
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the memory figures")
    parser.add_argument(
        "--sections",
        default="workers,bulk,linger,memory",
        help="which sections to run (comma list; raw and engine always run)",
    )
    add_bulk_arguments(parser)
    args = parser.parse_args()
    sections = {s.strip() for s in args.sections.split(",") if s.strip()}
    if "workers" not in sections:
        args.workers = ""
    if "memory" not in sections:
        args.no_memory = True
    chosen = [w.strip() for w in args.workers.split(",") if w.strip()]
    n = 2000 if args.quick else args.tasks
    repeat = 1 if args.quick else args.repeat
    items = payloads(n)
    rows: list[tuple[str, str, str, str]] = []
    figures: dict[str, Any] = {"tasks": n, "python": platform.python_version()}
    with tempfile.TemporaryDirectory(prefix="dueq-bench-") as tmp, RedisServer() as server:
        r = server.client()
        Path(tmp, "bench_handler.py").write_text(textwrap.dedent(HANDLERS))
        Path(tmp, "async_worker.py").write_text(textwrap.dedent(ASYNC_WORKER))
        out_path = str(Path(tmp, "out.txt"))
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([tmp, os.environ.get("PYTHONPATH", "")]),
            "BENCH_OUT": out_path,
            "BENCH_URL": server.url,
            "DUEQ_REDIS_URL": server.url,
        }
        log("raw consumer ...")
        raw, raw_cpu_us = max(raw_drain(r, items, out_path) for _ in range(repeat))
        figures["raw_drain_per_s"] = raw
        figures["raw_cpu_us_per_task"] = raw_cpu_us
        rows.append(
            (
                "raw",
                f"{raw:,.0f} tasks/s",
                f"ZPOPMIN(1000)+HMGET+HDEL, best; CPU/task {raw_cpu_us:.0f} us",
                "",
            )
        )
        log("engine loop ...")
        engine, engine_cpu_us = max(engine_drain(r, items, out_path) for _ in range(repeat))
        figures["engine_drain_per_s"] = engine
        figures["engine_cpu_us_per_task"] = engine_cpu_us
        rows.append(
            (
                "engine",
                f"{engine:,.0f} tasks/s",
                f"{engine / raw:.2f}x raw; claim(1000) + handler + ack_many in one thread, "
                f"best; CPU/task {engine_cpu_us:.0f} us",
                "",
            )
        )
        workers = {
            "threaded": [sys.executable, "-m", "dueq", "worker", QUEUE, "bench_handler:handle"],
            "named": [sys.executable, "-m", "dueq", "worker", "bench_handler:q"],
            "asyncio": [sys.executable, str(Path(tmp, "async_worker.py")), QUEUE],
        }
        for name, command in workers.items():
            if name not in chosen:
                continue
            runs = []
            for i in range(repeat):
                log(f"{name} worker, run {i + 1} ...")
                schedule(r, items, "bench_task" if name == "named" else None)
                runs.append(run_worker(command, env, r, n))
            figures[name] = runs
            for i, run in enumerate(runs, 1):
                drain = run["drain_per_s"]
                rows.append(
                    (
                        f"{name} #{i}",
                        f"{drain:,.0f} tasks/s",
                        f"{drain / raw:.2f}x raw, {drain / engine:.2f}x engine; "
                        f"start-up {run['startup_s']:.2f} s; CPU/task: "
                        f"worker {run['worker_cpu_us_per_task']:.0f} us, "
                        f"Redis {run['redis_cpu_us_per_task']:.0f} us",
                        f">= {TARGET_DRAIN:,}",
                    )
                )
        if "threaded" in figures and "named" in figures:
            plain = max(run["drain_per_s"] for run in figures["threaded"])
            named = max(run["drain_per_s"] for run in figures["named"])
            figures["named_vs_plain"] = named / plain
            rows.append(("named/plain", f"{named / plain:.3f}", "best drain of each", ">= 0.90"))
        if sections & {"bulk", "linger"}:
            bulk_rows, bulk_figures = run_bulk_sections(
                server, args, [s for s in ("bulk", "linger") if s in sections], repeat
            )
            rows += bulk_rows
            figures.update(bulk_figures)
        if args.no_memory:
            r.close()
            print_table(rows)
            print(json.dumps(figures))
            return
        log("memory ...")
        # bytes per task over at least 20,000 tasks: over --quick's 2,000, a fixed 150 kB or so
        # that a script call of that size leaves allocated in the server (measured: 436 B per
        # task at 2,000 against 383 at 20,000, the bare layout 358 and 382) reads as 80 B/task
        n_memory = max(n, MEMORY_TASKS)
        memory_items = items if n_memory == n else payloads(n_memory)
        figures["memory_tasks"] = n_memory
        memory = schedule(r, memory_items)
        parts = breakdown(r, n_memory)
        raw_bytes = raw_layout_bytes(r, memory_items)
        no_index_bytes = raw_layout_bytes(r, memory_items, by_id=False)
        figures["memory"] = memory
        figures["memory_breakdown"] = dict(parts)
        figures["raw_layout_bytes_per_task"] = raw_bytes
        figures["bytes_ratio_to_raw"] = memory["bytes_per_task"] / raw_bytes
        figures["no_index_layout_bytes_per_task"] = no_index_bytes
        rows.append(
            (
                "memory",
                f"{memory['bytes_per_task']:.0f} B/task",
                f"{memory['bytes_per_task'] / raw_bytes:.2f}x the raw ZSET+HASH layout "
                f"({raw_bytes:.0f} B/task); MEMORY USAGE of the keys "
                f"{memory['keys_bytes_per_task']:.0f} B/task",
                f"<= {TARGET_BYTES_RATIO}x raw",
            )
        )
        for key, value in memory.items():
            if key.startswith("key "):
                rows.append(("memory", f"{value:.0f} B/task", key[4:], ""))
        for part, value in parts:
            rows.append(("  of which", f"{value:.1f} B", part, ""))
        rows.append(
            (
                "memory",
                f"{no_index_bytes:.0f} B/task",
                "one ZSET of id+JSON, no by-id hash (no idempotency, no O(1) get/cancel by id)",
                "",
            )
        )
        r.close()
    print_table(rows)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
