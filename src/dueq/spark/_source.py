"""``DueqDataSource``: dueq as a Spark data source (``format("dueq")``), pyspark >= 4.0.

Spark runs every part of a Python data source in its own Python worker processes: ``writer``
and ``streamWriter`` on the driver's side, ``write`` in each task, ``commit`` and ``abort``
on the driver's side again (with the writer unpickled), ``partitions`` on the driver's side
and ``read`` in each task. So nothing here can use the SparkSession, its SQL functions or an
accumulator: counts travel in commit messages, and each part opens its own Redis connection.

**Rows.** A writer gets the DataFrame's rows as Arrow record batches
(``DataSourceArrowWriter``), not the (id, due, raw due, payload JSON[, fair key]) tuples that
``schedule_dataframe`` makes with Spark's SQL functions. ``dueq.spark._rows.Rows`` makes those
tuples in Python, as Spark would, with the payload JSON written as Spark's ``to_json`` writes it
(``dueq.spark._json``), so generated row-hash ids are the ones ``schedule_dataframe`` makes. The
tuples then go through the batch path's own partition code (``packed_batches``): the same
validation, the same bad-row reasons and samples, the same packed records.

**Batch writes** schedule each task's rows directly, one schedule-script call per batch, as
``schedule_dataframe`` does: idempotent by id, so task retries and re-runs add nothing twice.
The counts come back in commit messages; ``commit`` logs them.

**Streaming writes: exactly once per micro-batch.** Spark replays a micro-batch (same query,
same batch id, same rows) when its commit log entry is missing, which happens when the driver
dies after the sink committed. Scheduling is idempotent only while a task exists: a replay
after the tasks were acked would schedule them again. So a micro-batch is staged first and
scheduled once:

1. Each task stages its packed records under keys named by the streaming query id (stable
   across restarts from the same checkpoint; the tasks' ``sql.streaming.queryId`` local
   property) and the batch id (``spark_stage.lua``: a LIST of packed records, and a SET of the
   ids staged, so a retried task attempt stages nothing twice). Staged keys expire after
   ``staging_ttl_s`` unless a commit seals them, so a crashed job's stage goes away by itself.
   (The writer object cannot name the stage: Spark builds one for the tasks and another for
   ``commit``, so the query id travels in the commit messages.)
2. ``commit(messages, batchId)`` runs ``spark_commit.lua`` step by step. The first step seals
   the batch: it records ``batch|s`` for the query and drops the stage's expiry. From then on
   ``spark_stage.lua`` refuses to stage for that batch, so a late task attempt or a replay
   adds nothing to it. Each later step pops one staged element (at most ``batch_size``
   records) and schedules it with schedule.lua's own code (the include both scripts call)
   in the same atomic call, so Redis is never blocked for long however big the batch, and a
   record is either still staged or scheduled, never both or neither. The step that finds the
   stage empty records ``batch|c``: committed.
3. A replay of a committed batch (its id at or below the query's recorded batch) stages
   nothing and its commit schedules nothing, even if every task has been acked meanwhile. A
   driver that dies mid-commit leaves a sealed stage: the replay's tasks stage nothing, and
   its commit finishes the sealed stage, so every record is scheduled exactly once.
   ``abort`` drops the stage unless its commit has begun. When every task of a batch failed,
   no message names the query: the stage is then left to expire.

The record per query is one hash field, so memory is bounded by the number of queries; a
query idle for ``batch_memory_s`` (default 30 days) is forgotten (at most 100 per commit).
Spark commits a query's batches in order (batch N + 1 starts only after N's commit), which is
why one number per query tells every committed batch.

**Reads** (``spark.read.format("dueq")``) split the state's sorted set into score ranges at
its quantiles (found with ``ZRANGE`` by rank on the driver's side), one partition each; each
task pages through its range with ``ZRANGE BYSCORE ... LIMIT`` (resuming after the last score
seen, skipping the ties already read) and reads each page with the inspect script. Tasks that
change state during the read may be left out, or (moving to another score) read twice.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from dueq import discovery
from dueq._wire import protocol as protocol
from dueq._wire.codec import Encrypted, PayloadCodec, configured_codec, revealing
from dueq._wire.envelope import DEFAULT_MAX_PAYLOAD_BYTES
from dueq._wire.keys import QueueKeys, SparkBatchKeys
from dueq._wire.scripts import Scripts
from dueq._wire.snapshot import text
from dueq.exceptions import ConfigurationError, DueqError
from dueq.model import Task
from dueq.queue import SCHEDULE_BATCH, Queue
from dueq.sharding.layout import task_shard
from dueq.spark._batch import (
    _STATES,
    _TASK_SCHEMA,
    DEFAULT_BATCH_SIZE,
    READ_PAGE,
    PartitionCounts,
    PartitionPlan,
    _stored_snapshots,
    _task_row,
    check_target,
    close_batch,
    columns_of,
    int_option,
    packed_batches,
    partition_plan,
    require_queue,
    schedule_rows,
    settings_codec,
)
from dueq.spark._options import bool_option, checked
from dueq.spark._rows import Rows

try:
    import pyarrow as pa
    from pyspark import TaskContext
    from pyspark.sql import types as T
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceArrowWriter,
        DataSourceReader,
        DataSourceStreamArrowWriter,
        DataSourceStreamReader,
        InputPartition,
        WriterCommitMessage,
    )
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "the dueq data source needs pyspark >= 4.0 and pyarrow: pip install 'dueq[spark]'"
    ) from exc

__all__ = ["DueqCommitMessage", "DueqDataSource"]

logger = logging.getLogger("dueq.spark")

#: How long staged rows of a batch that never commits or aborts are kept (a crashed job's).
DEFAULT_STAGING_TTL_S = 7 * 86_400
#: How long a streaming query's last committed batch is remembered after its last commit.
DEFAULT_BATCH_MEMORY_S = 30 * 86_400
#: Pages per read partition unless ``partitions`` is given.
READ_PARTITION_PAGES = 10
MAX_READ_PARTITIONS = 256

_QUERY_ID = "sql.streaming.queryId"
_BATCH_ID = "streaming.sql.batchId"


# -- options -----------------------------------------------------------------------------------


def _target(options: Any) -> tuple[str, str]:
    queue, url = options.get("queue"), options.get("redis_url")
    if queue is None or url is None:
        raise ConfigurationError("the dueq data source needs the options queue and redis_url")
    check_target(queue, url)
    return str(queue), str(url)


@dataclass(frozen=True)
class _WriteSetup:
    plan: PartitionPlan
    rows: Rows
    staging_ttl_ms: int
    batch_memory_ms: int
    #: with the option batch: the completion task (options on_complete_payload, _task, _id)
    on_complete: Task | None = None
    #: no option secretKeys: each task seals with the session's keys, if it has any
    #: (``_task_plan``), with the option activeKey as its active key when given
    session_keys: bool = False
    active_key: str | None = None


def _on_complete(options: Any) -> Task | None:
    """The completion task the options on_complete_payload (JSON, default {}),
    on_complete_task (a task name) and on_complete_id describe, or None when none is given."""
    names = ("on_complete_payload", "on_complete_task", "on_complete_id")
    payload, task, task_id = (options.get(n) for n in names)
    if payload is None and task is None and task_id is None:
        return None
    try:
        value = json.loads(payload) if payload is not None else {}
    except ValueError as exc:
        raise ConfigurationError(f"option on_complete_payload is not JSON: {exc}") from None
    return Task(value, id=task_id, task=task)


def _option_payloads(options: Any) -> tuple[PayloadCodec, bool, str | None]:
    """The payload codec of the options secretKeys (``DUEQ_KEYS``' format), activeKey and
    compression; whether the tasks are to look for the session's keys (no option
    secretKeys), and the option activeKey. ConfigurationError for a bad value (never showing
    a key)."""
    compression = options.get("compression")
    if compression is not None and compression not in ("zstd", "auto"):
        raise ConfigurationError(
            f'option compression must be "zstd" or "auto", got {compression!r}'
        )
    active = options.get("activeKey") or None
    keys = options.get("secretKeys")
    codec: Encrypted | None = None
    if keys is not None:
        codec = configured_codec(str(keys), active, where="option secretKeys")
    return PayloadCodec(codec, compression), keys is None, active


def _task_plan(setup: _WriteSetup) -> PartitionPlan:
    """In a write task: the plan, sealing with the session's ``spark.dueq.secretKeys`` and
    ``spark.dueq.activeKey`` when no option gave keys. A Python data source never sees the
    session, but Spark copies the session's configuration into each SQL job's local
    properties, which its tasks read (``TaskContext.getLocalProperty``)."""
    plan = setup.plan
    if not setup.session_keys:
        return plan
    context = TaskContext.get()
    codec = settings_codec(
        (lambda name: None) if context is None else context.getLocalProperty,
        active=setup.active_key,
    )
    if codec is None:
        return plan
    return dataclasses.replace(plan, payloads=PayloadCodec(codec, plan.payloads.compression))


def _stream_batch(plan: PartitionPlan, batch_id: int) -> PartitionPlan:
    """A micro-batch's plan: with the option batch, its own batch "<batch>:<micro-batch id>"."""
    if plan.batch is None:
        return plan
    return dataclasses.replace(plan, batch=f"{plan.batch}:{batch_id}")


