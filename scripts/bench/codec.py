#!/usr/bin/env python
"""Payload codecs (issue 42): what encryption and compression cost a drain, and what
compression saves, beside a raw Redis drain measured in the same run.

Four variants drain the same tasks (``claim(limit)`` + ``ack_many``, as core.py's drain):
``plain`` (no codec), ``encrypted`` (``dueq.Encrypted``, AES-256-GCM), ``zstd``
(``compression="zstd"``) and ``zstd+encrypted``, each on 1 KB JSON payloads (rows of ids,
e-mail addresses and flags, as an order or a report job carries) and, for the encryption
ratio, on core.py's small payloads too. Variants alternate in rounds (``--rounds``, default
3) after one warm-up drain of each; each figure is the best round's, so a neighbour's burst on
a shared machine hurts every variant alike. The raw drain (pipelined ZPOPMIN 1000 + HMGET +
HDEL of the same stored bytes, core.py's baseline) runs in every round too.

Bytes per task: MEMORY USAGE of the tasks hash (SAMPLES 0: every field) / tasks, for the
scheduled tasks before the drain, and the used_memory delta of scheduling them; both per
variant. The issue's targets: encrypted drain >= 0.9x plain, zstd bytes <= 40% of plain and
zstd drain >= 0.95x plain (of 1 KB payloads).

    PYTHONPATH=src .venv/bin/python scripts/bench/codec.py [--tasks N] [--rounds R]

``--worker-rounds R`` (default 2) adds a worker section: ``dueq worker QUEUE handler`` (the
threaded worker with defaults, ``worker.py``'s handler: one line appended per task) drains the
small payloads as a subprocess, without a codec and with ``DUEQ_KEYS`` (encrypted), in
alternating rounds; each figure is the best round's drain (first ack to last). This is
throughput as a deployment sees it, where a task's decryption is one part of its cost; the
claim + ack_many drain above is the bare engine, where it is the largest part.

Bounded: ``--max-seconds`` (default 120) stops after the round under way and says so.
``--redis-url`` uses a running server (its database is flushed) instead of a child
redis-server on a free port.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import redis
from core import payload as small_payload  # core.py's 84 bytes of JSON

import dueq
from dueq.server import RedisServer

VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {},
    "encrypted": {"codec": "aes"},
    "zstd": {"compression": "zstd"},
    "zstd+encrypted": {"codec": "aes", "compression": "zstd"},
}
KEY = os.urandom(32)


def big_payload(i: int) -> dict[str, Any]:
    """About 1 KB of JSON: an order's rows (what compresses as real payloads do, not a run of
    one repeated byte)."""
    return {
        "order": 500_000 + i,
        "customer": f"customer{i % 977}@example.com",
        "rows": [
            {"sku": f"SKU-{(i * 7 + n) % 10_000:05d}", "qty": n % 4 + 1, "price": 9.99 + n}
            for n in range(14)
        ],
        "note": "deliver to the back door",
    }


def make_queue(r: redis.Redis, name: str, variant: str) -> dueq.Queue:
    options = dict(VARIANTS[variant])
    if options.pop("codec", None):
        options["codec"] = dueq.Encrypted(keys={"k1": KEY}, active="k1")
    return dueq.Queue(name, r, **options)


def schedule(q: dueq.Queue, payloads: list[dict[str, Any]]) -> None:
    q.schedule_many(dueq.Task(p, id=f"t{i}") for i, p in enumerate(payloads))


def used_memory(r: redis.Redis) -> int:
    r.connection_pool.disconnect()  # (frees the query buffers of the schedule's connections)
    return int(r.info("memory")["used_memory"])


def run_variant(
    r: redis.Redis, variant: str, payloads: list[dict[str, Any]], limit: int
) -> dict[str, float]:
    r.flushdb()
    q = make_queue(r, "bench-codec", variant)
    before = used_memory(r)
    schedule(q, payloads)
    after = used_memory(r)
    usage = int(r.memory_usage(q.keys.tasks, samples=0) or 0)
    q.check_server()  # the one-off CONFIG GET of the first claim, outside the timing
    start = time.perf_counter()
    done = 0
    while batch := q.claim(limit=limit):
        assert batch[0].payload == payloads[int(batch[0].id[1:])]
        done += q.ack_many(batch)
    elapsed = time.perf_counter() - start
    assert done == len(payloads), (done, len(payloads))
    return {
        "tasks_per_s": len(payloads) / elapsed,
        "tasks_bytes_per_task": usage / len(payloads),
        "used_memory_per_task": (after - before) / len(payloads),
    }


def run_raw(r: redis.Redis, payloads: list[dict[str, Any]]) -> float:
    """The raw drain's tasks per second: pipelined ZPOPMIN 1000 + HMGET + HDEL."""
    r.flushdb()
    q = dueq.Queue("bench-raw", r)
    schedule(q, payloads)
    start = time.perf_counter()
    moved = 0
    while moved < len(payloads):
        ids = [member for member, _ in r.zpopmin(q.keys.due, 1000)]
        pipe = r.pipeline(transaction=False)
        pipe.hmget(q.keys.tasks, ids)
        pipe.hdel(q.keys.tasks, *ids)
        pipe.execute()
        moved += len(ids)
    return len(payloads) / (time.perf_counter() - start)


def best(rounds: list[dict[str, float]], key: str, low: bool = False) -> float:
    values = [row[key] for row in rounds]
    return min(values) if low else max(values)


