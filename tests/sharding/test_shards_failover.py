"""A sharded queue on a local Redis Cluster of 3 primaries and 3 replicas (AOF, fsync always)
keeps every task through a failover: a consumer drains it while one shard's primary is
failed over to its replica (``CLUSTER FAILOVER``), with the README's durability settings
(``wait_replicas=1``: every schedule and settle is confirmed by a replica)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

import dueq
from dueq._wire.keys import QueueKeys
from dueq.server import RedisServer, local_cluster

TASKS = 600
WAIT_S = 120
#: what a failover can make a call raise: the consumer retries it, as a worker does
OUTAGE = (redis.ConnectionError, redis.TimeoutError, redis.exceptions.ClusterError)


@pytest.fixture
def nodes() -> Iterator[list[RedisServer]]:
    with local_cluster(3, replicas=1, appendonly=True) as started:
        yield started


def role(node: RedisServer) -> str:
    client = node.client()
    try:
        return str(client.info("replication")["role"])
    finally:
        client.close()


def test_wait_replicas_goes_to_the_node_of_each_shard(nodes: list[RedisServer]) -> None:
    client = RedisCluster(host="127.0.0.1", port=nodes[0].port)
    try:
        q = dueq.Queue("waited", client, shards=3, wait_replicas=1, wait_timeout=5.0)
        assert q.schedule_many(dueq.Task(i, id=f"w{i}") for i in range(30)).added == 30
        (d,) = q.claim(limit=1)
        d.ack()
        assert q.stats().scheduled == 29
        too_many = dueq.Queue("waited", client, shards=3, wait_replicas=2, wait_timeout=0.05)
        with pytest.raises(dueq.ReplicationTimeout):
            too_many.schedule("x", id="needs-two-replicas")
    finally:
        client.close()


@pytest.mark.parametrize("how", ["cluster failover", "kill"])
def test_a_failover_while_draining_loses_nothing_and_delivers_nothing_acked_again(
    nodes: list[RedisServer], how: str
) -> None:
    client = RedisCluster(host="127.0.0.1", port=nodes[0].port)
    q = dueq.Queue("drained", client, shards=3, wait_replicas=1, wait_timeout=5.0, lease=10.0)
    ids = [f"f{i}" for i in range(TASKS)]
    q.schedule_many(dueq.Task({"n": i}, id=task_id) for i, task_id in enumerate(ids))
    events: list[tuple[str, str]] = []  # ("delivered" | "acked", id), in the consumer's order
    errors: list[BaseException] = []
    stop = threading.Event()

    def settle(d: Any) -> bool:
        """Ack ``d``; False when it turns out not acked (its lease was lost with a killed
        primary: the task is due again, and its next delivery is not a duplicate of an ack)."""
        for _ in range(1000):  # bounded: retried like a worker's ack after a lost connection
            try:
                d.ack()
                return True
            except dueq.LeaseLost:  # an earlier try took and its reply was lost, or the lease
                return q.get(d.id) is None  # itself was lost in the failover
            except OUTAGE:
                time.sleep(0.05)
        raise AssertionError(f"could not ack {d.id}")

    def consume() -> None:
        try:
            while not stop.is_set():
                try:
                    batch = q.claim(limit=10)
                except OUTAGE:
                    time.sleep(0.05)
                    continue
                if not batch:
                    time.sleep(0.05)
                for d in batch:
                    events.append(("delivered", d.id))
                    if settle(d):
                        events.append(("acked", d.id))
                    time.sleep(0.002)  # slow enough that the failover lands mid-drain
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    consumer = threading.Thread(target=consume)
    consumer.start()
    try:
        deadline = time.monotonic() + WAIT_S
        while sum(kind == "acked" for kind, _ in events) < TASKS // 4:
            assert time.monotonic() < deadline and not errors, errors
            time.sleep(0.02)
        # the primary of shard 0, and its replica (nodes 3..5 replicate nodes 0..2 in order)
        slot = client.keyslot(QueueKeys.for_queue(q.shard_names[0]).due)  # type: ignore[attr-defined]
        port = client.nodes_manager.get_node_from_slot(slot).port
        primary = next(i for i, n in enumerate(nodes[:3]) if n.port == port)
        replica = nodes[3 + primary]
        asked = 0.0
        if how == "kill":  # a crash: the replica is elected once the node timeout passes
            nodes[primary].kill()
            asked = float("inf")
        while role(replica) != "master":
            assert time.monotonic() < deadline, "the replica was not promoted"
            if time.monotonic() - asked > 10:  # a manual failover times out after 5 s: ask again
                promote = replica.client()
                try:
                    promote.execute_command("CLUSTER", "FAILOVER")
                finally:
                    promote.close()
                asked = time.monotonic()
            time.sleep(0.05)
        if how == "kill":  # back as the new primary's replica, so WAIT is confirmed again
            nodes[primary].restart()
        while role(nodes[primary]) != "slave":
            assert time.monotonic() < deadline, "the old primary did not become a replica"
            time.sleep(0.05)
        acked_at_failover = sum(kind == "acked" for kind, _ in events)
        while len({i for kind, i in events if kind == "acked"}) < TASKS:
            assert time.monotonic() < deadline and not errors, errors
            time.sleep(0.05)
    finally:
        stop.set()
        consumer.join(WAIT_S)
    assert not errors, errors
    assert acked_at_failover < TASKS  # the failover happened while tasks were left
    acked_first: dict[str, int] = {}
    for position, (kind, task_id) in enumerate(events):
        if kind == "acked":
            acked_first.setdefault(task_id, position)
        else:
            assert task_id not in acked_first, f"{task_id} was delivered again after its ack"
    assert sorted(acked_first) == sorted(ids)  # nothing lost
    stats = q.stats()
    assert (stats.scheduled, stats.leased, stats.dead) == (0, 0, 0)
    after = client.nodes_manager.get_node_from_slot(slot).port
    assert after == replica.port  # the shard is served by the promoted replica now
    client.close()
