"""Spark's source of outcome events: ``spark.readStream.format("dueq").option("events", ...)``.

A queue's events are a Redis Stream (``dueq:{<queue>}:events``, written by the settling
scripts while ``q.configure(events=...)`` is on; ``dueq.events.stream``). This module reads it as a
Spark source, without a consumer group: Spark tracks where a query is.

**Offsets** are stream entry ids, one per stream: ``{"after": {"<queue>": "<ms>-<seq>"}, "seen":
{"<queue>": <n>}}``: the last entry each query has been given (a sharded queue has one stream per
shard, each a key of the dicts), and how many entries the stream had been given up to it (its
``entries-added`` count then; left out where unknown), which tells trimmed entries apart.
A micro-batch reads the entries after its start offset up to and including its end offset with
``XRANGE (<after> <upto> COUNT <page>``, page by page on the executors, so a replayed
micro-batch (same offsets, from the checkpoint) reads the same entries again and a restarted
query goes on after its checkpoint: exactly once with a fault-tolerant sink.
Reading changes nothing in Redis; ``commit`` has nothing to do.

**Where a new query starts** (the option ``events``): ``earliest`` (the oldest entry kept),
``latest`` (after the newest entry now), or a time (ISO 8601 with an offset, or epoch ms):
entries from that ms on. A query restarted from a checkpoint ignores it.

**Bounds.** ``maxEventsPerTrigger`` caps one micro-batch (Spark's ``ReadMaxRows``; the driver
finds the end id with one ``XRANGE ... COUNT`` per stream, shared evenly between shards);
``partitions`` splits each stream's range into that many time slices; every partition reads
``page_size`` entries per call, so no reply is bigger than a page.

**Trimmed entries.** The writing scripts trim entries older than the retention (oldest
first). A query that was stopped for longer loses entries it had not read. When the oldest entry
kept is after a micro-batch's start, the entries trimmed after that start number ``entries-added
now - seen - length`` (``XINFO STREAM``, Redis 7); if that is more than 0 the read fails with
``EventsTrimmed`` saying how many, unless ``failOnDataLoss`` is false (then it logs a warning and
reads on). Where ``seen`` is unknown (a time start inside the kept entries, until the query
catches up; Redis 6.2, which has no ``entries-added``) it fails when the entry it stopped after
was trimmed, saying events *may* be lost. Entries trimmed before a query began are no loss.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dueq import discovery
from dueq._wire.keys import QueueKeys
from dueq._wire.snapshot import REJECTED, setting_value, text
from dueq.events.stream import range_events
from dueq.exceptions import ConfigurationError, DueqError, EventsTrimmed
from dueq.spark._batch import check_target, int_option, require_queue
from dueq.spark._options import bool_option, checked

try:
    from pyspark.sql import types as T
    from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "the dueq events source needs pyspark >= 4.2: pip install 'dueq[spark]'"
    ) from exc

__all__ = [
    "EVENTS_SCHEMA",
    "RefusedStreamReader",
    "events_batch_reader",
    "events_stream_reader",
]

logger = logging.getLogger("dueq.spark")

#: The columns of an events DataFrame.
EVENTS_SCHEMA = T.StructType(
    [
        T.StructField("event_id", T.StringType(), False),
        T.StructField("queue", T.StringType(), False),
        T.StructField("task_id", T.StringType(), False),
        T.StructField("kind", T.StringType(), False),
        T.StructField("attempt", T.IntegerType(), False),
        T.StructField("at", T.TimestampType(), False),
        T.StructField("result", T.StringType(), True),
        T.StructField("error", T.StringType(), True),
        T.StructField("payload", T.StringType(), True),
        T.StructField("task", T.StringType(), True),
    ]
)

#: Entries one XRANGE call returns unless ``page_size`` says otherwise.
EVENTS_PAGE = 1000
MAX_EVENTS_PAGE = 10_000
MAX_SLICES = 256
_MAX_SEQ = 2**64 - 1
_NONE = "0-0"  # before every entry: XADD never writes the id 0-0


# -- stream ids --------------------------------------------------------------------------------


def _id(value: str) -> tuple[int, int]:
    ms, _, seq = value.partition("-")
    return int(ms), int(seq or 0)


def _later(a: str, b: str) -> str:
    return a if _id(a) >= _id(b) else b


def _start_id(raw: str) -> str | None:
    """The exclusive start of option ``events``: None for "latest", else the id just before
    the first entry to read ("earliest": before all; a time: before its ms)."""
    value = raw.strip()
    if value.lower() == "latest":
        return None
    if value.lower() == "earliest":
        return _NONE
    if value.isdigit():
        at_ms = int(value)
    else:
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            moment = None
        if moment is None or moment.tzinfo is None:
            raise ConfigurationError(
                "option events must be earliest, latest, epoch milliseconds or an ISO 8601 "
                f"time with an offset (e.g. 2026-11-26T09:00:00Z), got {raw!r}"
            )
        at_ms = max(int(moment.timestamp() * 1000), 0)
    return _NONE if at_ms == 0 else f"{at_ms - 1}-{_MAX_SEQ}"


# -- options and the driver's look at the streams ------------------------------------------------


@dataclass(frozen=True)
class _Stream:
    """What ``XINFO STREAM`` tells of one events stream (an absent one: empty, nothing added)."""

    last: str  # the newest id written (last-generated-id)
    first: str | None  # the oldest entry kept (None: empty)
    length: int
    added: int | None  # entries ever added (entries-added; None before Redis 7)

    def lost_after(self, after: str, seen: int | None) -> int | None:
        """How many entries after id ``after`` were trimmed (0: none), given ``seen``, the
        entries added up to it; None: some may have been (``seen`` unknown, and the oldest
        entry kept is after ``after``)."""
        if self.first is not None and _id(self.first) <= _id(after):
            return 0  # trimming goes oldest first: nothing after `after` went
        if self.length == 0 and _id(self.last) <= _id(after):
            return 0
        if seen is None or self.added is None:
            return None if after != _NONE else 0
        return max(self.added - seen - self.length, 0)

    def seen_at_start(self, after: str) -> int | None:
        """``seen`` for a new query starting after id ``after``: every entry trimmed so far
        counts as seen (they went before the query began); None when kept entries are at or
        before ``after`` (counting them would mean reading them)."""
        if self.added is None:
            return None
        if _id(after) >= _id(self.last):
            return self.added
        if self.first is None or _id(self.first) > _id(after):
            return self.added - self.length
        return None


def _look(client: Any, key: str) -> _Stream:
    import redis

    try:
        info = client.xinfo_stream(key)
    except redis.ResponseError as exc:
        if "no such key" in str(exc).lower():
            return _Stream(_NONE, None, 0, 0)
        raise
    first = info.get("first-entry")
    added = info.get("entries-added")
    return _Stream(
        last=text(info.get("last-generated-id") or _NONE),
        first=text(first[0]) if first else None,
        length=int(info.get("length") or 0),
        added=None if added is None else int(added),
    )


@dataclass(frozen=True)
class EventsOptions:
    """The checked options of an events read (``ConfigurationError`` names what is wrong)."""

    url: str
    queue: str
    start: str | None
    max_per_trigger: int | None
    slices: int
    page_size: int
    fail_on_loss: bool


def events_options(options: Any) -> EventsOptions:
    if "state" in {name.lower() for name in options}:
        raise ConfigurationError("option state reads tasks, option events reads events: not both")
    options = checked(options, "events read")
    queue, url = options.get("queue"), options.get("redis_url")
    if queue is None or url is None:
        raise ConfigurationError("the dueq data source needs the options queue and redis_url")
    check_target(queue, url)
    return EventsOptions(
        url=str(url),
        queue=str(queue),
        start=_start_id(str(options.get("events"))),
        max_per_trigger=int_option(options, "maxEventsPerTrigger", None, low=1, high=10**9),
        slices=int_option(options, "partitions", 1, low=1, high=MAX_SLICES) or 1,
        page_size=int_option(options, "page_size", EVENTS_PAGE, low=1, high=MAX_EVENTS_PAGE)
        or EVENTS_PAGE,
        fail_on_loss=bool_option(options, "failOnDataLoss", True),
    )


def _names(client: Any, opts: EventsOptions) -> list[str]:
    """The queue (or its shards), refused with ConfigurationError when events are off on
    every one of them and none has an events stream to read."""
    require_queue(client, opts.queue, opts.url, "its events cannot be read")
    names = discovery.stored_queue_names(client, opts.queue)
    for name in names:
        keys = QueueKeys.for_queue(name)
        raw = client.hget(keys.config, "events_ms")
        value = REJECTED if raw is None else setting_value("events_ms", text(raw))
        if (value is not REJECTED and value > 0) or client.exists(keys.events):
            return names
    raise ConfigurationError(
        f"events are off for queue {opts.queue!r}: nothing is written to read. Turn them on "
        "with q.configure(events=timedelta(hours=24)) (or dueq configure QUEUE --events SECONDS)"
    )


# -- partitions and rows -----------------------------------------------------------------------


@dataclass(frozen=True)
class EventRange(InputPartition):
    """One read partition: the entries of queue ``queue``'s events stream after id ``after``
    up to and including id ``upto``."""

    queue: str
    after: str
    upto: str


def _slices(queue: str, after: str, upto: str, count: int) -> list[EventRange]:
    """The range (after, upto] cut into ``count`` time slices of about equal span."""
    low_ms, high_ms = _id(after)[0], _id(upto)[0]
    span = high_ms - low_ms
    count = max(1, min(count, span))
    edges = [after]
    for i in range(1, count):
        edges.append(f"{low_ms + span * i // count}-{_MAX_SEQ}")
    edges.append(upto)
    return [EventRange(queue, a, b) for a, b in itertools.pairwise(edges) if a != b]


def _row(queue: str, entry: Any) -> tuple[Any, ...]:
    error = None if entry.error is None else json.dumps(entry.error.to_json(), ensure_ascii=False)
    task = entry.task
    return (
        entry.id,
        queue,
        entry.task_id,
        entry.kind,
        entry.attempt,
        entry.at,
        None if entry.result is None else json.dumps(entry.result, ensure_ascii=False),
        error,
        None if task is None else json.dumps(task.payload, ensure_ascii=False),
        None if task is None else task.task,
    )


def _read(opts: EventsOptions, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
    assert isinstance(partition, EventRange)
    key = QueueKeys.for_queue(partition.queue).events
    after = partition.after
    with discovery.client_for_url(opts.url) as client:
        while _id(after) < _id(partition.upto):
            reply = client.xrange(key, "(" + after, partition.upto, count=opts.page_size)
            if not reply:
                return
            for event in range_events(reply):
                yield _row(partition.queue, event)
            after = text(reply[-1][0])
            if len(reply) < opts.page_size:
                return


def _ranges(opts: EventsOptions, start: dict[str, Any], end: dict[str, Any]) -> list[EventRange]:
    """The partitions of (start, end], after the check for trimmed entries."""
    out: list[EventRange] = []
    starts, ends = start.get("after", {}), end.get("after", {})
    seen = start.get("seen", {})
    with discovery.client_for_url(opts.url) as client:
        for name, upto in ends.items():
            after = starts.get(name, _NONE)
            if _id(upto) <= _id(after):
                continue
            stream = _look(client, QueueKeys.for_queue(name).events)
            lost = stream.lost_after(after, seen.get(name))
            if lost != 0:
                how_many = "some events" if lost is None else f"{lost} event(s)"
                verb = "may have been" if lost is None else "were"
                message = (
                    f"{how_many} of queue {name!r} after {after} {verb} trimmed before this "
                    f"query read them (the oldest kept is {stream.first}; the query was stopped "
                    "for longer than the queue's events retention, or the stream was trimmed)"
                )
                if opts.fail_on_loss:
                    raise EventsTrimmed(
                        message + "; set option failOnDataLoss=false to read on without them"
                    )
                logger.warning("%s: reading on from the oldest entry kept", message)
            out += _slices(name, after, upto, opts.slices)
    return out


# -- the readers -------------------------------------------------------------------------------


class _EventsStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: EventsOptions) -> None:
        self.opts = opts
        with discovery.client_for_url(opts.url) as client:
            self.names = _names(client, opts)
        self.target: dict[str, str] | None = None  # Trigger.AvailableNow: the newest ids then

    def _streams(self) -> dict[str, _Stream]:
        with discovery.client_for_url(self.opts.url) as client:
            return {n: _look(client, QueueKeys.for_queue(n).events) for n in self.names}

    def initialOffset(self) -> dict[str, Any]:
        after: dict[str, str] = {}
        seen: dict[str, int] = {}
        for name, stream in self._streams().items():
            after[name] = stream.last if self.opts.start is None else self.opts.start
            count = stream.seen_at_start(after[name])
            if count is not None:
                seen[name] = count
        return {"after": after, "seen": seen}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.opts.max_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = {name: stream.last for name, stream in self._streams().items()}

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """Up to the newest entry (or the AvailableNow target), at most the limit's rows. The
        end's ``seen`` is the start's, plus the entries trimmed after the start (the read
        fails on them, or reads on without them), plus the entries up to the end."""
        starts: dict[str, str] = start.get("after", {})
        seen: dict[str, int] = start.get("seen", {})
        streams = self._streams()
        budget = None
        if isinstance(limit, ReadMaxRows):
            budget = max(1, limit.max_rows // max(1, len(self.names)))
        ends: dict[str, str] = {}
        end_seen: dict[str, int] = {}
        with discovery.client_for_url(self.opts.url) as client:
            for name in self.names:
                stream, after = streams[name], starts.get(name, _NONE)
                newest = (self.target or {}).get(name, stream.last)
                upto = _later(newest, after)
                read: int | None = 0 if upto == after else None  # entries in (after, upto]
                if budget is not None and upto != after:
                    key = QueueKeys.for_queue(name).events
                    page = client.xrange(key, "(" + after, upto, count=budget)
                    read = len(page)
                    if read == budget:  # more than the budget: stop at its last entry
                        upto = text(page[-1][0])
                ends[name] = upto
                lost = stream.lost_after(after, seen.get(name))
                if upto == stream.last and stream.added is not None:
                    end_seen[name] = stream.added
                elif read is not None and lost is not None and name in seen:
                    end_seen[name] = seen[name] + lost + read
        return {"after": ends, "seen": end_seen}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[EventRange]:
        return _ranges(self.opts, start, end)

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        return _read(self.opts, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: reading changed nothing in Redis, and Spark keeps the offsets."""


