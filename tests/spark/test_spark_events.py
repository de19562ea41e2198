"""Spark's source of outcome events (issue 30): ``spark.readStream.format("dueq")
.option("events", ...)`` and ``spark.read`` of the same, on conftest.py's real local
SparkSession and a real redis-server. Outcomes are made with the public API (claim, ack, fail);
the truth each test compares with is the events stream itself (XRANGE).

docs/spark-events.md's ```python block is run here too (``test_the_spark_events_page_runs``).
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import redis
from paths_support import DOCS

import dueq

pytest.importorskip("pyarrow", reason="the data source needs pyarrow: pip install 'dueq[spark]'")
pytest.importorskip(
    "pyspark.sql.streaming.datasource", reason="the events source needs pyspark >= 4.2"
)

from internals_support import spark_events
from pyspark.sql import SparkSession
from pyspark.sql.streaming.datasource import ReadAllAvailable
from spark_support import run_to_end

from dueq._wire.snapshot import text


def outcomes(q: dueq.Queue, prefix: str, n: int) -> None:
    """n tasks ending as: every fourth dead, every fourth retried once then acked, the rest
    acked; so 40 tasks make 50 events (30 acked, 10 retried, 10 dead)."""
    q.schedule_many(dueq.Task({"n": i}, id=f"{prefix}-{i}") for i in range(n))
    retried = set()
    while deliveries := q.claim(limit=100):
        for d in deliveries:
            i = int(d.id.rsplit("-", 1)[1])
            if i % 4 == 1:
                d.fail(dueq.Unrecoverable("no such account"))
            elif i % 4 == 2 and d.id not in retried:
                retried.add(d.id)
                d.fail(RuntimeError("try again"), retry_in=0)
            else:
                d.ack()


def stream_ids(r: redis.Redis, queue: str) -> list[str]:
    return [text(entry_id) for entry_id, _ in r.xrange(f"dueq:{{{queue}}}:events")]


def run_events_stream(
    spark: SparkSession, out: Path, checkpoint: Path, url: str, queue: str, **options: str
) -> Any:
    def run() -> Any:
        query = (
            spark.readStream.format("dueq")
            .options(queue=queue, redis_url=url, **options)
            .load()
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        return query

    return run_to_end(run)


@pytest.fixture
def events_queue(r: redis.Redis) -> dueq.Queue:
    q = dueq.Queue("sparkev", r)
    q.configure(events=timedelta(hours=1))
    return q


def test_a_stream_reads_each_of_40_outcomes_once_and_a_restart_reads_only_new_ones(
    spark, r, redis_server, events_queue, tmp_path
):
    outcomes(events_queue, "a", 40)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    options = {"events": "earliest", "maxEventsPerTrigger": "16"}
    query = run_events_stream(spark, out, checkpoint, redis_server.url, "sparkev", **options)
    rows = spark.read.parquet(str(out)).collect()
    assert sorted(row.event_id for row in rows) == stream_ids(r, "sparkev")
    assert len(rows) == 50
    kinds = [row.kind for row in rows]
    assert (kinds.count("acked"), kinds.count("retried"), kinds.count("dead")) == (30, 10, 10)
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [16, 16, 16, 2]  # maxEventsPerTrigger bounds each micro-batch

    outcomes(events_queue, "b", 8)
    query = run_events_stream(spark, out, checkpoint, redis_server.url, "sparkev", **options)
    assert sum(p["numInputRows"] for p in query.recentProgress) == 10  # only the new ones
    rows = spark.read.parquet(str(out)).collect()
    assert sorted(row.event_id for row in rows) == stream_ids(r, "sparkev")
    assert len(rows) == 60


def test_event_rows_carry_the_task_the_error_and_the_time(spark, r, redis_server, events_queue):
    outcomes(events_queue, "c", 4)
    df = (
        spark.read.format("dueq")
        .options(queue="sparkev", redis_url=redis_server.url, events="earliest", partitions="3")
        .load()
    )
    assert df.columns == [
        "event_id", "queue", "task_id", "kind", "attempt", "at", "result", "error", "payload",
        "task",
    ]  # fmt: skip
    rows = {(row.task_id, row.kind): row for row in df.collect()}
    assert sorted(rows) == [
        ("c-0", "acked"), ("c-1", "dead"), ("c-2", "acked"), ("c-2", "retried"), ("c-3", "acked")
    ]  # fmt: skip
    dead = rows[("c-1", "dead")]
    assert dead.payload == '{"n": 1}' and dead.attempt == 1 and dead.queue == "sparkev"
    assert '"message": "no such account"' in dead.error
    assert rows[("c-2", "acked")].attempt == 2
    assert rows[("c-0", "acked")].error is None
    stream_at = {
        text(fields[b"id"]): int(fields[b"at"]) for _, fields in r.xrange("dueq:{sparkev}:events")
    }
    assert (
        round(rows[("c-0", "acked")].at.replace(tzinfo=timezone.utc).timestamp() * 1000)
        == (stream_at["c-0"])
    )


def test_a_time_start_reads_the_events_from_that_time_on(spark, r, redis_server, events_queue):
    outcomes(events_queue, "d", 4)
    first_new = int(text(r.xrevrange("dueq:{sparkev}:events", count=1)[0][0]).split("-")[0]) + 1
    r.xadd("dueq:{sparkev}:events", {"id": "x", "kind": "acked", "at": "0"}, id=f"{first_new}-0")
    since = datetime.fromtimestamp(first_new / 1000, tz=timezone.utc).isoformat()
    for start in (since, str(first_new)):
        df = spark.read.format("dueq").options(
            queue="sparkev", redis_url=redis_server.url, events=start
        )
        assert [row.task_id for row in df.load().collect()] == ["x"]


def test_a_stream_fails_naming_the_range_when_entries_after_its_checkpoint_were_trimmed(
    spark, r, redis_server, events_queue, tmp_path
):
    outcomes(events_queue, "e", 4)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    run_events_stream(spark, out, checkpoint, redis_server.url, "sparkev", events="earliest")
    outcomes(events_queue, "f", 4)
    r.xtrim("dueq:{sparkev}:events", maxlen=2, approximate=False)  # 3 unread entries go
    with pytest.raises(Exception, match=r"3 event\(s\) of queue 'sparkev' after .* were trimmed"):
        run_events_stream(spark, out, checkpoint, redis_server.url, "sparkev", events="earliest")
    query = run_events_stream(
        spark,
        out,
        checkpoint,
        redis_server.url,
        "sparkev",
        events="earliest",
        failOnDataLoss="false",
    )
    assert sum(p["numInputRows"] for p in query.recentProgress) == 2  # what was kept


def test_a_sharded_queue_is_read_shard_by_shard(spark, r, redis_server):
    q = dueq.Queue("sparkevsh", r, shards=3)
    q.configure(events=timedelta(hours=1))
    outcomes(q, "s", 12)
    df = spark.read.format("dueq").options(
        queue="sparkevsh", redis_url=redis_server.url, events="earliest"
    )
    rows = df.load().collect()
    assert len(rows) == 15
    by_shard = {
        name: sorted(stream_ids(r, name)) for name in ("sparkevsh#0", "sparkevsh#1", "sparkevsh#2")
    }
    for name, ids in by_shard.items():
        assert sorted(row.event_id for row in rows if row.queue == name) == ids


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"events": "yesterday"}, "option events must be earliest, latest"),
        ({"events": "2026-11-26T09:00:00"}, "an ISO 8601 time with an offset"),
        ({"events": "earliest", "maxEventsPerTrigger": "0"}, "maxEventsPerTrigger must be in"),
        ({"events": "earliest", "partitions": "x"}, "partitions must be a whole number"),
        ({"events": "earliest", "failOnDataLoss": "maybe"}, "failOnDataLoss must be true or"),
        ({"events": "earliest", "state": "dead"}, "not both"),
        ({"events": "earliest", "queue": "bad name"}, "queue name"),
        (
            {"events": "earliest", "maxeventspertriger": "5"},
            r"unknown option 'maxeventspertriger' of a dueq events read.*'maxEventsPerTrigger'\?",
        ),
        ({"events": "earliest", "allow_missing": "true"}, "allow_missing is for task reads"),
    ],
)
def test_bad_event_options_raise_configuration_error(redis_server, options, message):
    from pyspark.sql.datasource import CaseInsensitiveDict

    given = CaseInsensitiveDict({"queue": "sparkev", "redis_url": redis_server.url, **options})
    with pytest.raises(dueq.ConfigurationError, match=message):
        spark_events().events_options(given)


def test_events_off_is_refused_with_a_pointer_to_configure(spark, r, redis_server):
    dueq.Queue("sparkev-off", r).schedule({"n": 1})
    reader = spark.readStream.format("dueq").options(
        queue="sparkev-off", redis_url=redis_server.url, events="latest"
    )
    with pytest.raises(Exception, match=r"events are off for queue 'sparkev-off'.*configure"):
        run_to_end(
            lambda: (
                reader.load()
                .writeStream.format("memory")
                .queryName("off")
                .start()
                .awaitTermination()
            )
        )
    with pytest.raises(dueq.ConfigurationError, match="events are off"):
        spark_events().events_stream_reader(
            {"queue": "sparkev-off", "redis_url": redis_server.url, "events": "latest"}
        ).initialOffset()


def test_the_events_of_a_queue_that_does_not_exist_are_refused_naming_it(r, redis_server):
    # it used to say "events are off", as if the queue were there
    options = {"queue": "sparkev-none", "redis_url": redis_server.url, "events": "latest"}
    with pytest.raises(dueq.ConfigurationError, match=r"^no queue named 'sparkev-none' at "):
        spark_events().events_stream_reader(options).initialOffset()


def test_a_dueq_stream_without_the_events_option_says_what_it_reads(spark, redis_server):
    stream = spark.readStream.format("dueq").options(queue="q", redis_url=redis_server.url)
    with pytest.raises(Exception, match="a dueq stream reads outcome events"):
        run_to_end(
            lambda: (
                stream.load()
                .writeStream.format("memory")
                .queryName("none")
                .start()
                .awaitTermination()
            )
        )


def test_the_spark_events_page_runs(spark, r, redis_server, tmp_path, monkeypatch):
    """docs/spark-events.md's ```python blocks, in order, against the test Redis."""
    page = (DOCS / "spark-events.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", page, flags=re.S | re.M)
    assert blocks
    monkeypatch.chdir(tmp_path)
    scope: dict[str, Any] = {"spark": spark, "REDIS_URL": redis_server.url}
    monkeypatch.setenv("REDIS_URL", redis_server.url)
    for block in blocks:
        exec(compile(block, "docs/spark-events.md", "exec"), scope)


