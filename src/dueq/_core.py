"""What both front ends share: validation, encoding and the flow of every operation, no I/O.

Each operation is a *flow*: a generator that validates its input, yields the protocol steps it
needs (``dueq._protocol``: a script call, a plain command or a batch of them), receives each
parsed reply and returns the result. A front end drives it: ``Queue`` sends each step with the
blocking client (``drive``), ``AsyncQueue`` awaits it on the asyncio client (``drive_async``).
A Redis error is thrown into the flow at the step that failed, so a flow can handle it as if
it had made the call itself. This is tenacity's ``BaseRetrying.iter()`` shape, driven by
``Retrying`` and ``AsyncRetrying``: the logic is written once and neither front end repeats it.
"""

from __future__ import annotations

import base64
import binascii
import logging
import warnings
from collections.abc import Awaitable, Callable, Generator, Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import redis

from . import _protocol as protocol
from . import _tracing
from ._identity import worker_id
from .checks import MAX_HOLDER_LENGTH, validate_holder, whole_number
from .clock import Clock, Duration, clock_ms, datetime_ms, duration_ms, ms_datetime
from .clock import positive_duration_ms as _positive_ms
from .cron import CronsCore
from .dead import DeadLettersCore
from .doctor import DoctorFinding, DoctorReport
from .envelope import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    FLAG_ABSOLUTE,
    FLAG_GENERATED_ID,
    TaskOptions,
    TraceContext,
    decode_delivery,
    encode_envelope,
    generated_ids,
    pack_task,
    repack_with_id,
    validate_id,
)
from .exceptions import (
    ConfigurationError,
    DueqError,
    InvalidTaskError,
    LeaseLost,
    PayloadError,
    TaskCancelled,
    Unrecoverable,
)
from .failures import error_record, token_holder
from .keys import QueueKeys, layout_key
from .logs import task_fields
from .registry import WorkerInfo, parse_workers
from .retry import RetryPolicy
from .snapshot import settings_from_hash, text
from .task import (
    MAX_KEY_CONCURRENCY,
    MAX_REMEMBER_DONE_MS,
    DeliveryBase,
    DueHistogram,
    HistoryPoint,
    Outcome,
    OutcomeKind,
    QueueSettings,
    QueueStats,
    Rate,
    ScheduleResult,
    Task,
    TaskInfo,
    TaskPage,
    TaskState,
)
from .wake import WakeSubscription, sharded_pubsub

if TYPE_CHECKING:
    from ._shards import Sharded

logger = logging.getLogger("dueq.queue")

T = TypeVar("T")
S = TypeVar("S")  # what a flow yields: a protocol step, or a call (the settle flows)
#: An operation written once: yields protocol steps, receives their parsed replies.
Flow = Generator[protocol.Step, Any, T]

#: Most tasks one claim call may lease; most tasks and bytes sent in one schedule call (Redis
#: refuses arguments over proto-max-bulk-len, 512 MB by default, and a long script blocks it).
MAX_CLAIM_BATCH = 1000
SCHEDULE_BATCH = 1000
SCHEDULE_BATCH_BYTES = 8 * 1024 * 1024
#: Largest payload limit a queue accepts.
MAX_PAYLOAD_LIMIT = 64 * 1024 * 1024
#: Oldest Redis the scripts run on (ZMSCORE).
MIN_REDIS_VERSION = (6, 2)
#: Rounds of fresh ids for generated ids that already existed (72-bit ids: one is plenty).
ID_RETRIES = 5
#: Most tasks one listing page returns, and entries one page looks at (list_tasks.lua's cost).
MAX_PAGE = 1000
LIST_BUDGET = 1000
#: The history's window (minutes) and the due histogram's largest shape.
HISTORY_MINUTES = 1440
#: Most keys, entries or ids one doctor.lua call looks at (``Queue.doctor(batch=...)``).
MAX_DOCTOR_BATCH = 10_000
#: Most leases (and rate entries) one doctor.lua call counts: about 10 ms of Redis time.
DOCTOR_LEASE_CAP = 20_000
MAX_BUCKETS = 1000
_STATES = ("scheduled", "leased", "dead")


def default_holder() -> str:
    """This process as a lease holder: its worker id (``dueq._identity.worker_id``, the name
    logs and metrics use), cut to MAX_HOLDER_LENGTH from the left when the host name is long;
    made again in a forked child."""
    wid = worker_id().replace("|", "_")
    return wid if len(wid) <= MAX_HOLDER_LENGTH else wid[-MAX_HOLDER_LENGTH:]


def _encode_cursor(raw: str) -> str | None:
    return base64.urlsafe_b64encode(raw.encode()).decode() if raw else None


def _decode_cursor(cursor: object, state: str) -> str:
    """The script's cursor inside one ``TaskPage.cursor`` of a listing of ``state``."""
    if cursor is None:
        return ""
    sources = {"scheduled": "0123456789p", "leased": "l", "dead": "d"}[state]
    try:
        raw = base64.urlsafe_b64decode(str(cursor).encode()).decode() if cursor else ""
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raw = ""
    if not (isinstance(cursor, str) and raw[:1] in tuple(sources) and raw[1:2] == "|"):
        raise InvalidTaskError(f"cursor {cursor!r} is not one a {state} listing returned")
    return raw


