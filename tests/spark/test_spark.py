"""dueq.spark on a real local SparkSession (the ``spark`` fixture of conftest.py)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections import Counter
from datetime import datetime, timedelta, timezone

import pytest
import redis

import dueq
from dueq._wire.snapshot import text
from dueq.server import RedisServer

pytest.importorskip("pyspark", reason="pyspark is not installed: pip install 'dueq[spark]'")

from pyspark.sql import functions as F
from spark_support import (
    ROWS,
    T0,
    bad_fair_keys_frame,
    bad_rows_frame,
    fair_frame,
    reminders,
    tenants_of,
)

from dueq import spark as ds


def due_at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=timezone.utc)


def test_partition_function_schedules_plain_tuples_without_spark(r, redis_server):
    plan = ds.PartitionPlan("plain", redis_server.url, "at", True, 2, "count")
    rows = [
        ("a", T0 * 1_000_000, None, '{"x":1}'),
        ("b", None, None, '{"x":2}'),
        ("c", (T0 + 1) * 1_000_000 + 400, None, '{"x":3}'),
        (None, T0 * 1_000_000, None, '{"x":4}'),
        ("d", T0 * 1_000_000, None, None),
        ("a", T0 * 1_000_000, None, '{"x":1}'),
    ]
    counts = ds.schedule_rows(iter(rows), plan)
    assert (counts.added, counts.existing) == (2, 1)
    assert counts.bad == {"due": 1, "id": 1, "payload": 1}
    assert len(counts.samples) == 3
    q = dueq.Queue("plain", r)
    assert q.get("a").payload == {"x": 1}
    assert q.get("c").due_at == due_at(T0 + 1)


def test_partition_function_stores_a_past_due_time_as_the_time_it_was_scheduled(r, redis_server):
    # issue 27: a row due in 2020 is due now, and its lag counts from now, not from 2020
    plan = ds.PartitionPlan("old-rows", redis_server.url, "at", True, 2, "count")
    y2020_us = int(datetime(2020, 1, 1, tzinfo=timezone.utc).timestamp()) * 1_000_000
    counts = ds.schedule_rows(iter([("a", y2020_us, None, '{"x":1}')]), plan)
    assert counts.added == 1
    stats = dueq.Queue("old-rows", r).stats()
    assert stats.due_now == 1
    assert 0 <= stats.oldest_due_lag_s < 60


def test_partition_function_raises_on_a_bad_row_when_asked(redis_server):
    plan = ds.PartitionPlan("plain", redis_server.url, "at", False, 10, "raise")
    with pytest.raises(dueq.InvalidTaskError, match="due time is unparsable"):
        ds.schedule_rows(iter([(None, None, "soon", "{}")]), plan)


def test_rows_are_scheduled_once_with_due_time_and_payload(spark, r, redis_server):
    df = reminders(spark)
    first = ds.schedule_dataframe(
        df, queue="rem", redis_url=redis_server.url, id_col="user", at_col="send_at"
    )
    assert (first.added, first.existing, first.bad_rows) == (ROWS, 0, 0)
    q = dueq.Queue("rem", r)
    assert q.stats().scheduled == ROWS
    for n in (0, 12_345, ROWS - 1):
        info = q.get(f"user-{n}")
        assert info.due_at == due_at(T0 + n)
        assert info.payload == {"n": n, "text": "hello"}
    again = ds.schedule_dataframe(
        df, queue="rem", redis_url=redis_server.url, id_col="user", at_col="send_at"
    )
    assert (again.added, again.existing) == (0, ROWS)
    assert q.stats().scheduled == ROWS


def test_row_hash_ids_are_stable_across_runs(spark, r, redis_server):
    df = reminders(spark, rows=1000).drop("user")
    first = ds.schedule_dataframe(df, queue="hashed", redis_url=redis_server.url, at_col="send_at")
    again = ds.schedule_dataframe(
        df.repartition(3), queue="hashed", redis_url=redis_server.url, at_col="send_at"
    )
    assert (first.added, again.added, again.existing) == (1000, 0, 1000)
    ids = {text(i) for i in r.zrange("dueq:{hashed}:due", 0, -1)}
    payload_0 = json.dumps({"n": 0, "text": "hello"}, separators=(",", ":")).encode()
    assert ds.row_id(1, T0 * 1000, payload_0) in ids


def test_a_failed_and_retried_partition_leaves_one_task_per_row(spark, r, redis_server, tmp_path):
    marker = tmp_path / "failed-once"

    def fail_once(n: int) -> int:  # row 9,000 of partition 0 fails, on the first attempt only
        if n == 9_000 and not marker.exists():
            marker.touch()
            raise RuntimeError("injected failure")
        return n

    df = reminders(spark).withColumn("n", F.udf(fail_once, "long", useArrow=False)(F.col("n")))
    result = ds.schedule_dataframe(
        df,
        queue="retried",
        redis_url=redis_server.url,
        id_col="user",
        at_col="send_at",
        batch_size=500,
    )
    assert marker.exists()
    assert result.added + result.existing == ROWS
    assert result.existing > 0  # the retry met the rows its failed attempt had written
    assert r.zcard("dueq:{retried}:due") == r.hlen("dueq:{retried}:tasks") == ROWS


def test_remember_done_keeps_a_rerun_after_the_tasks_ran_from_adding_them(spark, r, redis_server):
    df = reminders(spark, rows=1000).drop("send_at")  # due now
    options = {"queue": "ran", "redis_url": redis_server.url, "id_col": "user"}
    q = dueq.Queue("ran", r)
    q.configure(remember_done=timedelta(hours=1))  # once, for the job and the workers alike
    assert ds.schedule_dataframe(df, **options).added == 1000
    while deliveries := q.claim(limit=1000):
        q.ack_many(deliveries)
    again = ds.schedule_dataframe(df, **options)
    assert (again.added, again.existing) == (0, 1000)
    assert q.stats().scheduled == 0
    q.configure(remember_done=0)
    assert ds.schedule_dataframe(df, **options).added == 1000  # without the window: re-created


def test_the_remember_done_keyword_of_schedule_dataframe_still_works_without_a_warning(
    spark, r, redis_server
):
    df = reminders(spark, rows=10).drop("send_at")
    options = {"queue": "kw", "redis_url": redis_server.url, "id_col": "user"}
    window = timedelta(hours=1)
    assert ds.schedule_dataframe(df, remember_done=window, **options).added == 10
    with pytest.warns(DeprecationWarning):
        q = dueq.Queue("kw", r, remember_done=window)  # the consumer's deprecated keyword
    while deliveries := q.claim(limit=1000):
        q.ack_many(deliveries)
    assert ds.schedule_dataframe(df, remember_done=window, **options).existing == 10


def test_streaming_available_now_schedules_every_row(spark, r, redis_server, tmp_path):
    source = tmp_path / "in"
    source.mkdir()
    for part in range(3):
        lines = [
            json.dumps({"id": f"s-{part}-{i}", "at": "2030-01-01T09:00:00Z", "v": i})
            for i in range(100)
        ]
        (source / f"part-{part}.json").write_text("\n".join(lines) + "\n")
    stream = spark.readStream.schema("id string, at string, v long").json(str(source))
    writer = ds.foreach_batch(queue="stream", redis_url=redis_server.url, id_col="id", at_col="at")
    query = (
        stream.writeStream.foreachBatch(writer)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    q = dueq.Queue("stream", r)
    assert q.stats().scheduled == 300
    info = q.get("s-2-7")
    assert info.payload == {"v": 7}
    assert info.due_at == datetime(2030, 1, 1, 9, tzinfo=timezone.utc)


def test_bad_rows_are_counted_and_reported_not_dropped(spark, r, redis_server):
    result = ds.schedule_dataframe(
        bad_rows_frame(spark), queue="bad", redis_url=redis_server.url, id_col="id", at_col="at"
    )
    assert (result.added, result.bad_rows) == (1, 5)
    assert result.bad_by_reason == {"due": 2, "payload": 2, "id": 1}
    samples = "\n".join(result.bad_samples)
    assert "'null-due'" in samples and "next tuesday" in samples and "NaN or Infinity" in samples
    assert dueq.Queue("bad", r).get("ok").payload == {"x": 1.5, "xs": [1.0]}


def test_on_bad_row_raise_fails_the_job_with_a_dueq_error(spark, redis_server):
    with pytest.raises(dueq.InvalidTaskError, match=r"stopped at a bad row.*due time is null"):
        ds.schedule_dataframe(
            bad_rows_frame(spark).where("id = 'null-due'"),
            queue="bad",
            redis_url=redis_server.url,
            id_col="id",
            at_col="at",
            on_bad_row="raise",
        )


def test_due_times_are_read_in_the_session_time_zone(spark, r, redis_server):
    df = spark.createDataFrame(
        [("s", "2030-01-01 09:00:00"), ("offset", "2030-01-01T09:00:00+01:00")],
        "id string, at string",
    ).select("id", "at", F.col("at").cast("timestamp_ntz").alias("wall"))
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        ds.schedule_dataframe(
            df, queue="tz", redis_url=redis_server.url, id_col="id", at_col="at", payload_cols=[]
        )
        ds.schedule_dataframe(
            df.where("id = 's'").withColumn("id", F.lit("ntz")),
            queue="tz",
            redis_url=redis_server.url,
            id_col="id",
            at_col="wall",
            payload_cols=["wall"],
        )
    finally:
        spark.conf.set("spark.sql.session.timeZone", "UTC")
    q = dueq.Queue("tz", r)
    assert q.get("s").due_at == datetime(2030, 1, 1, 14, tzinfo=timezone.utc)
    assert q.get("offset").due_at == datetime(2030, 1, 1, 8, tzinfo=timezone.utc)
    assert q.get("ntz").due_at == datetime(2030, 1, 1, 14, tzinfo=timezone.utc)
    assert q.get("ntz").payload == {"wall": "2030-01-01T09:00:00.000000"}


def test_delay_column_counts_from_when_redis_writes_the_task(spark, r, redis_server):
    df = spark.createDataFrame([("a", 60), ("b", -1)], "id string, delay_s int")
    before = r.time()[0]
    result = ds.schedule_dataframe(
        df, queue="later", redis_url=redis_server.url, id_col="id", delay_col="delay_s"
    )
    after = r.time()[0] + 1
    assert (result.added, result.bad_by_reason) == (1, {"due": 1})
    info = dueq.Queue("later", r).get("a")
    assert due_at(before + 60) <= info.due_at <= due_at(after + 60)
    assert info.payload == {}


def test_read_tasks_returns_the_dead_letter_queue(spark, r, redis_server, clock):
    q = dueq.Queue("dlq", r, clock=clock)
    for i in range(5):
        q.schedule({"i": i}, id=f"t{i}")
    q.schedule({"i": 99}, id="alive", delay=3600)
    for d in q.claim(limit=10):
        d.fail(dueq.Unrecoverable(f"broken {d.payload['i']}"))
    dead = ds.read_tasks(spark, queue="dlq", redis_url=redis_server.url, page_size=2)
    rows = {row.id: row for row in dead.collect()}
    assert set(rows) == {f"t{i}" for i in range(5)}
    t3 = rows["t3"]
    assert (t3.state, t3.attempt, json.loads(t3.payload)) == ("dead", 1, {"i": 3})
    assert t3.attempts == t3.attempt  # the deprecated alias column
    assert json.loads(t3.errors)[0]["message"] == "broken 3"
    # the errors column holds the records of the task's one JSON form (docs/json.md)
    assert json.loads(t3.errors) == q.get("t3").to_json("dlq")["errors"]
    assert t3.died_at is not None and t3.due_at is None
    scheduled = ds.read_tasks(spark, queue="dlq", redis_url=redis_server.url, state="scheduled")
    assert [row.id for row in scheduled.collect()] == ["alive"]


def test_password_in_redis_url_works_in_executors(spark):
    with RedisServer() as server:
        admin = server.client()
        admin.config_set("requirepass", "s3cret word")
        url = f"redis://:s3cret%20word@127.0.0.1:{server.port}/0"
        df = reminders(spark, rows=50)
        result = ds.schedule_dataframe(df, queue="auth", redis_url=url, id_col="user")
        assert result.added == 50
        with pytest.raises(Exception, match=r"(?i)auth|password"):
            ds.schedule_dataframe(
                df, queue="auth", redis_url=url.replace("s3cret", "wrong"), id_col="user"
            )
        authed = redis.Redis.from_url(url)
        assert authed.zcard("dueq:{auth}:due") == 50
        assert ds.read_tasks(spark, queue="auth", redis_url=url, state="scheduled").count() == 50
        authed.close()


def test_tls_with_certificate_checks_works_in_executors(spark):
    if shutil.which("openssl") is None:
        pytest.skip("the TLS test needs the openssl command to make certificates")
    with RedisServer(tls=True) as server:  # TLS only, a throwaway CA; url names the CA file
        result = ds.schedule_dataframe(reminders(spark, rows=50), queue="tls", redis_url=server.url)
        assert result.added == 50
        assert server.client().zcard("dueq:{tls}:due") == 50
        unverified = f"rediss://127.0.0.1:{server.port}/0"  # the system CAs do not know ours
        with pytest.raises(Exception, match=r"(?i)certificate verify failed"):
            ds.schedule_dataframe(reminders(spark, rows=5), queue="tls", redis_url=unverified)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"id_col": "nope"}, "id_col 'nope' is not a column"),
        ({"at_col": "send_at", "delay_col": "n"}, "not both"),
        ({"on_bad_row": "ignore"}, "on_bad_row"),
        ({"batch_size": 0}, "batch_size"),
        ({"payload_cols": ["text", "missing"]}, "missing"),
        ({"at_col": "flag"}, "at_col 'flag' is boolean"),
        ({"queue": "a{b}"}, "queue name"),
        ({"fair_key_col": "nope"}, "fair_key_col 'nope' is not a column"),
        ({"fair_key_col": "flag"}, "fair_key_col 'flag' is boolean"),
    ],
)
def test_bad_arguments_raise_configuration_error(spark, redis_server, options, message):
    df = reminders(spark, rows=2).withColumn("flag", F.lit(True))
    kwargs = {"queue": "args", "redis_url": redis_server.url, **options}
    with pytest.raises(dueq.ConfigurationError, match=message):
        ds.schedule_dataframe(df, **kwargs)


def test_read_tasks_refuses_an_unknown_state(spark, redis_server):
    with pytest.raises(dueq.ConfigurationError, match="state"):
        ds.read_tasks(spark, queue="q", redis_url=redis_server.url, state="done")


def test_partition_function_lanes_rows_with_a_fair_key_without_spark(r, redis_server):
    q = dueq.Queue("plain-fair", r)
    q.configure(fairness="key")
    plan = ds.PartitionPlan("plain-fair", redis_server.url, "now", True, 10, "count")
    plan = dataclasses.replace(plan, has_fair_key=True)
    rows = [
        ("a", None, None, '{"x":1}', "acme"),
        ("b", None, None, '{"x":2}', None),
        ("c", None, None, '{"x":3}', ""),
        ("d", None, None, '{"x":4}', "globex"),
    ]
    counts = ds.schedule_rows(iter(rows), plan)
    assert (counts.added, counts.bad) == (3, {"fair_key": 1})
    assert (
        "row 2 of its partition (id 'c'): fair_key: key '' must be non-empty" in counts.samples[0]
    )
    assert tenants_of(r, "plain-fair") == {"acme": 1, "": 1, "globex": 1}
    assert r.hget("dueq:{plain-fair}:tasks", "a") == b'2:0|||\x1facme\n{"x":1}'
    assert r.hget("dueq:{plain-fair}:tasks", "b") == b'1:{"x":2}'  # no tenant: as before


def test_a_fair_key_column_lanes_each_row_under_its_tenant(spark, r, redis_server):
    q = dueq.Queue("fair-df", r)
    q.configure(fairness="key")
    result = ds.schedule_dataframe(
        fair_frame(spark), queue="fair-df", redis_url=redis_server.url, id_col="id",
        fair_key_col="tenant",
    )  # fmt: skip
    assert (result.added, result.bad_rows) == (30, 0)
    assert tenants_of(r, "fair-df") == {"acme": 26, "globex": 3, "": 1}
    assert q.get("t-0").payload == {"n": 0}  # the fair key column is not part of the payload
    assert r.hget("dueq:{fair-df}:tasks", "t-0") == b'2:0|||\x1facme\n{"n":0}'
    # every tenant is served in the first claim, whatever acme's backlog (the default
    # tenant's one task leaves acme its turn)
    first = q.claim(6)
    tenant = {f"t-{n}": "acme" if n < 26 else "globex" if n < 29 else "" for n in range(30)}
    assert Counter(tenant[d.id] for d in first) == {"acme": 3, "globex": 2, "": 1}
    again = ds.schedule_dataframe(
        fair_frame(spark), queue="fair-df", redis_url=redis_server.url, id_col="id",
        fair_key_col="tenant",
    )  # fmt: skip
    assert (again.added, again.existing) == (0, 30)


def test_a_fair_key_column_works_on_a_queue_that_is_not_fair(spark, r, redis_server):
    result = ds.schedule_dataframe(
        fair_frame(spark), queue="unfair-df", redis_url=redis_server.url, id_col="id",
        fair_key_col="tenant",
    )  # fmt: skip
    assert result.added == 30
    assert r.zcard("dueq:{unfair-df}:due") == 30 and r.zcard("dueq:{unfair-df}:parked") == 0
    assert r.hget("dueq:{unfair-df}:tasks", "t-27") == b'2:0|||\x1fglobex\n{"n":27}'
    assert len(dueq.Queue("unfair-df", r).claim(30)) == 30


def test_bad_fair_keys_are_counted_like_bad_ids(spark, r, redis_server):
    result = ds.schedule_dataframe(
        bad_fair_keys_frame(spark), queue="bad-fair", redis_url=redis_server.url, id_col="id",
        fair_key_col="tenant",
    )  # fmt: skip
    assert (result.added, result.bad_rows, result.bad_by_reason) == (2, 3, {"fair_key": 3})
    samples = "\n".join(result.bad_samples)
    assert "(id 'empty'): fair_key: key '' must be non-empty" in samples
    assert "(id 'control')" in samples and "(id 'long')" in samples
    assert "longer than 200 bytes" in samples
    assert {text(i) for i in r.zrange("dueq:{bad-fair}:due", 0, -1)} == {"ok", "no-tenant"}
    with pytest.raises(dueq.InvalidTaskError, match=r"stopped at a bad row.*'empty'.*fair_key"):
        ds.schedule_dataframe(
            bad_fair_keys_frame(spark).where("id = 'empty'"), queue="bad-fair",
            redis_url=redis_server.url, id_col="id", fair_key_col="tenant", on_bad_row="raise",
        )  # fmt: skip


def test_generated_ids_tell_tenants_apart_and_stay_the_same_without_one(spark, r, redis_server):
    df = spark.createDataFrame([("acme", 1), ("globex", 1), (None, 1)], "tenant string, n long")
    result = ds.schedule_dataframe(
        df, queue="fair-hash", redis_url=redis_server.url, fair_key_col="tenant"
    )
    assert result.added == 3  # one payload, three tenants: three tasks
    ids = {text(i) for i in r.zrange("dueq:{fair-hash}:due", 0, -1)}
    assert ds.row_id(0, 0, b'{"n":1}') in ids  # no tenant: the id of a row without the column
    assert ds.row_id(0, 0, b'{"n":1}', fair_key="acme") in ids
    assert ds.row_id(0, 0, b'{"n":1}', fair_key="globex") in ids
    tenants = spark.createDataFrame([(7, 1)], "tenant long, n long")  # integers as text
    ds.schedule_dataframe(tenants, queue="fair-hash", redis_url=redis_server.url,
                          fair_key_col="tenant")  # fmt: skip
    task = ds.row_id(0, 0, b'{"n":1}', fair_key="7")
    assert r.hget("dueq:{fair-hash}:tasks", task) == b'2:0|||\x1f7\n{"n":1}'