def read_batch(reader: Any, start: dict[str, Any], end: dict[str, Any]) -> list[str]:
    """The task ids one micro-batch of ``reader`` (driver and executor parts, no Spark) reads."""
    return [row[2] for part in reader.partitions(start, end) for row in reader.read(part)]


def test_the_offsets_count_entries_trimmed_mid_stream_exactly(r, redis_server, events_queue):
    from pyspark.sql.streaming.datasource import ReadMaxRows

    events_queue.schedule_many(dueq.Task({"n": i}, id=f"t-{i}") for i in range(6))
    for d in events_queue.claim(limit=6):
        d.ack()
    reader = spark_events().events_stream_reader(
        {"queue": "sparkev", "redis_url": redis_server.url, "events": "earliest"}
    )
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(2))
    assert read_batch(reader, start, end) == ["t-0", "t-1"]
    assert end["seen"] == {"sparkev": 2}
    r.xtrim("dueq:{sparkev}:events", maxlen=1, approximate=False)  # t-2 .. t-4 unread, gone
    following = reader.latestOffset(end, ReadMaxRows(2))
    with pytest.raises(dueq.EventsTrimmed, match=r"^3 event\(s\) of queue 'sparkev'"):
        reader.partitions(end, following)
    careless = spark_events().events_stream_reader(
        {"queue": "sparkev", "redis_url": redis_server.url, "events": "earliest",
         "failOnDataLoss": "false"}
    )  # fmt: skip
    assert read_batch(careless, end, following) == ["t-5"]
    assert following["seen"] == {"sparkev": 6}


