"""The Spark batch path behind ``dueq.spark``: column plans, the partition function and the
reads, shared by the public module and by the data source (``_spark_source``).

``dueq.spark`` is the public face (its docstring says how scheduling from a DataFrame works);
this module sits below both it and ``_spark_source``, so neither imports the other's insides
(``dueq.spark`` loads the data source lazily, as it needs pyspark >= 4.0 and pyarrow).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import logging
import math
import operator
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar
from urllib.parse import urlsplit, urlunsplit

from dueq import discovery
from dueq._util.checks import whole_number
from dueq._util.clock import Duration, duration_ms, positive_duration_ms
from dueq._wire import protocol as protocol
from dueq._wire.codec import (
    NO_CODEC,
    Compression,
    Encrypted,
    PayloadCodec,
    configured_codec,
    revealing,
)
from dueq._wire.envelope import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    ENVELOPE_PREFIX,
    FLAG_ABSOLUTE,
    TaskOptions,
    name_line,
    pack_task,
    record_extras,
    validate_task_name,
)
from dueq._wire.envelope import validate_id as _validate_id
from dueq._wire.keys import QueueKeys, validate_queue_name
from dueq._wire.snapshot import text
from dueq.exceptions import ConfigurationError, InvalidTaskError
from dueq.model import BatchInfo, Task, TaskInfo, TaskState, fair_key_of
from dueq.named import TaskFunction
from dueq.queue import SCHEDULE_BATCH, Queue

try:
    from pyspark.accumulators import AccumulatorParam
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql import types as T
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("dueq.spark needs pyspark: pip install 'dueq[spark]'") from exc

if TYPE_CHECKING:
    from pyspark.sql.connect.session import SparkSession as ConnectSession


logger = logging.getLogger("dueq.spark")  # the public module's name, as before the split

_Default = TypeVar("_Default", int, None)


def int_option(
    options: Any, name: str, default: _Default, *, low: int, high: int
) -> int | _Default:
    """A whole-number option of a Spark reader or writer in ``low..high``, or ``default`` when
    it is not given; ConfigurationError for anything else."""
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ConfigurationError(f"option {name} must be a whole number, got {raw!r}") from None
    if not low <= value <= high:
        raise ConfigurationError(f"option {name} must be in {low}..{high}, got {value}")
    return value


BadRowPolicy = Literal["count", "raise"]
DueKind = Literal["now", "at", "at_seconds", "delay"]

DEFAULT_BATCH_SIZE = 1000
#: How many bad-row descriptions a run keeps (per partition and in total).
MAX_BAD_SAMPLES = 10
#: Ids per page when read_tasks walks a state's sorted set.
READ_PAGE = 1000
#: Marks the message of a bad row that stopped a job (found again in Spark's error on the driver).
_BAD_ROW_MARK = "dueq bad row: "
#: Options that pin Spark's JSON text, so generated ids stay the same from run to run.
_JSON_OPTIONS = {
    "ignoreNullFields": "false",
    "timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX",
    "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS",
    "dateFormat": "yyyy-MM-dd",
}
_STATES = ("scheduled", "leased", "dead")


@dataclass
class PartitionCounts:
    """What one or more partitions did: tasks added, ids that existed, bad rows by reason.

    Reasons: ``"due"`` (null or unparsable due time, bad delay), ``"id"`` (null or invalid id),
    ``"payload"`` (not JSON, or over the payload size limit), ``"fair_key"`` (a fair key that
    cannot be a key: empty, with control characters, over 200 bytes; a null one is no tenant).
    """

    added: int = 0
    existing: int = 0
    bad: dict[str, int] = field(default_factory=dict)
    samples: list[str] = field(default_factory=list)

    def merge(self, other: PartitionCounts) -> PartitionCounts:
        self.added += other.added
        self.existing += other.existing
        for reason, count in other.bad.items():
            self.bad[reason] = self.bad.get(reason, 0) + count
        self.samples.extend(other.samples[: MAX_BAD_SAMPLES - len(self.samples)])
        return self


class _CountsParam(AccumulatorParam[PartitionCounts]):
    """Adds PartitionCounts in a Spark accumulator (updates of failed task attempts are dropped)."""

    def zero(self, value: PartitionCounts) -> PartitionCounts:
        return PartitionCounts()

    def addInPlace(self, value1: PartitionCounts, value2: PartitionCounts) -> PartitionCounts:
        return value1.merge(value2)


@dataclass(frozen=True)
class SparkScheduleResult:
    """What ``schedule_dataframe`` did.

    ``added`` + ``existing`` + ``bad_rows`` is the number of rows. Counts come from Spark
    accumulators, which keep only successful task attempts: rows a failed attempt had already
    written are counted as ``existing`` by the retry. ``bad_samples`` describes a few bad rows.
    """

    added: int
    existing: int
    bad_rows: int
    bad_by_reason: dict[str, int]
    bad_samples: list[str]
    #: with ``batch=``: the batch's counts right after the job closed it
    batch: BatchInfo | None = None


@dataclass(frozen=True)
class PartitionPlan:
    """Everything a partition needs, shipped to the executors with the closure."""

    queue: str
    redis_url: str
    due_kind: DueKind
    has_id: bool
    batch_size: int
    on_bad_row: BadRowPolicy
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    remember_done: Duration | None = None
    #: the named task each row runs (``@q.task``: the row's columns are its arguments)
    task: str | None = None
    #: the batch every row's task joins (closed by the driver once the job has written all)
    batch: str | None = None
    #: rows carry a fifth value, the task's fair key (its tenant on a fair queue), or None
    has_fair_key: bool = False
    #: how payloads are stored: sealed and/or compressed in the executors (its Encrypted
    #: pickles with its keys, which travel in the closure as the Redis URL does)
    payloads: PayloadCodec = NO_CODEC


class _BadRow(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _due(kind: DueKind, due: Any, raw: Any) -> tuple[int, int]:
    """(flags, due) of a packed record for a row's due value; _BadRow when it has none."""
    if kind == "now":
        return 0, 0
    if due is None:
        what = "null" if raw is None else f"unparsable ({str(raw)[:80]!r})"
        raise _BadRow("due", f"due time is {what}")
    if kind == "at":  # epoch microseconds, computed by Spark in the session time zone
        return FLAG_ABSOLUTE, (int(due) + 500) // 1000
    if kind == "at_seconds":
        if not math.isfinite(due):
            raise _BadRow("due", f"due time is not a finite number of seconds: {due!r}")
        return FLAG_ABSOLUTE, round(due * 1000)
    try:
        return 0, duration_ms(due, "delay")
    except InvalidTaskError as exc:
        raise _BadRow("due", str(exc)) from None


