#!/usr/bin/env python
"""Progress latency: from ``d.progress(body)`` being called to a follower's ``q.progress``
yielding the entry, p50/p99 over ``--entries`` entries (default 1,000), beside the raw Redis
round trip (PING) measured in the same run, and their ratio.

One task is leased; a follower (``Queue.progress`` on a thread, or ``AsyncQueue.progress`` on
a loop of its own thread: ``--front-end``) follows it, and the writer sends one entry at a time,
the next once the follower has the last (so each latency is one entry's, never a queue's):
latency = the follower's receive time - the time the writer called ``d.progress`` (both
``time.perf_counter`` of this process). PINGs are sent the same way, one at a time, before and
after. The run is bounded (``--max-seconds``, default 50): it stops early and says so.

    PYTHONPATH=src .venv/bin/python scripts/bench/progress.py [--entries N] [--front-end sync]

``--redis-url`` uses a running server instead of starting one (a redis-server child process
on a free port by default).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import threading
import time
from typing import Any

import redis
import redis.asyncio

from dueq import AsyncQueue, Queue
from dueq.server import RedisServer


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(round(p / 100 * (len(ordered) - 1)), len(ordered) - 1)]


def ping_ms(client: redis.Redis, count: int) -> list[float]:
    out = []
    for _ in range(count):
        start = time.perf_counter()
        client.ping()
        out.append((time.perf_counter() - start) * 1000)
    return out


class Follower:
    """A follower of ``task_id`` on its own thread: ``got[seq]`` is when each entry came."""

    def __init__(self, front_end: str, url: str, task_id: str) -> None:
        self.got: dict[int, float] = {}
        self.cond = threading.Condition()
        self.ready = threading.Event()
        self.front_end, self.url, self.task_id = front_end, url, task_id
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def note(self, seq: int) -> None:
        at = time.perf_counter()
        with self.cond:
            self.got[seq] = at
            self.cond.notify_all()

    def run(self) -> None:
        if self.front_end == "sync":
            q = Queue("bench-progress", redis.Redis.from_url(self.url))
            for entry in q.progress(self.task_id, timeout=30):
                self.note(entry.seq)
        else:
            asyncio.run(self.run_async())

    async def run_async(self) -> None:
        client = redis.asyncio.Redis.from_url(self.url)
        q = AsyncQueue("bench-progress", client)
        async for entry in q.progress(self.task_id, timeout=30):
            self.note(entry.seq)
        await client.aclose()

    def wait_for(self, seq: int, timeout_s: float = 5.0) -> float | None:
        with self.cond:
            self.cond.wait_for(lambda: seq in self.got, timeout_s)
            return self.got.get(seq)


def run(url: str, entries: int, front_end: str, max_seconds: float) -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    client.delete(*(client.keys("dueq:{bench-progress}:*") or ["none"]))
    q = Queue("bench-progress", client)
    q.schedule({"n": 1}, id="bench")
    (d,) = q.claim(1, lease=300)
    d.progress("warm-up")  # seq 1: the script loaded, the follower's history
    follower = Follower(front_end, url, "bench")
    if follower.wait_for(1, 10) is None:
        raise SystemExit("the follower did not start")
    for _ in range(50):  # warm up the live path
        seq = d.progress("warm")
        follower.wait_for(seq)
    pings = ping_ms(client, entries // 2)
    latencies: list[float] = []
    deadline = time.monotonic() + max_seconds
    for i in range(entries):
        if time.monotonic() > deadline:
            break
        start = time.perf_counter()
        seq = d.progress({"i": i, "of": entries})
        got = follower.wait_for(seq)
        if got is None:
            raise SystemExit(f"entry {seq} never reached the follower")
        latencies.append((got - start) * 1000)
    pings += ping_ms(client, entries - entries // 2)
    d.ack()
    follower.thread.join(5)
    lat50, lat99 = percentile(latencies, 50), percentile(latencies, 99)
    ping50, ping99 = percentile(pings, 50), percentile(pings, 99)
    return {
        "front_end": front_end,
        "entries": len(latencies),
        "stopped_early": len(latencies) < entries,
        "progress_p50_ms": round(lat50, 3),
        "progress_p99_ms": round(lat99, 3),
        "progress_mean_ms": round(statistics.fmean(latencies), 3),
        "ping_p50_ms": round(ping50, 3),
        "ping_p99_ms": round(ping99, 3),
        "ratio_p50": round(lat50 / ping50, 1),
        "ratio_p99": round(lat99 / ping99, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entries", type=int, default=1000)
    parser.add_argument("--front-end", choices=["sync", "async", "both"], default="both")
    parser.add_argument("--max-seconds", type=float, default=50.0)
    parser.add_argument("--redis-url")
    args = parser.parse_args(argv)
    front_ends = ["sync", "async"] if args.front_end == "both" else [args.front_end]
    budget = args.max_seconds / len(front_ends)
    if args.redis_url:
        results = [run(args.redis_url, args.entries, f, budget) for f in front_ends]
    else:
        with RedisServer() as server:
            results = [run(server.url, args.entries, f, budget) for f in front_ends]
    for result in results:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