def drive(flow: Generator[S, Any, T], send: Callable[[S], Any]) -> T:
    """Run a flow with a blocking ``send``; errors of a step are thrown into the flow. The one
    driver of every flow: the queue flows (steps are protocol steps) and the settle flows of
    ``dueq.operators`` (steps are calls)."""
    try:
        step = next(flow)
        while True:
            try:
                reply = send(step)
            except Exception as exc:  # the flow decides; unhandled, it comes back out here
                step = flow.throw(exc)
            else:
                step = flow.send(reply)
    except StopIteration as stop:
        result: T = stop.value
        return result


async def drive_async(flow: Generator[S, Any, T], send: Callable[[S], Awaitable[Any]]) -> T:
    """Run a flow with an awaitable ``send``; errors of a step are thrown into the flow."""
    try:
        step = next(flow)
        while True:
            try:
                reply = await send(step)
            except Exception as exc:  # the flow decides; unhandled, it comes back out here
                step = flow.throw(exc)
            else:
                step = flow.send(reply)
    except StopIteration as stop:
        result: T = stop.value
        return result


def _batches(records: list[bytes]) -> Iterator[list[int]]:
    """Positions of records, in runs of at most SCHEDULE_BATCH tasks and SCHEDULE_BATCH_BYTES."""
    batch: list[int] = []
    size = 0
    for i, record in enumerate(records):
        if batch and (len(batch) == SCHEDULE_BATCH or size + len(record) > SCHEDULE_BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(i)
        size += len(record)
    if batch:
        yield batch


def wrong_client(client: object, wanted: str, hint: str) -> ConfigurationError:
    """The error for a client of the wrong kind, naming what was given and what to use."""
    kind = type(client)
    return ConfigurationError(
        f"redis_client must be {wanted}, got {kind.__module__}.{kind.__name__}{hint}"
    )


def server_version_ok(version: str | None) -> tuple[int, ...] | None:
    """ConfigurationError for a Redis older than 6.2 (an unreadable version is let through);
    else the version's (major, minor), or None when it cannot be read."""
    if version is None:
        return None
    try:
        major_minor = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        logger.debug("cannot parse Redis version %r; skipping the check", version)
        return None
    if major_minor < MIN_REDIS_VERSION:
        raise ConfigurationError(f"dueq needs Redis >= 6.2; this server runs {version}")
    return major_minor


def _pairs(reply: Any) -> dict[str, Any]:
    """A reply of names and values (a flat list in RESP2, a map in RESP3) as a dict."""
    if isinstance(reply, dict):
        return {text(k): v for k, v in reply.items()}
    return {text(k): v for k, v in zip(reply[::2], reply[1::2], strict=False)}


def hello_version(reply: Any) -> str | None:
    """The server version from a HELLO reply (RESP2 flat list or RESP3 map)."""
    if not isinstance(reply, (list, dict)):
        return None
    found = _pairs(reply).get("version")
    return None if found is None else text(found)


def log_eviction_policy(policy: Any) -> None:
    """Say what the server's ``maxmemory-policy`` means for a queue.

    ``allkeys-*`` policies may evict queue keys when memory is full, losing tasks without a
    trace: a warning. ``volatile-*`` policies evict only keys with a TTL, and dueq's keys
    have none, so nothing is lost; Redis refuses writes instead, as with ``noeviction``, and
    consumers wait that out: an info line. ``noeviction``: nothing to say.
    """
    if policy is None or text(policy) == "noeviction":
        return
    if text(policy).startswith("volatile-"):
        logger.info(
            "Redis maxmemory-policy is %r: it evicts only keys with a TTL, and dueq's keys "
            "have none; when memory is full Redis will refuse writes (as with noeviction), "
            "which consumers wait out",
            text(policy),
        )
        return
    logger.warning(
        "Redis maxmemory-policy is %r: when memory is full Redis may evict queue keys and "
        "lose tasks without a trace; set maxmemory-policy noeviction",
        text(policy),
    )


def _raise_not_held(done: str, refused: list[str], cancelled: list[str]) -> None:
    """TaskCancelled when every refused lease was cancelled, LeaseLost (with ``.cancelled``)
    when some were lost; nothing when none was refused. ``refused`` keeps the caller's order."""
    if refused and len(cancelled) == len(refused):
        raise TaskCancelled(
            f"{len(refused)} task(s) cancelled while leased, not {done}: {refused[:10]}",
            refused,
        )
    if refused:
        raise LeaseLost(
            f"lease lost on {len(refused)} task(s), not {done}: {refused[:10]}",
            refused,
            cancelled,
        )


class ClaimBatch:
    """One claim call's result: the deliveries and when the next work is due.

    ``now_ms`` is the queue clock when the claim ran, ``now_fraction_ms`` the part of a
    millisecond past it (0 for an injected clock): together they let a consumer sleep until
    ``next_due_ms`` to within the round trip.
    """

    __slots__ = (
        "deliveries",
        "next_due_ms",
        "next_lease_deadline_ms",
        "now_fraction_ms",
        "now_ms",
        "paused",
    )

    def __init__(
        self,
        deliveries: list[Any],
        now_ms: int,
        next_due_ms: int | None,
        next_lease_deadline_ms: int | None,
        now_fraction_ms: float = 0.0,
        paused: bool = False,
    ) -> None:
        self.deliveries = deliveries
        self.paused = paused
        self.now_ms = now_ms
        self.now_fraction_ms = now_fraction_ms
        self.next_due_ms = next_due_ms
        self.next_lease_deadline_ms = next_lease_deadline_ms

    def sleep_ms(self, heartbeat_ms: float) -> float:
        """How long a consumer may sleep after this claim: until the next due time or lease
        deadline it reported (to within the round trip), at most ``heartbeat_ms``."""
        upcoming = [ms for ms in (self.next_due_ms, self.next_lease_deadline_ms) if ms is not None]
        if not upcoming:
            return heartbeat_ms
        until_ms = min(upcoming) - self.now_ms - self.now_fraction_ms
        return max(0.0, min(until_ms, heartbeat_ms))


class QueueCore:
    """Settings, validation and the flows of every queue operation, shared by ``Queue`` and
    ``AsyncQueue`` (which add the client, and send what the flows yield).

    ``sharded`` is the layout of a sharded queue (``dueq._shards.Sharded``, made by the front
    end), or None for a plain queue; the flows that reach the data hand a sharded queue's
    calls to it, and a plain queue runs them as they are.
    """

    def __init__(
        self,
        name: str,
        *,
        retry: RetryPolicy | None = None,
        lease: Duration = 30.0,
        clock: Clock | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        dead_max_count: int = 100_000,
        dead_max_age: Duration = timedelta(days=14),
        remember_done: Duration | None = None,
        wait_replicas: int = 0,
        wait_timeout: Duration = 1.0,
        holder: str | None = None,
        sharded: Sharded | None = None,
    ) -> None:
        keys = QueueKeys.for_queue(name)  # checks the name, sharded or not
        self._sharded = sharded
        if sharded is None:
            self.keys = keys
        #: how many shards the queue has (1: a plain queue), and their queues' names
        self.shard_count = 1 if sharded is None else sharded.count
        self.shard_names = (name,) if sharded is None else sharded.names
        #: who this queue's claims lease to (None: this process's worker id, see ``default_holder``)
        self.holder = None if holder is None else validate_holder(holder)
        self.name = name
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise ConfigurationError(f"retry must be a dueq.RetryPolicy, got {retry!r}")
        if clock is not None and not callable(clock):
            raise ConfigurationError("clock must be a zero-argument callable returning seconds")
        whole_number(max_payload_bytes, "max_payload_bytes", low=1, high=MAX_PAYLOAD_LIMIT)
        whole_number(dead_max_count, "dead_max_count", low=1)
        whole_number(wait_replicas, "wait_replicas", low=0, high=100)
        self.retry = retry or RetryPolicy()
        self.lease_ms = _positive_ms(lease, "lease")
        self.clock = clock
        self.max_payload_bytes = max_payload_bytes
        self.dead_max_count = dead_max_count
        self.dead_max_age_ms = _positive_ms(dead_max_age, "dead_max_age")
        #: the deprecated constructor keyword's window, used only while the queue has no
        #: remember_done setting in Redis (``configure``)
        self.remember_done_ms = (
            0 if remember_done is None else _positive_ms(remember_done, "remember_done")
        )
        if remember_done is not None:
            warnings.warn(
                f"{type(self).__name__}(remember_done=...) is deprecated: a window set in one "
                "process only is not seen by the others. Set it once for every producer and "
                "consumer with q.configure(remember_done=...) (or dueq configure QUEUE "
                "--remember-done ...); until then this process's window applies only while the "
                "queue has no setting of its own",
                DeprecationWarning,
                stacklevel=3,
            )
        self.wait_replicas = wait_replicas
        self.wait_timeout_ms = _positive_ms(wait_timeout, "wait_timeout")
        self._server_checked = False
        self._server_version: tuple[int, ...] | None = None
        # no sharded queue has '#' in its name (a shard's has): nothing to refuse then
        self._plain_checked = "#" in name
        # what q.dead and q.cron drive, and the cron keeper of this queue's claims
        self._dead_flows = DeadLettersCore(self) if sharded is None else sharded.dead_flows(self)
        self._cron_flows = CronsCore(self) if sharded is None else sharded.cron_flows(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    @cached_property
    def keys(self) -> QueueKeys:
        """The queue's Redis keys (``dueq.keys.QueueKeys``). A plain queue sets them in
        ``__init__``; a sharded queue has none of its own (each shard has its own): asking
        raises ConfigurationError."""
        if self._sharded is not None:
            raise self._sharded.no_keys()
        return QueueKeys.for_queue(self.name)

    def shard(self, task_id: str) -> QueueCore:
        """The queue of the shard that holds ``task_id`` (a plain queue of the same front
        end, see ``dueq._shards``); a plain queue holds every task itself."""
        return self if self._sharded is None else self._sharded.shard(task_id)

    # -- helpers -----------------------------------------------------------------------------

    def _wake_channels(self) -> list[str]:
        """The Pub/Sub channels whose messages wake this queue's consumers."""
        if self._sharded is not None:
            return self._sharded.wake_channels()
        return [self.keys.wake]

    def wake_subscription_flow(self) -> Flow[WakeSubscription]:
        """How this queue's consumers listen for wake messages: its channels, by SSUBSCRIBE
        where the scripts SPUBLISH (see ``publish_wake`` in _prelude.lua and ``dueq.wake``)."""
        if not self._server_checked:
            yield from self.check_server_flow()
        return WakeSubscription(
            tuple(self._wake_channels()), sharded=sharded_pubsub(self._server_version)
        )

    def now_arg(self) -> str:
        return "" if self.clock is None else str(clock_ms(self.clock))

    def _delivery(
        self,
        task_id: str,
        payload: Any,
        attempt: int,
        due_ms: int,
        lease_deadline_ms: int,
        token: str,
        first_claimed_ms: int,
        claimed_ms: int,
        options: TaskOptions,
        trace_context: TraceContext | None,
    ) -> DeliveryBase:
        """A delivery of the front end's kind (blocking or awaitable methods)."""
        raise NotImplementedError

    def cron_on_claim_flow(
        self, deliveries: list[Any], now_ms: int
    ) -> Flow[tuple[list[Any], int | None]]:
        """The cron keeper of a claim (``CronsCore.on_claim_flow``)."""
        return self._cron_flows.on_claim_flow(deliveries, now_ms)

    @staticmethod
    def _due(at: datetime | None, delay: Duration | None) -> tuple[int, int]:
        """(FLAG_ABSOLUTE, epoch ms) for at=, (0, delay ms) for delay= or neither."""
        if at is not None:
            if delay is not None:
                raise InvalidTaskError("give at= or delay=, not both")
            return FLAG_ABSOLUTE, datetime_ms(at)
        return 0, 0 if delay is None else duration_ms(delay, "delay")

    def plain_check_flow(self) -> Flow[None]:
        """Once per queue object, before its first schedule or claim: refuse to work as a
        plain queue over a sharded queue of the same name (``dueq._shards``), whose tasks live
        under other keys: it would schedule tasks no sharded consumer sees and claim none.

        One GET of the layout key, whose slot differs from the queue's (so it cannot be read
        inside the scripts); the other operations do not check (they read only). A user who
        may not read that key (an ACL rule from before sharded queues) skips the check.
        """
        if self._plain_checked:
            return
        try:
            recorded = yield protocol.command("GET", layout_key(self.name))
        except redis.exceptions.NoPermissionError as exc:  # cannot tell: work as before
            logger.debug("cannot read the shard count of %r (%s); not checked", self.name, exc)
            recorded = None
        if recorded is not None:
            shards = text(recorded)
            raise ConfigurationError(
                f"queue {self.name!r} is a sharded queue ({shards} shards, recorded in "
                f"{layout_key(self.name)}); a plain queue of that name would not see its tasks. "
                f"Open it with shards={shards}, or with dueq.discovery.open_queue(client, name)"
            )
        self._plain_checked = True

    def check_server_flow(self) -> Flow[None]:
        """Check the Redis server once: refuse versions before 6.2, and say what its
        ``maxmemory-policy`` means for the queue (see ``log_eviction_policy``).

        A least-privileged consumer needs neither INFO nor CONFIG: the version comes from
        ``INFO server`` or else ``HELLO`` (which every user may send), the policy from
        ``INFO memory`` or else ``CONFIG GET``; a check Redis refuses is skipped with a debug
        line.
        """
        version: str | None
        try:
            info = yield protocol.command("INFO", "server")
            version = str(info.get("redis_version", "0"))
        except redis.ResponseError:  # NOPERM for an ACL user without +info, or INFO renamed
            try:
                version = hello_version((yield protocol.command("HELLO")))
            except (redis.ResponseError, AttributeError, TypeError) as exc:  # none to read
                logger.debug("cannot read the Redis version (%s); skipping the check", exc)
                version = None
        self._server_version = server_version_ok(version)
        self._server_checked = True
        try:  # INFO memory names the policy too, and needs no CONFIG (which can read secrets)
            memory = yield protocol.command("INFO", "memory")
            policy = memory.get("maxmemory_policy")
        except redis.ResponseError:  # no +info (or INFO renamed): try CONFIG GET
            try:
                found = yield protocol.command("CONFIG GET", "maxmemory-policy", parse=_pairs)
            except redis.ResponseError as exc:  # CONFIG disabled (managed services) too
                logger.debug("cannot read maxmemory-policy (%s); skipping the check", exc)
                return
            policy = found.get("maxmemory-policy")
        log_eviction_policy(policy)

    # -- scheduling --------------------------------------------------------------------------

    def schedule_many_flow(self, tasks: Iterable[Task], replace: bool) -> Flow[ScheduleResult]:
        """Schedule ``tasks``, inside a ``send`` span when tracing (see ``_tracing``)."""
        send = _tracing.producer(self.name)
        if send is None:
            return (yield from self.encode_and_schedule_flow(tasks, replace, b""))
        try:
            result = yield from self.encode_and_schedule_flow(tasks, replace, send.line)
        except BaseException as exc:  # the span records any failure; the caller gets it
            send.failed(exc)
            raise
        send.sent(result.ids)
        return result

    def encode_and_schedule_flow(
        self, tasks: Iterable[Task], replace: bool, trace: bytes
    ) -> Flow[ScheduleResult]:
        ids: list[str] = []
        records: list[bytes] = []
        fresh_ids = generated_ids()
        max_bytes = self.max_payload_bytes
        due = self._due
        try:
            iterator = iter(tasks)
        except TypeError:
            raise InvalidTaskError(
                f"tasks must be an iterable of dueq.Task, got {type(tasks).__name__}"
            ) from None
        for position, task in enumerate(iterator):
            if not isinstance(task, Task):
                raise InvalidTaskError(f"task {position} is a {type(task).__name__}, not dueq.Task")
            if task.id is None:
                task_id, flags = next(fresh_ids), FLAG_GENERATED_ID
            else:
                task_id, flags = validate_id(task.id), 0
            try:
                if task.at is None and task.delay is None:
                    time_flag, due_ms = 0, 0  # due now
                else:
                    time_flag, due_ms = due(task.at, task.delay)
                options = task.options()
                envelope = encode_envelope(task.payload, max_bytes, options, trace)
            except (InvalidTaskError, PayloadError) as exc:
                raise type(exc)(f"task {position} ({task_id!r}): {exc}") from exc
            records.append(pack_task(flags | time_flag, due_ms, task_id, envelope))
            ids.append(task_id)
        return (yield from self.schedule_records_flow(ids, records, replace, fresh_ids))

    def schedule_records_flow(
        self, ids: list[str], records: list[bytes], replace: bool, fresh_ids: Iterator[str]
    ) -> Flow[ScheduleResult]:
        """Send packed records in batches; generated ids that were taken are drawn again."""
        if self._sharded is not None:
            return (yield from self._sharded.schedule_records_flow(ids, records, replace))
        yield from self.plain_check_flow()
        added = existing = replaced = 0
        for batch in _batches(records):
            pending = batch
            for _ in range(ID_RETRIES):
                blob = b"".join(records[i] for i in pending)
                reply: protocol.ScheduleReply = yield protocol.schedule(
                    self.keys,
                    self.now_arg(),
                    blob,
                    replace=replace,
                    window_ms=self.remember_done_ms,
                )
                added, existing = added + reply.added, existing + reply.existing
                replaced += reply.replaced
                pending = [pending[p] for p in reply.collided]
                if not pending:
                    break
                for i in pending:  # a generated id that was taken: draw another
                    ids[i] = next(fresh_ids)
                    records[i] = repack_with_id(records[i], ids[i])
            else:
                raise DueqError(f"no unused id found for {len(pending)} task(s)")
        return ScheduleResult(added=added, existing=existing, replaced=replaced, ids=ids)

    def cancel_flow(self, task_id: str) -> Flow[bool]:
        if self._sharded is not None:
            return (yield from self._sharded.cancel_flow(task_id))
        existed: bool = yield protocol.cancel(self.keys, self.now_arg(), validate_id(task_id))
        return existed

    def reschedule_flow(
        self, task_id: str, at: datetime | None, delay: Duration | None
    ) -> Flow[bool]:
        if self._sharded is not None:
            return (yield from self._sharded.reschedule_flow(task_id, at, delay))
        if at is None and delay is None:
            raise InvalidTaskError("reschedule needs at= or delay=")
        flags, due_ms = self._due(at, delay)
        reply: protocol.TimeReply = yield protocol.reschedule(
            self.keys,
            self.now_arg(),
            validate_id(task_id),
            absolute=flags == FLAG_ABSOLUTE,
            due_ms=due_ms,
        )
        return reply.status is protocol.Status.OK

    # -- consuming ---------------------------------------------------------------------------

    def claim_flow(
        self, limit: int, lease: Duration | None, holder: str | None = None
    ) -> Flow[ClaimBatch]:
        if self._sharded is not None:
            return (yield from self._sharded.claim_flow(limit, lease, holder))
        whole_number(limit, "limit", low=0, high=MAX_CLAIM_BATCH)
        lease_ms = self.lease_ms if lease is None else _positive_ms(lease, "lease")
        if holder is not None:
            validate_holder(holder)
        else:  # the queue's ("" names no holder: scripts/bench/views.py measures without)
            holder = default_holder() if self.holder is None else self.holder
        yield from self.plain_check_flow()
        reply: protocol.ClaimReply = yield protocol.claim(
            self.keys,
            self.now_arg(),
            limit=limit,
            lease_ms=lease_ms,
            max_attempts=self.retry.max_attempts,
            reclaim_limit=max(limit, 100),
            dead_max_count=self.dead_max_count,
            dead_max_age_ms=self.dead_max_age_ms,
            backoff_ms=self.retry.backoff_table_ms(),
            holder=holder,
        )
        now_ms, next_due = reply.now_ms, reply.next_due_ms
        if reply.dropped:
            logger.error(
                "queue %r: %d due task(s) had no stored data and were dropped: their keys were "
                "evicted or deleted (set maxmemory-policy noeviction)",
                self.name,
                reply.dropped,
            )
        if reply.buried:
            logger.error(
                "queue %r: %d due task(s) moved to dead at claim (unreadable attempt record, "
                "or max_attempts already reached); see their errors",
                self.name,
                reply.buried,
            )
        deliveries: list[Any] = []
        for row in reply.rows:
            try:
                payload, options, trace_context = decode_delivery(row.envelope)
            except PayloadError as exc:
                logger.error(
                    "queue %r: task %r attempt %d has an undecodable envelope; moved to dead: %s",
                    self.name,
                    row.id,
                    row.attempt,
                    exc,
                    extra=task_fields(self.name, row.id, row.attempt),
                )
                yield self._fail_call(row.id, reply.token, error_record(exc, row.attempt), True, 0)
                continue
            deliveries.append(
                self._delivery(
                    row.id,
                    payload,
                    row.attempt,
                    row.due_ms,
                    reply.lease_deadline_ms,
                    reply.token,
                    row.first_claimed_ms,
                    now_ms,
                    options,
                    trace_context,
                )
            )
        deliveries, cron_due = yield from self.cron_on_claim_flow(deliveries, now_ms)
        if cron_due is not None and (next_due is None or cron_due < next_due):
            next_due = cron_due
        return ClaimBatch(
            deliveries,
            now_ms,
            next_due,
            reply.next_lease_deadline_ms,
            reply.now_fraction_ms,
            reply.paused,
        )

    def ack_flow(self, deliveries: Sequence[DeliveryBase]) -> Flow[int]:
        if self._sharded is not None:
            return (yield from self._sharded.ack_flow(deliveries))
        if not deliveries:
            return 0
        acked, refused, cancelled = 0, [], []  # ids in the caller's order
        for start in range(0, len(deliveries), protocol.LEASE_BATCH):
            chunk = deliveries[start : start + protocol.LEASE_BATCH]
            reply: protocol.AckReply = yield protocol.ack(
                self.keys,
                self.now_arg(),
                [(d.id, d.token) for d in chunk],
                window_ms=self.remember_done_ms,
            )
            for d, verdict in zip(chunk, reply.verdicts, strict=True):
                if verdict == "c":
                    d.mark_settled(Outcome(d.id, "cancelled", d.attempt))
                    cancelled.append(d.id)
                elif verdict == "l":
                    d.mark_settled(Outcome(d.id, "lost", d.attempt))
                else:
                    d.mark_settled(None)
                if verdict != "h":
                    refused.append(d.id)
            acked += reply.acked
        _raise_not_held("acked", refused, cancelled)
        return acked

    def _fail_call(
        self, task_id: str, token: str, record: str, dead: bool, delay_ms: int
    ) -> protocol.Call[protocol.FailReply]:
        return protocol.fail(
            self.keys,
            self.now_arg(),
            task_id,
            token,
            record,
            dead=dead,
            delay_ms=delay_ms,
            dead_max_count=self.dead_max_count,
            dead_max_age_ms=self.dead_max_age_ms,
        )

    def fail_flow(
        self, delivery: DeliveryBase, error: BaseException | str, retry_in: Duration | None
    ) -> Flow[Outcome]:
        if self._sharded is not None:
            return (yield from self._sharded.fail_flow(delivery, error, retry_in))
        exc = error if isinstance(error, BaseException) else None
        age_s = max(delivery.claimed_ms - delivery.first_claimed_ms, 0) / 1000
        delay_ms = 0
        dead = isinstance(error, Unrecoverable) or self.retry.gives_up(
            delivery.attempt, age_s, exc, delivery.max_attempts
        )
        if not dead:
            if retry_in is not None:
                delay_ms = duration_ms(retry_in, "retry_in")
            else:
                delay_ms = round(self.retry.delay_s(delivery.attempt, age_s, exc) * 1000)
        record = error_record(error, delivery.attempt, token_holder(delivery.token))
        reply: protocol.FailReply = yield self._fail_call(
            delivery.id, delivery.token, record, dead, delay_ms
        )
        message = f"{type(error).__name__}: {error}" if exc else str(error)
        if reply.status is protocol.Status.CANCELLED:
            delivery.mark_settled(
                Outcome(delivery.id, "cancelled", delivery.attempt, None, message)
            )
            protocol.raise_for(
                reply.status,
                f"task {delivery.id!r} was cancelled while leased; failure not recorded",
                [delivery.id],
            )
        if reply.status is protocol.Status.LEASE_LOST:
            delivery.mark_settled(Outcome(delivery.id, "lost", delivery.attempt, None, message))
            protocol.raise_for(
                reply.status,
                f"lease on task {delivery.id!r} was lost; failure not recorded",
                [delivery.id],
            )
        kind: OutcomeKind = "dead" if reply.status is protocol.Status.DEAD else "retried"
        outcome = Outcome(delivery.id, kind, delivery.attempt, ms_datetime(reply.at_ms), message)
        delivery.mark_settled(outcome)
        return outcome

    def extend_flow(self, delivery: DeliveryBase, seconds: Duration) -> Flow[datetime]:
        if self._sharded is not None:
            return (yield from self._sharded.extend_flow(delivery, seconds))
        try:
            return (yield from self.extend_many_flow([delivery], seconds))
        except TaskCancelled:
            raise TaskCancelled(
                f"task {delivery.id!r} was cancelled while leased; not extended", [delivery.id]
            ) from None
        except LeaseLost:
            raise LeaseLost(
                f"lease on task {delivery.id!r} was lost; not extended", [delivery.id]
            ) from None

    def extend_many_flow(
        self, deliveries: Sequence[DeliveryBase], seconds: Duration
    ) -> Flow[datetime]:
        """One script call per LEASE_BATCH leases; each lease judged by its own token."""
        if self._sharded is not None:
            return (yield from self._sharded.extend_many_flow(deliveries, seconds))
        ms = _positive_ms(seconds, "lease extension")
        refused: list[str] = []
        cancelled: list[str] = []
        deadline_ms: int | None = None
        for start in range(0, len(deliveries), protocol.LEASE_BATCH):
            chunk = deliveries[start : start + protocol.LEASE_BATCH]
            reply: protocol.ExtendReply = yield protocol.extend(
                self.keys, self.now_arg(), [(d.id, d.token) for d in chunk], ms
            )
            for d, verdict in zip(chunk, reply.verdicts, strict=True):
                if verdict == "h":
                    d.lease_deadline_ms = reply.deadline_ms
                    continue
                refused.append(d.id)
                if verdict == "c":
                    d.mark_cancelled()
                    cancelled.append(d.id)
            deadline_ms = reply.deadline_ms
        _raise_not_held("extended", refused, cancelled)
        return ms_datetime(deadline_ms if deadline_ms is not None else 0)

    def release_flow(self, delivery: DeliveryBase, delay: Duration) -> Flow[Outcome]:
        if self._sharded is not None:
            return (yield from self._sharded.release_flow(delivery, delay))
        delay_ms = duration_ms(delay, "delay")
        reply: protocol.TimeReply = yield protocol.release(
            self.keys, self.now_arg(), delivery.id, delivery.token, delay_ms
        )
        if reply.status is protocol.Status.CANCELLED:
            delivery.mark_settled(Outcome(delivery.id, "cancelled", delivery.attempt))
            protocol.raise_for(
                reply.status,
                f"task {delivery.id!r} was cancelled while leased; not released",
                [delivery.id],
            )
        if reply.status is not protocol.Status.OK:
            delivery.mark_settled(Outcome(delivery.id, "lost", delivery.attempt))
            protocol.raise_for(
                reply.status, f"lease on task {delivery.id!r} was lost; not released", [delivery.id]
            )
        outcome = Outcome(delivery.id, "released", delivery.attempt, ms_datetime(reply.ms))
        delivery.mark_settled(outcome)
        return outcome

    # -- inspection --------------------------------------------------------------------------

    def get_flow(self, task_id: str) -> Flow[TaskInfo | None]:
        found = yield from self.inspect_ids_flow([validate_id(task_id)])
        return found[0] if found else None

    def get_many_flow(self, task_ids: Iterable[str]) -> Flow[list[TaskInfo]]:
        if isinstance(task_ids, (str, bytes)):  # a lone id would be read as its characters
            raise InvalidTaskError(f"task_ids must be an iterable of ids, got {task_ids!r}")
        ids = list(dict.fromkeys(validate_id(task_id) for task_id in task_ids))
        found: list[TaskInfo] = []
        for start in range(0, len(ids), MAX_PAGE):  # one snapshot per page of MAX_PAGE ids
            found += yield from self.inspect_ids_flow(ids[start : start + MAX_PAGE])
        return found

    def inspect_ids_flow(self, ids: Sequence[str]) -> Flow[list[TaskInfo]]:
        if self._sharded is not None:
            return (yield from self._sharded.inspect_ids_flow(ids))
        found: list[TaskInfo] = yield protocol.inspect_ids(self.keys, self.now_arg(), ids)
        return found

    def list_flow(
        self,
        state: TaskState,
        *,
        limit: int = 100,
        cursor: str | None = None,
        id_prefix: str | None = None,
        grep: str | None = None,
        error_type: str | None = None,
        after: datetime | None = None,
        before: datetime | None = None,
    ) -> Flow[TaskPage]:
        if self._sharded is not None:
            return (
                yield from self._sharded.list_flow(
                    state,
                    limit=limit,
                    cursor=cursor,
                    id_prefix=id_prefix,
                    grep=grep,
                    error_type=error_type,
                    after=after,
                    before=before,
                )
            )
        if state not in _STATES:
            raise InvalidTaskError(f"state must be one of {', '.join(_STATES)}, got {state!r}")
        whole_number(limit, "limit", low=1, high=MAX_PAGE)
        texts = {"id_prefix": id_prefix, "grep": grep, "error_type": error_type}
        for name, value in texts.items():
            if value is not None and not isinstance(value, str):
                raise InvalidTaskError(f"{name} must be a string, got {value!r}")
        keep = protocol.ListFilter(
            id_prefix or "",
            grep or "",
            error_type or "",
            None if after is None else datetime_ms(after),
            None if before is None else datetime_ms(before),
        )
        reply: protocol.ListReply = yield protocol.list_tasks(
            self.keys,
            self.now_arg(),
            state,
            _decode_cursor(cursor, state),
            limit,
            max(LIST_BUDGET, limit),
            keep,
        )
        return TaskPage(reply.tasks, _encode_cursor(reply.cursor), reply.looked_at)

    def run_now_flow(self, task_id: str) -> Flow[bool]:
        """A scheduled task (parked ones too) becomes due now; a dead one is replayed (attempts
        and errors reset, due now); a leased one is left alone (it is running): False."""
        if self._sharded is not None:
            return (yield from self._sharded.run_now_flow(task_id))
        task_id = validate_id(task_id)
        moved: protocol.TimeReply = yield protocol.reschedule(
            self.keys, self.now_arg(), task_id, absolute=False, due_ms=0
        )
        if moved.status is protocol.Status.OK:
            return True
        replayed: protocol.DeadReply = yield protocol.dead_ids(
            self.keys, self.now_arg(), "replay", [task_id]
        )
        return replayed.status is protocol.Status.OK

    def history_flow(self, minutes: int) -> Flow[list[HistoryPoint]]:
        if self._sharded is not None:
            return (yield from self._sharded.history_flow(minutes))
        whole_number(minutes, "minutes", low=1, high=HISTORY_MINUTES)
        reply: protocol.HistoryReply = yield protocol.history(
            self.keys, self.now_arg(), minutes=minutes, bucket_ms=1, buckets=0
        )
        first_ms = (reply.now_ms // 60_000 - minutes + 1) * 60_000
        return [
            HistoryPoint(ms_datetime(first_ms + i * 60_000), *row)
            for i, row in enumerate(reply.minutes)
        ]

    def due_histogram_flow(self, bucket: Duration, buckets: int) -> Flow[DueHistogram]:
        if self._sharded is not None:
            return (yield from self._sharded.due_histogram_flow(bucket, buckets))
        bucket_ms = _positive_ms(bucket, "bucket")
        whole_number(buckets, "buckets", low=1, high=MAX_BUCKETS)
        reply: protocol.HistoryReply = yield protocol.history(
            self.keys, self.now_arg(), minutes=0, bucket_ms=bucket_ms, buckets=buckets
        )
        return DueHistogram(
            ms_datetime(reply.now_ms),
            timedelta(milliseconds=bucket_ms),
            reply.overdue,
            reply.buckets,
            reply.later,
        )

    def stats_flow(self) -> Flow[QueueStats]:
        if self._sharded is not None:
            return (yield from self._sharded.stats_flow())
        stats: QueueStats = yield protocol.stats(self.keys, self.now_arg())
        return stats

    def doctor_flow(self, fix: bool, batch: int) -> Flow[DoctorReport]:
        """Every doctor.lua phase, batch by batch (each call atomic for its batch); one finding
        per what and subject (a key can be looked at twice while the queue runs on)."""
        if self._sharded is not None:
            return (yield from self._sharded.doctor_flow(fix, batch))
        if not isinstance(fix, bool):
            raise ConfigurationError(f"fix must be True or False, got {fix!r}")
        whole_number(batch, "batch", low=1, high=MAX_DOCTOR_BATCH)
        findings: dict[tuple[str, str], DoctorFinding] = {}
        notes: list[str] = []
        for phase in protocol.DOCTOR_PHASES:
            cursor = ""
            while True:
                reply: protocol.DoctorReply = yield protocol.doctor(
                    self.keys,
                    self.now_arg(),
                    phase,
                    cursor,
                    batch=batch,
                    fix=fix,
                    lease_cap=DOCTOR_LEASE_CAP,
                )
                for finding in reply.findings:
                    findings.setdefault((finding.what, finding.subject), finding)
                if reply.note and reply.note not in notes:
                    notes.append(reply.note)
                if not reply.cursor:
                    break
                cursor = reply.cursor
        for finding in findings.values():
            if finding.fixed:  # a change to Redis: say what was changed
                logger.info("doctor repaired %r: %s", self.name, finding.line())
        return DoctorReport(self.name, fix, list(findings.values()), notes)

    # -- the worker registry (dueq.registry) -------------------------------------------------

    def workers_flow(self) -> Flow[list[WorkerInfo]]:
        if self._sharded is not None:
            return (yield from self._sharded.workers_flow())
        try:
            server_ms, expiries, entries = yield protocol.workers_read(self.keys)
        except redis.ResponseError as exc:
            if "WRONGTYPE" not in str(exc):
                raise
            # a registry key of another type (by hand): no readable entry; the next beat of
            # any worker replaces it (heartbeat.lua)
            logger.warning("the worker registry of %r is unreadable (%s)", self.name, exc)
            return []
        now_ms = clock_ms(self.clock) if self.clock is not None else server_ms
        return parse_workers(now_ms, expiries, entries)

    def heartbeat_flow(self, entry_json: str, ttl_ms: int, leave: bool) -> Flow[int]:
        if self._sharded is not None:
            return (yield from self._sharded.heartbeat_flow(entry_json, ttl_ms, leave))
        live: int = yield protocol.heartbeat(
            self.keys, self.now_arg(), worker_id(), entry_json, ttl_ms=ttl_ms, leave=leave
        )
        return live

    # -- settings ----------------------------------------------------------------------------

    def configure_flow(
        self,
        *,
        paused: bool | None = None,
        remember_done: Duration | None = None,
        rate: Rate | Literal[False] | None = None,
        key_rate: Rate | Literal[False] | None = None,
        key_concurrency: int | Literal[False] | None = None,
    ) -> Flow[QueueSettings]:
        """Validate every change before writing any; None leaves a setting as it is."""
        if self._sharded is not None:
            return (
                yield from self._sharded.configure_flow(
                    paused=paused,
                    remember_done=remember_done,
                    rate=rate,
                    key_rate=key_rate,
                    key_concurrency=key_concurrency,
                )
            )
        changes: list[tuple[str, str]] = []
        for name, value in (("rate", rate), ("key_rate", key_rate)):
            if value is None:
                continue
            if value is not False and not isinstance(value, Rate):
                raise ConfigurationError(f"{name} must be a dueq.Rate or False, got {value!r}")
            changes.append((name, "" if value is False else f"{value.n}/{value.per_ms}"))
        if key_concurrency is not None:
            if key_concurrency is not False:
                whole_number(key_concurrency, "key_concurrency", low=1, high=MAX_KEY_CONCURRENCY)
            changes.append(
                ("key_concurrency", "" if key_concurrency is False else str(key_concurrency))
            )
        if paused is not None:
            if not isinstance(paused, bool):
                raise ConfigurationError(f"paused must be True or False, got {paused!r}")
            changes.append(("paused", "1" if paused else ""))
        if remember_done is not None:
            ms = duration_ms(remember_done, "remember_done", error=ConfigurationError)
            if ms > MAX_REMEMBER_DONE_MS:
                raise ConfigurationError(
                    f"remember_done must be at most 366 days, got {remember_done!r}"
                )
            changes.append(("remember_done_ms", str(ms) if ms > 0 else ""))
        settings: QueueSettings = yield protocol.configure(self.keys, changes)
        return settings

    def settings_flow(self) -> Flow[QueueSettings]:
        if self._sharded is not None:
            return (yield from self._sharded.settings_flow())
        settings: QueueSettings = yield protocol.command(
            "HGETALL", self.keys.config, parse=settings_from_hash
        )
        return settings