def _payload(text: str | None, max_bytes: int) -> bytes:
    """The payload JSON Spark made (None when a float in it is NaN or infinite), checked."""
    if text is None:
        raise _BadRow("payload", "payload is not JSON-encodable: it holds NaN or Infinity")
    data = text.encode("utf-8")
    if len(data) > max_bytes:
        raise _BadRow("payload", f"payload is {len(data)} bytes, over the limit of {max_bytes}")
    return data


#: What the key of row ids is derived from the active key with (``Encrypted.derived_key``).
ROW_ID_LABEL = b"dueq spark row id v1"


def row_id(
    flags: int,
    due: int,
    payload: bytes,
    task: str | None = None,
    fair_key: str | None = None,
    *,
    codec: Encrypted | None = None,
) -> str:
    """The id of a task without an id column: a hash of its due time and payload JSON (and
    its task name, for a named task: the same arguments to two tasks are two tasks; and its
    fair key, when it has one: the same payload for two tenants is two tasks).

    With an encrypting ``codec`` the hash is an HMAC-SHA256 keyed by a key derived from its
    active key (``ROW_ID_LABEL``): a plain hash would let whoever reads Redis confirm a guessed
    payload (an e-mail address) by hashing it, which is what the encryption hides. Such an id
    is stable for one active key only: after a rotation the same row gets another id."""
    head = b"%d:%d:" % (flags, due)
    if task is not None:
        head += b"@%s:" % task.encode("ascii")
    if fair_key is not None:
        tenant = fair_key.encode("utf-8")
        head += b"\x1f%d:%s:" % (len(tenant), tenant)
    if codec is None:
        return hashlib.sha256(head + payload).hexdigest()[:32]
    key = codec.derived_key(ROW_ID_LABEL)
    return hmac.new(key, head + payload, hashlib.sha256).hexdigest()[:32]


def _task_id(
    plan: PartitionPlan, given: Any, flags: int, due: int, payload: bytes, fair: str | None
) -> str:
    if not plan.has_id:
        return row_id(flags, due, payload, plan.task, fair, codec=plan.payloads.codec)
    if given is None:
        raise _BadRow("id", "id is null")
    try:
        return _validate_id(given)
    except InvalidTaskError as exc:
        raise _BadRow("id", str(exc)) from None


