"""dueq in one minute: schedule, claim, fail, retry with backoff, dead-letter, replay.

Runs on an embedded redis-server (a throwaway process on a free loopback port) unless you
pass --redis-url. Run:  .venv/bin/python examples/quickstart.py
"""

from __future__ import annotations

import argparse
import time

import redis
import tenacity

import dueq
from dueq.server import RedisServer


def drain(queue: dueq.Queue, handler, until_idle_s: float = 1.5) -> None:
    """Claim and handle due tasks until nothing has been due for ``until_idle_s``."""
    idle_since = time.monotonic()
    while time.monotonic() - idle_since < until_idle_s:
        batch = queue.claim(limit=10)
        if not batch:
            time.sleep(0.05)
            continue
        idle_since = time.monotonic()
        for delivery in batch:
            try:
                handler(delivery)
                delivery.ack()
                print(f"  acked    {delivery.id:<12} attempt {delivery.attempt}")
            except Exception as exc:
                outcome = delivery.fail(exc)
                when = outcome.at.strftime("%H:%M:%S.%f")[:-3] if outcome.at else "-"
                print(
                    f"  {outcome.kind:<8} {delivery.id:<12} attempt {delivery.attempt}: "
                    f"{exc} (at {when})"
                )


def send_email(delivery: dueq.Delivery) -> None:
    """A handler: fails twice for 'flaky', always for 'poison', never for others."""
    to = delivery.payload["to"]
    if to == "poison@example.com":
        raise ValueError("mailbox does not exist")
    if to == "flaky@example.com" and delivery.attempt < 3:
        raise ConnectionError("SMTP timeout")


def main(redis_url: str | None) -> None:
    server = None
    if redis_url is None:
        server = RedisServer().start()
        redis_url = server.url
        print(f"embedded redis-server on {redis_url}")
    client = redis.Redis.from_url(redis_url)
    policy = dueq.RetryPolicy(max_attempts=3, wait=tenacity.wait_exponential(multiplier=0.2, max=2))
    q = dueq.Queue("quickstart-emails", client, retry=policy, lease=5)
    try:
        print("\n1. schedule three emails, due in 0.5 s; scheduling an id twice adds nothing")
        for who in ("ok", "flaky", "poison"):
            q.schedule({"to": f"{who}@example.com"}, id=f"email:{who}", delay=0.5)
        again = q.schedule_many([dueq.Task({"to": "ok@example.com"}, id="email:ok")])
        print(f"  re-scheduling email:ok: added={again.added} existing={again.existing}")
        print(f"  claim before the due time returns {q.claim()}")
        time.sleep(0.5)

        print("\n2. claim, handle, ack or fail; failures come back with growing backoff")
        drain(q, send_email)

        stats = q.stats()
        print(
            f"\n3. stats: scheduled={stats.scheduled} leased={stats.leased} dead={stats.dead} "
            f"counters={stats.counters}"
        )

        print("\n4. the dead-letter queue keeps every attempt's error")
        for info in q.dead.list():
            print(f"  {info.id}: attempt {info.attempt}, payload {info.payload}")
            for err in info.errors:
                print(f"    attempt {err.attempt}: {err.type}: {err.message}")

        print("\n5. replay it once the mailbox is fixed (attempts reset)")
        print(f"  replayed {q.dead.replay(['email:poison'])}")
        drain(q, lambda d: None)
        print(f"\ndone: {q.stats().counters}")
    finally:
        client.close()
        if server is not None:
            server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--redis-url", help="use this Redis instead of an embedded one")
    main(parser.parse_args().redis_url)
