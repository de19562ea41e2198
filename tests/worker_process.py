"""A worker process for the tests that kill, stop and signal one (run as a script).

It runs ``dueq.Worker`` (or, with ``--front-end async``, ``dueq.AsyncWorker``) on one queue.
The handler pushes ``"<id>:<attempt>"`` to the Redis list ``started`` and then sleeps
``--sleep`` seconds. On exit the worker's outcome counts go to the list ``exited`` as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time

import redis
import redis.asyncio

import dueq


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--queue", default="w")
    parser.add_argument("--lease", type=float, default=1.0)
    parser.add_argument("--sleep", type=float, default=600.0)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--max-in-flight", type=int, default=None)
    parser.add_argument("--grace", type=float, default=10.0)
    parser.add_argument("--heartbeat", type=float, default=5.0)
    parser.add_argument("--front-end", choices=["sync", "async"], default="sync")
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument(
        "--log-claimed", action="store_true", help="also push each claim time (ms) to 'claimed'"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="worker: %(levelname)s %(message)s")
    if args.front_end == "async":
        asyncio.run(run_async(args))
        return
    r = redis.Redis.from_url(args.url)
    q = dueq.Queue(args.queue, r, lease=args.lease, shards=args.shards)

    def handle(d: dueq.Delivery) -> None:
        r.rpush("started", f"{d.id}:{d.attempt}")
        if args.log_claimed:
            r.rpush("claimed", d.claimed_ms)
        time.sleep(args.sleep)

    worker = dueq.Worker(
        q,
        handle,
        concurrency=args.concurrency,
        max_in_flight=args.max_in_flight,
        grace=args.grace,
        heartbeat=args.heartbeat,
    )
    worker.run()
    r.rpush("exited", json.dumps(dict(worker.outcomes)))


async def run_async(args: argparse.Namespace) -> None:
    """The same worker as ``main`` on the asyncio front end (``AsyncWorker``)."""
    r = redis.asyncio.Redis.from_url(args.url)
    q = dueq.AsyncQueue(args.queue, r, lease=args.lease, shards=args.shards)

    async def handle(d: dueq.AsyncDelivery) -> None:
        await r.rpush("started", f"{d.id}:{d.attempt}")
        if args.log_claimed:
            await r.rpush("claimed", d.claimed_ms)
        await asyncio.sleep(args.sleep)

    worker = dueq.AsyncWorker(
        q,
        handle,
        concurrency=args.concurrency,
        max_in_flight=args.max_in_flight,
        grace=args.grace,
        heartbeat=args.heartbeat,
    )
    await worker.run()
    await r.rpush("exited", json.dumps(dict(worker.outcomes)))
    await r.aclose()


if __name__ == "__main__":
    main()