def schedule_rows(rows: Iterable[Sequence[Any]], plan: PartitionPlan) -> PartitionCounts:
    """Schedule one partition's rows; the partition function, usable without Spark.

    Each row is ``(id or None, due or None, raw due text or None, payload JSON)`` as
    ``schedule_dataframe`` prepares it, with a fifth value, the fair key or None, when
    ``plan.has_fair_key``. Opens its own connection; one script call per batch.
    """
    counts = PartitionCounts()
    client = discovery.client_for_url(plan.redis_url)
    try:
        with warnings.catch_warnings():  # the deprecated keyword, kept for this parameter
            warnings.simplefilter("ignore", DeprecationWarning)
            # as stored: a sharded queue's logical queue, which sends each batch to its
            # shards (one script call per shard), so ids and idempotency are the same
            q = discovery.open_queue(
                client,
                plan.queue,
                max_payload_bytes=plan.max_payload_bytes,
                remember_done=plan.remember_done,
                codec=plan.payloads.codec,
                compression=plan.payloads.compression,
            )
        for ids, records in packed_batches(rows, plan, counts):
            _flush(q, ids, records, counts)
    finally:
        client.close()
    return counts


def packed_batches(
    rows: Iterable[Sequence[Any]], plan: PartitionPlan, counts: PartitionCounts
) -> Iterator[tuple[list[str], list[bytes]]]:
    """The good rows as batches of (ids, packed task records), at most ``batch_size`` each;
    bad rows are counted in ``counts`` (or raise, with ``on_bad_row="raise"``), and logged
    once the rows are used up. Rows as ``schedule_rows`` takes them."""
    ids: list[str] = []
    records: list[bytes] = []
    head = ENVELOPE_PREFIX if plan.task is None else ENVELOPE_PREFIX + name_line(plan.task)
    extra_flags, extra = record_extras(plan.batch, (), False) if plan.batch else (0, b"")
    #: the head of each fair key's tasks (the tasks of a partition share a few tenants)
    heads: dict[str | None, bytes] = {None: head}
    fair = None
    for number, row in enumerate(rows):
        given, due, raw, payload = row[:4]
        try:
            flags, due_ms = _due(plan.due_kind, due, raw)
            data = _payload(payload, plan.max_payload_bytes)
            if plan.has_fair_key:
                fair = _fair_key(row[4])
            task_id = _task_id(plan, given, flags, due_ms, data, fair)
        except _BadRow as bad:
            _count_bad(counts, plan, number, given, bad)
            continue
        tenant_head = heads.get(fair)
        if tenant_head is None:
            tenant_head = heads[fair] = TaskOptions(fair_key=fair).head() + head[2:]
        if plan.payloads.writes:  # after the id: a row-hash id is of the JSON
            data = plan.payloads.seal(data, plan.queue, task_id)
        ids.append(task_id)
        records.append(
            pack_task(flags | extra_flags, due_ms, task_id, tenant_head + data, extra=extra)
        )
        if len(records) >= plan.batch_size:
            yield ids, records
            ids, records = [], []
    if records:
        yield ids, records
    if counts.bad:
        logger.warning("partition had %d bad row(s): %s", sum(counts.bad.values()), counts.samples)


def _stored_snapshots(q: Queue, ids: Sequence[str]) -> list[TaskInfo]:
    """``q.get_many`` of ids read from the queue's sorted sets; an id no task could have (a
    member written by hand) is logged and left out rather than failing the whole read."""
    usable = []
    for task_id in ids:
        try:
            usable.append(_validate_id(task_id))
        except InvalidTaskError as exc:
            logger.warning(
                "queue %r: skipped a stored member that is not a task id: %s", q.name, exc
            )
    return q.get_many(usable)


def _flush(q: Queue, ids: list[str], records: list[bytes], counts: PartitionCounts) -> None:
    result = q.schedule_records(ids, records, False, iter(()))
    counts.added += result.added
    counts.existing += result.existing


def _fair_key(given: Any) -> str | None:
    """A row's fair key, checked as ``Task(fair_key=)`` checks one (None: no tenant of its
    own); _BadRow when it cannot be a key."""
    if given is None:
        return None
    try:
        return fair_key_of(given, None)
    except InvalidTaskError as exc:
        raise _BadRow("fair_key", str(exc)) from None


