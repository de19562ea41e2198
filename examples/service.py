"""A small service: subscribe to a queue, process tasks with a flaky handler, watch outcomes.

A producer schedules 60 "webhook" tasks spread over the next three seconds. The service is a
reactive pipeline: ``queue.observe()`` emits each task the moment it is due, and
``dueq.operators.process`` runs the handler on 8 threads, acks successes, retries failures
with growing backoff and buries a poison task in the dead-letter queue. The service stops on
its own once every task is settled (or on Ctrl-C).

Runs on an embedded redis-server unless you pass --redis-url. Run:
    .venv/bin/python examples/service.py
"""

from __future__ import annotations

import argparse
import random
import threading
import time
from collections import Counter

import redis
import tenacity

import dueq
from dueq.server import RedisServer

TASKS = 60
FLAKY_RATE = 0.3  # share of attempts that fail with a transient error


def deliver_webhook(delivery: dueq.Delivery) -> None:
    """The handler: a remote endpoint that times out now and then, and one bad URL."""
    url = delivery.payload["url"]
    if url.startswith("ftp:"):
        raise dueq.Unrecoverable(f"unsupported scheme: {url}")  # no point retrying
    if random.random() < FLAKY_RATE:
        raise TimeoutError(f"{url} did not answer")
    time.sleep(0.01)  # the call itself


def main(redis_url: str | None) -> int:
    random.seed(7)
    server = RedisServer().start() if redis_url is None else None
    client = redis.Redis.from_url(server.url if server else redis_url)  # type: ignore[arg-type]
    retry = dueq.RetryPolicy(
        max_attempts=4,
        wait=tenacity.wait_exponential(multiplier=0.1, max=1) + tenacity.wait_random(0, 0.05),
    )
    q = dueq.Queue("service-webhooks", client, retry=retry, lease=10)
    q.schedule_many(
        dueq.Task(
            {"url": "ftp://legacy.example.com" if i == 13 else f"https://hooks.example.com/{i}"},
            id=f"hook:{i}",
            delay=i * 3 / TASKS,
        )
        for i in range(TASKS)
    )
    print(f"scheduled {TASKS} webhooks over the next 3 s")

    counts: Counter[str] = Counter()
    settled: set[str] = set()
    finished = threading.Event()

    def show(outcome: dueq.Outcome) -> None:
        counts[outcome.kind] += 1
        when = f" next try {outcome.at:%H:%M:%S.%f}"[:-3] if outcome.kind == "retried" else ""
        error = f" ({outcome.error})" if outcome.error else ""
        print(f"  {outcome.kind:<8} {outcome.id:<8} attempt {outcome.attempt}{when}{error}")
        if outcome.kind in ("acked", "dead"):
            settled.add(outcome.id)
            if len(settled) == TASKS:
                finished.set()

    outcomes = q.observe(max_in_flight=32).pipe(dueq.operators.process(deliver_webhook, 8))
    subscription = outcomes.subscribe(on_next=show, on_error=lambda e: print(f"error: {e!r}"))
    try:
        finished.wait(60)
    except KeyboardInterrupt:
        print("interrupted")
    finally:
        subscription.dispose()  # stops claiming; tasks not started go back to the queue
    stats = q.stats()
    print(f"\noutcomes: {dict(counts)}")
    print(f"queue: scheduled={stats.scheduled} leased={stats.leased} dead={stats.dead}")
    for info in q.dead.list():
        print(f"dead: {info.id} after {info.attempt} attempt(s): {info.errors[-1].message}")
    client.close()
    if server is not None:
        server.stop()
    return 0 if finished.is_set() else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--redis-url", help="use this Redis instead of an embedded one")
    raise SystemExit(main(parser.parse_args().redis_url))