def _write_setup(options: Any, schema: T.StructType, *, streaming: bool = False) -> _WriteSetup:
    options = checked(options, "streaming write" if streaming else "write")
    queue, url = _target(options)
    payload = options.get("payload_cols")
    payload_cols = None if payload is None else [c.strip() for c in payload.split(",") if c.strip()]
    payloads, session_keys, active_key = _option_payloads(options)
    columns = columns_of(
        schema,
        options.get("id_col"),
        options.get("at_col"),
        options.get("delay_col"),
        payload_cols,
        options.get("fair_key_col"),
    )
    plan = partition_plan(
        queue,
        url,
        columns.due_kind,
        has_id=columns.id_col is not None,
        batch_size=int_option(
            options, "batch_size", DEFAULT_BATCH_SIZE, low=1, high=SCHEDULE_BATCH
        ),
        on_bad_row=options.get("on_bad_row", "count"),
        max_payload_bytes=int_option(
            options, "max_payload_bytes", DEFAULT_MAX_PAYLOAD_BYTES, low=1, high=2**31 - 1
        ),
        remember_done=None,
        task=options.get("task"),
        batch=options.get("batch"),
        has_fair_key=columns.fair_key_col is not None,
        payloads=payloads,
    )
    day_s = 86_400
    ttl_s = int_option(options, "staging_ttl_s", DEFAULT_STAGING_TTL_S, low=60, high=365 * day_s)
    memory_s = int_option(
        options, "batch_memory_s", DEFAULT_BATCH_MEMORY_S, low=day_s, high=3650 * day_s
    )
    on_complete = _on_complete(options)
    if on_complete is not None and plan.batch is None:
        raise ConfigurationError("the on_complete_* options need the option batch")
    return _WriteSetup(
        plan,
        Rows(schema, columns),
        ttl_s * 1000,
        memory_s * 1000,
        on_complete,
        session_keys,
        active_key,
    )


