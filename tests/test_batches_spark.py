"""A Spark write with ``batch=``: every row's task joins the batch, the driver closes it when
the job has written every partition, and the completion task runs once (issue 30)."""

from __future__ import annotations

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