def test_a_time_start_among_kept_entries_fails_only_when_its_entry_may_be_gone(
    r, redis_server, events_queue
):
    events_queue.schedule_many(dueq.Task({"n": i}, id=f"u-{i}") for i in range(3))
    for d in events_queue.claim(limit=3):
        d.ack()
    last_ms = int(stream_ids(r, "sparkev")[-1].split("-")[0])
    r.xadd(
        "dueq:{sparkev}:events", {"id": "later", "kind": "acked", "at": "0"}, id=f"{last_ms + 5}-0"
    )
    options = {"queue": "sparkev", "redis_url": redis_server.url, "events": str(last_ms + 1)}
    reader = spark_events().events_stream_reader(options)
    start = reader.initialOffset()
    assert start["seen"] == {}  # kept entries before the start: not counted, not read
    end = reader.latestOffset(start, ReadAllAvailable())
    assert read_batch(reader, start, end) == ["later"]
    assert end["seen"] == {"sparkev": 4}  # caught up: counted from here on
    r.xtrim("dueq:{sparkev}:events", maxlen=0, approximate=False)
    with pytest.raises(dueq.EventsTrimmed, match=r"some events .* may have been"):
        reader.partitions(start, end)


def test_an_available_now_run_counts_what_it_read_up_to_its_target(r, redis_server, events_queue):
    from pyspark.sql.streaming.datasource import ReadMaxRows

    outcomes(events_queue, "v", 4)  # 5 events
    reader = spark_events().events_stream_reader(
        {"queue": "sparkev", "redis_url": redis_server.url, "events": "earliest"}
    )
    start = reader.initialOffset()
    reader.prepareForTriggerAvailableNow()
    outcomes(events_queue, "w", 4)  # 5 more, after the run's target
    end = reader.latestOffset(start, ReadMaxRows(100))
    assert sorted(read_batch(reader, start, end)) == ["v-0", "v-1", "v-2", "v-2", "v-3"]
    assert end["seen"] == {"sparkev": 5}
    assert reader.latestOffset(end, ReadMaxRows(100)) == end  # the target: nothing more
