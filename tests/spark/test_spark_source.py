"""dueq.spark.DueqDataSource (``format("dueq")``) on a real local SparkSession and redis-server.

The session is conftest.py's (local[2,4]: two cores, a task may fail three times).
Nothing here registers the data source except the test that checks ``register``: pyspark
finds it through the ``pyspark_dueq`` module.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import redis
from paths_support import DOCS

import dueq

pytest.importorskip("pyarrow", reason="the data source needs pyarrow: pip install 'dueq[spark]'")
pytest.importorskip("pyspark.sql.datasource", reason="the data source needs pyspark >= 4.0")

import pyarrow as pa
from internals_support import protocol, spark_source
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from spark_support import (
    ROWS,
    bad_fair_keys_frame,
    bad_rows_frame,
    fair_frame,
    reminders,
    staging_keys,
    stream_files,
    tenants_of,
)

from dueq import spark as ds
from dueq._wire.envelope import pack_task
from dueq._wire.keys import QueueKeys, SparkBatchKeys
from dueq._wire.scripts import Scripts
from dueq._wire.snapshot import text


def ids_of(r: redis.Redis, queue: str) -> set[str]:
    return {text(i) for i in r.zrange(f"dueq:{{{queue}}}:due", 0, -1)}


def write(df: DataFrame, queue: str, url: str, **options: str) -> None:
    df.write.format("dueq").mode("append").options(queue=queue, redis_url=url, **options).save()


def test_format_dueq_is_found_without_registering_and_register_works_too(spark, r, redis_server):
    write(reminders(spark, rows=10), "found", redis_server.url, id_col="user")
    assert r.zcard("dueq:{found}:due") == 10
    ds.register(spark)
    write(reminders(spark, rows=20), "found", redis_server.url, id_col="user")
    assert r.zcard("dueq:{found}:due") == 20


def test_batch_write_is_idempotent_with_the_due_times_and_payloads_of_schedule_dataframe(
    spark, r, redis_server
):
    df = reminders(spark, rows=ROWS)
    options = {"id_col": "user", "at_col": "send_at"}
    write(df, "src", redis_server.url, **options)
    write(df.repartition(3), "src", redis_server.url, **options)
    ds.schedule_dataframe(df, queue="helper", redis_url=redis_server.url, **options)
    assert r.zcard("dueq:{src}:due") == r.hlen("dueq:{src}:tasks") == ROWS
    assert r.zrange("dueq:{src}:due", 0, -1, withscores=True) == r.zrange(
        "dueq:{helper}:due", 0, -1, withscores=True
    )
    for n in (0, 12_345, ROWS - 1):
        assert r.hget("dueq:{src}:tasks", f"user-{n}") == r.hget("dueq:{helper}:tasks", f"user-{n}")


def test_generated_ids_and_payload_json_are_the_ones_schedule_dataframe_makes(
    spark, r, redis_server
):
    spark.conf.set("spark.sql.session.timeZone", "Europe/Berlin")
    try:
        df = spark.range(300, numPartitions=2).select(
            (F.lit(1_900_000_000) + F.col("id")).cast("timestamp").alias("at"),
            (F.col("id") * 1234.5678e3).alias("big"),
            (F.col("id") / 3e5).cast("float").alias("small"),
            F.concat(F.lit('ünï "q"\\\t\x01 '), F.col("id")).alias("s"),
            F.array(F.col("id"), F.lit(None).cast("long")).alias("xs"),
            F.create_map(F.lit("k"), F.col("id") % 2 == 0).alias("m"),
            F.struct(F.col("id").cast("decimal(12,3)").alias("d"), F.lit(None).alias("n")).alias(
                "st"
            ),
            F.col("id").cast("timestamp").alias("ts"),
            F.to_date(F.col("id").cast("timestamp")).alias("day"),
            F.lit(b"\x00\xff").alias("bin"),
        )
        write(df, "hash-src", redis_server.url, at_col="at")
        ds.schedule_dataframe(df, queue="hash-helper", redis_url=redis_server.url, at_col="at")
    finally:
        spark.conf.set("spark.sql.session.timeZone", "UTC")
    assert len(ids_of(r, "hash-src")) == 300
    assert ids_of(r, "hash-src") == ids_of(r, "hash-helper")


def test_bad_rows_are_left_out_and_the_good_ones_written(spark, r, redis_server):
    write(bad_rows_frame(spark), "bad-src", redis_server.url, id_col="id", at_col="at")
    assert ids_of(r, "bad-src") == {"ok"}
    assert dueq.Queue("bad-src", r).get("ok").payload == {"x": 1.5, "xs": [1.0]}


def test_the_write_task_counts_bad_rows_by_reason_without_spark(redis_server):
    schema = T.StructType(
        [
            T.StructField("id", T.StringType()),
            T.StructField("at", T.StringType()),
            T.StructField("x", T.DoubleType()),
        ]
    )
    setup = spark_source()._write_setup(
        {"queue": "bad-arrow", "redis_url": redis_server.url, "id_col": "id", "at_col": "at"},
        schema,
    )
    batch = pa.record_batch(
        [
            pa.array(["ok", None, "late", "nan"]),
            pa.array(["2030-01-01 09:00:00Z", "2030-01-01", "next tuesday", "2030-01-01"]),
            pa.array([1.0, 2.0, 3.0, float("nan")]),
        ],
        names=["id", "at", "x"],
    )
    counts = ds.schedule_rows(setup.rows(iter([batch])), setup.plan)
    assert (counts.added, counts.bad) == (1, {"id": 1, "due": 1, "payload": 1})
    assert dueq.Queue("bad-arrow", redis_server.client()).get("ok").payload == {"x": 1.0}


def test_on_bad_row_raise_fails_the_write_naming_the_row(spark, redis_server):
    with pytest.raises(Exception, match=r"dueq bad row: .*due time is null"):
        write(
            bad_rows_frame(spark).where("id = 'null-due'"),
            "bad-raise",
            redis_server.url,
            id_col="id",
            at_col="at",
            on_bad_row="raise",
        )


def test_bad_options_are_refused_before_any_task_runs(spark, redis_server):
    with pytest.raises(Exception, match="at_col 'nope' is not a column"):
        write(reminders(spark, rows=2), "opts", redis_server.url, at_col="nope")
    with pytest.raises(Exception, match="state must be scheduled, leased or dead"):
        spark.read.format("dueq").options(
            queue="opts", redis_url=redis_server.url, state="done"
        ).load().collect()


def test_a_misspelled_read_option_fails_naming_the_nearest_valid_one(spark, r, redis_server):
    # stat="scheduled" used to be ignored: the dead tasks (the default state) came back
    q = dueq.Queue("typo-read", r)
    q.schedule({"n": 1}, id="alive", delay=3600)

    def read() -> Any:  # a new reader each time: .option() changes the reader it is called on
        return spark.read.format("dueq").options(queue="typo-read", redis_url=redis_server.url)

    with pytest.raises(Exception, match=r"unknown option 'stat' of a dueq read.*'state'\?"):
        read().option("stat", "scheduled").load().collect()
    rows = read().option("STATE", "scheduled").load().collect()  # the case of a name is free
    assert [row.id for row in rows] == ["alive"]


def test_a_misspelled_write_option_fails_before_any_row_is_written(spark, r, redis_server):
    df = reminders(spark, rows=20)
    with pytest.raises(Exception, match=r"unknown option 'id_coll' of a dueq write.*'id_col'\?"):
        write(df, "typo-write", redis_server.url, id_coll="user")
    with pytest.raises(Exception, match="option staging_ttl_s is for streaming writes"):
        write(df, "typo-write", redis_server.url, id_col="user", staging_ttl_s="3600")
    assert r.zcard("dueq:{typo-write}:due") == 0
    write(df, "typo-write", redis_server.url, ID_Col="user", Batch_Size="7")
    assert ids_of(r, "typo-write") == {f"user-{n}" for n in range(20)}


def test_the_option_check_takes_spark_lower_cased_names_and_plain_dicts(redis_server):
    from pyspark.sql.datasource import CaseInsensitiveDict

    schema = T.StructType([T.StructField("id", T.StringType())])
    given = {"Queue": "q", "REDIS_URL": redis_server.url, "id_col": "id", "batchSize": "9"}
    for options in (given, CaseInsensitiveDict(given)):
        with pytest.raises(
            dueq.ConfigurationError, match=r"^unknown option 'batchsize' .*'batch_size'\?"
        ):
            spark_source()._write_setup(options, schema)
    with pytest.raises(dueq.ConfigurationError, match=r"unknown options 'foo', 'pag_size' "):
        spark_source()._Reader(
            CaseInsensitiveDict(queue="q", redis_url=redis_server.url, foo="1", pag_size="3")
        )


def test_reading_a_queue_that_does_not_exist_fails_unless_allow_missing(spark, redis_server):
    read = spark.read.format("dueq").options(queue="nowhere", redis_url=redis_server.url)
    with pytest.raises(Exception, match=r"no queue named 'nowhere' at redis://.*allow_missing"):
        read.load().collect()
    assert read.option("allow_missing", "true").load().collect() == []
    with pytest.raises(Exception, match="option allow_missing must be true or false"):
        read.option("allow_missing", "yes").load().collect()
    with pytest.raises(dueq.ConfigurationError, match="no queue named 'nowhere'"):
        ds.read_tasks(spark, queue="nowhere", redis_url=redis_server.url)
    assert (
        ds.read_tasks(
            spark, queue="nowhere", redis_url=redis_server.url, allow_missing=True
        ).count()
        == 0
    )


def run_stream(
    spark: SparkSession, source: Path, checkpoint: Path, queue: str, url: str, **options: str
) -> None:
    stream = spark.readStream.schema("id string, at string, v long").json(str(source))
    transform = options.pop("transform", None)
    if transform is not None:
        stream = stream.withColumn("v", transform(F.col("v")))
    query = (
        stream.writeStream.format("dueq")
        .options(queue=queue, redis_url=url, id_col="id", at_col="at", **options)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def drain(q: dueq.Queue) -> int:
    acked = 0
    while deliveries := q.claim(limit=1000):
        acked += q.ack_many(deliveries)
    return acked


def test_a_replayed_micro_batch_schedules_nothing_even_after_its_tasks_were_acked(
    spark, r, redis_server, tmp_path, clock
):
    stream_files(tmp_path / "in")
    checkpoint = tmp_path / "checkpoint"
    run_stream(spark, tmp_path / "in", checkpoint, "replay", redis_server.url)
    q = dueq.Queue("replay", r, clock=clock)
    assert q.stats().scheduled == 300
    assert q.get("s-1-7").payload == {"v": 7}
    clock.advance(1_900_000_000 - clock())  # past 2030-01-01 09:00: every task is due
    assert drain(q) == 300
    entry = checkpoint / "commits" / "0"
    assert entry.exists()
    entry.unlink()  # the driver "died" after the sink committed, before Spark's log did
    (checkpoint / "commits" / ".0.crc").unlink(missing_ok=True)
    run_stream(spark, tmp_path / "in", checkpoint, "replay", redis_server.url)
    assert (checkpoint / "commits" / "0").exists()  # Spark did replay batch 0
    assert q.stats().scheduled == 0
    assert staging_keys(r, "replay") == []


def test_a_task_failing_mid_batch_leaves_exactly_one_task_per_row(spark, r, redis_server, tmp_path):
    marker = tmp_path / "failed-once"

    def fail_once(v: int) -> int:  # after that task staged 100 rows, on its first attempt only
        if v == 120 and not marker.exists():
            marker.touch()
            raise RuntimeError("injected failure")
        return v

    stream_files(tmp_path / "in")
    run_stream(
        spark,
        tmp_path / "in",
        tmp_path / "checkpoint",
        "flaky",
        redis_server.url,
        batch_size="50",
        transform=F.udf(fail_once, "long", useArrow=False),
    )
    assert marker.exists()
    assert r.zcard("dueq:{flaky}:due") == r.hlen("dueq:{flaky}:tasks") == 300
    assert staging_keys(r, "flaky") == []


def test_a_failed_micro_batch_is_aborted_and_leaves_nothing_behind(
    spark, r, redis_server, tmp_path
):
    def always_fail(v: int) -> int:
        if v == 120:
            raise RuntimeError("injected failure, every attempt")
        return v

    stream_files(tmp_path / "in")
    with pytest.raises(Exception, match="injected failure"):
        run_stream(
            spark,
            tmp_path / "in",
            tmp_path / "checkpoint",
            "aborted",
            redis_server.url,
            batch_size="50",
            transform=F.udf(always_fail, "long", useArrow=False),
        )
    assert r.zcard("dueq:{aborted}:due") == 0
    assert staging_keys(r, "aborted") == []


def test_a_misspelled_stream_option_fails_the_query_and_stages_nothing(
    spark, r, redis_server, tmp_path
):
    stream_files(tmp_path / "in")
    with pytest.raises(Exception, match=r"unknown option 'staging_ttl' .*'staging_ttl_s'\?"):
        run_stream(
            spark,
            tmp_path / "in",
            tmp_path / "ck",
            "typo-stream",
            redis_server.url,
            staging_ttl="3600",
        )
    assert r.zcard("dueq:{typo-stream}:due") == 0
    assert staging_keys(r, "typo-stream") == []


@pytest.fixture
def dead_letters(r: redis.Redis, clock) -> Iterator[dueq.Queue]:
    q = dueq.Queue("dlq-src", r, clock=clock)
    q.schedule_many(dueq.Task({"i": i}, id=f"t{i}") for i in range(3000))
    q.schedule({"i": -1}, id="alive", delay=3600)
    while deliveries := q.claim(limit=1000):
        for d in deliveries:
            d.fail(dueq.Unrecoverable(f"broken {d.payload['i']}"))
            clock.advance(0.0001 * (d.payload["i"] % 3))  # some die in the same ms, some not
    yield q


def test_dead_letters_read_as_a_dataframe_in_several_partitions(spark, redis_server, dead_letters):
    dead = (
        spark.read.format("dueq")
        .options(queue="dlq-src", redis_url=redis_server.url, page_size="100")
        .load()
    )
    assert dead.rdd.getNumPartitions() == 3  # ten pages of 100 per partition
    rows = dead.collect()
    assert sorted(row.id for row in rows) == sorted(f"t{i}" for i in range(3000))
    t3 = next(row for row in rows if row.id == "t3")
    assert (t3.state, t3.attempt, json.loads(t3.payload)) == ("dead", 1, {"i": 3})
    assert t3.attempts == t3.attempt  # the deprecated alias column
    assert json.loads(t3.errors)[0]["message"] == "broken 3"
    scheduled = (
        spark.read.format("dueq")
        .options(queue="dlq-src", redis_url=redis_server.url, state="scheduled")
        .load()
    )
    assert [row.id for row in scheduled.collect()] == ["alive"]


def test_a_read_with_many_ties_at_one_score_pages_through_every_task(spark, r, redis_server):
    q = dueq.Queue("ties", r)
    q.schedule_many(dueq.Task({}, id=f"t{i:04d}", delay=3600) for i in range(1050))
    r.zadd("dueq:{ties}:due", {f"t{i:04d}": 5 for i in range(1050)})  # one score for all
    df = (
        spark.read.format("dueq")
        .options(
            queue="ties",
            redis_url=redis_server.url,
            state="scheduled",
            page_size="100",
            partitions="4",
        )
        .load()
    )
    assert sorted(row.id for row in df.collect()) == [f"t{i:04d}" for i in range(1050)]


def test_scheduled_tasks_of_every_priority_and_parked_ones_are_read(spark, r, redis_server):
    q = dueq.Queue("levels", r)
    q.configure(key_concurrency=1)
    q.schedule_many(dueq.Task({}, id=f"plain{i}", delay=3600) for i in range(5))
    q.schedule_many(dueq.Task({}, id=f"urgent{i}", delay=3600, priority=7) for i in range(3))
    q.schedule_many(dueq.Task({}, id=f"keyed{i}", key="tenant") for i in range(3))
    [held] = q.claim(10)  # leases one keyed task; the other two are parked
    assert held.key == "tenant"
    expected = sorted(
        [f"plain{i}" for i in range(5)]
        + [f"urgent{i}" for i in range(3)]
        + [f"keyed{i}" for i in range(3) if f"keyed{i}" != held.id]
    )
    df = (
        spark.read.format("dueq")
        .options(queue="levels", redis_url=redis_server.url, state="scheduled", partitions="3")
        .load()
    )
    assert sorted(row.id for row in df.collect()) == expected
    helper = ds.read_tasks(spark, queue="levels", redis_url=redis_server.url, state="scheduled")
    assert sorted(row.id for row in helper.collect()) == expected


def run_call(scripts: Scripts, call: protocol.Call[Any]) -> Any:
    return call.parse(scripts.run(call.script, call.keys, call.args))


def test_a_commit_that_died_half_way_is_finished_by_the_replay_exactly_once(r):
    """The driver dies after scheduling part of a batch; workers ack that part; Spark replays
    the batch: the replay's tasks stage nothing, its commit schedules the rest of the stage,
    and nothing acked comes back."""
    scripts, k = Scripts(r), QueueKeys.for_queue("half")
    keys = SparkBatchKeys.for_batch("half", "query", 7)
    blobs = [b"".join(pack_task(0, 0, f"{part}-{i}", b"1:{}") for i in range(3)) for part in "ab"]
    for blob in blobs:
        assert run_call(scripts, protocol.spark_stage(keys, "", "query", 7, 60_000, blob)).staged
    again = run_call(scripts, protocol.spark_stage(keys, "", "query", 7, 60_000, blobs[0]))
    assert (again.staged, again.duplicates) == (0, 3)  # a retried task stages nothing twice
    assert 0 < r.pttl(keys.rows) <= 60_000
    commit = protocol.spark_commit(
        k, keys, "", query="query", batch=7, memory_ms=86_400_000, window_ms=0
    )

    def step() -> protocol.CommitStep:
        return run_call(scripts, commit)

    assert step().scheduled.added == 3  # sealed, one element scheduled; then the driver dies
    assert r.pttl(keys.rows) == -1  # sealed: no longer expires
    assert drain(dueq.Queue("half", r)) == 3
    replay = run_call(scripts, protocol.spark_stage(keys, "", "query", 7, 60_000, blobs[0]))
    assert replay.refused
    aborted = run_call(scripts, protocol.spark_abort(keys, "", "query", 7))
    assert not aborted  # a failed replay keeps the sealed stage for the next commit
    assert step().scheduled.added == 3
    assert step().state is protocol.CommitState.COMMITTED
    assert step().state is protocol.CommitState.COMMITTED_BEFORE
    assert sorted(ids_of(r, "half")) == ["b-0", "b-1", "b-2"]
    assert r.keys("dueq:{half}:spark:stage:*") == []


# -- fair queues (docs/fairness.md) ------------------------------------------------------------


def test_a_fair_key_column_lanes_rows_as_schedule_dataframe_does(spark, r, redis_server):
    for queue in ("fair-src", "fair-helper"):
        dueq.Queue(queue, r).configure(fairness="key")
    write(fair_frame(spark), "fair-src", redis_server.url, id_col="id", fair_key_col="tenant")
    ds.schedule_dataframe(
        fair_frame(spark), queue="fair-helper", redis_url=redis_server.url, id_col="id",
        fair_key_col="tenant",
    )  # fmt: skip
    assert tenants_of(r, "fair-src") == {"acme": 26, "globex": 3, "": 1}
    assert r.hgetall("dueq:{fair-src}:tasks") == r.hgetall("dueq:{fair-helper}:tasks")
    assert r.hget("dueq:{fair-src}:tasks", "t-26") == b'2:0|||\x1fglobex\n{"n":26}'
    generated = fair_frame(spark).drop("id")  # the row-hash ids of both paths are the same too
    write(generated, "fair-src", redis_server.url, fair_key_col="tenant")
    ds.schedule_dataframe(
        generated, queue="fair-helper", redis_url=redis_server.url, fair_key_col="tenant"
    )
    assert r.hlen("dueq:{fair-src}:tasks") == 60
    assert r.hgetall("dueq:{fair-src}:tasks") == r.hgetall("dueq:{fair-helper}:tasks")


def test_bad_fair_keys_are_left_out_of_a_write_as_bad_ids_are(spark, r, redis_server):
    write(bad_fair_keys_frame(spark), "fair-bad", redis_server.url, id_col="id",
          fair_key_col="tenant")  # fmt: skip
    assert ids_of(r, "fair-bad") == {"ok", "no-tenant"}
    with pytest.raises(Exception, match=r"dueq bad row: .*'control'.*fair_key: key"):
        write(bad_fair_keys_frame(spark).where("id = 'control'"), "fair-bad", redis_server.url,
              id_col="id", fair_key_col="tenant", on_bad_row="raise")  # fmt: skip
    with pytest.raises(Exception, match="fair_key_col 'nope' is not a column"):
        write(fair_frame(spark), "fair-bad", redis_server.url, fair_key_col="nope")
    schema = T.StructType(
        [T.StructField("id", T.StringType()), T.StructField("tenant", T.StringType())]
    )
    setup = spark_source()._write_setup(
        {"queue": "fair-arrow", "redis_url": redis_server.url, "id_col": "id",
         "fair_key_col": "tenant"},
        schema,
    )  # fmt: skip
    batch = pa.record_batch(
        [pa.array(["ok", "null", "empty"]), pa.array(["acme", None, ""])], names=["id", "tenant"]
    )
    counts = ds.schedule_rows(setup.rows(iter([batch])), setup.plan)
    assert (counts.added, counts.bad) == (2, {"fair_key": 1})
    assert r.hget("dueq:{fair-arrow}:tasks", "ok") == b"2:0|||\x1facme\n{}"


def test_a_stream_with_a_fair_key_column_lanes_each_micro_batch_on_commit(
    spark, r, redis_server, tmp_path
):
    dueq.Queue("fair-stream", r).configure(fairness="key")
    stream_files(tmp_path / "in")
    stream = (
        spark.readStream.schema("id string, at string, v long")
        .json(str(tmp_path / "in"))
        .select("id", F.substring("id", 1, 3).alias("tenant"), "v")  # "s-0", "s-1"; due now
    )
    query = (
        stream.writeStream.format("dueq")
        .options(queue="fair-stream", redis_url=redis_server.url, id_col="id",
                 fair_key_col="tenant")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )  # fmt: skip
    query.awaitTermination()
    assert tenants_of(r, "fair-stream") == {"s-0": 150, "s-1": 150}
    assert r.hget("dueq:{fair-stream}:tasks", "s-1-7") == b'2:0|||\x1fs-1\n{"v":7}'


def test_a_fair_queue_s_laned_tasks_are_read_as_scheduled_with_their_due_times(
    spark, r, redis_server
):
    q = dueq.Queue("fair-read", r)
    q.configure(fairness="key")
    q.schedule_many(dueq.Task({"i": i}, id=f"a{i:03d}", fair_key="acme") for i in range(250))
    q.schedule_many(
        dueq.Task({"i": i}, id=f"g{i}", key="globex/x", fair_key="globex", priority=5)
        for i in range(5)
    )
    q.schedule_many(dueq.Task({"i": i}, id=f"k{i}", key="initech") for i in range(4))
    q.schedule_many(dueq.Task({}, id=f"later{i}", delay=3600, fair_key="acme") for i in range(3))
    assert tenants_of(r, "fair-read") == {"acme": 250, "globex": 5, "initech": 4}
    ids = [f"a{i:03d}" for i in range(250)] + [f"g{i}" for i in range(5)]
    ids += [f"k{i}" for i in range(4)] + [f"later{i}" for i in range(3)]
    expected = {i: q.get(i) for i in ids}
    now = datetime.now(timezone.utc)
    assert all(info.due_at <= now for i, info in expected.items() if not i.startswith("later"))
    df = (
        spark.read.format("dueq")
        .options(queue="fair-read", redis_url=redis_server.url, state="scheduled",
                 page_size="40", partitions="3")
        .load()
    )  # fmt: skip
    helper = ds.read_tasks(
        spark, queue="fair-read", redis_url=redis_server.url, state="scheduled", page_size=40
    )
    for rows in (df.collect(), helper.collect()):
        assert sorted(row.id for row in rows) == sorted(expected)
        for row in rows:
            info = expected[row.id]
            assert row.state == "scheduled"
            assert row.due_at.astimezone(timezone.utc) == info.due_at  # naive: local time
            assert json.loads(row.payload) == info.payload
    later = next(row for row in df.collect() if row.id == "later0")
    assert later.due_at.astimezone(timezone.utc) > now + timedelta(minutes=59)


def test_the_spark_page_runs(spark, r, redis_server, tmp_path, monkeypatch):
    """docs/spark.md's ```python blocks that are not marked not run, in order, against the
    test Redis and the test SparkSession."""
    page = (DOCS / "spark.md").read_text()
    blocks = [
        body
        for mark, body in re.findall(r"^([^\n]*)\n\n?```python\n(.*?)^```", page, flags=re.S | re.M)
        if "not run:" not in mark
    ]
    assert blocks
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("REDIS_URL", redis_server.url)
    scope: dict[str, Any] = {"spark": spark, "REDIS_URL": redis_server.url}
    for block in blocks:
        exec(compile(block, "docs/spark.md", "exec"), scope)


def test_an_encrypted_payload_reads_as_its_marker_unless_decrypt_is_given(spark, r, redis_server):
    pytest.importorskip("cryptography")
    import os

    codec = dueq.Encrypted(keys={"k1": os.urandom(32)})
    q = dueq.Queue("vault", r, codec=codec)
    q.schedule_many(dueq.Task({"card": f"SECRET-{i}"}, id=f"v{i}", delay=3600) for i in range(4))
    df = (
        spark.read.format("dueq")
        .options(queue="vault", redis_url=redis_server.url, state="scheduled", partitions="2")
        .load()
    )
    helper = ds.read_tasks(spark, queue="vault", redis_url=redis_server.url, state="scheduled")
    for rows in (df.collect(), helper.collect()):
        assert len(rows) == 4
        assert all(json.loads(row.payload).startswith("<encrypted k1, ") for row in rows)
        assert not [row for row in rows if "SECRET" in row.payload]
    opened = ds.read_tasks(
        spark, queue="vault", redis_url=redis_server.url, state="scheduled", decrypt=codec
    ).collect()
    assert sorted(json.loads(row.payload)["card"] for row in opened) == [
        f"SECRET-{i}" for i in range(4)
    ]
