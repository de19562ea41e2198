"""A Spark write with ``batch=``: every row's task joins the batch, the driver closes it when
the job has written every partition, and the completion task runs once (issue 30)."""

from __future__ import annotations

import json

import pytest

import dueq

pytest.importorskip("pyspark", reason="pyspark is not installed: pip install 'dueq[spark]'")

from pyspark.sql import functions as F

from dueq import spark as ds


def test_the_partition_function_counts_a_rerun_partition_once(r, redis_server):
    plan = ds.PartitionPlan("pb", redis_server.url, "now", True, 2, "count", batch="b")
    rows = [(f"t{i}", None, None, '{"x":1}') for i in range(3)]
    ds.schedule_rows(iter(rows), plan)
    ds.schedule_rows(iter(rows), plan)  # a retried partition
    assert dueq.Queue("pb", r).batch("b").total == 3


def test_a_spark_write_with_a_batch_runs_one_completion_after_every_row(spark, r, redis_server):
    df = spark.range(50, numPartitions=2).select(
        F.concat(F.lit("row-"), F.col("id")).alias("rid"), F.col("id").alias("n")
    )
    result = ds.schedule_dataframe(
        df,
        queue="sb",
        redis_url=redis_server.url,
        id_col="rid",
        batch="job-1",
        on_complete=dueq.Task({"job": "job-1"}, id="job-1-done"),
    )
    assert result.added == 50
    assert (result.batch.total, result.batch.closed, result.batch.complete) == (50, True, False)
    q = dueq.Queue("sb", r)
    assert q.get("job-1-done") is None
    order = []
    while deliveries := q.claim(limit=7):
        for d in deliveries:
            order.append(d.id)
            d.ack()
    assert order.count("job-1-done") == 1 and order[-1] == "job-1-done"
    assert len(order) == 51
    assert q.batch("job-1").acked == 50


def test_the_data_source_closes_its_batch_when_the_write_commits(spark, r, redis_server):
    df = spark.range(30, numPartitions=3).select(
        F.concat(F.lit("d-"), F.col("id")).alias("rid"), F.col("id").alias("n")
    )
    df.write.format("dueq").mode("append").options(
        queue="dsb",
        redis_url=redis_server.url,
        id_col="rid",
        batch="ds-1",
        on_complete_payload='{"done": true}',
        on_complete_id="ds-1-done",
    ).save()
    q = dueq.Queue("dsb", r)
    info = q.batch("ds-1")
    assert (info.total, info.closed, info.complete) == (30, True, False)
    seen = []
    while deliveries := q.claim(limit=7):
        seen += [d.id for d in deliveries]
        q.ack_many(deliveries)
    assert seen.count("ds-1-done") == 1 and seen[-1] == "ds-1-done"
    assert q.get("ds-1-done") is None and q.batch("ds-1").acked == 30


def test_each_streamed_micro_batch_is_its_own_batch_closed_at_its_commit(
    spark, r, redis_server, tmp_path
):
    source = tmp_path / "in"
    source.mkdir()
    for part in range(2):
        rows = [json.dumps({"id": f"s-{part}-{i}", "v": i}) for i in range(20)]
        (source / f"part-{part}.json").write_text("\n".join(rows) + "\n")
    query = (
        spark.readStream.schema("id string, v long")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .writeStream.format("dueq")
        .options(queue="stb", redis_url=redis_server.url, id_col="id", batch="feed")
        .option("on_complete_task", "feed_done")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    q = dueq.Queue("stb", r)
    assert [(b.id, b.total, b.closed) for b in sorted(q.batches(), key=lambda b: b.id)] == [
        ("feed:0", 20, True),
        ("feed:1", 20, True),
    ]
    assert q.get("batch:feed:0") is None  # its members have not run yet
    seen = []
    while deliveries := q.claim(limit=100):
        seen += [d.id for d in deliveries]
        q.ack_many(deliveries)
    assert sorted(i for i in seen if i.startswith("batch:")) == ["batch:feed:0", "batch:feed:1"]
