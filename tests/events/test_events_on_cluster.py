"""Outcome events of a queue on a Redis Cluster client (issue 43): the blocking reader gets a
client of its own that is a cluster client too (it routes XREADGROUP to the node of the
queue's hash slot, and follows the slot if it moves); closing the reader closes it, leaving no
connection behind on any node. On both front ends; a sharded queue's events stay refused.

Outcomes are made before the reader starts and read from ``since`` (a group made then starts
there), so the queue's own client is idle while the connections of the reader are counted.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
import redis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from waiting_support import wait_for

import dueq
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


def test_a_group_on_a_cluster_queue_reads_its_events_and_closes_its_connections(
    cluster, node_clients
):
    start = make_outcomes(cluster, "ev-cluster")
    q = dueq.Queue("ev-cluster", cluster)
    before = client_ids(node_clients)
    events: list[dueq.Event] = []

    def on_event(ev: dueq.Event) -> None:
        events.append(ev)
        ev.ack()

    subscription = q.events("audit", consumer="a1", since=start).subscribe(on_next=on_event)
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


def test_events_of_a_sharded_queue_on_a_cluster_are_refused(cluster, cluster_nodes):
    q = dueq.Queue("ev-sharded", cluster, shards=3)
    with pytest.raises(dueq.ConfigurationError, match="sharded queue"):
        q.events("audit")
    aq = dueq.AsyncQueue(
        "ev-sharded", AsyncRedisCluster(host="127.0.0.1", port=cluster_nodes[0].port), shards=3
    )
    with pytest.raises(dueq.ConfigurationError, match="sharded queue"):
        aq.events("audit")