# -- writers -----------------------------------------------------------------------------------


@dataclass
class DueqCommitMessage(WriterCommitMessage):
    """What one write task did: its counts and, when streaming, what it staged."""

    counts: PartitionCounts = field(default_factory=PartitionCounts)
    query: str = ""
    staged: int = 0
    duplicates: int = 0
    #: records not staged because their batch was sealed or committed (a replay)
    refused: int = 0


def _ours(messages: Sequence[WriterCommitMessage | None]) -> list[DueqCommitMessage]:
    """The messages of the tasks that finished (a failed task's is None)."""
    return [m for m in messages if isinstance(m, DueqCommitMessage)]


def _total(messages: Sequence[WriterCommitMessage | None]) -> PartitionCounts:
    total = PartitionCounts()
    for message in _ours(messages):
        total.merge(message.counts)
    return total


def _log_bad(total: PartitionCounts) -> None:
    if total.bad:
        logger.warning("%d bad row(s) not scheduled: %s", sum(total.bad.values()), total.samples)


class _BatchWriter(DataSourceArrowWriter):
    def __init__(self, setup: _WriteSetup) -> None:
        self.setup = setup

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DueqCommitMessage:
        return DueqCommitMessage(schedule_rows(self.setup.rows(iterator), _task_plan(self.setup)))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        total = _total(messages)
        logger.info(
            "scheduled into %r: %d added, %d existing, %d bad",
            self.setup.plan.queue,
            total.added,
            total.existing,
            sum(total.bad.values()),
        )
        _log_bad(total)
        if self.setup.plan.batch is not None:  # every task has written: close the batch
            info = close_batch(self.setup.plan, self.setup.on_complete)
            logger.info("closed batch %r of %r: %s", info.id, self.setup.plan.queue, info)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        total = _total(messages)
        logger.warning(
            "write into %r failed; its finished tasks had added %d task(s) (they stay: running "
            "the job again adds only what is missing)",
            self.setup.plan.queue,
            total.added,
        )


