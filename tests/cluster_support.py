"""A real local Redis Cluster for tests: N primaries on free loopback ports, slots dealt out in
N equal contiguous runs (as ``redis-cli --cluster create`` does)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from dueq.server import RedisServer

SLOTS = 16384


@contextmanager
def local_cluster(primaries: int = 3) -> Iterator[list[RedisServer]]:
    """Start ``primaries`` cluster-enabled servers, join them and wait for ``cluster_state:ok``."""
    nodes = [RedisServer(extra_args=["--cluster-enabled", "yes"]).start() for _ in range(primaries)]
    try:
        clients = [n.client() for n in nodes]
        share = SLOTS // primaries
        for i, client in enumerate(clients):
            last = SLOTS - 1 if i == primaries - 1 else (i + 1) * share - 1
            client.execute_command("CLUSTER", "ADDSLOTSRANGE", i * share, last)
        for node in nodes[1:]:
            clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", node.port)
        for _ in range(1000):  # bounded wait for the nodes to agree
            if all(c.cluster("info")["cluster_state"] == "ok" for c in clients):
                break
            time.sleep(0.02)
        else:
            raise RuntimeError("the local cluster did not reach cluster_state:ok")
        for c in clients:
            c.close()
        yield nodes
    finally:
        for node in nodes:
            node.stop()
