"""Spark on a sharded queue over a real local Redis Cluster of 3 primaries, with a real local
SparkSession: batch writes (``schedule_dataframe`` and the ``dueq`` data source) go to the
logical queue, each task to the shard of its id, idempotently; ``read_tasks`` reads every
shard, and the data source's partitioned read reads each shard in its own partitions;
streaming writes stage and commit per shard, so a replayed micro-batch adds nothing and a
commit cut off between shards is finished once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from internals_support import protocol, spark_source
from redis.cluster import RedisCluster

import dueq
from dueq._wire.envelope import pack_task
from dueq._wire.keys import QueueKeys, SparkBatchKeys
from dueq._wire.scripts import Scripts
from dueq.server import RedisServer

pytest.importorskip("pyspark", reason="pyspark is not installed: pip install 'dueq[spark]'")
from internals_support import shards
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from dueq import shard_of
from dueq import spark as ds

shard_names = shards.shard_names

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


def test_schedule_dataframe_makes_one_batch_over_every_shard_that_completes_once(
    spark: Any, cluster: RedisCluster, cluster_nodes: list[RedisServer]
) -> None:
    q = dueq.Queue("sparkbatch", cluster, shards=3)
    q.pause()
    done = dueq.Task({"import": "imp"})
    result = ds.schedule_dataframe(
        rows(spark, 300),
        queue=q.name,
        redis_url=url(cluster_nodes),
        id_col="user",
        batch="imp",
        on_complete=done,
    )
    assert result.batch is not None and (result.batch.total, result.batch.closed) == (300, True)
    assert len(per_primary(cluster, q.name)) == 3  # the members lie on every primary
    q.resume()
    ran = []
    while deliveries := q.claim(limit=64):
        ran += [d.payload for d in deliveries]
        assert q.ack_many(deliveries) == len(deliveries)
    assert ran.count({"import": "imp"}) == 1 and len(ran) == 301
    info = q.batch("imp")
    assert info is not None and (info.acked, info.complete) == (300, True)


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


def stream_once(spark: Any, source: Path, checkpoint: Path, queue: str, redis_url: str) -> None:
    query = (
        spark.readStream.schema("id string, at string, v long")
        .json(str(source))
        .writeStream.format("dueq")
        .options(queue=queue, redis_url=redis_url, id_col="id", at_col="at")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def test_a_replayed_micro_batch_adds_nothing_to_any_shard_even_after_its_tasks_ran(
    spark: Any, cluster: RedisCluster, cluster_nodes: list[RedisServer], tmp_path: Path
) -> None:
    source = tmp_path / "in"
    source.mkdir()
    lines = [json.dumps({"id": f"s-{i}", "at": "2020-01-01T09:00:00Z", "v": i}) for i in range(300)]
    (source / "part-0.json").write_text("\n".join(lines) + "\n")
    q = dueq.Queue("sparkstream", cluster, shards=3)
    q.pause()  # records the layout; claims below run after resume
    checkpoint = tmp_path / "checkpoint"
    stream_once(spark, source, checkpoint, q.name, url(cluster_nodes))
    assert q.stats().scheduled == 300
    assert len(per_primary(cluster, q.name)) == 3
    q.resume()
    acked = 0
    while deliveries := q.claim(1000):
        acked += q.ack_many(deliveries)
    assert acked == 300
    (checkpoint / "commits" / "0").unlink()  # the driver died after the sink committed
    (checkpoint / "commits" / ".0.crc").unlink(missing_ok=True)
    stream_once(spark, source, checkpoint, q.name, url(cluster_nodes))
    assert (checkpoint / "commits" / "0").exists()  # Spark did replay batch 0
    assert q.stats().scheduled == 0
    assert not any(cluster.keys(f"dueq:{{{n}}}:spark:stage:*") for n in shard_names(q.name, 3))


def test_a_commit_cut_off_between_shards_is_finished_by_the_replay_exactly_once(
    cluster: RedisCluster, cluster_nodes: list[RedisServer]
) -> None:
    import pyspark.sql.types as T

    DueqCommitMessage = spark_source().DueqCommitMessage
    DueqDataSource = spark_source().DueqDataSource

    q = dueq.Queue("sparkcut", cluster, shards=3)
    q.pause()
    schema = T.StructType([T.StructField("id", T.StringType()), T.StructField("v", T.LongType())])
    options = {"queue": q.name, "redis_url": url(cluster_nodes), "id_col": "id"}
    writer = DueqDataSource(options).streamWriter(schema, False)
    names = shard_names(q.name, 3)
    scripts = Scripts(cluster)
    ids = [f"c{i}" for i in range(30)]
    for i in ids:  # what the write tasks stage: each row in its id's shard
        name = names[shard_of(i, 3)]
        record = pack_task(0, 0, i, b'1:{"v":1}')
        call = protocol.spark_stage(
            SparkBatchKeys.for_batch(name, "query", 4), "", "query", 4, 60_000, record
        )
        assert call.parse(scripts.run(call.script, call.keys, call.args)).staged == 1
    # the first shard commits, then the driver dies before the others
    first = protocol.spark_commit(
        QueueKeys.for_queue(names[0]),
        SparkBatchKeys.for_batch(names[0], "query", 4),
        "",
        query="query",
        batch=4,
        memory_ms=86_400_000,
        window_ms=0,
    )
    while first.parse(scripts.run(first.script, first.keys, first.args)).state is (
        protocol.CommitState.PROMOTED
    ):
        pass
    on_first = sum(1 for i in ids if shard_of(i, 3) == 0)
    assert q.stats().scheduled == on_first
    writer.commit([DueqCommitMessage(query="query")], 4)  # the replay's commit
    assert sorted(t.id for t in q.iter_tasks("scheduled")) == sorted(ids)
    writer.commit([DueqCommitMessage(query="query")], 4)  # and once more: nothing changes
    assert q.stats().scheduled == 30
