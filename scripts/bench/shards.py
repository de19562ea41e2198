#!/usr/bin/env python
"""Sharded queues on a local Redis Cluster of 3 primaries: throughput for 1, 3 and 6 shards.

For each shard count N (``Queue(name, cluster, shards=N)``; N = 1 is the plain queue, on one
primary) it measures, on a fresh queue:

1. schedule   ``Queue.schedule_many`` of ``--tasks`` tasks with explicit ids (blocking client:
              the shards' batches are sent in turn)
2. schedule~  the same through ``AsyncQueue.schedule_many`` (the shards' batches are awaited
              together, so the primaries work in parallel)
3. drain      one blocking consumer: ``claim_batch(1000)`` + ``ack_many`` until empty

and, for each phase, each primary's server-side time from ``INFO commandstats`` (the sum of
``usec`` over every command, reset with ``CONFIG RESETSTAT`` before the phase), per task it
handled. On this machine the three primaries and the client share 2 cores, so the measured
rates cannot scale; the projection can: with a core per primary, the busiest primary bounds
the queue at ``tasks / (its server µs) * 1e6`` tasks/s (the client side must then scale out
too: more producer and consumer processes). That projection is printed as ``server-bound``.

    .venv/bin/python scripts/bench/shards.py [--tasks N] [--shards 1,3,6] [--quick]

The table goes to stdout, followed by one JSON line with every figure; progress to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import time
from typing import Any

import redis
import redis.asyncio.cluster
from redis.cluster import RedisCluster
from report import print_table

import dueq
from dueq.server import local_cluster

perf = time.perf_counter
CLAIM = 1000


def server_usec(nodes: list[redis.Redis]) -> list[int]:
    """Each node's server time (µs) summed over every command since the last reset."""
    out = []
    for node in nodes:
        stats = node.info("commandstats")
        out.append(sum(int(v["usec"]) for v in stats.values()))
    return out


def reset(nodes: list[redis.Redis]) -> None:
    for node in nodes:
        node.config_resetstat()


def tasks_of(n: int, prefix: str) -> list[dueq.Task]:
    return [dueq.Task({"n": i, "pad": "x" * 64}, id=f"{prefix}{i}") for i in range(n)]


def phase(
    label: str, shards: int, n: int, seconds: float, nodes: list[redis.Redis]
) -> dict[str, Any]:
    usec = server_usec(nodes)
    busiest = max(usec)
    row = {
        "phase": label,
        "shards": shards,
        "tasks": n,
        "seconds": round(seconds, 3),
        "tasks_per_s": round(n / seconds),
        "server_usec_per_node": usec,
        "server_usec_per_task": round(sum(usec) / n, 2),
        "server_bound_tasks_per_s": round(n / busiest * 1e6) if busiest else None,
    }
    print(
        f"{label:10} shards={shards}: {row['tasks_per_s']:>7} tasks/s, server µs per node "
        f"{usec}, server-bound {row['server_bound_tasks_per_s']} tasks/s",
        file=sys.stderr,
    )
    return row


def run_sync(cluster: RedisCluster, nodes: list[redis.Redis], shards: int, n: int) -> list[Any]:
    q = dueq.Queue(f"bench-s{shards}", cluster, shards=shards)
    q.stats()  # the one-time checks (server, shard count) outside the timings
    q.claim(0)
    batch = tasks_of(n, "t")
    reset(nodes)
    start = perf()
    assert q.schedule_many(batch).added == n
    rows = [phase("schedule", shards, n, perf() - start, nodes)]
    reset(nodes)
    done = 0
    start = perf()
    while done < n:
        got = q.claim_batch(CLAIM).deliveries
        if got:
            done += q.ack_many(got)
    rows.append(phase("drain", shards, n, perf() - start, nodes))
    return rows


def run_async(port: int, nodes: list[redis.Redis], shards: int, n: int) -> dict[str, Any]:
    async def main() -> float:
        client = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=port)
        q = dueq.AsyncQueue(f"bench-a{shards}", client, shards=shards)
        await q.stats()
        batch = tasks_of(n, "a")
        reset(nodes)
        start = perf()
        assert (await q.schedule_many(batch)).added == n
        seconds = perf() - start
        await client.aclose()
        return seconds

    seconds = asyncio.run(main())
    return phase("schedule~", shards, n, seconds, nodes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=60_000)
    parser.add_argument("--shards", default="1,3,6")
    parser.add_argument("--quick", action="store_true", help="10,000 tasks")
    args = parser.parse_args()
    n = 10_000 if args.quick else args.tasks
    counts = [int(s) for s in args.shards.split(",")]
    rows: list[dict[str, Any]] = []
    with local_cluster(3) as servers:
        nodes = [s.client() for s in servers]
        cluster = RedisCluster(host="127.0.0.1", port=servers[0].port)
        for shards in counts:
            rows += run_sync(cluster, nodes, shards, n)
            rows.append(run_async(servers[0].port, nodes, shards, n))
            for node in nodes:
                node.flushall()
        cluster.close()
        version = nodes[0].info("server")["redis_version"]
    table = [
        (
            f"{r['phase']} N={r['shards']}",
            f"{r['tasks_per_s']:,} tasks/s",
            f"server µs/task {r['server_usec_per_task']}, per primary "
            f"{[round(u / r['tasks'], 2) for u in r['server_usec_per_node']]}",
            f"server-bound {r['server_bound_tasks_per_s']:,}/s",
        )
        for r in rows
    ]
    print_table(table)
    meta = {"python": platform.python_version(), "redis": version, "tasks": n}
    print(json.dumps({"meta": meta, "rows": rows}))


if __name__ == "__main__":
    main()
