"""Spark integration: schedule tasks from DataFrames (batch or streaming), read tasks back.

``schedule_dataframe`` runs ``foreachPartition``: each partition opens its own Redis
connection (``redis.Redis.from_url``, so ``rediss://`` and passwords work on executors) and
schedules its rows in batches, one schedule-script call per batch. Spark itself turns each row
into a small tuple first (id, due time in epoch microseconds, payload JSON), so due times and
timestamps in the payload are read in the session time zone and Python does little per row.

Ids come from ``id_col`` or, without one, from a hash of the task (its due time and payload):
``sha256(b"<flags>:<due ms>:" + payload JSON)``, first 32 hex digits. The hash is the same in
every process and run, so Spark's task retries, speculative execution and re-runs of a job
never duplicate a task that is still in the queue (see ``SparkScheduleResult`` for the counts).
With an encrypting codec the hash is an HMAC keyed by a key derived from the active key
(``row_id``), so the id does not let whoever reads Redis confirm a guessed payload; such ids
change when the active key does (give ``id_col`` for ids stable across a key rotation).

Spark Connect sessions have no SparkContext and so no accumulators: ``schedule_dataframe``
(and ``foreach_batch``) refuses a Connect DataFrame with ConfigurationError before any job
runs, pointing at the data source (``_spark_source``), which counts in commit messages and
works from Connect. ``read_tasks`` and ``register`` take either kind of session.

pyspark is an optional extra: ``pip install 'dueq[spark]'``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dueq.spark._batch import (
    ACTIVE_KEY_CONF,
    KEYS_CONF,
    BadRowPolicy,
    PartitionCounts,
    PartitionPlan,
    SparkScheduleResult,
    foreach_batch,
    read_tasks,
    row_id,
    schedule_dataframe,
    schedule_rows,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    from dueq.spark._source import DueqDataSource

__all__ = [
    "ACTIVE_KEY_CONF",
    "KEYS_CONF",
    "BadRowPolicy",
    "DueqDataSource",
    "PartitionCounts",
    "PartitionPlan",
    "SparkScheduleResult",
    "foreach_batch",
    "read_tasks",
    "register",
    "row_id",
    "schedule_dataframe",
    "schedule_rows",
]


def register(spark: SparkSession | ConnectSession) -> None:
    """Register ``DueqDataSource`` with ``spark`` so that ``format("dueq")`` finds it.

    Works with a Spark Connect session too: the client sends the class to the server.
    """
    from dueq.spark._source import DueqDataSource

    spark.dataSource.register(DueqDataSource)


def __getattr__(name: str) -> Any:
    # DueqDataSource lives in _spark_source (pyspark >= 4.0 and pyarrow): loaded on first use,
    # so dueq.spark itself works with pyspark 3.5.
    if name == "DueqDataSource":
        from dueq.spark._source import DueqDataSource

        return DueqDataSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
