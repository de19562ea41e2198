"""Spark rows as calls of a named task: ``schedule_dataframe(..., task=)`` and the data
source's ``.option("task", ...)``; each row's columns are the task's arguments."""

from __future__ import annotations

import pytest
import redis

import dueq

pytest.importorskip("pyspark", reason="pyspark is not installed: pip install 'dueq[spark]'")

from dueq import spark as ds
from dueq.named import dispatcher


def test_partition_rows_of_a_named_task_carry_its_name_without_spark(r, redis_server):
    plan = ds.PartitionPlan("rows", redis_server.url, "now", False, 10, "count", task="greet")
    counts = ds.schedule_rows(iter([(None, None, None, '{"who":"a"}')]), plan)
    assert counts.added == 1
    [info] = dueq.Queue("rows", r).list_tasks("scheduled").tasks
    assert info.task_name == "greet" and info.payload == {"who": "a"}
    # the same arguments to another task (or none) are another task: the hashed id differs
    assert ds.row_id(0, 0, b'{"who":"a"}', "greet") != ds.row_id(0, 0, b'{"who":"a"}')


def test_dataframe_rows_run_as_a_named_task_by_helper_and_by_data_source(
    spark, r: redis.Redis, redis_server
):
    q = dueq.Queue("named-rows", r)
    seen: list[tuple[str, int]] = []

    @q.task(name="send_welcome")
    def send_welcome(to: str, n: int) -> None:
        seen.append((to, n))

    df = spark.createDataFrame(
        [("a@b.c", 1, "u1"), ("d@e.f", 2, "u2")], "to string, n long, id string"
    )
    result = ds.schedule_dataframe(
        df.filter("n = 1"),
        queue="named-rows",
        redis_url=redis_server.url,
        id_col="id",
        task=send_welcome,
    )
    assert result.added == 1
    df.filter("n = 2").write.format("dueq").mode("append").options(
        queue="named-rows", redis_url=redis_server.url, id_col="id", task="send_welcome"
    ).save()
    assert q.get("u1").task_name == q.get("u2").task_name == "send_welcome"
    assert q.get("u2").payload == {"to": "d@e.f", "n": 2}
    with pytest.raises(dueq.InvalidTaskError, match="task name"):
        ds.schedule_dataframe(
            df, queue="named-rows", redis_url=redis_server.url, id_col="id", task="bad name"
        )
    with pytest.raises(dueq.InvalidTaskError, match="missing a required argument: 'n'"):
        ds.schedule_dataframe(
            df.drop("n"),
            queue="named-rows",
            redis_url=redis_server.url,
            id_col="id",
            task=send_welcome,
        )
    run = dispatcher([q], None, on_loop=False)
    for d in q.claim():
        run(d)
        d.ack()
    assert sorted(seen) == [("a@b.c", 1), ("d@e.f", 2)]


def test_rows_of_a_named_task_with_a_fair_key_are_stored_as_schedule_stores_them(r, redis_server):
    q = dueq.Queue("named-fair", r)
    q.configure(fairness="key")
    plan = ds.PartitionPlan(
        "named-fair", redis_server.url, "now", True, 10, "count", task="greet", has_fair_key=True
    )
    counts = ds.schedule_rows(iter([("row", None, None, '{"who":"a"}', "acme")]), plan)
    assert counts.added == 1
    q.schedule({"who": "a"}, id="api", task="greet", fair_key="acme")
    stored = r.hmget("dueq:{named-fair}:tasks", ["row", "api"])
    assert stored[0] == stored[1] == b'2:0|||\x1facme\n~@greet\n{"who":"a"}'
    assert q.get("row").task_name == "greet"
    assert [d.id for d in q.claim(10)] in (["row", "api"], ["api", "row"])
