"""Fair scheduling between tenants: a noisy neighbour and two small tenants on one queue.

Tenant "bulk" schedules 6,000 reports at once; then "alice" and "bob" schedule 20 tasks each,
one at a time while the worker drains. Without fairness, alice's and bob's tasks wait behind
the whole backlog. With ``configure(fairness="key")`` each of their tasks is claimed in the next
claim, whatever the backlog; and with a weight, a paying tenant ("gold") gets more of the
workers than bulk while both have work.

The example runs the same scenario twice (fairness off, then on) and prints, for each, how many
bulk tasks started between a small tenant's task being scheduled and it starting (its wait
behind the neighbour, in tasks: with fairness on, about what the worker had already claimed),
and the shares of gold against bulk.

Runs on an embedded redis-server unless you pass --redis-url. Run:
    .venv/bin/python examples/fair_tenants.py
"""

from __future__ import annotations

import argparse
import threading
import time
from collections import Counter

import redis

import dueq
from dueq.server import RedisServer

BULK = 6000
SMALL = 20


def scenario(r: redis.Redis, name: str, fair: bool) -> list[int]:
    """Drain ``BULK`` bulk tasks while alice and bob schedule ``SMALL`` each; for each small
    task, how many bulk tasks started between its scheduling and its start."""
    q = dueq.Queue(name, r)
    if fair:
        q.configure(fairness="key")
    lock = threading.Lock()
    done = threading.Event()
    bulk_started = 0
    scheduled_at: dict[str, int] = {}  # small task id -> bulk tasks started when scheduled
    waits: list[int] = []

    def handle(d: dueq.Delivery) -> None:
        nonlocal bulk_started
        time.sleep(0.0002)  # (the work)
        with lock:
            if d.key == "bulk":
                bulk_started += 1
            else:
                waits.append(bulk_started - scheduled_at[d.id])
            if bulk_started + len(waits) == BULK + 2 * SMALL:
                done.set()

    q.schedule_many(dueq.Task({"report": i}, key="bulk") for i in range(BULK))
    worker = dueq.Worker(q, handle, concurrency=4)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        for i in range(SMALL):
            for tenant in ("alice", "bob"):
                with lock:
                    scheduled_at[f"{tenant}-{i}"] = bulk_started
                q.schedule({"n": i}, id=f"{tenant}-{i}", key=tenant)
            time.sleep(0.01)
        if not done.wait(120):
            raise SystemExit(f"{name}: {bulk_started + len(waits)} tasks ran in 120 s")
    finally:
        worker.stop()
        thread.join()
    return sorted(waits)


def weighted(r: redis.Redis) -> Counter[str]:
    """gold (weight 3) and bulk (weight 1) with backlogs: their shares of 1,000 claims."""
    q = dueq.Queue("fair-weights", r)
    q.configure(fairness="key", key_limits={"gold": dueq.KeyLimit(weight=3)})
    for tenant in ("bulk", "gold"):
        q.schedule_many(dueq.Task({"n": i}, key=tenant) for i in range(2000))
    got: Counter[str] = Counter()
    for _ in range(10):
        batch = q.claim(100)
        got.update(d.key or "" for d in batch)
        q.ack_many(batch)
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-url", help="a Redis to use (default: an embedded one)")
    args = parser.parse_args()
    server = None if args.redis_url else RedisServer().start()
    try:
        r = redis.Redis.from_url(args.redis_url or server.url)  # type: ignore[union-attr]
        for fair in (False, True):
            waits = scenario(r, f"fair-{'on' if fair else 'off'}", fair)
            print(
                f"fairness {'on ' if fair else 'off'}: a small tenant's task waited for "
                f"{waits[len(waits) // 2]} bulk tasks (median; at most {waits[-1]}) of {BULK}"
            )
        shares = weighted(r)
        print(f"weights 3 : 1 over 1,000 claims: gold {shares['gold']}, bulk {shares['bulk']}")
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
