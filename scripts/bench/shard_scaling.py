#!/usr/bin/env python
"""Does drain grow with primaries (issue 43)? A sharded queue over local Redis Clusters of 1, 2
and 3 primaries, drained by one ``dueq worker`` process per primary, and what idle shards cost.

For each cluster size k (``--primaries 1,2,3``): a fresh cluster of k primaries, a queue of
``shards=k`` (one shard per primary: ``shard_names`` places them so), ``--tasks`` tasks
scheduled, then k ``dueq worker QUEUE handler:handle`` processes (defaults, a handler that does
nothing) started together; drain is tasks per second from the first ack to the last (the
parent polls the acked counters). Per primary it prints the server CPU time of the drain
(``INFO cpu`` used_cpu_sys + used_cpu_user, before and after) and the server time of the
commands (``INFO commandstats`` usec, reset before the drain), each per task handled. The
issue's target: the total server CPU per task at k primaries within 1.2x of one primary's, so
capacity grows with primaries (each primary's own work per task stays flat).

``raw`` is the raw Redis drain measured in the same run on the one-primary cluster
(pipelined ZPOPMIN 1000 + HMGET + HDEL of the same stored tasks, core.py's baseline), and each
dueq drain is shown against it.

Idle shards: on the 3-primary cluster, tasks that all hash to shard 0, claimed one at a time
(``claim(limit=1)``) by one queue object; the claim scripts each primary ran over those claims
(``cmdstat_evalsha`` calls) show whether idle shards are asked. On this machine every process
shares 2 cores, so the drain rates cannot grow with k; CPU per task is the figure that must
stay flat.

    PYTHONPATH=src .venv/bin/python scripts/bench/shard_scaling.py [--tasks N] [--primaries 1,2,3]

Bounded: ``--max-seconds`` (default 240) skips the cluster sizes not started by then. The
table goes to stdout, followed by one JSON line with every figure; progress to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
from redis.cluster import RedisCluster
from report import print_table

import dueq
from dueq.server import local_cluster

perf = time.perf_counter
QUEUE = "scale"
HANDLER = "def handle(d):\n    pass\n"
TIMEOUT_S = 180.0


def cpu_s(node: redis.Redis) -> float:
    info = node.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def command_usec(node: redis.Redis) -> int:
    return sum(int(v["usec"]) for v in node.info("commandstats").values())


def script_calls(node: redis.Redis) -> int:
    stats = node.info("commandstats")
    return sum(
        int(stats.get(name, {}).get("calls", 0)) for name in ("cmdstat_evalsha", "cmdstat_eval")
    )


def schedule(q: dueq.Queue, n: int, ids: list[str] | None = None) -> None:
    ids = ids or [f"t{i}" for i in range(n)]
    for start in range(0, n, 5000):
        part = ids[start : start + 5000]
        q.schedule_many(dueq.Task({"n": i, "pad": "x" * 64}, id=i) for i in part)


def acked(q: dueq.Queue) -> int:
    return int(q.stats().counters.get("acked", 0))


def raw_drain(node: redis.Redis, n: int) -> float:
    """Tasks per second of the raw drain of ``n`` tasks stored by dueq on one primary."""
    q = dueq.Queue("raw", node)
    schedule(q, n)
    start = perf()
    moved = 0
    while moved < n:
        ids = [member for member, _ in node.zpopmin(q.keys.due, 1000)]
        if not ids:
            break
        pipe = node.pipeline(transaction=False)
        pipe.hmget(q.keys.tasks, ids)
        pipe.hdel(q.keys.tasks, *ids)
        pipe.execute()
        moved += len(ids)
    return moved / (perf() - start)


def drain_with_workers(primaries: int, n: int, tmp: str, servers: list[Any]) -> dict[str, Any]:
    nodes = [s.client() for s in servers]
    cluster = RedisCluster(host="127.0.0.1", port=servers[0].port)
    q = dueq.Queue(QUEUE, cluster, shards=primaries)
    schedule(q, n)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([tmp, os.environ.get("PYTHONPATH", "")]),
        "DUEQ_REDIS_URL": f"redis+cluster://127.0.0.1:{servers[0].port}",
    }
    command = [sys.executable, "-m", "dueq", "worker", QUEUE, "scale_handler:handle"]
    for node in nodes:
        node.config_resetstat()
    cpu_before = [cpu_s(node) for node in nodes]
    children = [
        subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for _ in range(primaries)
    ]
    first = last = None
    cpu_first = cpu_before
    usec_first = [0] * primaries
    done_first = 0
    try:
        deadline = perf() + TIMEOUT_S
        while perf() < deadline:
            done = acked(q)
            now = perf()
            if done and first is None:
                first, done_first = now, done
                cpu_first = [cpu_s(node) for node in nodes]
                usec_first = [command_usec(node) for node in nodes]
            if done >= n:
                last = now
                break
            for child in children:
                if child.poll() is not None:
                    raise RuntimeError(f"a worker exited: {child.stderr.read().decode()[-2000:]}")
            time.sleep(0.005)
    finally:
        for child in children:
            child.terminate()
        for child in children:
            try:
                child.wait(30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            if child.stderr is not None:
                child.stderr.close()
    if first is None or last is None:
        raise RuntimeError(f"{primaries} primaries: the workers did not drain in time")
    handled = max(n - done_first, 1)
    cpu_us = [(cpu_s(node) - c) / handled * 1e6 for node, c in zip(nodes, cpu_first, strict=True)]
    usec = [(command_usec(node) - u) / handled for node, u in zip(nodes, usec_first, strict=True)]
    cluster.close()
    return {
        "primaries": primaries,
        "drain_per_s": round(handled / max(last - first, 1e-9)),
        "server_cpu_us_per_task_per_primary": [round(v, 2) for v in cpu_us],
        "server_cpu_us_per_task": round(sum(cpu_us), 2),
        "command_us_per_task_per_primary": [round(v, 2) for v in usec],
        "command_us_per_task": round(sum(usec), 2),
    }


def idle_shards(servers: list[Any], claims: int = 200) -> dict[str, Any]:
    """Claim scripts per primary over ``claims`` claims of tasks that all lie on shard 0."""
    nodes = [s.client() for s in servers]
    cluster = RedisCluster(host="127.0.0.1", port=servers[0].port)
    q = dueq.Queue("idle", cluster, shards=len(servers))
    ids = [i for i in (f"i{k}" for k in range(20 * claims)) if dueq.shard_of(i, len(servers)) == 0]
    schedule(q, claims, ids[:claims])
    q.claim(0)  # the one-time checks and a first look at every shard
    before = [script_calls(node) for node in nodes]
    for _ in range(claims):
        for d in q.claim(limit=1):
            d.ack()
    after = [script_calls(node) for node in nodes]
    owner = cluster.get_node_from_key(f"{{{q.shard_names[0]}}}:due")
    ports = [node.connection_pool.connection_kwargs["port"] for node in nodes]
    cluster.close()
    calls = [b - a for a, b in zip(before, after, strict=True)]
    return {
        "claims": claims,
        "script_calls_per_primary": calls,
        "busy_primary": ports.index(owner.port),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=30_000)
    parser.add_argument("--primaries", default="1,2,3")
    parser.add_argument("--max-seconds", type=float, default=240.0)
    args = parser.parse_args()
    sizes = [int(k) for k in args.primaries.split(",")]
    started = perf()
    rows: list[dict[str, Any]] = []
    figures: dict[str, Any] = {"tasks": args.tasks, "python": platform.python_version()}
    with tempfile.TemporaryDirectory(prefix="dueq-scale-") as tmp:
        Path(tmp, "scale_handler.py").write_text(HANDLER)
        for k in sizes:
            if rows and perf() - started > args.max_seconds:
                print(f"stopped before {k} primaries (--max-seconds)", file=sys.stderr)
                break
            print(f"{k} primaries ...", file=sys.stderr, flush=True)
            with local_cluster(k) as servers:
                if k == 1:  # a one-node cluster holds every slot: a plain client reaches all
                    node = servers[0].client()
                    figures["raw_drain_per_s"] = round(raw_drain(node, args.tasks))
                    node.flushall()
                rows.append(drain_with_workers(k, args.tasks, tmp, servers))
                if k == 3:
                    for s in servers:
                        s.client().flushall()
                    figures["idle"] = idle_shards(servers)
    base = rows[0]["server_cpu_us_per_task"] if rows and rows[0]["primaries"] == 1 else None
    raw = figures.get("raw_drain_per_s")
    table = []
    for row in rows:
        ratio = row["server_cpu_us_per_task"] / base if base else None
        row["server_cpu_vs_one_primary"] = None if ratio is None else round(ratio, 3)
        table.append(
            (
                f"{row['primaries']} primaries",
                f"{row['drain_per_s']:,} tasks/s"
                + (f" ({row['drain_per_s'] / raw:.2f}x raw)" if raw else ""),
                f"server CPU µs/task {row['server_cpu_us_per_task']} "
                f"(per primary {row['server_cpu_us_per_task_per_primary']}), "
                f"commands µs/task {row['command_us_per_task']}",
                "" if ratio is None else f"{ratio:.2f}x one primary (target <= 1.2x)",
            )
        )
    if raw:
        table.append(("raw", f"{raw:,} tasks/s", "ZPOPMIN(1000)+HMGET+HDEL, 1 primary", ""))
    if "idle" in figures:
        idle = figures["idle"]
        table.append(
            (
                "idle shards",
                f"{idle['claims']} claims",
                f"claim scripts per primary {idle['script_calls_per_primary']} "
                f"(shard 0 on primary {idle['busy_primary']})",
                "idle primaries: 0",
            )
        )
    print_table(table)
    figures["rows"] = rows
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
