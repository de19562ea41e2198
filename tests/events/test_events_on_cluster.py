"""Outcome events of a queue on a Redis Cluster client (issue 43): the blocking reader gets a
client of its own that is a cluster client too (it routes XREADGROUP to the node of the
queue's hash slot, and follows the slot if it moves); closing the reader closes it, leaving no
connection behind on any node. On both front ends; a sharded queue's reader reads each
shard's stream (in three slots, on three nodes) in turn.

Outcomes are made before the reader starts and read from ``since`` (a group made then starts
there), so the queue's own client is idle while the connections of the reader are counted.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import redis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from waiting_support import wait_for

import dueq
from dueq._wire.keys import QueueKeys
from dueq.server import RedisServer

EXPECTED = [("bad", "dead"), ("ok", "acked")]


@pytest.fixture
def node_clients(cluster_nodes: list[RedisServer]) -> Iterator[list[redis.Redis]]:
    """A plain client of each node, to list the connections each node holds."""
    clients = [redis.Redis(host="127.0.0.1", port=node.port) for node in cluster_nodes]
    yield clients
    for client in clients:
        client.close()


def client_ids(nodes: list[redis.Redis]) -> set[tuple[int, int]]:
    """(node index, client id) of every connection the nodes hold, the listing ones' included."""
    return {(i, int(c["id"])) for i, node in enumerate(nodes) for c in node.client_list()}


def make_outcomes(cluster: RedisCluster, name: str) -> datetime:
    """One acked and one dead task on an events-on queue ``name``; the time before both."""
    q = dueq.Queue(name, cluster, retry=dueq.RetryPolicy(max_attempts=1))
    q.configure(events=timedelta(hours=24))
    start = datetime.now(tz=timezone.utc) - timedelta(seconds=1)
    q.schedule({"n": 1}, id="ok")
    q.schedule({"n": 2}, id="bad")
    deliveries = {d.id: d for d in q.claim(limit=2)}
    deliveries["ok"].ack()
    assert deliveries["bad"].fail(RuntimeError("boom")).kind == "dead"
    return start


def acking_reader(q: dueq.Queue, start: datetime) -> tuple[list[dueq.Event], Any]:
    """A member "a1" of group "audit" of ``q`` from ``start`` that acks what it reads: the
    events it read, and its subscription (dispose it)."""
    events: list[dueq.Event] = []

    def on_event(ev: dueq.Event) -> None:
        events.append(ev)
        ev.ack()

    return events, q.events("audit", consumer="a1", since=start).subscribe(on_next=on_event)


def test_a_group_on_a_cluster_queue_reads_its_events_and_closes_its_connections(
    cluster, node_clients
):
    start = make_outcomes(cluster, "ev-cluster")
    q = dueq.Queue("ev-cluster", cluster)
    before = client_ids(node_clients)
    events, subscription = acking_reader(q, start)
    try:
        wait_for(lambda: len(events) >= 2, "the 2 outcome events")
        assert sorted((ev.task_id, ev.kind) for ev in events) == EXPECTED
        assert {ev.group for ev in events} == {"audit"}
        wait_for(lambda: client_ids(node_clients) - before, "the reader's own connection")
        slot_node = cluster.get_node_from_key(q.keys.events)
        (owner,) = (
            n for n in node_clients if n.connection_pool.connection_kwargs["port"] == slot_node.port
        )
        # the reader blocks on the node that owns the queue's slot
        wait_for(
            lambda: any(c["cmd"] == "xreadgroup" for c in owner.client_list()),
            "a blocking XREADGROUP on the slot's node",
        )
        wait_for(lambda: q.event_groups()[0].pending == 0, "both events acked")
    finally:
        subscription.dispose()
    wait_for(lambda: not client_ids(node_clients) - before, "the reader's connections closed")


