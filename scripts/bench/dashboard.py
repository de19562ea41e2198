#!/usr/bin/env python
"""How long the dashboard takes to answer with many queues and a million scheduled tasks.

Starts its own throwaway redis-server (``dueq.server.RedisServer``, free loopback port), fills
``--queues`` queues with ``--tasks`` scheduled tasks in all (``schedule_many``, due over the
next 24 hours, a few at each priority) plus ``--dead`` dead tasks per queue in three error
types, then serves the dashboard with uvicorn on a free loopback port and times real HTTP
GETs of each page and endpoint (``--repeat`` times each; median and worst). Every view is
paged or bucketed, so the figures should not grow with the number of tasks: the overview is
one stats call per queue, the queue page a page of each state, 48 histogram buckets and at
most 5,000 dead tasks grouped.

    PYTHONPATH=src .venv/bin/python scripts/bench/dashboard.py [--queues 20] [--tasks 1000000]
"""

from __future__ import annotations

import argparse
import random
import socket
import statistics
import sys
import threading
import time

import httpx
import uvicorn

from dueq import Queue, RetryPolicy, Task
from dueq.dashboard import create_app
from dueq.server import RedisServer

TARGET_S = 1.0
ERRORS = (ValueError, KeyError, TimeoutError)


def fill(r: object, queues: int, tasks: int, dead: int) -> list[str]:
    """Schedule ``tasks`` over ``queues`` queues and bury ``dead`` per queue; their names."""
    names = [f"bench-{i:02d}" for i in range(queues)]
    rng = random.Random(7)
    per_queue = tasks // queues
    start = time.perf_counter()
    for name in names:
        q = Queue(name, r, retry=RetryPolicy(max_attempts=1))  # type: ignore[arg-type]
        for first in range(0, per_queue, 10_000):
            q.schedule_many(
                Task(
                    {"order": first + i, "to": f"user{first + i}@example.com"},
                    id=f"{name}:{first + i}",
                    delay=rng.uniform(60, 86_400),
                    priority=rng.choice((0, 0, 0, 1, 5)),
                )
                for i in range(min(10_000, per_queue - first))
            )
        q.schedule_many(Task({"d": i}, id=f"{name}:dead:{i}") for i in range(dead))
        while batch := q.claim(1000):
            for n, d in enumerate(batch):
                d.fail(ERRORS[n % len(ERRORS)](f"failure {n}"))
    print(
        f"filled {queues} queues with {per_queue * queues:,} scheduled and {dead * queues:,}"
        f" dead tasks in {time.perf_counter() - start:.1f} s",
        flush=True,
    )
    return names


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queues", type=int, default=20)
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--dead", type=int, default=3_000, help="dead tasks per queue")
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()

    server = RedisServer().start()
    try:
        r = server.client()
        names = fill(r, args.queues, args.tasks, args.dead)
        port = free_port()
        uv = uvicorn.Server(
            uvicorn.Config(create_app(server.url), host="127.0.0.1", port=port, log_level="warning")
        )
        thread = threading.Thread(target=uv.run, daemon=True)
        thread.start()
        while not uv.started:
            time.sleep(0.05)
        first = names[0]
        paths = {
            "overview page /": "/",
            "overview JSON (polled)": "/api/overview",
            "throughput chart, all queues": "/chart/throughput.svg",
            f"queue page {first}": f"/queue?queue={first}",
            "queue search by id prefix": f"/queue?queue={first}&id_prefix={first}:4999",
            "queue search by payload text": f"/queue?queue={first}&grep=user49999@",
            "due histogram chart": f"/chart/due.svg?queue={first}",
            "task page": f"/task?queue={first}&id={first}:dead:1",
            "workers page": "/workers",
            "/metrics": "/metrics",
        }
        print(f"{'view':<32} {'median s':>9} {'worst s':>9}  under {TARGET_S:g} s")
        worst_overall = 0.0
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            for label, path in paths.items():
                times = []
                for _ in range(args.repeat):
                    start = time.perf_counter()
                    answer = client.get(path)
                    times.append(time.perf_counter() - start)
                    assert answer.status_code == 200, (path, answer.status_code, answer.text)
                worst = max(times)
                if label.startswith("overview"):
                    worst_overall = max(worst_overall, worst)
                ok = "yes" if worst < TARGET_S else "NO"
                print(f"{label:<32} {statistics.median(times):>9.3f} {worst:>9.3f}  {ok}")
        uv.should_exit = True
        thread.join(10)
        print(
            f"overview, worst of {args.repeat}: {worst_overall:.3f} s with {args.queues} queues"
            f" and {args.tasks:,} scheduled tasks"
        )
        return 0 if worst_overall < TARGET_S else 1
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
