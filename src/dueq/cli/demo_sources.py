"""Where the demo's tasks come from, and the handler that runs them.

A source is anything with a ``name`` and ``run(queue, board)``: it runs on its own thread,
schedules tasks and reports to the board (``board.source(name, status, added=n, done=...)``).
The demo waits until every source is done and the queue has drained. To add a source, write
such a class and put an instance in the list ``demo_sources`` returns.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from dueq.cli.demo_board import Board
from dueq.delivery import Delivery
from dueq.model import Task
from dueq.queue import Queue

#: Templates the handler knows; a task naming another one crashes it every time (poison).
TEMPLATES = {
    "receipt": "Your order #{n} is confirmed",
    "digest": "Your weekly digest #{n}",
    "report": "Status report #{n}",
}
#: Share of tasks that fail transiently 1, 2 or 3 times before they succeed.
FLAKY_SHARES = ((1, 0.15), (2, 0.05), (3, 0.03))
POISON_EVERY = 97  # about one order in a hundred names a template that does not exist
POLL_S = 0.1


def handle(d: Delivery) -> None:
    """The demo's handler: render a message (crashes on an unknown template), then "send" it.

    ``fail_times`` in the payload makes the first attempts time out, as a flaky mail server
    would; the queue retries them with growing delays.
    """
    message = TEMPLATES[d.payload["template"]].format(n=d.payload["n"])  # KeyError: poison
    _send(message, timeout=d.attempt <= d.payload.get("fail_times", 0))


def _send(message: str, *, timeout: bool) -> None:
    """Pretend to send ``message``: it takes a moment, or times out."""
    time.sleep(0.01 + 0.04 * random.random())
    if timeout:
        raise TimeoutError("mail server did not answer")


class Source(Protocol):
    """A source of demo tasks (see the module docstring)."""

    name: str

    def run(self, queue: Queue, board: Board) -> None: ...


def _fail_times(rng: random.Random) -> int:
    draw = rng.random()
    for times, share in FLAKY_SHARES:
        if draw < share:
            return times
        draw -= share
    return 0


class Orders:
    """``count`` order receipts due over the next ``spread_s`` seconds, a few of them poison."""

    name = "orders"

    def __init__(self, count: int, spread_s: float, seed: int | None) -> None:
        self.count, self.spread_s, self.rng = count, spread_s, random.Random(seed)

    def run(self, queue: Queue, board: Board) -> None:
        poison = self.count // 2 % POISON_EVERY  # at least one, whatever the count
        tasks = [
            Task(
                {
                    "n": n,
                    "template": "receipt-v0" if n % POISON_EVERY == poison else "receipt",
                    "fail_times": _fail_times(self.rng),
                },
                id=f"order:{n:04d}",
                delay=self.spread_s * n / self.count,
            )
            for n in range(self.count)
        ]
        result = queue.schedule_many(tasks)
        board.source(
            self.name, f"{result.added} due over {self.spread_s:g} s", added=result.added, done=True
        )


class Recurring:
    """A status report every ``every_s`` seconds from a cron definition (seconds field first);
    each occurrence times out once and succeeds on its retry. After ``runs`` occurrences the
    definition is removed, so the demo can drain."""

    name = "cron"
    definition = "status-report"

    def __init__(self, runs: int, every_s: int) -> None:
        self.runs, self.every_s = runs, every_s

    def run(self, queue: Queue, board: Board) -> None:
        expr = f"*/{self.every_s} * * * * *"
        payload = {"template": "report", "n": 0, "fail_times": 1}
        queue.cron.add(self.definition, expr, payload=payload)
        board.source(self.name, f"{self.definition!r} at {expr!r}, every {self.every_s} s")
        fired: set[object] = set()
        while len(fired) < self.runs:
            definition = queue.cron.get(self.definition)
            if definition is not None and definition.last_fired_at is not None:
                fired.add(definition.last_fired_at)
            time.sleep(POLL_S)
        queue.cron.remove(self.definition)
        status = f"{self.definition!r} fired {len(fired)} times, then removed"
        board.source(self.name, status, added=len(fired), done=True)


@contextlib.contextmanager
def _stderr_to(path: Path) -> Iterator[None]:
    """Point file descriptor 2 at ``path`` while the block runs, so that the JVM Spark starts
    (and the Python workers it starts) log there instead of over the demo's screen."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class SparkDigests:
    """``rows`` weekly digests from a small Spark DataFrame, via ``dueq.spark``."""

    name = "spark"

    def __init__(self, rows: int, redis_url: str, log: Path) -> None:
        self.rows, self.redis_url, self.log = rows, redis_url, log

    def run(self, queue: Queue, board: Board) -> None:
        board.starting(self.name, "starting a local Spark session")
        started = time.monotonic()
        try:
            from pyspark.sql import SparkSession
            from pyspark.sql import functions as F

            from dueq.spark import schedule_dataframe
        except ImportError:
            board.source(self.name, "skipped: pip install 'dueq[spark]' to see it", done=True)
            return
        os.environ["PYSPARK_PYTHON"] = sys.executable  # its workers must import dueq

        with _stderr_to(self.log):
            spark = (
                SparkSession.builder.master("local[2]")
                .appName("dueq-demo")
                .config("spark.ui.enabled", "false")
                .config("spark.ui.showConsoleProgress", "false")
                .getOrCreate()
            )
        try:
            if not board.start_done(self.name):  # too late: the demo went on without it
                return
            spark.sparkContext.setLogLevel("ERROR")
            board.source(self.name, f"scheduling {self.rows} rows (Spark's log: {self.log})")
            df = spark.range(self.rows, numPartitions=2).select(
                F.format_string("digest:%03d", "id").alias("id"),
                (F.lit(1.0) + F.col("id") % 20 * 0.2).alias("delay_s"),
                F.col("id").alias("n"),
                F.lit("digest").alias("template"),
                F.when(F.col("id") % 6 == 0, 1).otherwise(0).alias("fail_times"),
            )
            result = schedule_dataframe(
                df, queue=queue.name, redis_url=self.redis_url, id_col="id", delay_col="delay_s"
            )
        finally:
            spark.stop()
        took = time.monotonic() - started
        status = f"{result.added} rows scheduled by Spark in {took:.1f} s"
        board.source(self.name, status, added=result.added, done=True)


def demo_sources(
    tasks: int, spread_s: float, seed: int | None, spark: bool, redis_url: str, logs: Path
) -> list[Source]:
    """The demo's sources: orders, a recurring report, and Spark digests when asked for and
    pyspark is installed."""
    sources: list[Source] = [Orders(tasks, spread_s, seed), Recurring(runs=4, every_s=3)]
    if spark:
        sources.append(SparkDigests(max(tasks // 5, 1), redis_url, logs / "spark.log"))
    return sources