class _EventsBatchReader(DataSourceReader):
    """``spark.read``: the entries kept now, from the option ``events`` (default earliest)."""

    def __init__(self, opts: EventsOptions) -> None:
        self.opts = opts
        stream_reader = _EventsStreamReader(opts)
        self.start = stream_reader.initialOffset()
        self.end = stream_reader.latestOffset(self.start, ReadAllAvailable())

    def partitions(self) -> Sequence[EventRange]:
        return _ranges(self.opts, self.start, self.end) or [
            EventRange(self.opts.queue, "0-0", "0-0")
        ]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        return _read(self.opts, partition)


class RefusedStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A stream reader that raises ``error`` from each call. ``streamReader`` returns it instead
    of raising: pyspark 4.3's streaming source runner calls ``reader.stop()`` in a ``finally``
    around the ``streamReader`` call, so an error raised there surfaces as an UnboundLocalError
    on ``reader``, and the user never sees what was wrong with the options."""

    def __init__(self, error: DueqError) -> None:
        self.error = error

    def _raise(self) -> Any:
        raise self.error

    def initialOffset(self) -> dict[str, Any]:
        return self._raise()  # type: ignore[no-any-return]

    def getDefaultReadLimit(self) -> ReadLimit:
        return self._raise()  # type: ignore[no-any-return]

    def prepareForTriggerAvailableNow(self) -> None:
        self._raise()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        return self._raise()  # type: ignore[no-any-return]

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[EventRange]:
        return self._raise()  # type: ignore[no-any-return]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        return self._raise()  # type: ignore[no-any-return]


def events_stream_reader(options: Any) -> DataSourceStreamReader:
    """The stream reader of ``options`` (a RefusedStreamReader when they are wrong)."""
    try:
        return _EventsStreamReader(events_options(options))
    except DueqError as exc:  # raised from the reader's first call: see RefusedStreamReader
        return RefusedStreamReader(exc)


def events_batch_reader(options: Any) -> _EventsBatchReader:
    return _EventsBatchReader(events_options(options))