class _StreamWriter(DataSourceStreamArrowWriter):
    """Stages each micro-batch in the queue, then commits it there. A sharded queue stages
    and commits per shard (``names``: its shards in shard order, from the driver): each row
    goes to the stage of its id's shard, and the commit runs shard by shard, each one
    idempotent by (query, batch) on its own, so a commit cut off between two shards is
    finished by the replay (the committed shards answer "committed before")."""

    def __init__(self, setup: _WriteSetup, names: list[str]) -> None:
        if setup.plan.batch is not None and len(names) > 1:
            raise ConfigurationError(
                "the option batch of a streaming write needs an unsharded queue (a micro-batch "
                "commits shard by shard; a batch write, or schedule_dataframe, takes batch on "
                "a sharded queue)"
            )
        self.setup = setup
        self.names = names

    def _keys(self, name: str, query: str, batch: int) -> SparkBatchKeys:
        return SparkBatchKeys.for_batch(name, query, batch)

    def _by_shard(self, ids: list[str], records: list[bytes]) -> list[tuple[str, list[bytes]]]:
        """The records grouped by the queue (or shard) that holds each id."""
        if len(self.names) == 1:
            return [(self.names[0], records)]
        groups: dict[int, list[bytes]] = {}
        for task_id, record in zip(ids, records, strict=True):
            groups.setdefault(task_shard(task_id, len(self.names)), []).append(record)
        return [(self.names[i], groups[i]) for i in sorted(groups)]

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DueqCommitMessage:
        context = TaskContext.get()
        query = context.getLocalProperty(_QUERY_ID) if context else None
        batch_text = context.getLocalProperty(_BATCH_ID) if context else None
        if query is None or batch_text is None:
            raise DueqError("the dueq stream writer runs only inside a streaming micro-batch")
        batch = int(batch_text)
        message = DueqCommitMessage(query=query)
        with discovery.client_for_url(self.setup.plan.redis_url) as client:
            scripts = Scripts(client)
            plan = _stream_batch(_task_plan(self.setup), batch)
            for ids, records in packed_batches(self.setup.rows(iterator), plan, message.counts):
                for name, part in self._by_shard(ids, records):
                    call = protocol.spark_stage(
                        self._keys(name, query, batch),
                        "",
                        query,
                        batch,
                        self.setup.staging_ttl_ms,
                        b"".join(part),
                    )
                    reply = call.parse(scripts.run(call.script, call.keys, call.args))
                    message.staged += reply.staged
                    message.duplicates += reply.duplicates
                    message.refused += len(part) if reply.refused else 0
        return message

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        query = next((m.query for m in _ours(messages) if m.query), None)
        if query is None:  # no task ran (an empty micro-batch): nothing was staged
            return
        total = _total(messages)
        plan = self.setup.plan
        added = existing = 0
        states = []
        with discovery.client_for_url(plan.redis_url) as client:
            scripts = Scripts(client)
            for name in self.names:  # shard by shard: each commit is idempotent on its own
                call = protocol.spark_commit(
                    QueueKeys.for_queue(name),
                    self._keys(name, query, batchId),
                    "",
                    query=query,
                    batch=batchId,
                    memory_ms=self.setup.batch_memory_ms,
                    window_ms=0,
                )
                while True:
                    step = call.parse(scripts.run(call.script, call.keys, call.args))
                    if step.state is not protocol.CommitState.PROMOTED:
                        break
                    assert step.scheduled is not None
                    added += step.scheduled.added
                    existing += step.scheduled.existing
                if step.state is protocol.CommitState.EARLIER_UNFINISHED:
                    raise DueqError(
                        f"batch {step.batch} of streaming query {query} began to commit into "
                        f"{name!r} and never finished; batch {batchId} cannot commit"
                    )
                states.append(step.state)
        if all(state is protocol.CommitState.COMMITTED_BEFORE for state in states):
            logger.info(
                "micro-batch %d of query %s was committed into %r before: nothing scheduled",
                batchId,
                query,
                plan.queue,
            )
        else:
            logger.info(
                "micro-batch %d of query %s into %r: %d added, %d existing, %d bad",
                batchId,
                query,
                plan.queue,
                added,
                existing,
                sum(total.bad.values()),
            )
        _log_bad(total)
        if plan.batch is not None:  # committed (now or before): close its batch, idempotently
            info = close_batch(_stream_batch(plan, batchId), self.setup.on_complete)
            logger.info("closed batch %r of %r: %s", info.id, plan.queue, info)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        query = next((m.query for m in _ours(messages) if m.query), None)
        if query is None:  # every task failed: their stage (if any) expires after staging_ttl_s
            logger.warning("micro-batch %d into %r failed", batchId, self.setup.plan.queue)
            return
        dropped = True
        with discovery.client_for_url(self.setup.plan.redis_url) as client:
            scripts = Scripts(client)
            for name in self.names:
                call = protocol.spark_abort(self._keys(name, query, batchId), "", query, batchId)
                dropped = call.parse(scripts.run(call.script, call.keys, call.args)) and dropped
        logger.warning(
            "micro-batch %d into %r failed: %s",
            batchId,
            self.setup.plan.queue,
            "its staged rows were dropped"
            if dropped
            else "its commit had begun; kept for the replay",
        )