def _count_bad(
    counts: PartitionCounts, plan: PartitionPlan, number: int, given: Any, bad: _BadRow
) -> None:
    where = f"row {number} of its partition" + (f" (id {given!r})" if given is not None else "")
    message = f"{where}: {bad}"
    if plan.on_bad_row == "raise":
        raise InvalidTaskError(_BAD_ROW_MARK + message)
    counts.bad[bad.reason] = counts.bad.get(bad.reason, 0) + 1
    if len(counts.samples) < MAX_BAD_SAMPLES:
        counts.samples.append(message)


def _column(name: str) -> Column:
    return F.col("`" + name.replace("`", "``") + "`")


def _has_float(dtype: T.DataType) -> bool:
    if isinstance(dtype, (T.FloatType, T.DoubleType)):
        return True
    if isinstance(dtype, T.StructType):
        return any(_has_float(f.dataType) for f in dtype.fields)
    if isinstance(dtype, T.ArrayType):
        return _has_float(dtype.elementType)
    if isinstance(dtype, T.MapType):
        return _has_float(dtype.keyType) or _has_float(dtype.valueType)
    return False


def _non_finite(col: Column, dtype: T.DataType) -> Column:
    """True where a float in ``col`` (at any depth) is NaN or infinite; for types with floats.

    Spark's to_json writes such values as strings ("NaN"), which would hide the bad value.
    """
    if isinstance(dtype, (T.FloatType, T.DoubleType)):
        return F.isnan(col) | (F.abs(col) == float("inf"))
    parts: list[Column] = []
    if isinstance(dtype, T.StructType):
        parts = [
            _non_finite(col.getField(f.name), f.dataType)
            for f in dtype.fields
            if _has_float(f.dataType)
        ]
    elif isinstance(dtype, T.ArrayType):
        parts = [_any_non_finite(col, dtype.elementType)]
    elif isinstance(dtype, T.MapType):
        inner = [(F.map_keys(col), dtype.keyType), (F.map_values(col), dtype.valueType)]
        parts = [_any_non_finite(items, t) for items, t in inner if _has_float(t)]
    return functools.reduce(operator.or_, parts)


def _any_non_finite(items: Column, dtype: T.DataType) -> Column:
    def check(item: Column) -> Column:
        return _non_finite(item, dtype)

    return F.exists(items, check)


def _at_kind(dtype: T.DataType, name: str) -> DueKind:
    if isinstance(dtype, (T.TimestampType, T.TimestampNTZType, T.DateType, T.StringType)):
        return "at"
    if isinstance(dtype, T.NumericType):
        return "at_seconds"
    raise ConfigurationError(
        f"at_col {name!r} is {dtype.simpleString()}: give a timestamp, date, string or "
        "epoch-seconds column"
    )


def _delay_kind(dtype: T.DataType, name: str) -> DueKind:
    if isinstance(dtype, (T.NumericType, T.DayTimeIntervalType)):
        return "delay"
    raise ConfigurationError(
        f"delay_col {name!r} is {dtype.simpleString()}: give seconds or a day-time interval"
    )


@dataclass(frozen=True)
class ColumnPlan:
    """Which columns of a schema make a task, checked: ``columns_of`` builds it for
    ``schedule_dataframe`` and the ``dueq`` data source alike."""

    id_col: str | None
    due_col: str | None
    due_kind: DueKind
    payload_cols: list[str]
    #: the column of each task's fair key (its tenant on a fair queue; null: none)
    fair_key_col: str | None = None


def columns_of(
    schema: T.StructType,
    id_col: str | None,
    at_col: str | None,
    delay_col: str | None,
    payload_cols: Sequence[str] | None,
    fair_key_col: str | None = None,
) -> ColumnPlan:
    """The task columns of ``schema``; ConfigurationError for a missing or unusable column."""
    columns = schema.fieldNames()
    named = {
        "id_col": id_col,
        "at_col": at_col,
        "delay_col": delay_col,
        "fair_key_col": fair_key_col,
    }
    for what, name in named.items():
        if name is not None and name not in columns:
            raise ConfigurationError(f"{what} {name!r} is not a column of the DataFrame")
    if at_col is not None and delay_col is not None:
        raise ConfigurationError("give at_col or delay_col, not both")
    if payload_cols is None:
        payload_cols = [c for c in columns if c not in named.values()]
    elif isinstance(payload_cols, str) or not all(isinstance(c, str) for c in payload_cols):
        raise ConfigurationError("payload_cols must be a list of column names")
    missing = [c for c in payload_cols if c not in columns]
    if missing:
        raise ConfigurationError(f"payload_cols {missing} are not columns of the DataFrame")
    for what, name in (("id_col", id_col), ("fair_key_col", fair_key_col)):
        if name is None:
            continue
        dtype = schema[name].dataType
        if not isinstance(dtype, (T.StringType, T.IntegralType)):
            raise ConfigurationError(
                f"{what} {name!r} is {dtype.simpleString()}: give a string or integer column"
            )
    kind: DueKind = "now"
    if at_col is not None:
        kind = _at_kind(schema[at_col].dataType, at_col)
    elif delay_col is not None:
        kind = _delay_kind(schema[delay_col].dataType, delay_col)
    return ColumnPlan(id_col, at_col or delay_col, kind, list(payload_cols), fair_key_col)


