"""A worker process for tests/test_results.py (run as a script): a ``dueq.Worker`` (or, with
``--front-end async``, ``dueq.AsyncWorker``) whose handler returns ``{"squared": n * n}`` for
the payload ``{"n": n}``, until SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import signal

import redis
import redis.asyncio

import dueq


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--queue", default="w")
    parser.add_argument("--front-end", choices=["sync", "async"], default="sync")
    args = parser.parse_args()
    if args.front_end == "async":
        asyncio.run(run_async(args))
        return
    q = dueq.Queue(args.queue, redis.Redis.from_url(args.url))
    dueq.Worker(q, lambda d: {"squared": d.payload["n"] ** 2}).run()


async def run_async(args: argparse.Namespace) -> None:
    client = redis.asyncio.Redis.from_url(args.url)
    q = dueq.AsyncQueue(args.queue, client)

    async def handle(d: dueq.AsyncDelivery) -> dict[str, int]:
        return {"squared": d.payload["n"] ** 2}

    worker = dueq.AsyncWorker(q, handle)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, worker.stop)
    await worker.run()
    await client.aclose()


if __name__ == "__main__":
    main()