# -- reader ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScoreRange(InputPartition):
    """One read partition: the members of sorted set ``key`` of queue ``queue`` (the queue
    itself, or one shard of a sharded queue) scored ``low`` (inclusive) up to ``high``
    (exclusive)."""

    queue: str
    key: str
    low: str
    high: str


class _Reader(DataSourceReader):
    def __init__(self, options: Any) -> None:
        options = checked(options, "read")
        self.queue, self.url = _target(options)
        self.state = options.get("state", "dead")
        if self.state not in _STATES:
            raise ConfigurationError(f"state must be scheduled, leased or dead, got {self.state!r}")
        self.page_size = int_option(options, "page_size", READ_PAGE, low=1, high=SCHEDULE_BATCH)
        self.wanted = int_option(options, "partitions", 0, low=0, high=MAX_READ_PARTITIONS)
        allow_missing = bool_option(options, "allow_missing", False)
        # read in the executors, whose environment holds DUEQ_KEYS (spark.executorEnv.*)
        self.decrypt = bool_option(options, "decrypt", False)
        # a sharded queue is read shard by shard: each shard is a queue of its own keys
        names = _queue_names(self.url, self.queue, allow_missing=allow_missing)
        # a scheduled task waits in its priority's due set, or parked (see claim.lua)
        self.zsets = [
            (name, key)
            for name in names
            for key in protocol.state_zsets(QueueKeys.for_queue(name), self.state)
        ]

    def partitions(self) -> Sequence[ScoreRange]:
        out: list[ScoreRange] = []
        with discovery.client_for_url(self.url) as client:
            counts = [int(client.zcard(key)) for _, key in self.zsets]
            total = sum(counts)
            for (name, key), count in zip(self.zsets, counts, strict=True):
                if count == 0:
                    continue
                if self.wanted:
                    wanted = max(1, round(self.wanted * count / total))
                else:
                    wanted = math.ceil(count / (self.page_size * READ_PARTITION_PAGES))
                parts = max(1, min(wanted, count, MAX_READ_PARTITIONS))
                bounds: list[str] = []
                for i in range(1, parts):
                    found = client.zrange(
                        key, i * count // parts, i * count // parts, withscores=True
                    )
                    if found:
                        score = repr(float(found[0][1]))
                        if not bounds or bounds[-1] != score:
                            bounds.append(score)
                edges = ["-inf", *bounds, "+inf"]
                out += [ScoreRange(name, key, low, high) for low, high in itertools.pairwise(edges)]
        return out or [ScoreRange(*self.zsets[0], "-inf", "+inf")]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, ScoreRange)
        codec = revealing(self.decrypt, "option decrypt")  # None: sealed payloads show markers
        with discovery.client_for_url(self.url) as client:
            q = Queue(partition.queue, client, codec=codec)
            low, skip = partition.low, 0
            high = partition.high if partition.high == "+inf" else "(" + partition.high
            parked = partition.key == QueueKeys.for_queue(partition.queue).parked
            as_id = protocol.parked_id if parked else text
            while True:
                page = client.zrange(
                    partition.key,
                    low,
                    high,
                    byscore=True,
                    offset=skip,
                    num=self.page_size,
                    withscores=True,
                )
                if not page:
                    return
                ids = [as_id(m) for m, _ in page]
                for info in _stored_snapshots(q, ids):
                    if info.state == self.state:
                        yield _task_row(info)
                if len(page) < self.page_size:
                    return
                last = float(page[-1][1])
                ties = sum(1 for _, score in page if float(score) == last)
                skip = skip + ties if low != "-inf" and float(low) == last else ties
                low = repr(last)