def _due_column(schema: T.StructType, plan: ColumnPlan) -> tuple[Column, Column]:
    """The due column (epoch microseconds for "at") and the raw column for messages."""
    null = F.lit(None).cast("string")
    if plan.due_col is None:
        return F.lit(None), null
    dtype = schema[plan.due_col].dataType
    col = _column(plan.due_col)
    if isinstance(dtype, T.TimestampType):
        return F.unix_micros(col), null
    if isinstance(dtype, (T.TimestampNTZType, T.DateType)):  # wall time in the session zone
        return F.unix_micros(col.cast("timestamp")), null
    if isinstance(dtype, T.StringType):
        return F.unix_micros(F.try_to_timestamp(col)), col
    if isinstance(dtype, T.NumericType):
        return col.cast("double"), null
    return col, null  # a day-time interval


def _prepare(
    df: DataFrame,
    id_col: str | None,
    at_col: str | None,
    delay_col: str | None,
    payload_cols: Sequence[str] | None,
    fair_key_col: str | None = None,
) -> tuple[DataFrame, DueKind]:
    """The DataFrame of (id, due, raw due, payload JSON) rows the partitions read, with the
    fair key as a fifth column when ``fair_key_col`` is given."""
    plan = columns_of(df.schema, id_col, at_col, delay_col, payload_cols, fair_key_col)
    null = F.lit(None).cast("string")
    ident = null if plan.id_col is None else _column(plan.id_col).cast("string")
    due, raw = _due_column(df.schema, plan)
    payload = F.lit("{}")
    if plan.payload_cols:
        payload = F.to_json(F.struct(*[_column(c) for c in plan.payload_cols]), _JSON_OPTIONS)
        types = {c: df.schema[c].dataType for c in plan.payload_cols}
        bad = [_non_finite(_column(c), t) for c, t in types.items() if _has_float(t)]
        if bad:
            payload = F.when(functools.reduce(operator.or_, bad), None).otherwise(payload)
    if plan.fair_key_col is None:
        return df.select(ident, due, raw, payload), plan.due_kind
    fair = _column(plan.fair_key_col).cast("string")
    return df.select(ident, due, raw, payload, fair), plan.due_kind


def check_target(queue: str, redis_url: str) -> None:
    """ConfigurationError unless ``queue`` can name a queue and ``redis_url`` is a URL."""
    validate_queue_name(queue)
    if not isinstance(redis_url, str) or not redis_url:
        raise ConfigurationError(
            f"redis_url must be a redis:// or rediss:// URL, got {redis_url!r}"
        )


def partition_plan(
    queue: str,
    redis_url: str,
    due_kind: DueKind,
    *,
    has_id: bool,
    batch_size: int,
    on_bad_row: str,
    max_payload_bytes: int,
    remember_done: Duration | None,
    task: str | None = None,
    batch: str | None = None,
    has_fair_key: bool = False,
    payloads: PayloadCodec = NO_CODEC,
) -> PartitionPlan:
    """A checked PartitionPlan (ConfigurationError for a bad setting; InvalidTaskError for a
    bad task name)."""
    check_target(queue, redis_url)
    whole_number(batch_size, "batch_size", low=1, high=SCHEDULE_BATCH)
    if on_bad_row != "count" and on_bad_row != "raise":
        raise ConfigurationError(f"on_bad_row must be 'count' or 'raise', got {on_bad_row!r}")
    policy: BadRowPolicy = "raise" if on_bad_row == "raise" else "count"
    whole_number(max_payload_bytes, "max_payload_bytes", low=1)
    if remember_done is not None:
        positive_duration_ms(remember_done, "remember_done")
    return PartitionPlan(
        queue,
        redis_url,
        due_kind,
        has_id,
        batch_size,
        policy,
        max_payload_bytes,
        remember_done,
        None if task is None else validate_task_name(task),
        None if batch is None else _validate_id(batch),
        has_fair_key,
        payloads,
    )


