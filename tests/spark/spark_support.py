"""Data frames and stream folders shared by the Spark tests (test_spark.py, test_spark_source.py,
test_spark_connect.py). Import it only after ``pytest.importorskip("pyspark")``: it imports
pyspark."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import redis
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from dueq._wire.snapshot import text

T = TypeVar("T")

#: What Spark says when the Python worker of a Python data source or a foreachBatch function
#: did not connect back within its fixed 10 s: a busy 2-core machine can pass that while the
#: worker imports pyspark, before the query read a row.
WORKER_TIMEOUT = "Python worker failed to connect back"
#: Runs of a streaming query, in all, when its Python worker keeps missing that window.
WORKER_TRIES = 3


def run_to_end(run: Callable[[], T]) -> T:
    """``run()`` (a streaming query, from its start to its end), run again (WORKER_TRIES in
    all) only when it failed because Spark's Python worker did not connect back in time;
    every other error, and the last try's, is the caller's."""
    for tries_left in range(WORKER_TRIES - 1, -1, -1):
        try:
            return run()
        except Exception as exc:  # Spark's errors (classic and Connect) share no narrower base
            if tries_left == 0 or WORKER_TIMEOUT not in str(exc):
                raise
    raise AssertionError("unreachable")


T0 = 1_900_000_000  # epoch seconds of the first row's due time (2030-03-17)
ROWS = 20_000


def reminders(spark: SparkSession, rows: int = ROWS, partitions: int = 2) -> DataFrame:
    return spark.range(rows, numPartitions=partitions).select(
        F.concat(F.lit("user-"), F.col("id")).alias("user"),
        (F.lit(T0) + F.col("id")).cast("timestamp").alias("send_at"),
        F.col("id").alias("n"),
        F.lit("hello").alias("text"),
    )


def bad_rows_frame(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame(
        [
            ("ok", "2030-01-01 09:00:00", 1.5, [1.0]),
            ("null-due", None, 1.0, [1.0]),
            ("junk-due", "next tuesday", 1.0, [1.0]),
            ("nan", "2030-01-01 09:00:00", float("nan"), [1.0]),
            ("nested-inf", "2030-01-01 09:00:00", 1.0, [float("inf")]),
            (None, "2030-01-01 09:00:00", 1.0, [1.0]),
        ],
        "id string, at string, x double, xs array<double>",
    )


def staging_keys(r: redis.Redis, queue: str) -> list[str]:
    return [text(k) for k in r.keys(f"dueq:{{{queue}}}:spark:stage:*")]


def stream_files(folder: Path, files: int = 2, rows: int = 150) -> None:
    folder.mkdir(exist_ok=True)
    for part in range(files):
        lines = [
            json.dumps({"id": f"s-{part}-{i}", "at": "2030-01-01T09:00:00Z", "v": i})
            for i in range(rows)
        ]
        (folder / f"part-{part}.json").write_text("\n".join(lines) + "\n")


def tenants_of(r: redis.Redis, queue: str) -> Counter[str]:
    """How many tasks each tenant's lane holds in fair queue ``queue``: its parked set's laned
    members, ``"\\x01<tenant>\\x00<9 - priority><due ms><id>"`` (docs/fairness.md)."""
    members = (text(m) for m in r.zrange(f"dueq:{{{queue}}}:parked", 0, -1))
    return Counter(m[1:].partition("\0")[0] for m in members if m.startswith("\x01"))


def fair_frame(spark: SparkSession) -> DataFrame:
    """30 rows due now: ids t-0 .. t-29, tenant "acme" for 26 of them, "globex" for t-26 ..
    t-28 and none (null: the default tenant) for t-29; a payload column n."""
    return spark.range(30, numPartitions=2).select(
        F.concat(F.lit("t-"), F.col("id")).alias("id"),
        F.when(F.col("id") < 26, "acme")
        .when(F.col("id") < 29, "globex")
        .otherwise(F.lit(None).cast("string"))
        .alias("tenant"),
        F.col("id").alias("n"),
    )


def bad_fair_keys_frame(spark: SparkSession) -> DataFrame:
    """Rows whose tenant is fine (ok, and null: the default tenant) or no key: empty, with a
    control character, over 200 bytes."""
    return spark.createDataFrame(
        [
            ("ok", "acme", 1),
            ("no-tenant", None, 2),
            ("empty", "", 3),
            ("control", "ac\x01me", 4),
            ("long", "x" * 201, 5),
        ],
        "id string, tenant string, n long",
    )
