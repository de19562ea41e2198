"""Recurring tasks: a nightly report in Berlin time and a 15-minute sync, over a weekend with a
daylight-saving change, kept by three workers at once, with a failing occurrence retried.

Cron definitions live in Redis. Adding one schedules its next occurrence; claiming an
occurrence schedules the one after, so every worker keeps the schedule and no separate
scheduler runs. Occurrence ids are ``cron:<name>:<slot>``: three workers claiming side by side
never run one slot twice.

To show three days in a second, the queues run on a simulated clock (``clock=``), which moves
in 5-minute steps; in production you leave ``clock`` out (Redis's own time is used) and run
``dueq.Worker(q, handler).run()`` on as many hosts as you like.

Runs on an embedded redis-server unless you pass --redis-url. Run:
    .venv/bin/python examples/cron.py
"""

from __future__ import annotations

import argparse
import random
from collections import Counter
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import redis
import tenacity

import dueq
from dueq.server import RedisServer

BERLIN = ZoneInfo("Europe/Berlin")
START = datetime(2026, 3, 27, 22, 0, tzinfo=timezone.utc)  # Friday night; clocks go forward Sunday
DAYS = 3
STEP = timedelta(minutes=5)


class SimulatedClock:
    """Epoch seconds that move only when told to."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now.timestamp()


def handle(delivery: dueq.Delivery) -> None:
    """The job: the sync at 10:00 on Saturday fails twice (its API is down), then succeeds."""
    occurrence = dueq.Occurrence.from_id(delivery.id)
    assert occurrence is not None
    saturday_10_00 = datetime(2026, 3, 28, 9, 0, tzinfo=timezone.utc)
    if occurrence.name == "sync" and occurrence.slot == saturday_10_00 and delivery.attempt < 3:
        raise ConnectionError("sync API unavailable")


def local(when: datetime | None) -> str:
    return "-" if when is None else when.astimezone(BERLIN).strftime("%a %H:%M %Z")


def main(redis_url: str | None) -> int:
    random.seed(3)
    server = RedisServer().start() if redis_url is None else None
    url = server.url if server else str(redis_url)
    clock = SimulatedClock(START)
    retry = dueq.RetryPolicy(max_attempts=5, wait=tenacity.wait_exponential(multiplier=120))
    workers = [
        dueq.Queue("cron-example", redis.Redis.from_url(url), retry=retry, clock=clock)
        for _ in range(3)
    ]
    q = workers[0]
    for worker in workers:  # every worker may declare the schedules it needs: harmless
        worker.cron.add(
            "nightly-report", "30 2 * * *", payload={"report": "daily"}, tz="Europe/Berlin"
        )
        worker.cron.add("sync", "*/15 * * * *", payload={"source": "crm"}, tz="Europe/Berlin")
    for definition in q.cron.list():
        name, expr, next_at = definition.name, definition.expr, local(definition.next_at)
        print(f"{name:<15} {expr:<13} {definition.tz:<14} next {next_at}")

    runs: Counter[str] = Counter()
    end = START + timedelta(days=DAYS)
    while clock.now < end:
        clock.now += STEP
        for number in random.sample(range(1, 4), 3):  # the workers race in a random order
            worker = workers[number - 1]
            for delivery in worker.claim(limit=100):
                try:
                    handle(delivery)
                except ConnectionError as exc:
                    outcome = delivery.fail(exc)
                    print(
                        f"  {local(clock.now)}  worker {number}: {delivery.id} attempt "
                        f"{delivery.attempt} failed, retry at {local(outcome.at)}"
                    )
                    continue
                delivery.ack()
                runs[delivery.id] += 1
                if delivery.id.startswith("cron:nightly-report") or delivery.attempt > 1:
                    print(
                        f"  {local(clock.now)}  worker {number}: ran {delivery.id} "
                        f"(attempt {delivery.attempt})"
                    )

    syncs = sum(1 for task_id in runs if task_id.startswith("cron:sync"))
    print(
        f"\n{syncs} sync runs in {DAYS * 24} hours; the skipped hour's 4 slots ran once, at 03:00"
    )
    print(f"runs per occurrence: {sorted(set(runs.values()))} (each slot ran exactly once)")
    for definition in q.cron.list():
        last, next_at = local(definition.last_fired_at), local(definition.next_at)
        print(f"{definition.name:<15} last fired {last}, next {next_at}")
    for worker in workers:
        worker.redis.close()
    if server:
        server.stop()
    return 0 if set(runs.values()) == {1} else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", help="use this Redis instead of an embedded one")
    raise SystemExit(main(parser.parse_args().redis_url))
