"""Outcome events: follow what happens to a queue's tasks from other services.

With ``q.configure(events=timedelta(hours=24))`` every script that settles a task (ack, fail,
cancel, and claim for expired leases, buried tasks and tasks past their expiry) appends one
entry to the queue's events stream (``dueq:{<queue>}:events``, a Redis Stream) in the same
call: an event is written if and only if the outcome happened. Entries older than the
retention are trimmed by the writing scripts (see lua/include/events.lua).

Reading (``q.events(...)`` / ``aq.events(...)``), written once as ``events_flow`` and driven by a
thread (``observe_events``, a reactivex Observable) or on the caller's event loop
(``dueq.events.aio``):

- ``group="billing"``: a consumer group (XGROUP CREATE ... MKSTREAM on first use, starting at
  ``since`` or at the stream's end). Each event goes to one member; ``ev.ack()`` (XACK) settles
  it, and an event not acked within ``redeliver_after`` goes to another member (XAUTOCLAIM,
  like a task's expired lease). A member started again under the same ``consumer`` name reads
  its pending entries first, then new ones.
- no group: a tail of every event from now (or from ``since``), XREAD BLOCK; ``ack`` does
  nothing.

A sharded queue has one stream per shard (each in its shard's slot): its reader
(``sharded_events_flow``, chosen once by ``reader_flow``) reads them all as one logical stream,
one ``ReaderSpec`` per shard with the same group and member, visiting the shards in turn with
reads that do not block (one XREADGROUP cannot name streams of several slots) and blocking
briefly on one shard in rotation only when all are empty. Each event names its stream
(``EventBase.stream``) and is acked there; order is kept within a shard, not across shards.

Blocking reads run on a connection of their own (``reader_client``), never on the queue's
shared client, as the wake listener keeps its own Pub/Sub connection.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import threading
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol

import reactivex
from reactivex import Observable, abc
from reactivex.disposable import Disposable

from dueq._util.clock import Duration, positive_duration_ms
from dueq._util.outage import Backoff, describe, is_outage
from dueq._wire import protocol as protocol
from dueq._wire.codec import (
    NO_CODEC,
    PROGRESS_PURPOSE,
    RESULT_PURPOSE,
    PayloadCodec,
    SealedMarker,
)
from dueq._wire.envelope import decode_named, sealed_marker
from dueq._wire.failures import parse_error_records
from dueq._wire.keys import QueueKeys, validate_queue_name
from dueq._wire.ports import DrivesFlows
from dueq._wire.snapshot import shown_errors
from dueq.exceptions import ConfigurationError, PayloadError, UndecryptableTask
from dueq.model import ErrorRecord, Task, iso_ms

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster

logger = logging.getLogger("dueq.events")


class ReadsEvents(DrivesFlows, Protocol):
    """What a blocking events reader needs of its queue (``Queue`` has it): the flows' members,
    its shards' names (a plain queue's: its own; one stream each), its holder and its client."""

    @property
    def shard_names(self) -> tuple[str, ...]: ...

    @property
    def holder(self) -> str | None: ...

    @property
    def redis(self) -> Redis | RedisCluster: ...


EventKind = Literal["acked", "retried", "dead", "cancelled", "expired", "progress"]

#: Most entries one read returns.
READ_COUNT = 100
#: Longest one blocking read waits; bounds how long stopping a reader takes to be noticed.
BLOCK_MS = 1000


@dataclass(frozen=True)
class EventBase:
    """One outcome of one task, as the settling script recorded it, or one progress entry.

    ``kind``: acked, retried, dead, cancelled or expired; or progress (``d.progress(body)``,
    written by progress.lua under the lease: ``seq`` and ``body`` are the entry's, ``task``
    is None). ``attempt``: the deliveries the task
    had when it ended this way. ``at``: when (queue clock). ``result``: the handler's value
    when acked while the queue keeps results (``keep_results``), else None. ``error``: the
    failed attempt's record (retried, dead). ``task``: the task as scheduled (payload, id and
    options; ``task.task`` names a named task's function), None when its data was gone.
    ``id`` is the stream entry id; ``group`` the consumer group it was read in (None: a tail);
    ``stream`` the stream it was read from (a sharded queue's events come from its shards').
    """

    id: str
    task_id: str
    kind: str
    attempt: int
    at: datetime
    result: Any = None
    error: ErrorRecord | None = None
    task: Task | None = None
    group: str | None = None
    #: a progress event's entry: its seq (1, 2, ... per task) and its JSON value
    seq: int | None = None
    body: Any = None
    #: the events stream the event was read from: the queue's, or on a sharded queue its
    #: task's shard's (``ack`` settles it there); None for an event not read by a reader
    stream: str | None = None
    _acker: Callable[[str], Any] | None = field(default=None, repr=False, compare=False)

    @property
    def undecryptable(self) -> PayloadError | None:
        """Why a sealed value of this event was not opened (UndecryptableTask: no key of the
        reader's codec opens it, or the reader has none), or None when every value was: its
        ``result`` or its ``task.payload`` is then a marker (``<encrypted k1, 80 B>``), not
        the value."""
        payload = None if self.task is None else self.task.payload
        for value in (self.result, payload):
            if isinstance(value, SealedMarker):
                return value.error
        return None

    def to_json(self) -> dict[str, Any]:
        """This event as JSON types (the CLI's ``--json``, the dashboard)."""
        task = self.task
        return {
            "id": self.id,
            "task_id": self.task_id,
            "kind": self.kind,
            "attempt": self.attempt,
            "at": iso_ms(self.at),
            "result": self.result,
            "error": None if self.error is None else self.error.to_json(),
            "payload": None if task is None else task.payload,
            "task": None if task is None else task.task,
            "group": self.group,
            "seq": self.seq,
            "body": self.body,
        }


class Event(EventBase):
    """An event read by ``Queue.events``; ``ack()`` settles it in its group."""

    def ack(self) -> None:
        """Settle this event in its consumer group (XACK), so it is not redelivered; does
        nothing for an event read without a group."""
        if self._acker is not None:
            self._acker(self.id)


class AsyncEvent(EventBase):
    """An event read by ``AsyncQueue.events``; ``await ev.ack()`` settles it in its group."""

    async def ack(self) -> None:
        """As ``Event.ack``."""
        if self._acker is not None:
            await self._acker(self.id)


# -- reading: the steps, written once ---------------------------------------------------------


class ReaderSpec(NamedTuple):
    """What one reader reads of one stream: the stream, its group and member name (None: a
    tail), the redelivery idle time, where a new group or a tail starts (a stream id, or ""
    for now), and the keys of the queue (or shard) whose stream it is (``events_read``)."""

    stream: str
    group: str | None
    consumer: str
    redeliver_ms: int
    start_id: str
    keys: QueueKeys


def reader_specs(
    queue: Any,
    *,
    group: str | None,
    consumer: str | None,
    default_consumer: str,
    redeliver_after: Duration,
    since: datetime | None,
) -> list[ReaderSpec]:
    """Check a reader's options (ConfigurationError names what is wrong); one spec per stream
    of ``queue``: its own, or one per shard (``shard_names``: a plain queue's is its name), the
    same group and member on each."""
    if group is not None:
        validate_queue_name(group)  # printable, no whitespace: a name fit for a group
    if consumer is not None:
        validate_queue_name(consumer)
    redeliver_ms = positive_duration_ms(redeliver_after, "redeliver_after")
    start_id = ""
    if since is not None:
        if not isinstance(since, datetime) or since.tzinfo is None:
            raise ConfigurationError(f"since must be an aware datetime, got {since!r}")
        start_id = f"{max(int(since.timestamp() * 1000), 0)}-0"
    member = consumer or default_consumer
    return [
        ReaderSpec(keys.events, group, member, redeliver_ms, start_id, keys)
        for keys in map(QueueKeys.for_queue, queue.shard_names)
    ]


#: One step of the reader flows: ("call", method, args, kwargs, spec) asks the driver for a
#: reply of the reader client's method; ("emit", entries, spec) hands entries read from
#: ``spec.stream`` over (the reply is None). ``spec`` names the stream the step is about.
Step = tuple[Any, ...]


def reader_flow(specs: list[ReaderSpec]) -> Generator[Step, Any, None]:
    """The reader of ``specs``' streams, chosen once: ``events_flow`` of a plain queue's one
    stream, ``sharded_events_flow`` of a sharded queue's streams."""
    return events_flow(specs[0]) if len(specs) == 1 else sharded_events_flow(specs)


def events_flow(spec: ReaderSpec) -> Generator[Step, Any, None]:
    """The reader loop of one stream (see the module docstring): yields client calls and
    batches of entries ``(entry id, fields)``, forever; the driver stops it between steps."""
    if spec.group is None:
        last = yield from _tail_start(spec)
        while True:
            last = yield from _tail_read(spec, last, BLOCK_MS)
    yield ("call", "create_group", (spec,), {}, spec)
    trimmed = yield from _pending(spec)
    block_ms = min(BLOCK_MS, spec.redeliver_ms)
    while True:
        trimmed += yield from _redeliver(spec)
        found = yield from _read_new(spec, trimmed)
        trimmed = 0
        if found:
            continue
        yield from _read_blocking(spec, block_ms)


def sharded_events_flow(specs: list[ReaderSpec]) -> Generator[Step, Any, None]:
    """The reader loop of a sharded queue's streams, one per shard, as one logical stream.

    A Redis Cluster places the shards' streams in different slots (different nodes), so one
    XREADGROUP cannot name them all (CROSSSLOT): each round visits every shard's stream in
    turn with the steps of ``events_flow`` that do not block (redelivery, then the new
    entries, on the shard's own keys), and only a round that found nothing new blocks, on one
    shard in rotation, for ``BLOCK_MS`` / N (at least ``MIN_SHARD_BLOCK_MS``): no shard
    starves, and a reader of N empty shards blocks about ``BLOCK_MS`` per N rounds. Each shard
    keeps its own order; there is none across shards."""
    if specs[0].group is None:
        lasts = []
        for spec in specs:
            lasts.append((yield from _tail_start(spec)))
        turn = 0
        while True:
            read_any = False
            for i, spec in enumerate(specs):
                last = yield from _tail_read(spec, lasts[i], None)
                read_any = read_any or last != lasts[i]
                lasts[i] = last
            if read_any:
                continue
            i = turn % len(specs)
            turn += 1
            lasts[i] = yield from _tail_read(specs[i], lasts[i], _shard_block_ms(specs))
    trimmed = [0] * len(specs)
    for spec in specs:
        yield ("call", "create_group", (spec,), {}, spec)
    for i, spec in enumerate(specs):
        trimmed[i] = yield from _pending(spec)
    turn = 0
    while True:
        found = False
        for i, spec in enumerate(specs):
            trimmed[i] += yield from _redeliver(spec)
            found = (yield from _read_new(spec, trimmed[i])) or found
            trimmed[i] = 0
        if found:
            continue
        yield from _read_blocking(specs[turn % len(specs)], _shard_block_ms(specs))
        turn += 1


#: Shortest block of a sharded reader's blocking read, however many shards it reads.
MIN_SHARD_BLOCK_MS = 20


def _shard_block_ms(specs: list[ReaderSpec]) -> int:
    return max(min(BLOCK_MS, specs[0].redeliver_ms) // len(specs), MIN_SHARD_BLOCK_MS)


def _tail_start(spec: ReaderSpec) -> Generator[Step, Any, str]:
    """Where a tail of ``spec.stream`` starts: ``since``, or after the stream's last entry
    (none: from the start)."""
    if spec.start_id:
        return spec.start_id
    newest = yield ("call", "xrevrange", (spec.stream,), {"count": 1}, spec)
    return text(newest[0][0]) if newest else "0-0"


def _tail_read(spec: ReaderSpec, last: str, block_ms: int | None) -> Generator[Step, Any, str]:
    """One XREAD of a tail after ``last`` (blocking ``block_ms``; None: not blocking); returns
    the id of the last entry read."""
    kwargs: dict[str, Any] = {"count": READ_COUNT}
    if block_ms is not None:
        kwargs["block"] = block_ms
    reply = yield ("call", "xread", ({spec.stream: last},), kwargs, spec)
    entries = stream_entries(reply)
    if not entries:
        return last
    yield ("emit", entries, spec)
    return str(entries[-1][0])


def _pending(spec: ReaderSpec) -> Generator[Step, Any, int]:
    """This member's pending entries first (a restart resumes them); returns how many of them
    were trimmed while pending (delivered, never acked: lost, counted by the next
    events_read)."""
    trimmed = 0
    pending_from = "0"
    while pending_from:
        reply = yield (
            "call",
            "xreadgroup",
            (spec.group, spec.consumer, {spec.stream: pending_from}),
            {"count": READ_COUNT},
            spec,
        )
        entries = stream_entries(reply)
        pending_from = entries[-1][0] if entries else ""
        kept, gone = yield from _settle_trimmed(spec, entries)
        trimmed += gone
        if kept:
            yield ("emit", kept, spec)
    return trimmed


def _redeliver(spec: ReaderSpec) -> Generator[Step, Any, int]:
    """Claim the group's entries idle past ``redeliver_ms`` (XAUTOCLAIM) and hand them over;
    returns how many were trimmed while pending."""
    reply = yield (
        "call",
        "xautoclaim",
        (spec.stream, spec.group, spec.consumer, spec.redeliver_ms),
        {"start_id": "0-0", "count": READ_COUNT},
        spec,
    )
    claimed, gone = yield from _settle_trimmed(
        spec, _entry_list(reply[1] if len(reply) > 1 else [])
    )
    if claimed:
        yield ("emit", claimed, spec)
    # (Redis 7 takes entries trimmed while pending out of the PEL itself, and names them)
    return gone + (len(reply[2]) if len(reply) > 2 and reply[2] else 0)


def _read_new(spec: ReaderSpec, trimmed: int) -> Generator[Step, Any, bool]:
    """What the group lost to the retention, counted atomically with a read of new entries (no
    trim can fall between them); whether any were new."""
    read = yield ("call", "events_read", (spec, trimmed), {}, spec)
    _warn_lost(spec, read.lost, trimmed)
    entries = stream_entries(read.reply)
    if entries:
        yield ("emit", entries, spec)
    return bool(entries)


def _read_blocking(spec: ReaderSpec, block_ms: int) -> Generator[Step, Any, None]:
    """One XREADGROUP of new entries, blocking up to ``block_ms``."""
    reply = yield (
        "call",
        "xreadgroup",
        (spec.group, spec.consumer, {spec.stream: ">"}),
        {"count": READ_COUNT, "block": block_ms},
        spec,
    )
    entries = stream_entries(reply)
    if entries:
        yield ("emit", entries, spec)


def events_read_flow(
    queue: Any, spec: ReaderSpec, trimmed_pending: int
) -> Generator[Any, Any, protocol.EventsRead]:
    """The ``events_read`` step of the reader flows, on the queue's own client (a script: no
    blocking read), on the keys of the queue or shard whose stream ``spec`` reads."""
    read: protocol.EventsRead = yield protocol.events_read(
        spec.keys, str(spec.group), spec.consumer, READ_COUNT, trimmed_pending
    )
    return read


def _settle_trimmed(
    spec: ReaderSpec, entries: list[tuple[str, dict[str, str] | None]]
) -> Generator[Step, Any, tuple[list[tuple[str, dict[str, str]]], int]]:
    """Ack the entries trimmed while pending (nothing is left to tell of them, and unacked
    they would come back forever); returns the others and how many were trimmed."""
    gone = [entry_id for entry_id, fields in entries if fields is None]
    if gone:
        yield ("call", "xack", (spec.stream, spec.group, *gone), {}, spec)
    return [(entry_id, fields) for entry_id, fields in entries if fields is not None], len(gone)


def _warn_lost(spec: ReaderSpec, lost: int | None, trimmed_pending: int) -> None:
    """Say what a group lost to the events retention (both counted in ``events_lost``)."""
    if lost:
        logger.warning(
            "events of %s: group %r fell behind the events retention: %d event(s) were "
            "trimmed before it read them and are lost (the dueq_events_lost_total metric "
            "counts them; keep events longer, q.configure(events=...), or add members)",
            spec.stream,
            spec.group,
            lost,
        )
    if trimmed_pending:
        logger.warning(
            "events of %s: group %r: %d event(s) delivered to member %r were trimmed before "
            "they were acked and are lost (counted in dueq_events_lost_total)",
            spec.stream,
            spec.group,
            trimmed_pending,
            spec.consumer,
        )


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _field_text(value: bytes | str) -> str:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else str(value)


def stream_entries(reply: Any) -> list[tuple[str, dict[str, str] | None]]:
    """The entries of an XREAD/XREADGROUP reply of one stream, in any of the shapes redis-py
    parses it into (RESP2 ``[[name, entries]]``; RESP3 ``{name: [entries]}``, or unified
    ``{name: entries}``)."""
    if not reply:
        return []
    if isinstance(reply, dict):
        value = next(iter(reply.values()))
        nested = (
            isinstance(value, list)
            and len(value) == 1
            and isinstance(value[0], list)
            and (not value[0] or isinstance(value[0][0], (tuple, list)))
        )
        return _entry_list(value[0] if nested else value)
    return _entry_list(reply[0][1])


def _entry_list(entries: Any) -> list[tuple[str, dict[str, str] | None]]:
    out: list[tuple[str, dict[str, str] | None]] = []
    for entry in entries or []:
        entry_id, fields = entry[0], entry[1]
        if entry_id is None:  # deleted while pending (redis-py drops its id): nothing to tell
            continue
        if not fields:  # trimmed while pending: the id alone (redis-py may give {} for nil)
            out.append((text(entry_id), None))
            continue
        if isinstance(fields, list):
            fields = dict(zip(fields[::2], fields[1::2], strict=True))
        # (a sealed envelope is bytes, not UTF-8: kept byte for byte for parse_event)
        out.append((text(entry_id), {text(k): _field_text(v) for k, v in fields.items()}))
    return out


def parse_event(
    cls: type[EventBase],
    entry_id: str,
    fields: dict[str, str],
    group: str | None,
    acker: Callable[[str], Any] | None,
    codec: PayloadCodec = NO_CODEC,
    queue: str = "",
    *,
    stream: str | None = None,
) -> EventBase:
    """One event from a stream entry's fields (see lua/include/events.lua). Its task's sealed
    payload and its sealed result are opened with ``codec`` as the task's of ``queue``; one
    that cannot be shows as its SealedMarker (``EventBase.undecryptable`` says why), so that
    one task's event never stops a reader."""
    at_ms = int(fields.get("at", "0") or 0)
    task_id = fields.get("id", "")
    result = None
    if "result" in fields:
        try:
            result = json.loads(fields["result"])
        except ValueError:  # stored by ack.lua as JSON already checked; unreadable: left out
            result = None
        result = codec.shown_value(result, queue, task_id, RESULT_PURPOSE)
    error = None
    if "error" in fields:
        records = parse_error_records("[" + fields["error"] + "]")
        # a sealed message (Encrypted(errors=True)) opened for the key's holder, else a marker
        error = shown_errors(records, codec, queue, task_id)[0] if records else None
    body = None
    if "body" in fields:
        try:
            body = json.loads(fields["body"])
        except ValueError:  # written by progress.lua as JSON already checked; unreadable: None
            body = None
        # sealed by progress_flow under an encrypting codec: opened for the key's holder
        body = codec.shown_value(body, queue, task_id, PROGRESS_PURPOSE)
    task = None
    if "task" in fields:
        raw = fields["task"].encode("utf-8", "surrogateescape")  # (read so: _entry_list)
        try:
            payload, options, _, name = decode_named(raw, codec, queue, task_id)
            timeout = None if options.timeout_ms is None else options.timeout_ms / 1000
            task = Task(
                payload,
                id=fields.get("id"),
                priority=options.priority,
                key=options.key,
                timeout=timeout,
                max_attempts=options.max_attempts,
                task=name,
            )
        except UndecryptableTask as exc:  # its marker, never its bytes
            task = Task(SealedMarker(sealed_marker(raw) or "<encrypted>", exc), id=task_id)
        except PayloadError:  # the stored task cannot be read: the event still tells its id
            task = None
    return cls(
        id=entry_id,
        task_id=fields.get("id", ""),
        kind=fields.get("kind", ""),
        attempt=int(fields.get("attempt", "0") or 0),
        at=datetime.fromtimestamp(at_ms / 1000, tz=timezone.utc),
        result=result,
        error=error,
        task=task,
        group=group,
        seq=int(fields["seq"]) if fields.get("seq", "").isdigit() else None,
        body=body,
        stream=stream,
        _acker=acker,
    )


def reader_client(client: Any) -> Any:
    """A client of its own for blocking reads, on ``client``'s server and settings (a read that
    blocks never holds a connection the queue needs); ``close_reader`` / ``aclose_reader``
    closes its connections. Its socket timeout outlasts a blocking read.

    For a ``Redis``: over a pool of one connection. For a ``RedisCluster`` (blocking or asyncio):
    a cluster client of the same startup nodes and settings, one connection a node; it routes
    each read by key to the node of the queue's hash slot (all of a queue's keys share one
    tag) and follows the slot when it moves, which a client of one node could not."""
    if hasattr(client, "nodes_manager"):  # redis-py's cluster clients have no connection_pool
        return _cluster_reader_client(client)
    pool = client.connection_pool
    kwargs = _outlasting_a_read(dict(pool.connection_kwargs))
    own_pool = type(pool)(connection_class=pool.connection_class, max_connections=1, **kwargs)
    return type(client)(connection_pool=own_pool)


def close_reader(client: Any) -> None:
    """Close a blocking ``reader_client``: a client over a pool of its own leaves the pool open,
    so it is disconnected too; a cluster client's ``close`` closes every node's."""
    client.close()
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        pool.disconnect()


async def aclose_reader(client: Any) -> None:
    """``close_reader`` of an asyncio ``reader_client``."""
    await client.aclose()
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        await pool.disconnect()


#: Connection keywords a cluster client puts in for itself, tied to that client: its own
#: on_connect hook, its response callbacks, registries and notification handlers.
_CLUSTER_OWN_KWARGS = frozenset(
    {
        "redis_connect_func",
        "response_callbacks",
        "himport_registry",
        "maint_notifications_config",
        "maint_notifications_pool_handler",
        "oss_cluster_maint_notifications_handler",
        "max_connections",
    }
)


def _cluster_reader_client(client: Any) -> Any:
    """``reader_client`` of a ``RedisCluster``: the blocking class takes the connection keywords
    as ``**kwargs``; the asyncio one names each (TLS as ``ssl=True``), so they are passed by
    its signature."""
    manager = client.nodes_manager
    kwargs = {
        key: value
        for key, value in client.get_connection_kwargs().items()
        if key not in _CLUSTER_OWN_KWARGS
    }
    user_on_connect = getattr(client, "user_on_connect_func", None)  # the blocking class's
    if user_on_connect is not None:
        kwargs["redis_connect_func"] = user_on_connect
    params = inspect.signature(type(client)).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        kwargs["ssl"] = "ssl_cert_reqs" in kwargs  # set with the TLS keywords, and only then
        kwargs = {key: value for key, value in kwargs.items() if key in params}
    node_class = type(next(iter(manager.startup_nodes.values())))
    return type(client)(
        # fresh nodes: a blocking ClusterNode carries its client, which must not be shared
        startup_nodes=[node_class(n.host, n.port) for n in manager.startup_nodes.values()],
        require_full_coverage=getattr(
            manager, "require_full_coverage", getattr(manager, "_require_full_coverage", True)
        ),
        dynamic_startup_nodes=getattr(manager, "_dynamic_startup_nodes", True),
        address_remap=manager.address_remap,
        reinitialize_steps=client.reinitialize_steps,
        retry=client.retry,
        max_connections=1,
        **_outlasting_a_read(kwargs),
    )


def _outlasting_a_read(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with a socket timeout (if any) long enough for a blocking read."""
    timeout = kwargs.get("socket_timeout")
    if timeout is not None and timeout < BLOCK_MS / 1000 + 5:
        kwargs["socket_timeout"] = BLOCK_MS / 1000 + 5
    return kwargs


def create_group(client: Any, spec: ReaderSpec) -> None:
    """XGROUP CREATE ... MKSTREAM at ``spec.start_id`` (or the stream's end); an existing group
    keeps where it stopped (BUSYGROUP)."""
    import redis

    try:
        client.xgroup_create(spec.stream, spec.group, id=spec.start_id or "$", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def group_lost(exc: BaseException, spec: ReaderSpec) -> bool:
    """Whether a group read failed because the stream or the group went away under it (the
    stream deleted while a member blocked: "UNBLOCKED the stream key no longer exists"; the
    group destroyed or never re-made: "NOGROUP"). The reader makes the group again, from the
    new stream's start (``recreate_group``), and reads on: a deleted stream is not an error of
    the follower's."""
    import redis

    if spec.group is None or not isinstance(exc, redis.ResponseError):
        return False
    text = str(exc)
    return text.startswith("UNBLOCKED") or text.startswith("NOGROUP")


def recreate_group(client: Any, spec: ReaderSpec) -> None:
    """XGROUP CREATE ... MKSTREAM at 0 after the stream or the group went away (group_lost):
    every entry the new stream gets is delivered."""
    import redis

    try:
        client.xgroup_create(spec.stream, spec.group, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def latest_events(client: Any, queue: Any, count: int) -> list[Event]:
    """The newest ``count`` events of a queue, newest first (XREVRANGE on ``client``, the
    blocking one): what the CLI and the dashboard show. A sharded queue's come from every
    shard's stream (one XREVRANGE each: they lie in different slots), merged by their entry
    ids (the ms of the clock that wrote them, then the sequence): the shards' clocks are one
    clock on one server, and within a few ms of each other on a cluster."""
    streams = [QueueKeys.for_queue(name).events for name in queue.shard_names]
    found = [ev for key in streams for ev in range_events(client.xrevrange(key, count=count))]
    if len(streams) > 1:
        found.sort(key=lambda ev: _entry_order(ev.id), reverse=True)
    return found[:count]


def _entry_order(entry_id: str) -> tuple[int, int]:
    """A stream entry id (``<ms>-<seq>``) as numbers, to order entries of several streams."""
    ms, _, seq = entry_id.partition("-")
    return (int(ms), int(seq or 0)) if ms.isdigit() and (seq or "0").isdigit() else (0, 0)


def range_events(reply: Any) -> list[Event]:
    """The events of an XRANGE / XREVRANGE reply, in its order (entries without fields, which
    a range never returns, are left out): for readers that track stream ids themselves (the
    CLI, the dashboard, Spark's events source)."""
    return [
        parse_event(Event, entry_id, fields, None, None)  # type: ignore[misc]
        for entry_id, fields in _entry_list(reply)
        if fields is not None
    ]


# -- the groups' info: Queue.event_groups --------------------------------------------------------


@dataclass(frozen=True)
class EventGroup:
    """One consumer group of a queue's events stream (``Queue.event_groups``).

    ``lag``: events in the stream not delivered to the group yet (None when the server cannot
    tell: Redis 6.2, or entries deleted by hand). ``lost``: events trimmed (older than the
    events retention) before the group read them, that no member has reported yet (the
    member's next read logs a warning and counts them in ``dueq_events_lost_total``; None on
    Redis 6.2). ``pending``: delivered to a member and not acked yet.
    """

    name: str
    consumers: int
    pending: int
    last_delivered_id: str
    lag: int | None
    lost: int | None

    def to_json(self) -> dict[str, Any]:
        """This group as JSON types."""
        return {
            "name": self.name,
            "consumers": self.consumers,
            "pending": self.pending,
            "last_delivered_id": self.last_delivered_id,
            "lag": self.lag,
            "lost": self.lost,
        }


def _stream_id(value: str) -> tuple[int, int]:
    ms_text, _, seq = value.partition("-")
    return int(ms_text), int(seq or 0)


def _number(value: Any) -> int | None:
    return None if value is None else int(value)


def event_group(stream_info: dict[str, Any], group: dict[str, Any]) -> EventGroup:
    """An ``EventGroup`` from ``XINFO STREAM`` and one group of ``XINFO GROUPS`` (as redis-py
    parses them): the same reckoning as events_read.lua, without its writes."""
    delivered = text(group.get("last-delivered-id") or "0-0")
    added = _number(stream_info.get("entries-added"))
    read = _number(group.get("entries-read"))
    if read is None and delivered == "0-0":  # a group that never read (events_read.lua)
        read = 0
    length = int(stream_info.get("length") or 0)
    first = stream_info.get("first-entry")
    newest = text(stream_info.get("last-generated-id") or "0-0")
    oldest_kept = text(first[0]) if first else None
    behind = (
        _stream_id(delivered) < _stream_id(oldest_kept)
        if oldest_kept is not None
        else _stream_id(delivered) < _stream_id(newest)
    )
    if added is None:  # Redis 6.2: no counts to reckon with
        lag, lost = (length if behind else None), None
    elif behind:  # every entry kept is after the group's last one
        lag, lost = length, None if read is None else max(added - length - read, 0)
    else:
        lag, lost = _number(group.get("lag")), 0 if read is not None else None
    return EventGroup(
        name=text(group.get("name") or ""),
        consumers=int(group.get("consumers") or 0),
        pending=int(group.get("pending") or 0),
        last_delivered_id=delivered,
        lag=lag,
        lost=lost,
    )


def event_groups_flow(queue: Any) -> Generator[Any, Any, list[EventGroup]]:
    """The consumer groups of a queue's events streams, by name ([] without a stream): a plain
    queue's one stream, or a sharded queue's groups summed over the shards' streams
    (``merge_groups``). Each stream is read on its own (on a cluster the shards' streams are
    in different slots)."""
    found: list[EventGroup] = []
    for name in queue.shard_names:
        stream = QueueKeys.for_queue(name).events
        exists = yield protocol.command("EXISTS", stream)
        if not exists:
            continue
        info, groups = yield protocol.Batch(
            (protocol.command("XINFO STREAM", stream), protocol.command("XINFO GROUPS", stream))
        )
        found += [event_group(_str_keys(info), _str_keys(g)) for g in groups]
    by_name: dict[str, list[EventGroup]] = {}
    for g in found:
        by_name.setdefault(g.name, []).append(g)
    return [merge_groups(by_name[name]) for name in sorted(by_name)]


def merge_groups(parts: list[EventGroup]) -> EventGroup:
    """One group of a logical queue from its groups of the same name on each shard's stream
    (one part on a plain queue: itself): ``pending``, ``lag`` and ``lost`` summed (None when
    any shard cannot tell), ``consumers`` the most on any shard (a member reads every shard),
    ``last_delivered_id`` the newest (ids of different shards are not in one order)."""
    if len(parts) == 1:
        return parts[0]
    lags, losts = [p.lag for p in parts], [p.lost for p in parts]
    return EventGroup(
        name=parts[0].name,
        consumers=max(p.consumers for p in parts),
        pending=sum(p.pending for p in parts),
        last_delivered_id=max((p.last_delivered_id for p in parts), key=_stream_id),
        lag=None if None in lags else sum(x for x in lags if x is not None),
        lost=None if None in losts else sum(x for x in losts if x is not None),
    )


def _str_keys(reply: Any) -> dict[str, Any]:
    """A redis-py XINFO dict with text keys (its keys are bytes with some settings)."""
    return {text(k): v for k, v in dict(reply).items()}


# -- the threaded driver: Queue.events ------------------------------------------------------


def observe_events(
    queue: ReadsEvents,
    *,
    group: str | None = None,
    consumer: str | None = None,
    redeliver_after: Duration = 30.0,
    since: datetime | None = None,
) -> Observable[Event]:
    """The observable behind ``Queue.events``; see there."""
    specs = reader_specs(
        queue,
        group=group,
        consumer=consumer,
        default_consumer=queue.holder or _worker_id(),
        redeliver_after=redeliver_after,
        since=since,
    )

    def subscribe(
        observer: abc.ObserverBase[Event], _scheduler: abc.SchedulerBase | None
    ) -> abc.DisposableBase:
        reader = _Reader(queue, specs, observer)
        reader.prepare()  # a tail starts now, a group exists before subscribe returns
        reader.start()
        return Disposable(reader.stop)

    return reactivex.create(subscribe)


def _worker_id() -> str:
    from dueq._util.identity import worker_id

    return worker_id()


#: The reader flows' steps that set a reader up (a tail's start, a group's creation): run with
#: the first step before subscribe returns, on every stream.
START_METHODS = frozenset({"xrevrange", "create_group"})


class _Reader:
    """One subscription's reader thread: drives ``reader_flow`` on a client of its own and
    hands each event to ``on_next`` with no lock held (a subscriber may dispose inside it)."""

    def __init__(
        self, queue: ReadsEvents, specs: list[ReaderSpec], observer: abc.ObserverBase[Event]
    ) -> None:
        self._queue = queue
        self._observer = observer
        self._client = reader_client(queue.redis)
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"dueq-events-{queue.name}", daemon=True
        )
        self._flow = reader_flow(specs)
        self._first: Step | None = None

    def prepare(self) -> None:
        """Run the flow's first call here, before subscribe returns, and its other set-up calls
        (``START_METHODS``): a tail's start point, or the group's creation, on every stream."""
        step = self._flow.send(self._call(next(self._flow)))
        while step[0] == "call" and step[1] in START_METHODS:
            step = self._flow.send(self._call(step))
        self._first = step

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _ack(self, spec: ReaderSpec, entry_id: str) -> None:
        self._queue.redis.xack(spec.stream, str(spec.group), entry_id)

    def _call(self, step: Step) -> Any:
        _, method, args, kwargs, _spec = step
        if method == "create_group":
            return create_group(self._client, *args)
        if method == "events_read":
            return self._queue.drive(events_read_flow(self._queue, *args))
        return getattr(self._client, method)(*args, **kwargs)

    def _run(self) -> None:
        backoff = Backoff()
        step = self._first
        try:
            while step is not None and not self._stopped.is_set():
                if step[0] == "emit":
                    spec: ReaderSpec = step[2]
                    acker = None if spec.group is None else functools.partial(self._ack, spec)
                    for entry_id, fields in step[1]:
                        if self._stopped.is_set():
                            return
                        assert fields is not None  # events_flow acks trimmed ones itself
                        event = parse_event(
                            Event,
                            entry_id,
                            fields,
                            spec.group,
                            acker,
                            self._queue.payload_codec,
                            self._queue.name,
                            stream=spec.stream,
                        )
                        try:
                            self._observer.on_next(event)  # type: ignore[arg-type]
                        except Exception:  # the subscriber raised: reactivex detached it
                            logger.exception("events subscriber of %s raised", self._queue.name)
                            self._stopped.set()
                            return
                    step = next(self._flow)
                    continue
                try:
                    reply = self._call(step)
                except Exception as exc:  # an outage waits and retries; anything else ends
                    if self._stopped.is_set():  # disposed while the call ran: nothing to mend
                        return
                    if group_lost(exc, step[4]):
                        logger.warning(
                            "events of %s: %s; making the group again", self._queue.name, exc
                        )
                        recreate_group(self._client, step[4])
                        continue
                    if not is_outage(exc):
                        self._stopped.set()
                        self._observer.on_error(exc)
                        return
                    logger.warning("events of %s: %s; retrying", self._queue.name, describe(exc))
                    self._stopped.wait(backoff.failed())
                    continue
                backoff.succeeded()
                step = self._flow.send(reply)
        finally:
            close_reader(self._client)