def test_an_async_group_on_a_cluster_queue_reads_its_events_and_closes_its_connections(
    cluster, cluster_nodes, node_clients
):
    start = make_outcomes(cluster, "aev-cluster")
    before = client_ids(node_clients)
    seen: list[tuple[str, str, str | None]] = []

    async def follow() -> None:
        client = AsyncRedisCluster(host="127.0.0.1", port=cluster_nodes[0].port)
        try:
            aq = dueq.AsyncQueue("aev-cluster", client)
            async with contextlib.aclosing(aq.events("audit", consumer="a1", since=start)) as it:
                async for ev in it:
                    seen.append((ev.task_id, ev.kind, ev.group))
                    await ev.ack()
                    if len(seen) == 2:
                        break
            (group,) = await aq.event_groups()
            assert group.pending == 0
        finally:
            await client.aclose()

    asyncio.run(asyncio.wait_for(follow(), 30))
    assert sorted(seen) == [(t, k, "audit") for t, k in EXPECTED]
    wait_for(lambda: not client_ids(node_clients) - before, "the reader's connections closed")


def make_sharded_outcomes(
    cluster: RedisCluster, name: str
) -> tuple[datetime, set[tuple[str, str]]]:
    """Outcomes on every shard of a 3-shard events-on queue: acked, dead and cancelled tasks;
    the time before them, and the (task id, kind) of each."""
    q = dueq.Queue(name, cluster, shards=3, retry=dueq.RetryPolicy(max_attempts=1))
    q.configure(events=timedelta(hours=24))
    start = datetime.now(tz=timezone.utc) - timedelta(seconds=1)
    ids = [f"t{i}" for i in range(12)]
    assert len({q.shard(tid).name for tid in ids}) == 3
    for tid in ids:
        q.schedule({"n": tid}, id=tid)
    deliveries = {d.id: d for d in q.claim(limit=12)}
    expected = set()
    for i, tid in enumerate(ids):
        kind = ("acked", "dead", "cancelled")[i % 3]
        if kind == "acked":
            deliveries[tid].ack()
        elif kind == "dead":
            deliveries[tid].fail(RuntimeError("boom"))
        else:
            q.cancel(tid)
        expected.add((tid, kind))
    return start, expected


def test_a_group_of_a_sharded_queue_on_a_cluster_reads_every_shards_events(cluster, node_clients):
    start, expected = make_sharded_outcomes(cluster, "ev-sharded")
    q = dueq.Queue("ev-sharded", cluster, shards=3)
    streams = [QueueKeys.for_queue(n).events for n in q.shard_names]
    # the shards' streams are on three nodes: no one XREADGROUP could name them all
    assert len({cluster.get_node_from_key(s).port for s in streams}) == 3
    before = client_ids(node_clients)
    events, subscription = acking_reader(q, start)
    try:
        wait_for(lambda: len(events) >= 12, "the 12 outcome events of 3 shards")
        assert sorted((ev.task_id, ev.kind) for ev in events) == sorted(expected)
        assert len(events) == 12
        assert all(
            ev.stream == QueueKeys.for_queue(q.shard(ev.task_id).name).events for ev in events
        )
        wait_for(
            lambda: all(cluster.xpending(s, "audit")["pending"] == 0 for s in streams),
            "every event acked on its shard",
        )
        assert [(g.name, g.pending) for g in q.event_groups()] == [("audit", 0)]
    finally:
        subscription.dispose()
    wait_for(lambda: not client_ids(node_clients) - before, "the reader's connections closed")


def test_an_async_group_of_a_sharded_queue_on_a_cluster_reads_every_shards_events(
    cluster, cluster_nodes
):
    start, expected = make_sharded_outcomes(cluster, "aev-sharded")
    seen: list[tuple[str, str]] = []

    async def follow() -> None:
        client = AsyncRedisCluster(host="127.0.0.1", port=cluster_nodes[0].port)
        try:
            aq = dueq.AsyncQueue("aev-sharded", client, shards=3)
            async with contextlib.aclosing(aq.events("audit", consumer="a1", since=start)) as it:
                async for ev in it:
                    seen.append((ev.task_id, ev.kind))
                    await ev.ack()
                    if len(seen) == 12:
                        break
            (group,) = await aq.event_groups()
            assert group.pending == 0
        finally:
            await client.aclose()

    asyncio.run(asyncio.wait_for(follow(), 30))
    assert sorted(seen) == sorted(expected)