#: The session configuration of the keys a writer seals with (``DUEQ_KEYS``' format). Its name
#: holds "secret" so that Spark's default ``spark.redaction.regex`` hides its value in the UI,
#: the event log and ``spark.sql("SET")``; ``spark.dueq.keys`` would show the keys there.
KEYS_CONF = "spark.dueq.secretKeys"
#: The session configuration of the active key (default: the last of ``KEYS_CONF``).
ACTIVE_KEY_CONF = "spark.dueq.activeKey"


def session_codec(spark: SparkSession, codec: Encrypted | None = None) -> Encrypted | None:
    """The codec a writer seals with: ``codec`` when given, else the keys of the session's
    ``spark.dueq.secretKeys`` and ``spark.dueq.activeKey`` (``settings_codec``), else None.
    Read on the driver; the plan carries it to the executors, which seal."""
    return settings_codec(lambda name: spark.conf.get(name, None), codec)


def settings_codec(
    setting: Callable[[str], str | None],
    codec: Encrypted | None = None,
    active: str | None = None,
) -> Encrypted | None:
    """``codec`` when given, else the codec of the settings ``KEYS_CONF`` and
    ``ACTIVE_KEY_CONF`` as ``setting(name)`` reads them (a session's configuration, or a
    task's local properties, where Spark copies it: the data source has no session), the
    active key ``active`` when given (``configured_codec``); None when no key is set."""
    if codec is not None:
        return configured_codec(codec, where="codec")
    active = active or setting(ACTIVE_KEY_CONF) or None
    return configured_codec(setting(KEYS_CONF), active, where=KEYS_CONF)


def task_name_of(task: Any, payload_cols: Sequence[str]) -> str | None:
    """The name of ``task`` (a name, or a ``dueq.TaskFunction``, whose signature must accept
    ``payload_cols`` as its arguments: InvalidTaskError before anything is written)."""
    if task is None or isinstance(task, str):
        return task
    if not isinstance(task, TaskFunction):
        raise InvalidTaskError(f"task must be a name or a dueq.TaskFunction, got {task!r}")
    task.check_arguments(dict.fromkeys(payload_cols))
    return task.name


