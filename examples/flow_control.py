"""Flow control every consumer obeys: per-tenant limits, priorities, per-task timeouts, pause.

A backlog of 24 emails for one big tenant and 3 for a small one is due at once. The queue
allows each tenant 2 sends at a time (key_concurrency), so the small tenant is not stuck behind
the big one; an urgent task scheduled last (priority 9) runs first; a task with its own 0.3 s
timeout that hangs is failed, then dead; a pause holds everything until resume.

Runs on an embedded redis-server unless you pass --redis-url. Run:
    .venv/bin/python examples/flow_control.py
"""

from __future__ import annotations

import argparse
import threading
import time
from collections import Counter
from typing import Any

import redis

import dueq
from dueq.server import RedisServer

CONCURRENCY = 6


class Board:
    """What the handlers did: the order tasks started in, and the most sends per tenant."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started: list[str] = []
        self.running: Counter[str] = Counter()
        self.most: Counter[str] = Counter()

    def send(self, d: dueq.Delivery) -> None:
        tenant = d.key or "-"
        with self.lock:
            self.started.append(d.id)
            self.running[tenant] += 1
            self.most[tenant] = max(self.most[tenant], self.running[tenant])
        try:
            if d.payload.get("hang"):
                time.sleep(3)  # past its own timeout: failed at 0.3 s, this thread abandoned
            time.sleep(0.05)  # the SMTP call
        finally:
            with self.lock:
                self.running[tenant] -= 1


def main(redis_url: str | None) -> None:
    server = None
    if redis_url is None:
        server = RedisServer().start()
        redis_url = server.url
    client = redis.Redis.from_url(redis_url)
    q = dueq.Queue("flow-emails", client, retry=dueq.RetryPolicy(max_attempts=3))
    board = Board()
    outcomes: list[dueq.Outcome] = []
    done = threading.Event()
    total = 24 + 3 + 1 + 1
    try:
        q.configure(key_concurrency=2)
        q.pause()  # schedule the whole backlog first, as a Spark job would
        q.schedule_many(
            dueq.Task({"to": f"user{i}@big.example"}, id=f"big:{i:02d}", key="tenant:big")
            for i in range(24)
        )
        q.schedule_many(
            dueq.Task({"to": f"user{i}@small.example"}, id=f"small:{i}", key="tenant:small")
            for i in range(3)
        )
        q.schedule({"to": "ops@example.com"}, id="urgent", priority=9)
        q.schedule({"hang": True}, id="hangs", timeout=0.3, max_attempts=1)
        print(f"paused with {q.stats().scheduled} due: {q.settings()}")

        def on_next(outcome: dueq.Outcome) -> None:
            outcomes.append(outcome)
            if len(outcomes) == total:
                done.set()

        stream = q.observe().pipe(dueq.operators.process(board.send, concurrency=CONCURRENCY))
        subscription = stream.subscribe(on_next=on_next)
        time.sleep(0.3)
        print(f"while paused, handlers started: {len(board.started)}")
        q.resume()
        if not done.wait(30):
            raise SystemExit(f"only {len(outcomes)} of {total} outcomes in 30 s")
        subscription.dispose()
    finally:
        client.close()
        if server is not None:
            server.stop()

    kinds = Counter(o.kind for o in outcomes)
    small_last = max(board.started.index(f"small:{i}") for i in range(3))
    print(f"outcomes: {dict(sorted(kinds.items()))}")
    print(f"first started: {board.started[0]}")
    print(f"most sends at once per tenant: {dict(sorted(board.most.items()))}")
    print(f"small tenant done starting at position {small_last + 1} of {len(board.started)}")
    dead = [o for o in outcomes if o.kind == "dead"]
    for o in dead:
        print(f"dead: {o.id}: {o.error}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-url", help="use this Redis instead of an embedded one")
    args: Any = parser.parse_args()
    main(args.redis_url)
