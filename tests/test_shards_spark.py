"""Spark on a sharded queue over a real local Redis Cluster of 3 primaries, with a real local
SparkSession: batch writes (``schedule_dataframe`` and the ``dueq`` data source) go to the
logical queue, each task to the shard of its id, idempotently; ``read_tasks`` reads every
shard, and the data source's partitioned read reads each shard in its own partitions.
(Streaming writes refuse a sharded queue: tests/test_shards_ops.py.)"""

from __future__ import annotations

import json
from typing import Any

import pytest
from redis.cluster import RedisCluster

import dueq
from dueq.keys import QueueKeys
from dueq.server import RedisServer

pytest.importorskip("pyspark", reason="pyspark is not installed: pip install 'dueq[spark]'")
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from dueq import spark as ds
from dueq._shards import shard_names

T0 = 1_900_000_000
ROWS = 3_000


def rows(spark: SparkSession, n: int = ROWS) -> DataFrame:
    return spark.range(n, numPartitions=3).select(
        F.concat(F.lit("user-"), F.col("id")).alias("user"),
        (F.lit(T0) + F.col("id")).cast("timestamp").alias("send_at"),
        F.col("id").alias("n"),
    )


def url(cluster_nodes: list[RedisServer]) -> str:
    return f"redis+cluster://127.0.0.1:{cluster_nodes[0].port}"


def per_primary(cluster: RedisCluster, name: str) -> dict[int, int]:
    """Scheduled tasks of each shard of ``name``, by the port of the primary that holds it."""
    out: dict[int, int] = {}
    for shard in shard_names(name, 3):
        node = cluster.get_node_from_key(QueueKeys.for_queue(shard).due)
        out[node.port] = out.get(node.port, 0) + dueq.Queue(shard, cluster).stats().scheduled
    return out


def test_schedule_dataframe_spreads_rows_over_every_primary_once(
    spark: Any, cluster: RedisCluster, cluster_nodes: list[RedisServer]
) -> None:
    q = dueq.Queue("sparkshards", cluster, shards=3)
    q.pause()  # records the layout (N = 3) before the job, as any first use does
    df = rows(spark)
    first = ds.schedule_dataframe(
        df, queue=q.name, redis_url=url(cluster_nodes), id_col="user", at_col="send_at"
    )
    assert (first.added, first.existing, first.bad_rows) == (ROWS, 0, 0)
    spread = per_primary(cluster, q.name)
    assert len(spread) == 3 and all(n > 800 for n in spread.values()), spread
    assert q.stats().scheduled == ROWS
    info = q.get("user-1234")
    assert info is not None and info.payload == {"n": 1234}
    assert info.due_at.timestamp() == T0 + 1234
    again = ds.schedule_dataframe(
        df, queue=q.name, redis_url=url(cluster_nodes), id_col="user", at_col="send_at"
    )
    assert (again.added, again.existing) == (0, ROWS)
    assert q.stats().scheduled == ROWS


def test_the_data_sources_batch_write_reaches_the_shards(
    spark: Any, cluster: RedisCluster, cluster_nodes: list[RedisServer]
) -> None:
    q = dueq.Queue("sparksource", cluster, shards=3)
    q.pause()
    options = {"queue": q.name, "redis_url": url(cluster_nodes), "id_col": "user"}
    options["at_col"] = "send_at"
    for _ in range(2):  # the second write adds nothing
        rows(spark, 300).write.format("dueq").options(**options).mode("append").save()
    assert q.stats().scheduled == 300
    assert len(per_primary(cluster, q.name)) == 3


def test_read_tasks_reads_the_dead_letters_of_every_shard(
    spark: Any, cluster: RedisCluster, cluster_nodes: list[RedisServer]
) -> None:
    q = dueq.Queue("sparkdead", cluster, shards=3)
    q.schedule_many(dueq.Task({"i": i}, id=f"d{i}") for i in range(12))
    for d in q.claim(100):
        d.fail(dueq.Unrecoverable(f"broken {d.payload['i']}"))
    dead = ds.read_tasks(spark, queue=q.name, redis_url=url(cluster_nodes), page_size=5)
    found = {row.id: row for row in dead.collect()}
    assert set(found) == {f"d{i}" for i in range(12)}
    assert json.loads(found["d7"].errors)[0]["message"] == "broken 7"


def test_the_data_sources_read_partitions_each_shard_and_reads_every_task_once(
    spark: Any, cluster: RedisCluster, cluster_nodes: list[RedisServer]
) -> None:
    q = dueq.Queue("sparkread", cluster, shards=3)
    q.schedule_many(dueq.Task({"i": i}, id=f"s{i}", delay=3600, priority=i % 3) for i in range(90))
    options = {"queue": q.name, "redis_url": url(cluster_nodes), "state": "scheduled"}
    df = spark.read.format("dueq").options(partitions="6", **options).load()
    assert df.rdd.getNumPartitions() >= 3  # at least one per shard
    found = [row.id for row in df.collect()]
    assert sorted(found) == sorted(f"s{i}" for i in range(90))