def schedule_dataframe(
    df: DataFrame,
    *,
    queue: str,
    redis_url: str,
    id_col: str | None = None,
    at_col: str | None = None,
    delay_col: str | None = None,
    payload_cols: Sequence[str] | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    on_bad_row: BadRowPolicy = "count",
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    remember_done: Duration | None = None,
    task: str | TaskFunction[..., Any] | None = None,
    batch: str | None = None,
    on_complete: Task | None = None,
    fair_key_col: str | None = None,
    codec: Encrypted | None = None,
    compression: Compression | None = None,
) -> SparkScheduleResult:
    """Schedule one task per row of ``df``; an id that is already in the queue is left alone.

    Due time: ``at_col`` (timestamp, date, or string read in the session time zone; numbers
    are epoch seconds), ``delay_col`` (seconds or a day-time interval, from when Redis writes
    the task), or neither (due now). Payload: the other columns (or ``payload_cols``) as a
    JSON object, as Spark's ``to_json`` writes them. Rows with a null or unparsable due time,
    a null or invalid id, or a payload that is not JSON are counted in the result
    (``on_bad_row="count"``) or stop the job with InvalidTaskError (``"raise"``); rows
    scheduled before that stay scheduled, and running again adds only what is missing.
    Works inside ``writeStream.foreachBatch`` as well (see ``foreach_batch``). Needs a classic
    session: a Spark Connect DataFrame raises ConfigurationError (no accumulators there; its
    way is ``df.write.format("dueq")``).
    ``remember_done`` is the queue's window of ``Queue(remember_done=...)``: ids acked within
    it count as existing, so re-running a job after its tasks ran adds nothing.
    ``task`` makes each row a call of a named task (``@q.task``; a name, or the function,
    whose signature is then checked against the payload columns first): the payload columns
    are its arguments.
    ``batch`` makes every row's task a member of that batch; once every partition has been
    written the driver closes it (``Queue.close_batch``), with ``on_complete`` as its
    completion task, so it runs once after the last row's task has ended. A job that fails
    leaves the batch open: running it again adds only what is missing, then closes it.
    ``fair_key_col`` names a column (string or integer, nullable) of each task's fair key: its
    tenant on a fair queue (``configure(fairness="key")``, docs/fairness.md), validated as
    ``Task(fair_key=)`` is; a row whose value cannot be a key is a bad row (reason
    ``"fair_key"``), a null one is a task without one. Without ``id_col`` the fair key is part
    of the generated id (the same payload for two tenants is two tasks).
    ``codec`` (a ``dueq.Encrypted``) seals each payload in the executors; without it, the
    session's configuration ``spark.dueq.secretKeys`` (``"k1=<base64>,k2=..."`` as
    ``DUEQ_KEYS``) and ``spark.dueq.activeKey`` give the keys (``session_codec``); neither: no
    encryption. ``compression`` is ``"zstd"`` or ``"auto"``, as ``Queue(compression=)``.
    """
    check_target(queue, redis_url)
    try:
        context = df.sparkSession.sparkContext
    except AttributeError:  # pyspark's JVM_ATTRIBUTE_NOT_SUPPORTED: a Spark Connect session
        raise ConfigurationError(
            "schedule_dataframe needs a classic SparkSession (it counts with an accumulator, "
            "which Spark Connect has not); from Spark Connect, write with "
            "df.write.format('dueq') (and writeStream.format('dueq') instead of foreach_batch)"
        ) from None
    payloads = PayloadCodec(session_codec(df.sparkSession, codec), compression)
    prepared, kind = _prepare(df, id_col, at_col, delay_col, payload_cols, fair_key_col)
    columns = columns_of(df.schema, id_col, at_col, delay_col, payload_cols, fair_key_col)
    plan = partition_plan(
        queue,
        redis_url,
        kind,
        has_id=id_col is not None,
        batch_size=batch_size,
        on_bad_row=on_bad_row,
        max_payload_bytes=max_payload_bytes,
        remember_done=remember_done,
        task=task_name_of(task, columns.payload_cols),
        batch=batch,
        has_fair_key=fair_key_col is not None,
        payloads=payloads,
    )
    counts = context.accumulator(PartitionCounts(), _CountsParam())
    try:
        prepared.foreachPartition(functools.partial(_run_partition, plan, counts))
    except Exception as exc:
        line = next((ln for ln in str(exc).splitlines() if _BAD_ROW_MARK in ln), None)
        if line is None:
            raise
        message = line[line.index(_BAD_ROW_MARK) + len(_BAD_ROW_MARK) :]
        raise InvalidTaskError(
            f"schedule_dataframe stopped at a bad row (on_bad_row='raise'): {message}"
        ) from None
    total: PartitionCounts = counts.value
    result = SparkScheduleResult(
        added=total.added,
        existing=total.existing,
        bad_rows=sum(total.bad.values()),
        bad_by_reason=dict(total.bad),
        bad_samples=list(total.samples),
        batch=None if plan.batch is None else close_batch(plan, on_complete),
    )
    logger.info(
        "scheduled into %r: %d added, %d existing, %d bad",
        queue,
        result.added,
        result.existing,
        result.bad_rows,
    )
    if result.bad_rows:
        logger.warning("%d bad row(s) not scheduled: %s", result.bad_rows, result.bad_samples)
    return result


def close_batch(plan: PartitionPlan, on_complete: Task | None) -> BatchInfo:
    """Close the plan's batch (on the driver, once every partition has been written)."""
    assert plan.batch is not None
    client = discovery.client_for_url(plan.redis_url)
    try:
        q = discovery.open_queue(client, plan.queue, max_payload_bytes=plan.max_payload_bytes)
        return q.close_batch(plan.batch, on_complete=on_complete)
    finally:
        client.close()


def _run_partition(plan: PartitionPlan, counts: Any, rows: Iterable[Sequence[Any]]) -> None:
    counts.add(schedule_rows(rows, plan))


def foreach_batch(**options: Any) -> Callable[[DataFrame, int], None]:
    """A ``writeStream.foreachBatch`` function scheduling each micro-batch.

    Takes ``schedule_dataframe``'s keyword arguments; each batch's counts are logged. Needs a
    classic session, as ``schedule_dataframe`` does; from Spark Connect (and for exactly-once
    micro-batches) use ``writeStream.format("dueq")``.
    """

    def write(batch: DataFrame, epoch_id: int) -> None:
        result = schedule_dataframe(batch, **options)
        logger.info("micro-batch %d: %s", epoch_id, result)

    return write


