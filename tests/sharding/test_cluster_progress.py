"""Progress on a Redis Cluster (issue 39): a sharded queue's entries are published by SPUBLISH
on the node of the task's shard, and a follower hears them by SSUBSCRIBE there (redis-py's
sharded subscription, read with get_sharded_message), then ends at the task's end."""

from __future__ import annotations

import asyncio
import threading

from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from waiting_support import wait_for

import dueq


def test_a_follower_on_a_cluster_hears_entries_of_a_task_on_each_node(cluster):
    q = dueq.Queue("progress", cluster, shards=3)
    q.configure(keep_results=600)
    ids = [f"t{i}" for i in range(9)]
    for task_id in ids:
        q.schedule({"id": task_id}, id=task_id)
    deliveries = {d.id: d for d in q.claim(20)}
    assert sorted(deliveries) == sorted(ids)
    node_of = {t: cluster.get_node_from_key(q.shard(t).keys.steps).name for t in ids}
    one_per_node = list({node: t for t, node in node_of.items()}.values())
    assert len(one_per_node) >= 2  # the shards' tags spread over the primaries
    for task_id in one_per_node:
        _follow_one(q, deliveries[task_id])


def _follow_one(q: dueq.Queue, d: dueq.Delivery) -> None:
    d.progress("kept")
    seen: list[int] = []
    follower = threading.Thread(
        target=lambda: seen.extend(p.seq for p in q.progress(d.id, timeout=20))
    )
    follower.start()
    wait_for(lambda: seen == [1], "the history")
    d.progress("live")
    wait_for(lambda: seen == [1, 2], "the live entry")
    d.ack()
    follower.join(10)
    assert not follower.is_alive() and seen == [1, 2]


def test_an_async_follower_on_a_cluster_hears_the_entries_of_its_task(cluster):
    q = dueq.Queue("aprogress", cluster, shards=3)
    q.schedule({"n": 1}, id="t1")
    (d,) = q.claim()
    d.progress("kept")
    port = cluster.get_default_node().port
    seen: list[int] = []

    async def follow() -> None:
        client = AsyncRedisCluster(host="127.0.0.1", port=port)
        try:
            aq = dueq.AsyncQueue("aprogress", client, shards=3)
            async for p in aq.progress("t1", timeout=20):
                seen.append(p.seq)
        finally:
            await client.aclose()

    follower = threading.Thread(target=lambda: asyncio.run(follow()))
    follower.start()
    wait_for(lambda: seen == [1], "the history")
    d.progress("live")
    wait_for(lambda: seen == [1, 2], "the live entry")
    d.ack()
    follower.join(10)
    assert not follower.is_alive() and seen == [1, 2]