# -- the data source ---------------------------------------------------------------------------


class DueqDataSource(DataSource):
    """``format("dueq")``: write DataFrames and streams into a dueq queue, read its tasks.

    Register once per session with ``spark.dataSource.register(DueqDataSource)`` (pyspark also
    finds it on its own where the ``pyspark_dueq`` module is importable). Options: ``queue`` and
    ``redis_url`` (always); for writes ``id_col``, ``at_col``, ``delay_col``, ``payload_cols``
    (comma-separated), ``batch_size``, ``on_bad_row``, ``max_payload_bytes``, ``task`` (each row
    calls that named task, its columns the arguments), ``fair_key_col`` (each row's tenant on a
    fair queue), ``secretKeys``, ``activeKey`` and ``compression`` (payloads sealed in the
    tasks; without ``secretKeys`` with the session's ``spark.dueq.secretKeys``: ``_task_plan``),
    and for streams ``staging_ttl_s`` and ``batch_memory_s``; for reads ``state``
    (scheduled, leased or dead), ``page_size``, ``partitions``, ``allow_missing`` (a queue
    that does not exist reads as empty instead of failing) and ``decrypt`` (``true``: open
    encrypted payloads with ``DUEQ_KEYS`` of the executors' environment; else each shows as
    its marker, ``<encrypted k1, 61 B>``); for reads and streams of outcome
    events ``events`` (where a new query starts), ``maxEventsPerTrigger``, ``partitions``,
    ``page_size`` and ``failOnDataLoss`` (``dueq.spark._events``). Any other option is refused
    with ConfigurationError naming the nearest valid one (``dueq.spark._options``); names are
    case-insensitive.
    """

    @classmethod
    def name(cls) -> str:
        return "dueq"

    def schema(self) -> T.StructType:
        if "events" in self.options:  # the events source needs pyspark >= 4.2: loaded on use
            from dueq.spark._events import EVENTS_SCHEMA

            return EVENTS_SCHEMA
        return _TASK_SCHEMA

    def writer(self, schema: T.StructType, overwrite: bool) -> _BatchWriter:
        return _BatchWriter(_write_setup(self.options, schema))

    def streamWriter(self, schema: T.StructType, overwrite: bool) -> _StreamWriter:
        setup = _write_setup(self.options, schema, streaming=True)
        return _StreamWriter(setup, _queue_names(setup.plan.redis_url, setup.plan.queue))

    def reader(self, schema: T.StructType) -> DataSourceReader:
        if "events" in self.options:
            from dueq.spark._events import events_batch_reader

            return events_batch_reader(self.options)
        return _Reader(self.options)

    def streamReader(self, schema: T.StructType) -> DataSourceStreamReader:
        """``spark.readStream``: the queue's outcome events (``dueq.spark._events``)."""
        from dueq.spark._events import RefusedStreamReader, events_stream_reader

        if "events" not in self.options:  # refused at the first call (see RefusedStreamReader)
            return RefusedStreamReader(
                ConfigurationError(
                    "a dueq stream reads outcome events: give the option events (earliest, "
                    "latest, or a time to start from)"
                )
            )
        return events_stream_reader(self.options)


def _queue_names(url: str, queue: str, *, allow_missing: bool = True) -> list[str]:
    """On the driver: the queues the data source works on for ``queue`` (itself, or its
    shards: ``discovery.stored_queue_names``). Unless ``allow_missing``, ConfigurationError
    when no such queue exists (a read of a misspelt name would be empty without a word)."""
    with discovery.client_for_url(url) as client:
        if not allow_missing:
            require_queue(
                client, queue, url, "give the option allow_missing=true to read it as empty"
            )
        return discovery.stored_queue_names(client, queue)
