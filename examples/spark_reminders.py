"""Spark to dueq: one reminder per user, due at 09:00 in the user's own time zone.

A DataFrame of users and IANA time zones becomes dueq tasks with ``schedule_dataframe``; the
ids come from the user and the date, so running it again adds nothing. A user without a time
zone has no due time: that row is counted as bad, not dropped silently.

Runs on an embedded redis-server (a throwaway process on a free loopback port) unless you pass
--redis-url, and on a local SparkSession. Needs ``pip install 'dueq[spark]'`` and Java 17+:

    .venv/bin/python examples/spark_reminders.py [--date 2030-01-15] [--redis-url URL]
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import date, timedelta
from zoneinfo import ZoneInfo

import redis
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import dueq
from dueq.server import RedisServer
from dueq.spark import schedule_dataframe

USERS = [
    ("ana", "Europe/Lisbon"),
    ("bo", "America/New_York"),
    ("chen", "Asia/Shanghai"),
    ("dev", "Asia/Kolkata"),
    ("eli", "Pacific/Auckland"),
    ("fay", None),  # no time zone on file: no due time, counted as a bad row
]


def main(redis_url: str | None, day: date) -> None:
    server = None
    if redis_url is None:
        server = RedisServer().start()
        redis_url = server.url
        print(f"embedded redis-server on {redis_url}")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers import this dueq
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("dueq-spark-reminders")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        users = spark.createDataFrame(USERS, "user string, tz string")
        reminders = users.select(
            F.concat_ws(":", F.lit("reminder"), "user", F.lit(day.isoformat())).alias("id"),
            # 09:00 on the day as a wall-clock time in the user's zone -> an instant
            F.make_timestamp(
                F.lit(day.year), F.lit(day.month), F.lit(day.day), F.lit(9), F.lit(0),
                F.lit(0), F.col("tz"),
            ).alias("remind_at"),
            "user",
            "tz",
        )  # fmt: skip
        for run in ("first", "second"):
            result = schedule_dataframe(
                reminders, queue="reminders", redis_url=redis_url, id_col="id", at_col="remind_at"
            )
            print(
                f"{run} run: added={result.added} existing={result.existing} "
                f"bad={result.bad_rows} {result.bad_by_reason}"
            )
        for sample in result.bad_samples:
            print(f"  bad row: {sample}")
    finally:
        spark.stop()

    client = redis.Redis.from_url(redis_url)
    q = dueq.Queue("reminders", client)
    print("reminders (UTC due time, and the same instant in the user's zone):")
    for user, tz in USERS:
        info = q.get(f"reminder:{user}:{day.isoformat()}")
        if info is None or info.due_at is None or tz is None:
            print(f"  {user:<5} no reminder")
            continue
        local = info.due_at.astimezone(ZoneInfo(tz))
        print(
            f"  {user:<5} {info.due_at:%Y-%m-%d %H:%M} UTC = {local:%H:%M} {tz:<17} "
            f"payload={info.payload}"
        )
    client.close()
    if server is not None:
        server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", help="an existing Redis (default: start an embedded one)")
    parser.add_argument(
        "--date",
        type=date.fromisoformat,
        default=date.today() + timedelta(days=1),
        help="the day of the reminders (default: tomorrow)",
    )
    args = parser.parse_args()
    main(args.redis_url, args.date)
