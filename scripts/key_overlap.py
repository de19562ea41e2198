#!/usr/bin/env python
"""How many handlers of one key run at once with ``key_concurrency=1`` when a handler keeps
running after dueq gave up on its attempt (docs/timeouts.md quotes this script's table).

``key_concurrency`` counts leases. An attempt past its ``timeout`` is failed (its lease ends)
while a plain-function handler cannot be stopped; a task cancelled while running
(``q.cancel``) loses its lease while a handler that ignores ``d.cancelled`` goes on. Either way
the key's slot goes to its next task while the old handler still runs.

It starts its own Redis (``dueq.server.RedisServer``, loopback, free port). Each case: one key,
``TASKS`` tasks of it, a plain handler that sleeps ``HANDLER_S`` whatever happens, and counts
how many of its calls for that key run at the same moment; it prints one Markdown table.

    PYTHONPATH=src python scripts/key_overlap.py
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import redis
import redis.asyncio

import dueq
from dueq.server import RedisServer

TASKS = 12
HANDLER_S = 1.0
TIMEOUT_S = 0.2
BOUND_S = 30.0


class Overlap:
    """Counts the handler calls running at once; ``most`` is the largest count seen."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = 0
        self.most = 0
        self.calls = 0

    def handler(self, started: threading.Event | None = None) -> Any:
        def handle(d: Any) -> None:
            with self._lock:
                self.now += 1
                self.calls += 1
                self.most = max(self.most, self.now)
            if started is not None:
                started.set()
            time.sleep(HANDLER_S)  # ignores its timeout and d.cancelled
            with self._lock:
                self.now -= 1

        return handle


def no_wait(state: Any) -> float:
    return 0.0


def wait_until(condition: Any) -> None:
    deadline = time.monotonic() + BOUND_S
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(0.01)


def timeout_case(url: str, front: str, concurrency: int, name: str) -> Overlap:
    """TASKS tasks of one key, each attempt past TIMEOUT_S (max_attempts=1: dead after it)."""
    overlap = Overlap()
    policy = dueq.RetryPolicy(1, wait=no_wait)
    if front == "Worker":
        q = dueq.Queue(name, redis.Redis.from_url(url), retry=policy)
        q.configure(key_concurrency=1)
        q.schedule_many(dueq.Task(i, key="k") for i in range(TASKS))
        w = dueq.Worker(q, overlap.handler(), concurrency=concurrency, timeout=TIMEOUT_S)
        runner = threading.Thread(target=w.run)
        runner.start()
        wait_until(lambda: w.outcomes["dead"] == TASKS)
        w.stop()
        w.stop()
        runner.join(BOUND_S)
    else:

        async def main() -> None:
            client = redis.asyncio.Redis.from_url(url)
            aq = dueq.AsyncQueue(name, client, retry=policy)
            await aq.configure(key_concurrency=1)
            await aq.schedule_many(dueq.Task(i, key="k") for i in range(TASKS))
            aw = dueq.AsyncWorker(
                aq,
                overlap.handler(),
                concurrency=concurrency,
                timeout=TIMEOUT_S,
                handle_signals=False,
            )
            running = asyncio.ensure_future(aw.run())
            while aw.outcomes["dead"] < TASKS:
                await asyncio.sleep(0.01)
            aw.stop()
            aw.stop()
            await running
            await client.aclose()

        asyncio.run(main())
    wait_until(lambda: overlap.now == 0)  # every abandoned handler has returned
    return overlap


def cancel_case(url: str, front: str, name: str) -> Overlap:
    """Two tasks of one key, no timeout; the first is cancelled while its handler runs."""
    overlap = Overlap()
    started = threading.Event()
    if front == "Worker":
        q = dueq.Queue(name, redis.Redis.from_url(url))
        q.configure(key_concurrency=1)
        first = q.schedule(0, key="k")
        q.schedule(1, key="k", delay=0.05)
        w = dueq.Worker(q, overlap.handler(started), concurrency=2)
        runner = threading.Thread(target=w.run)
        runner.start()
        wait_until(started.is_set)
        q.cancel(first)
        wait_until(lambda: overlap.calls == 2)
        wait_until(lambda: overlap.now == 0)
        w.stop()
        runner.join(BOUND_S)
    else:

        async def main() -> None:
            client = redis.asyncio.Redis.from_url(url)
            aq = dueq.AsyncQueue(name, client)
            await aq.configure(key_concurrency=1)
            first = await aq.schedule(0, key="k")
            await aq.schedule(1, key="k", delay=0.05)
            aw = dueq.AsyncWorker(aq, overlap.handler(started), concurrency=2, handle_signals=False)
            running = asyncio.ensure_future(aw.run())
            while not started.is_set():
                await asyncio.sleep(0.01)
            await aq.cancel(first)
            while overlap.calls < 2 or overlap.now:
                await asyncio.sleep(0.01)
            aw.stop()
            await running
            await client.aclose()

        asyncio.run(main())
    return overlap


def main() -> None:
    rows = []
    with RedisServer() as server:
        url = server.url
        for front in ("Worker", "AsyncWorker"):
            for concurrency in (1, 4):
                o = timeout_case(url, front, concurrency, f"ko-{front}-{concurrency}")
                rows.append(
                    (front, f"timeout {TIMEOUT_S:g} s, concurrency {concurrency}", o.most, o.calls)
                )
            o = cancel_case(url, front, f"kc-{front}")
            rows.append((front, "q.cancel() while running, concurrency 2", o.most, o.calls))
    print(
        f"key_concurrency=1, one key, handlers sleep {HANDLER_S:g} s ignoring timeout and "
        "d.cancelled\n"
    )
    print("| consumer | case | most handlers of the key at once | handler calls |")
    print("|---|---|---|---|")
    for front, case, most, calls in rows:
        print(f"| {front} | {case} | {most} | {calls} |")


if __name__ == "__main__":
    main()