def run(url: str, tasks: int, rounds: int, limit: int, max_seconds: float) -> dict[str, Any]:
    r = redis.Redis.from_url(url)
    sizes = {"1kb": [big_payload(i) for i in range(tasks)]}
    sizes["small"] = [small_payload(i) for i in range(tasks)]
    json_bytes = {
        name: round(sum(len(json.dumps(p, separators=(",", ":"))) for p in ps) / tasks)
        for name, ps in sizes.items()
    }
    found: dict[tuple[str, str], list[dict[str, float]]] = {}
    raw: dict[str, list[float]] = {name: [] for name in sizes}
    deadline = time.monotonic() + max_seconds
    for variant in VARIANTS:  # warm up: scripts loaded, ciphers and compressors made
        run_variant(r, variant, sizes["1kb"][:1000], limit)
    run_raw(r, sizes["1kb"][:1000])
    done_rounds = 0
    for round_no in range(rounds):
        if round_no and time.monotonic() > deadline:
            break
        for size, payloads in sizes.items():
            order = list(VARIANTS) if round_no % 2 == 0 else list(reversed(VARIANTS))
            if size == "small":
                order = [v for v in order if v in ("plain", "encrypted")]
            raw[size].append(run_raw(r, payloads))
            for variant in order:
                found.setdefault((size, variant), []).append(
                    run_variant(r, variant, payloads, limit)
                )
        done_rounds += 1
        print(f"round {done_rounds} done", file=sys.stderr, flush=True)
    out: dict[str, Any] = {
        "tasks": tasks,
        "rounds": done_rounds,
        "stopped_early": done_rounds < rounds,
        "json_bytes": json_bytes,
    }
    for size in sizes:
        raw_rate = max(raw[size])
        rows = {}
        for variant in VARIANTS:
            if (size, variant) not in found:
                continue
            got = found[(size, variant)]
            rate = best(got, "tasks_per_s")
            rows[variant] = {
                "tasks_per_s": round(rate),
                "vs_raw": round(rate / raw_rate, 3),
                "tasks_bytes_per_task": round(best(got, "tasks_bytes_per_task", low=True)),
                "used_memory_per_task": round(best(got, "used_memory_per_task", low=True)),
            }
        plain = rows["plain"]
        for row in rows.values():
            row["drain_vs_plain"] = round(row["tasks_per_s"] / plain["tasks_per_s"], 3)
            row["bytes_vs_plain"] = round(
                row["tasks_bytes_per_task"] / plain["tasks_bytes_per_task"], 3
            )
        out[size] = {"raw_tasks_per_s": round(raw_rate), "variants": rows}
    return out


def run_workers(url: str, tasks: int, rounds: int) -> dict[str, Any]:
    """The worker section (see the module docstring): plain and encrypted ``dueq worker``
    drains of the small payloads, alternating, ``rounds`` each; the best of each."""
    from worker import HANDLERS, QUEUE, run_worker

    r = redis.Redis.from_url(url)
    payloads = [small_payload(i) for i in range(tasks)]
    key_line = "k1=" + base64.b64encode(KEY).decode("ascii")
    found: dict[str, list[float]] = {"plain": [], "encrypted": []}
    with tempfile.TemporaryDirectory(prefix="dueq-bench-codec-") as tmp:
        Path(tmp, "bench_handler.py").write_text(textwrap.dedent(HANDLERS))
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([tmp, os.environ.get("PYTHONPATH", "")]),
            "BENCH_OUT": str(Path(tmp, "out.txt")),
            "BENCH_URL": url,
            "DUEQ_REDIS_URL": url,
        }
        command = [sys.executable, "-m", "dueq", "worker", QUEUE, "bench_handler:handle"]
        for round_no in range(rounds):
            order = ["plain", "encrypted"] if round_no % 2 == 0 else ["encrypted", "plain"]
            for variant in order:
                r.flushdb()
                sealed = variant == "encrypted"
                codec = dueq.Encrypted(keys={"k1": KEY}, active="k1") if sealed else None
                schedule(dueq.Queue(QUEUE, r, codec=codec), payloads)
                extra = {"DUEQ_KEYS": key_line, "DUEQ_ACTIVE_KEY": "k1"} if sealed else {}
                run = run_worker(command, {**env, **extra}, r, tasks)
                found[variant].append(run["drain_per_s"])
            print(f"worker round {round_no + 1} done", file=sys.stderr, flush=True)
    plain, encrypted = max(found["plain"]), max(found["encrypted"])
    return {
        "worker_plain_tasks_per_s": round(plain),
        "worker_encrypted_tasks_per_s": round(encrypted),
        "worker_encrypted_vs_plain": round(encrypted / plain, 3),
        "runs": {k: [round(v) for v in vs] for k, vs in found.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--limit", type=int, default=1000, help="claim batch size")
    parser.add_argument("--max-seconds", type=float, default=120.0)
    parser.add_argument("--worker-rounds", type=int, default=2)
    parser.add_argument("--redis-url")
    args = parser.parse_args(argv)

    def both(url: str) -> dict[str, Any]:
        result = run(url, args.tasks, args.rounds, args.limit, args.max_seconds)
        if args.worker_rounds:
            result["worker"] = run_workers(url, args.tasks, args.worker_rounds)
        return result

    if args.redis_url:
        result = both(args.redis_url)
    else:
        with RedisServer() as server:
            result = both(server.url)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
