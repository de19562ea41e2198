#!/usr/bin/env python
"""Spark into a sharded queue on a 3-primary Redis Cluster: rows/s and bytes per task (issue 43).

Starts its own local Redis Cluster (``dueq.server.local_cluster``, free loopback ports) and a
local SparkSession (``local[2]``; its start is timed apart and is in no rate), then, every
figure from this run:

1. spark  ``schedule_dataframe`` of ``--rows`` rows (id, due time, the core benchmark's four
          payload fields) into ``Queue(..., shards=3)``, the executors sending each task to the
          shard of its id: rows/s, the rows each primary holds, and bytes per task (the
          primaries' ``used_memory`` after minus before, over the rows)
2. raw    the same kind of data written with no dueq at all: one process pipelining an
          ``HSET`` of the envelope and a ``ZADD`` of the due time per task, 1,000 tasks per
          round trip, into the same cluster (``--raw-rows``, default the smaller of 1M and
          ``--rows``): rows/s and bytes per task, and the ratios spark / raw

    .venv/bin/python scripts/bench/spark_cluster.py [--rows N] [--raw-rows N]

At 10M rows (the default) the cluster holds about 5 GB; a run takes a few minutes on 2 vCPUs
(``--rows 200000`` for a smoke run). The table goes to stdout, then one JSON line with every
figure; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from typing import Any

import pyspark
from redis.cluster import RedisCluster
from spark import DUE_S, frame, start_session  # the Spark benchmark's frame and session

import dueq
from dueq.server import local_cluster
from dueq.spark import schedule_dataframe

perf = time.perf_counter

PRIMARIES = 3


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def used_memory(cluster: RedisCluster) -> dict[int, int]:
    """Each primary's ``used_memory``, by port."""
    return {
        node.port: int(node.redis_connection.info("memory")["used_memory"])
        for node in cluster.get_primaries()
    }


def flush(cluster: RedisCluster) -> None:
    for node in cluster.get_primaries():
        node.redis_connection.flushall()


def time_raw(cluster: RedisCluster, rows: int) -> tuple[float, float]:
    """(rows/s, bytes per task) of HSET + ZADD per task, pipelined 1,000 tasks per round."""
    flush(cluster)
    before = sum(used_memory(cluster).values())
    tags = [f"raw#{i}" for i in range(PRIMARIES * 4)]
    body = '1:{"user_id":%d,"action":"send_welcome_email","locale":"en-GB","retries_left":3}'
    start = perf()
    for low in range(0, rows, 1000):
        pipe = cluster.pipeline(transaction=False)
        for i in range(low, min(low + 1000, rows)):
            tag = tags[i % len(tags)]
            pipe.hset(f"raw:{{{tag}}}:tasks", f"welcome:{i}", body % (10_000_000 + i))
            pipe.zadd(f"raw:{{{tag}}}:due", {f"welcome:{i}": (DUE_S + i % 86_400) * 1000})
        pipe.execute()
    elapsed = perf() - start
    after = sum(used_memory(cluster).values())
    return rows / elapsed, (after - before) / rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000, help="rows of the job (10M)")
    parser.add_argument("--raw-rows", type=int, default=None, help="rows of the raw reference")
    parser.add_argument("--partitions", type=int, default=8, help="partitions of the frame")
    args = parser.parse_args(argv)
    raw_rows = args.raw_rows or min(args.rows, 1_000_000)
    with local_cluster(PRIMARIES) as nodes:
        cluster = RedisCluster(host="127.0.0.1", port=nodes[0].port)
        url = f"redis+cluster://127.0.0.1:{nodes[0].port}"
        log("starting Spark (timed apart: JVM, py4j gateway, SparkContext)")
        spark, session_s = start_session("dueq-bench-cluster")
        try:
            q = dueq.Queue("spark10m", cluster, shards=PRIMARIES)
            q.pause()  # records the layout (3 shards) before the job, as any first use does
            before = used_memory(cluster)
            log(f"spark: schedule_dataframe of {args.rows:,} rows into 3 shards")
            start = perf()
            result = schedule_dataframe(
                frame(spark, args.rows, args.partitions),
                queue=q.name,
                redis_url=url,
                id_col="task_id",
                at_col="send_at",
            )
            spark_s = perf() - start
        finally:
            spark.stop()
        after = used_memory(cluster)
        stats = q.stats()
        if result.added != args.rows or stats.scheduled != args.rows:
            raise SystemExit(f"spark scheduled {result.added} ({stats.scheduled}) of {args.rows}")
        per_shard = {s.shard: s.scheduled for s in stats.shards}
        spark_rate = args.rows / spark_s
        spark_bytes = (sum(after.values()) - sum(before.values())) / args.rows
        log(f"raw: HSET + ZADD of {raw_rows:,} tasks from one process")
        raw_rate, raw_bytes = time_raw(cluster, raw_rows)
        version = cluster.get_primaries()[0].redis_connection.info("server")["redis_version"]
        cluster.close()
    load = os.getloadavg()
    figures: dict[str, Any] = {
        "rows": args.rows,
        "partitions": args.partitions,
        "primaries": PRIMARIES,
        "spark_s": round(spark_s, 1),
        "spark_rows_per_s": round(spark_rate),
        "spark_bytes_per_task": round(spark_bytes),
        "tasks_per_shard": per_shard,
        "memory_growth_per_primary_mb": {
            str(port): round((after[port] - before[port]) / 2**20) for port in after
        },
        "raw_rows": raw_rows,
        "raw_rows_per_s": round(raw_rate),
        "raw_bytes_per_task": round(raw_bytes),
        "ratio_rows_per_s": round(spark_rate / raw_rate, 2),
        "ratio_bytes_per_task": round(spark_bytes / raw_bytes, 2),
        "session_start_s": round(session_s, 1),
        "load_average": [round(x, 2) for x in load],
        "redis": version,
        "pyspark": pyspark.__version__,
        "dueq": dueq.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    print(f"{'measure':<56} {'rows/s':>10} {'B/task':>8}")
    print(
        f"{f'schedule_dataframe, local[2], {args.rows:,} rows, 3 shards':<56} "
        f"{spark_rate:>10,.0f} {spark_bytes:>8,.0f}"
    )
    print(
        f"{f'raw HSET + ZADD, one process, {raw_rows:,} rows':<56} "
        f"{raw_rate:>10,.0f} {raw_bytes:>8,.0f}"
    )
    print(
        f"ratio spark / raw: {spark_rate / raw_rate:.2f} (rows/s), "
        f"{spark_bytes / raw_bytes:.2f} (bytes per task)"
    )
    print("tasks per shard: " + ", ".join(f"{n} {c:,}" for n, c in per_shard.items()))
    print(f"job {spark_s:.1f} s; session start {session_s:.1f} s (in no rate); load {load[0]:.2f}")
    print(json.dumps(figures, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
