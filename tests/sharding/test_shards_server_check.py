"""The server check of a sharded queue on a Redis Cluster (issue 43): every shard's primary is
checked (its version, its ``maxmemory-policy``), not only the node redis-py picks for a
command without a key, and a risky policy is named with the shard (and port) that has it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator

import pytest
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import ClusterNode, RedisCluster

import dueq


def _primary_of(cluster: RedisCluster, shard_name: str) -> ClusterNode:
    """The primary that holds shard ``shard_name``'s keys."""
    node: ClusterNode = cluster.get_node_from_key(f"dueq:{{{shard_name}}}:due")
    return node


@pytest.fixture
def risky_shard(cluster: RedisCluster) -> Iterator[tuple[str, ClusterNode]]:
    """Shard 2 of ``srvchk`` (3 shards) and its primary, whose ``maxmemory-policy`` is
    ``allkeys-lru`` for the test (the other primaries keep ``noeviction``)."""
    name = dueq.Queue("srvchk", cluster, shards=3).shard_names[2]
    node = _primary_of(cluster, name)
    cluster.config_set("maxmemory-policy", "allkeys-lru", target_nodes=node)
    try:
        yield name, node
    finally:
        cluster.config_set("maxmemory-policy", "noeviction", target_nodes=node)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        rec.getMessage()
        for rec in caplog.records
        if rec.name.startswith("dueq") and rec.levelno >= logging.WARNING
    ]


def _claim_twice(q: dueq.Queue) -> None:
    q.claim()
    q.claim()  # checked once per queue object: one warning


@pytest.mark.parametrize("trigger", [dueq.Queue.check_server, _claim_twice])
def test_a_risky_policy_on_one_shards_primary_warns_naming_that_shard_and_node(
    cluster: RedisCluster,
    risky_shard: tuple[str, ClusterNode],
    caplog: pytest.LogCaptureFixture,
    trigger: Callable[[dueq.Queue], object],
) -> None:
    name, node = risky_shard
    q = dueq.Queue("srvchk", cluster, shards=3)
    others = [n for n in q.shard_names if n != name]
    # the node redis-py sends a keyless command to is not the risky one: a check of only that
    # node would say nothing
    assert cluster.get_default_node().port != node.port or pytest.skip("default node is risky")
    with caplog.at_level("INFO", logger="dueq"):
        trigger(q)
    (message,) = _warnings(caplog)
    assert "allkeys-lru" in message and "lose tasks" in message
    assert repr(name) in message and str(node.port) in message
    assert not any(repr(other) in message for other in others)


def test_every_primary_receives_the_checks_info(cluster: RedisCluster) -> None:
    q = dueq.Queue("srvchk-info", cluster, shards=3)
    primaries = {_primary_of(cluster, n).name: _primary_of(cluster, n) for n in q.shard_names}
    assert len(primaries) == 3  # one shard per primary (the shards' slot ranges)

    def info_calls() -> dict[str, int]:
        return {
            name: int(
                cluster.info("commandstats", target_nodes=node)
                .get("cmdstat_info", {})
                .get("calls", 0)
            )
            for name, node in primaries.items()
        }

    before = info_calls()
    q.check_server()
    after = info_calls()
    # the first read of commandstats counts in the second: 1 + INFO server + INFO memory
    assert {n: after[n] - before[n] for n in primaries} == dict.fromkeys(primaries, 3)


def test_an_async_sharded_queue_checks_every_shards_primary(
    cluster: RedisCluster, risky_shard: tuple[str, ClusterNode], caplog: pytest.LogCaptureFixture
) -> None:
    name, node = risky_shard

    async def check() -> None:
        client = AsyncRedisCluster(host="127.0.0.1", port=cluster.get_default_node().port)
        try:
            aq = dueq.AsyncQueue("srvchk", client, shards=3)
            await aq.check_server()
        finally:
            await client.aclose()

    with caplog.at_level("WARNING", logger="dueq"):
        asyncio.run(check())
    (message,) = _warnings(caplog)
    assert repr(name) in message and str(node.port) in message