_TASK_SCHEMA = T.StructType(
    [
        T.StructField("id", T.StringType(), False),
        T.StructField("state", T.StringType(), False),
        T.StructField("due_at", T.TimestampType(), True),
        T.StructField("died_at", T.TimestampType(), True),
        T.StructField("attempt", T.IntegerType(), False),
        T.StructField("errors", T.StringType(), False),
        T.StructField("payload", T.StringType(), True),
        # deprecated alias of "attempt" (its name before the one name of TaskInfo and the
        # task JSON): the same value, kept for readers that select it; to be removed
        T.StructField("attempts", T.IntegerType(), False),
    ]
)


def _task_row(info: TaskInfo) -> tuple[Any, ...]:
    # errors: the records of the task's one JSON form (TaskInfo.to_json, docs/json.md); the
    # other columns keep Spark types (timestamps, not ISO text), so the row is not that form
    errors = [e.to_json() for e in info.errors]
    return (
        info.id,
        info.state,
        info.due_at,
        info.died_at,
        info.attempt,
        json.dumps(errors, ensure_ascii=False),
        json.dumps(info.payload, ensure_ascii=False),
        info.attempt,  # the deprecated "attempts" column
    )


def where(redis_url: str) -> str:
    """``redis_url`` for a message: scheme, host, port and database, without the user-info
    and query (where passwords and certificate paths go)."""
    try:
        parts = urlsplit(redis_url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:  # not a URL one can split: show nothing of it that could be a secret
        return "<unparsable URL>"
    return urlunsplit((parts.scheme, host + port, parts.path, "", ""))


def require_queue(client: Any, queue: str, redis_url: str, hint: str) -> None:
    """ConfigurationError unless queue ``queue`` exists (``discovery.queue_exists``): reading
    a misspelt name would otherwise find nothing without a word. ``hint`` ends the message."""
    if not discovery.queue_exists(client, queue):
        raise ConfigurationError(f"no queue named {queue!r} at {where(redis_url)}: {hint}")


def read_tasks(
    spark: SparkSession | ConnectSession,
    *,
    queue: str,
    redis_url: str,
    state: TaskState = "dead",
    page_size: int = READ_PAGE,
    allow_missing: bool = False,
    decrypt: bool | Encrypted = False,
) -> DataFrame:
    """A DataFrame of the tasks in one state (``"scheduled"``, ``"leased"`` or ``"dead"``).

    Columns: id, state, due_at, died_at, attempt, errors (JSON list), payload (JSON text), and
    attempts, a deprecated alias of attempt (to be removed). An encrypted payload's column is
    its marker (``"<encrypted k1, 61 B>"``) unless ``decrypt``: ``True`` opens it with the keys
    of ``DUEQ_KEYS``, a ``dueq.Encrypted`` with its own (the driver reads every row).
    The driver walks the state's sorted set with ZSCAN, ``page_size`` ids at a time, and reads
    each page in one script call, so no reply is larger than a page. Tasks that change state
    during the walk are left out; the rows are collected on the driver, so this suits the
    dead-letter queue (capped by ``dead_max_count``) and other queues of moderate size.
    Works with a Spark Connect session too (the rows are sent with the plan).
    ConfigurationError when there is no such queue, unless ``allow_missing`` (then: no rows).
    """
    if state not in _STATES:
        raise ConfigurationError(f"state must be scheduled, leased or dead, got {state!r}")
    whole_number(page_size, "page_size", low=1, high=SCHEDULE_BATCH)
    codec = revealing(decrypt, "read_tasks(decrypt=True)")
    rows: list[tuple[Any, ...]] = []
    seen: set[str] = set()
    with discovery.client_for_url(redis_url) as client:
        if not allow_missing:
            require_queue(client, queue, redis_url, "pass allow_missing=True to read it as empty")
        # a sharded queue is read shard by shard (each a plain queue of its own keys)
        for name in discovery.stored_queue_names(client, queue):
            keys = QueueKeys.for_queue(name)
            q = Queue(name, client, codec=codec)
            for key in protocol.state_zsets(keys, state):
                as_id = protocol.parked_id if key == keys.parked else text
                cursor = 0
                while True:
                    cursor, members = client.zscan(key, cursor, count=page_size)
                    fresh = [i for i in (as_id(m) for m, _score in members) if i not in seen]
                    seen.update(fresh)
                    for start in range(0, len(fresh), page_size):  # COUNT is only a hint
                        infos = _stored_snapshots(q, fresh[start : start + page_size])
                        rows.extend(_task_row(i) for i in infos if i.state == state)
                    if cursor == 0:
                        break
    logger.info("read %d %s task(s) from %r", len(rows), state, queue)
    return spark.createDataFrame(rows, _TASK_SCHEMA)
