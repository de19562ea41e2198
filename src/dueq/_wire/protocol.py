"""The protocol layer: one Python counterpart per Lua script, and no I/O.

Each function below builds a ``Call`` for one script: it owns that script's key order (read
from ``QueueKeys``), packs its arguments, and carries the parser of its reply. A front end only
sends ``call.keys`` and ``call.args`` to ``call.script`` and hands the reply to ``call.parse``,
so nothing outside this module knows a key order or a reply offset (``tests/wire/test_scripts.py``
checks every key order here against the script's KEYS header). The same calls serve a
blocking client and an asyncio one, the way httpx's ``BaseClient`` builds requests for both
``Client`` and ``AsyncClient``.

ARGV[1] of every script is the queue clock: epoch ms, or "" for the server's ``TIME``; the
front end passes it as ``now``.

Status codes that scripts return are one enum (``Status``), mapped to dueq's exceptions in one
table (``STATUS_ERRORS``).
"""

from __future__ import annotations

import enum
import functools
import hashlib
import json
import struct
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Generic, Literal, NamedTuple, TypeVar

from dueq._util.clock import ms_datetime
from dueq._wire.codec import NO_CODEC, PayloadCodec
from dueq._wire.envelope import MAX_ID_BYTES
from dueq._wire.keys import QueueKeys, SparkBatchKeys
from dueq._wire.snapshot import (
    batch_info,
    inspected,
    queue_stats,
    settings_from_reply,
    task_infos,
    text,
)
from dueq.doctor import DoctorFinding
from dueq.exceptions import ConfigurationError, DueqError, LeaseLost, TaskCancelled, TaskNotFound
from dueq.model import MAX_KEY_LIMITS, BatchInfo, Progress, QueueSettings, QueueStats, TaskInfo

T = TypeVar("T")


class Status(enum.Enum):
    """What a script reports beyond its data."""

    OK = "ok"
    RETRIED = "retried"  # fail.lua: back in due
    DEAD = "dead"  # fail.lua: buried
    EXPIRED = "expired"  # fail.lua: its next attempt would come after its expiry: ended
    LEASE_LOST = "lease lost"  # ack/fail/extend/release: the caller's lease is gone
    CANCELLED = "cancelled"  # ack/fail/extend/release: its task was cancelled while leased
    NOT_SCHEDULED = "not scheduled"  # reschedule.lua: the task is not waiting in due
    NOT_DEAD = "not dead"  # dead.lua: some ids are not in the dead-letter queue
    STEP_POSITION = "step position"  # step.lua: the log has another count of committed steps


#: The exception each failing status raises (statuses absent here are not errors).
STATUS_ERRORS: dict[Status, type[DueqError]] = {
    Status.LEASE_LOST: LeaseLost,
    Status.CANCELLED: TaskCancelled,
    Status.NOT_DEAD: TaskNotFound,
}


def raise_for(status: Status, message: str, ids: Sequence[str] = ()) -> None:
    """Raise the exception STATUS_ERRORS maps ``status`` to (nothing for other statuses)."""
    error = STATUS_ERRORS.get(status)
    if error is LeaseLost or error is TaskNotFound or error is TaskCancelled:
        raise error(message, ids)
    if error is not None:
        raise error(message)


class Call(Generic[T]):
    """One script call: which script, its KEYS and ARGV, and how to read its reply.

    (A plain class with slots, as cheap to make at import as a NamedTuple: Python 3.10 has no
    generic NamedTuple.)"""

    __slots__ = ("args", "keys", "parse", "script")

    def __init__(
        self, script: str, keys: list[str], args: list[Any], parse: Callable[[Any], T]
    ) -> None:
        self.script = script
        self.keys = keys
        self.args = args
        self.parse = parse

    def __repr__(self) -> str:
        return f"Call({self.script!r}, keys={self.keys!r}, args={self.args!r})"


class Command(Generic[T]):
    """One plain Redis command (reads such as ZCARD, HMGET, TIME) and how to read its reply
    (as redis-py's response callbacks leave it). ``route``: a key whose node a Redis Cluster
    client sends a command without keys to (INFO of one shard's primary; see
    ``scripts.route_options``); None, the client's own choice (any other client ignores it)."""

    __slots__ = ("args", "parse", "route")

    def __init__(
        self, args: tuple[Any, ...], parse: Callable[[Any], T], route: str | None = None
    ) -> None:
        self.args = args
        self.parse = parse
        self.route = route

    def __repr__(self) -> str:
        return f"Command({self.args!r})"


class Batch(NamedTuple):
    """Plain commands sent in one round trip (a non-transactional pipeline); the reply is the
    list of their parsed replies."""

    commands: tuple[Command[Any], ...]


#: What a flow (see ``dueq._flows.core``) asks its front end to send.
Step = Call[Any] | Command[Any] | Batch
#: An operation written once: yields protocol steps, receives their parsed replies, returns a
#: ``T`` (``dueq._flows.drive`` runs it). Here, with the steps, so that a part of a queue (dead
#: letters, cron, events) can name the flows it returns without importing the flows' package.
Flow = Generator[Step, Any, T]


def _same(reply: Any) -> Any:
    return reply


def command(
    *args: Any, parse: Callable[[Any], Any] = _same, route: str | None = None
) -> Command[Any]:
    """A plain command whose reply is used as redis-py returns it, unless ``parse`` is given;
    sent to the node of key ``route`` on a Redis Cluster (``Command``)."""
    return Command(args, parse, route)


# -- schedule.lua ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScheduleReply:
    added: int
    existing: int
    replaced: int
    #: 0-based positions (within the batch) of generated ids that already existed
    collided: list[int]
    #: 0-based positions of tasks not written because their batch had completed
    refused: list[int] = field(default_factory=list)
    #: 0-based positions of tasks not written because their parents wait for them (a cycle)
    cyclic: list[int] = field(default_factory=list)
    #: 0-based positions of tasks not written because the cycle check reached its bound
    unchecked: list[int] = field(default_factory=list)


def _parse_schedule(reply: Any) -> ScheduleReply:
    numbers = [int(p) for p in reply[3:] if isinstance(p, int)]
    marked = [
        p.decode() if isinstance(p, bytes) else p for p in reply[3:] if not isinstance(p, int)
    ]
    return ScheduleReply(
        int(reply[0]),
        int(reply[1]),
        int(reply[2]),
        [p - 1 for p in numbers if p > 0],
        [-p - 1 for p in numbers if p < 0],
        [int(p[1:]) - 1 for p in marked if p[0] == "c"],
        [int(p[1:]) - 1 for p in marked if p[0] == "u"],
    )


def schedule(
    k: QueueKeys, now: str, blob: bytes, *, replace: bool, window_ms: int
) -> Call[ScheduleReply]:
    """Add a batch of packed task records (see ``envelope.pack_task``)."""
    keys = [k.due, k.tasks, k.meta, k.errors, k.leased, k.dead, k.stats, k.wake, k.done, k.config]
    keys += [k.key_state, k.parked, k.key_wait, k.history, k.debounce, *_batch_keys(k)]
    keys += [*_after_keys(k), k.results, k.steps, k.fair, k.fair_due, *k.upper_due]
    args = [now, "1" if replace else "0", blob, window_ms]
    return Call("schedule", keys, args, _parse_schedule)


def _after_keys(k: QueueKeys) -> list[str]:
    """The dependency keys every script that ends a task takes (after_settle, dependencies.lua)."""
    return [k.waiting, k.after, k.children]


def _batch_keys(k: QueueKeys) -> list[str]:
    """The batch keys every script that ends a task takes (batch_settle, batches.lua)."""
    return [k.batches, k.batch_of, k.batch_on, k.batch_ended]


# -- close_batch.lua ---------------------------------------------------------------------------


class CloseBatchReply(NamedTuple):
    #: whether this call closed the batch (False: it was closed before, or refused)
    closed: bool
    info: BatchInfo
    #: refused: the completion task's id is taken by a task of the queue; nothing was written
    taken: bool = False


def close_batch(k: QueueKeys, now: str, batch: str, record: bytes) -> Call[CloseBatchReply]:
    """Close ``batch``; ``record`` is its completion task packed as for schedule (or empty)."""
    keys = [k.due, k.tasks, k.stats, k.wake, k.history, k.batches, k.batch_on, k.batch_ended]
    keys += k.upper_due

    def parse(reply: Any) -> CloseBatchReply:
        info = batch_info(batch, reply[1])
        assert info is not None  # the script always returns the record it wrote
        status = int(reply[0])
        return CloseBatchReply(status == 1, info, taken=status == -1)

    return Call("close_batch", keys, [now, batch, record], parse)


def batch_read(k: QueueKeys, batch: str) -> Command[BatchInfo | None]:
    """One batch's record (None when there is none)."""
    return command("HGET", k.batches, batch, parse=lambda raw: batch_info(batch, raw))


def batches_scan(k: QueueKeys, cursor: int, count: int) -> Command[tuple[int, list[BatchInfo]]]:
    """One HSCAN step over the batch records: the next cursor (0: done) and the batches."""

    def parse(reply: Any) -> tuple[int, list[BatchInfo]]:
        cursor, found = reply
        items = found.items()  # redis-py parses HSCAN into (cursor, dict)
        infos = [batch_info(name, raw) for name, raw in items]
        return int(cursor), [i for i in infos if i is not None]

    return command("HSCAN", k.batches, cursor, "COUNT", count, parse=parse)


# -- batch_gather.lua (a sharded queue's batches: dueq.sharding.batches) -----------------------


class Gathered(NamedTuple):
    """A batch's record on its home shard (``gather``): how many parts it has, which of them
    have completed, and its times (ms; None until then)."""

    parts: int
    done: frozenset[int]
    created_ms: int | None
    closed_ms: int | None
    completed_ms: int | None
    #: its completion task was not scheduled: a task with its id existed when it completed
    taken: bool


def gathered(raw: bytes | str | None) -> Gathered | None:
    """A ``gather`` record ("parts|done|created_ms|closed_ms|completed_ms|taken"), or None."""
    if not raw:
        return None
    fields = (text(raw).split("|") + [""] * 6)[:6]
    times = [int(f) if f.isdigit() else None for f in fields[2:5]]
    return Gathered(
        int(fields[0]) if fields[0].isdigit() else 0,
        frozenset(i for i, c in enumerate(fields[1]) if c == "1"),
        times[0],
        times[1],
        times[2],
        fields[5] == "1",
    )


class GatherReply(NamedTuple):
    #: open: 1 opened now, 0 opened before, -1 completion id taken; parts: 1 completed now
    status: int
    record: Gathered | None


def _gather_keys(k: QueueKeys) -> list[str]:
    return [k.due, k.tasks, k.stats, k.wake, k.history, k.gather, k.gather_on, k.gather_ended]


def _gather_reply(reply: Any) -> GatherReply:
    return GatherReply(int(reply[0]), gathered(reply[1]))


def gather_open(k: QueueKeys, now: str, batch: str, parts: int, record: bytes) -> Call[GatherReply]:
    """Open ``batch`` on its home shard for ``parts`` parts, with its completion task
    ``record`` (packed as for schedule, or empty); a batch opened before is left as it was."""
    keys = _gather_keys(k) + k.upper_due
    return Call("batch_gather", keys, [now, "open", batch, str(parts), record], _gather_reply)


def gather_parts(k: QueueKeys, now: str, batch: str, parts: Iterable[int]) -> Call[GatherReply]:
    """Mark ``parts`` of ``batch`` completed on its home shard (the completion task is
    scheduled once every part is)."""
    keys = _gather_keys(k) + k.upper_due
    args = [now, "parts", batch, *(str(p) for p in parts)]
    return Call("batch_gather", keys, args, _gather_reply)


def gather_read(k: QueueKeys, batch: str) -> Command[Gathered | None]:
    """One batch's home record (None when there is none)."""
    return command("HGET", k.gather, batch, parse=gathered)


def gather_scan(
    k: QueueKeys, cursor: int, count: int
) -> Command[tuple[int, list[tuple[str, Gathered]]]]:
    """One HSCAN step over the home records: the next cursor (0: done) and (batch, record)."""

    def parse(reply: Any) -> tuple[int, list[tuple[str, Gathered]]]:
        cursor, found = reply
        records = [(text(name), gathered(raw)) for name, raw in found.items()]
        return int(cursor), [(name, g) for name, g in records if g is not None]

    return command("HSCAN", k.gather, cursor, "COUNT", count, parse=parse)


# -- claim.lua ---------------------------------------------------------------------------------

#: Fields before the first delivery in claim.lua's reply (the head, then the column of each
#: task's due ms, attempt and first claim), and fields per delivery (id, envelope).
CLAIM_HEAD = 10
_CLAIM_ROW = 2


#: One leased task as claim.lua returned it, the payload still encoded: (id, envelope,
#: attempt, due ms, first-claimed ms). A plain tuple (zipped from the reply at C speed): a
#: claim makes up to 1,000 of them, and a dataclass per row cost more than the rest of the
#: parse.
ClaimedRow = tuple[str, bytes | str, int, int, int]


class ClaimReply(NamedTuple):
    now_ms: int
    #: the part of a millisecond past ``now_ms`` (0 for an injected clock)
    now_fraction_ms: float
    next_due_ms: int | None
    next_lease_deadline_ms: int | None
    token: str
    lease_deadline_ms: int
    #: due ids whose stored data was gone (dropped), tasks sent to dead by the claim itself
    dropped: int
    buried: int
    #: the queue is paused: nothing was leased (expired leases were still reclaimed)
    paused: bool
    rows: list[ClaimedRow]
    #: the queue's fairness is on (``configure(fairness="key")``)
    fair: bool = False


def _claimed_rows(reply: Any, now_ms: int) -> list[ClaimedRow]:
    """The rows after the head: ids and envelopes sliced out of the flat reply, zipped with the
    column (reply[9]) of each task's "<due>" (a first delivery first claimed now) or
    "<due>,<attempt>,<first>". A claim of first deliveries takes no Python call per row."""
    ids = reply[CLAIM_HEAD::_CLAIM_ROW]
    n = len(ids)
    if not n:
        return []
    if isinstance(ids[0], bytes):  # every id then (a client decodes all replies or none)
        ids = [raw.decode("utf-8") for raw in ids]
    column = text(reply[CLAIM_HEAD - 1])
    envelopes = reply[CLAIM_HEAD + 1 :: _CLAIM_ROW]
    if "," not in column:
        dues = map(int, column.split("|"))
        return list(zip(ids, envelopes, repeat(1, n), dues, repeat(now_ms, n), strict=True))
    attempts: list[int] = []
    due_list: list[int] = []
    firsts: list[int] = []
    for entry in column.split("|"):
        due, _, rest = entry.partition(",")
        due_list.append(int(due))
        if rest:
            attempt, _, first = rest.partition(",")
            attempts.append(int(attempt))
            firsts.append(int(first))
        else:
            attempts.append(1)
            firsts.append(now_ms)
    return list(zip(ids, envelopes, attempts, due_list, firsts, strict=True))


def _parse_claim(reply: Any) -> ClaimReply:
    now_ms, next_due, next_deadline = int(reply[0]), int(reply[1]), int(reply[2])
    return ClaimReply(
        now_ms=now_ms,
        now_fraction_ms=int(reply[5]) / 1000,
        next_due_ms=None if next_due < 0 else next_due,
        next_lease_deadline_ms=None if next_deadline < 0 else next_deadline,
        token=text(reply[3]),
        lease_deadline_ms=int(reply[4]),
        dropped=int(reply[6]),
        buried=int(reply[7]),
        paused=int(reply[8]) & 1 == 1,
        rows=_claimed_rows(reply, now_ms),
        fair=int(reply[8]) & 2 == 2,
    )


def claim(
    k: QueueKeys,
    now: str,
    *,
    limit: int,
    lease_ms: int,
    max_attempts: int,
    reclaim_limit: int,
    dead_max_count: int,
    dead_max_age_ms: int,
    backoff_ms: Sequence[int],
    holder: str = "",
) -> Call[ClaimReply]:
    """Reclaim expired leases, then lease up to ``limit`` due tasks to ``holder`` (a worker
    id kept in the lease token, "<deadline ms>@<holder>"; "" for none)."""
    keys = [k.due, k.leased, k.tasks, k.meta, k.errors, k.dead, k.stats, k.config, k.rate]
    keys += [k.key_state, k.parked, k.key_wait, k.history, k.cron, k.cron_last, k.ended]
    keys += [k.results, k.finished, k.debounce, k.events, *_batch_keys(k), k.wake]
    keys += [*_after_keys(k), k.steps, k.fair, k.fair_due, k.fair_claims0, k.fair_claims1]
    keys += [k.claims, *k.upper_due]
    args = [
        now,
        limit,
        lease_ms,
        max_attempts,
        reclaim_limit,
        dead_max_count,
        dead_max_age_ms,
        holder,
        *backoff_ms,
    ]
    return Call("claim", keys, args, _parse_claim)


# -- ack.lua -----------------------------------------------------------------------------------


class AckReply(NamedTuple):
    acked: int
    #: one character per (id, token) pair as sent: "h" acked, "c" its task was cancelled
    #: while leased, "l" its lease was lost (both not acked)
    verdicts: str
    #: the queue's keep_results in ms when the call ran (0: no result was kept)
    kept_ms: int = 0


#: Most leases one ack or extend call settles or moves (the flows split bigger batches).
LEASE_BATCH = 1000


def pack_pairs(pairs: Sequence[tuple[str, str]]) -> bytes:
    """(id, lease token) pairs as one argument (see ack.lua): each run of consecutive pairs
    under one token is its token (struct '>Hc0') and count ('>I4'), then its ids ('>Hc0'
    each). One argument per batch instead of two per delivery (redis.asyncio packs each
    argument in Python), and a claim's token once instead of once per pair (it was about 60%
    of the bytes, and a string made per pair in Lua). Ids are at most MAX_ID_BYTES, so their
    length fits the 16-bit prefix.

    The usual batch, the leases of one claim (one token) with ASCII ids, is packed without a
    Python step per pair: as Latin-1 text (ASCII characters are their bytes, and each length
    prefix is two characters below 256), joined and encoded once."""
    if not pairs:
        return b""
    ids, tokens = zip(*pairs, strict=True)
    token = tokens[0]
    n = len(ids)
    if tokens.count(token) == n and len(token) < len(_PREFIXES):
        joined = "".join(ids)
        if joined.isascii() and token.isascii() and max(map(len, ids)) < len(_PREFIXES):
            text: list[str] = [""] * (2 * n + 1)
            text[0] = _PREFIXES[len(token)] + token + _COUNT.pack(n).decode("latin-1")
            text[1::2] = map(_PREFIXES.__getitem__, map(len, ids))
            text[2::2] = ids
            return "".join(text).encode("latin-1")
    parts: list[bytes] = []
    length = _LENGTH.pack
    run_token = tokens[0]  # the run being packed: its token and its ids (two parts each)
    run_ids: list[bytes] = []
    for task_id, token in pairs:
        if token != run_token:
            parts.append(_run(run_token, run_ids))
            run_token, run_ids = token, []
        raw_id = task_id.encode()
        run_ids += (length(len(raw_id)), raw_id)
    parts.append(_run(run_token, run_ids))
    return b"".join(parts)


def _run(token: str, packed_ids: list[bytes]) -> bytes:
    """One run of pack_pairs: its token and count, then its ids (packed, two parts each)."""
    raw_token = token.encode()
    head = _LENGTH.pack(len(raw_token)) + raw_token + _COUNT.pack(len(packed_ids) // 2)
    return head + b"".join(packed_ids)


#: The 16-bit big-endian length of n as two Latin-1 characters, for n up to MAX_ID_BYTES.
_PREFIXES = [chr(n >> 8) + chr(n & 255) for n in range(MAX_ID_BYTES + 1)]
#: The count of ids in a run of pack_pairs.
_COUNT = struct.Struct(">I")
#: The 16-bit length before each packed string.
_LENGTH = struct.Struct(">H")


def _parse_ack(reply: Any) -> AckReply:
    return AckReply(int(reply[0]), text(reply[1]), int(reply[2]))


def pack_values(values: Sequence[bytes]) -> bytes:
    """The handlers' values of an ack, one per pair (see ``dueq.results.result_entry``), as
    one argument, struct '>Hc0' each; b"" when no pair has one (ack.lua reads none)."""
    if not any(values):
        return b""
    parts: list[bytes] = []
    for value in values:
        parts += (len(value).to_bytes(2, "big"), value)
    return b"".join(parts)


def ack(
    k: QueueKeys,
    now: str,
    held: Sequence[tuple[str, str]],
    *,
    window_ms: int,
    values: Sequence[bytes] = (),
) -> Call[AckReply]:
    """Finish leased tasks, given as (id, lease token) pairs; ``values`` (parallel to
    ``held``, or empty) are the entries to keep as their results when the queue keeps them."""
    args: list[Any] = [now, window_ms, pack_pairs(held), pack_values(values)]
    keys = [k.leased, k.tasks, k.meta, k.errors, k.stats, k.done, k.config, k.cancelled]
    keys += [k.key_state, k.key_wait, k.wake, k.history, k.cron, k.cron_last]
    keys += [k.results, k.finished, k.ended, k.debounce, k.due, k.events, *_batch_keys(k)]
    keys += [*_after_keys(k), k.dead, k.steps, *k.upper_due]
    return Call("ack", keys, args, _parse_ack)


# -- fail.lua ----------------------------------------------------------------------------------

_FAIL_STATUS = {
    0: Status.LEASE_LOST,
    1: Status.RETRIED,
    2: Status.DEAD,
    3: Status.CANCELLED,
    4: Status.EXPIRED,
}


class FailReply(NamedTuple):
    status: Status  # RETRIED, DEAD, EXPIRED, LEASE_LOST or CANCELLED
    at_ms: int  # next attempt (RETRIED) or time of death (DEAD) or of expiry (EXPIRED)


class Failure(NamedTuple):
    """One failed delivery for ``fail_many``: its lease, the error record (JSON, without
    "at"), and whether it is buried (``dead``) or retried after ``delay_ms``."""

    task_id: str
    token: str
    record: str
    dead: bool
    delay_ms: int


def _parse_fail_many(reply: Any) -> list[FailReply]:
    return [
        FailReply(_FAIL_STATUS[int(status)], int(at_ms))
        for status, at_ms in zip(reply[::2], reply[1::2], strict=True)
    ]


def fail_many(
    k: QueueKeys,
    now: str,
    failures: Sequence[Failure],
    *,
    dead_max_count: int,
    dead_max_age_ms: int,
) -> Call[list[FailReply]]:
    """Record failed deliveries in one call, each settled as if alone and in order: retried
    after its delay, or buried. The replies are one per failure, in the order given."""
    keys = [k.due, k.leased, k.tasks, k.meta, k.errors, k.dead, k.stats, k.wake, k.cancelled]
    keys += [k.key_state, k.key_wait, k.history, k.cron, k.cron_last, k.config, k.ended]
    keys += [k.results, k.finished, k.debounce, k.events, *_batch_keys(k), *_after_keys(k)]
    keys += [k.steps, k.claims, *k.upper_due]
    args: list[Any] = [now, dead_max_count, dead_max_age_ms]
    for f in failures:
        args += (f.task_id, f.token, f.record, "dead" if f.dead else "retry", f.delay_ms)
    return Call("fail", keys, args, _parse_fail_many)


def _parse_fail(reply: Any) -> FailReply:
    return _parse_fail_many(reply)[0]


def fail(
    k: QueueKeys,
    now: str,
    task_id: str,
    token: str,
    record: str,
    *,
    dead: bool,
    delay_ms: int,
    dead_max_count: int,
    dead_max_age_ms: int,
) -> Call[FailReply]:
    """Record one failed delivery (an error record without "at"); retry after a delay, or
    bury: ``fail_many`` of one."""
    call = fail_many(
        k,
        now,
        [Failure(task_id, token, record, dead, delay_ms)],
        dead_max_count=dead_max_count,
        dead_max_age_ms=dead_max_age_ms,
    )
    return Call(call.script, call.keys, call.args, _parse_fail)


# -- extend.lua, release.lua, reschedule.lua: a time in ms, or -1 ------------------------------


class TimeReply(NamedTuple):
    status: Status
    ms: int  # the new lease deadline / due time (only when status is OK)


def _time_reply(failed: Status) -> Callable[[Any], TimeReply]:
    def parse(reply: Any) -> TimeReply:
        value = int(reply)
        return TimeReply(failed, value) if value < 0 else TimeReply(Status.OK, value)

    return parse


class ExtendReply(NamedTuple):
    deadline_ms: int  # the new deadline of every lease that was held
    #: one character per (id, token) pair as sent: "h" extended, "c" its task was cancelled
    #: while leased, "l" its lease was lost (both not extended)
    verdicts: str


def _parse_extend(reply: Any) -> ExtendReply:
    return ExtendReply(int(reply[0]), text(reply[1]))


def extend(
    k: QueueKeys, now: str, held: Sequence[tuple[str, str]], lease_ms: int
) -> Call[ExtendReply]:
    """Move the deadlines of held leases, given as (id, lease token) pairs, to now +
    ``lease_ms``; at most LEASE_BATCH pairs."""
    keys = [k.leased, k.meta, k.cancelled, k.claims]
    return Call("extend", keys, [now, lease_ms, pack_pairs(held)], _parse_extend)


def release_many(
    k: QueueKeys, now: str, held: Sequence[tuple[str, str]], delay_ms: int, hold_ms: int = 0
) -> Call[ExtendReply]:
    """Give leased tasks back, given as (id, lease token) pairs, due after ``delay_ms``,
    without counting their deliveries; with ``hold_ms`` (a KeyCooldown) each one's limit key is
    held that long too. At most LEASE_BATCH pairs. The reply is extend.lua's form: the due ms
    and a verdict per pair ("h" released, "c" cancelled while leased, "l" lease lost)."""
    keys = [k.due, k.leased, k.meta, k.stats, k.wake, k.cancelled, k.tasks]
    keys += [k.key_state, k.key_wait, k.config, k.claims, *k.upper_due]
    return Call("release", keys, [now, delay_ms, hold_ms, pack_pairs(held)], _parse_extend)


def release(
    k: QueueKeys, now: str, task_id: str, token: str, delay_ms: int, hold_ms: int = 0
) -> Call[TimeReply]:
    """Give one leased task back (``release_many`` of one pair): its new due ms, or the status
    of a lease that is not held."""
    call = release_many(k, now, [(task_id, token)], delay_ms, hold_ms)
    return Call(call.script, call.keys, call.args, _parse_release)


def _parse_release(reply: Any) -> TimeReply:
    """release.lua's reply for one pair: the new due ms, or lease lost / cancelled."""
    due_ms, verdict = _parse_extend(reply)
    if verdict == "h":
        return TimeReply(Status.OK, due_ms)
    return TimeReply(Status.CANCELLED if verdict == "c" else Status.LEASE_LOST, -1)


def reschedule(
    k: QueueKeys, now: str, task_id: str, *, absolute: bool, due_ms: int
) -> Call[TimeReply]:
    """Move a scheduled task to ``due_ms`` (epoch ms when ``absolute``, else a delay)."""
    args = [now, task_id, 1 if absolute else 0, due_ms]
    keys = [k.due, k.wake, k.tasks, k.meta, k.key_state, k.parked, k.fair_due, k.fair]
    keys += k.upper_due
    return Call("reschedule", keys, args, _time_reply(Status.NOT_SCHEDULED))


# -- cancel.lua --------------------------------------------------------------------------------


def cancel(k: QueueKeys, now: str, task_id: str) -> Call[bool]:
    """Remove a task in any state; the reply says whether it existed."""
    keys = [k.due, k.leased, k.dead, k.tasks, k.meta, k.errors, k.stats, k.cancelled]
    keys += [k.key_state, k.parked, k.key_wait, k.wake, k.config, k.results, k.finished]
    keys += [k.ended, k.debounce, k.events, *_batch_keys(k), k.history, *_after_keys(k)]
    keys += [k.steps, k.fair_due, k.fair, k.claims, *k.upper_due]
    return Call("cancel", keys, [now, task_id], bool)


# -- inspect.lua, stats.lua --------------------------------------------------------------------

_INSPECT_KEYS = ("due", "leased", "dead", "tasks", "meta", "errors")


def inspect_ids(
    k: QueueKeys, now: str, ids: Sequence[str], codec: PayloadCodec = NO_CODEC
) -> Call[list[TaskInfo]]:
    """Snapshots of the given tasks (missing ones are left out; sealed payloads opened with
    ``codec``)."""
    keys = [*(getattr(k, name) for name in _INSPECT_KEYS), k.parked, k.results, k.waiting]
    parse = functools.partial(inspected, codec=codec, queue=k.queue)
    return Call("inspect", [*keys, k.steps, k.claims, *k.upper_due], [now, "ids", *ids], parse)


def inspect_dead(
    k: QueueKeys, now: str, offset: int, count: int, codec: PayloadCodec = NO_CODEC
) -> Call[list[TaskInfo]]:
    """Snapshots of dead tasks, most recently died first (``codec``: as ``inspect_ids``)."""
    keys = [*(getattr(k, name) for name in _INSPECT_KEYS), k.parked, k.results, k.waiting]
    parse = functools.partial(inspected, codec=codec, queue=k.queue)
    return Call(
        "inspect", [*keys, k.steps, k.claims, *k.upper_due], [now, "dead", offset, count], parse
    )


class ListReply(NamedTuple):
    cursor: str  # "" when the listing is done
    looked_at: int
    tasks: list[TaskInfo]


def _parse_list(reply: Any, codec: PayloadCodec = NO_CODEC, queue: str = "") -> ListReply:
    return ListReply(text(reply[0]), int(reply[1]), task_infos(reply[2:], codec, queue))


class ListFilter(NamedTuple):
    """What list_tasks.lua keeps: "" (or None) for any."""

    id_prefix: str = ""
    grep: str = ""
    error_type: str = ""
    low_ms: int | None = None
    high_ms: int | None = None


def list_tasks(
    k: QueueKeys,
    now: str,
    state: str,
    cursor: str,
    limit: int,
    budget: int,
    keep: ListFilter,
    codec: PayloadCodec = NO_CODEC,
) -> Call[ListReply]:
    """One page of the tasks in ``state``, looking at most at ``budget`` entries (sealed
    payloads opened with ``codec``)."""
    keys = [*(getattr(k, name) for name in _INSPECT_KEYS), k.parked, k.results, k.finished]
    keys += [k.waiting, k.claims, *k.upper_due]
    low = "" if keep.low_ms is None else keep.low_ms
    high = "" if keep.high_ms is None else keep.high_ms
    args = [now, state, cursor, limit, budget, keep.id_prefix, keep.grep, keep.error_type]
    parse = functools.partial(_parse_list, codec=codec, queue=k.queue)
    return Call("list_tasks", keys, [*args, low, high], parse)


class HistoryReply(NamedTuple):
    now_ms: int
    #: per minute (oldest first), the counts in HISTORY_COUNTERS order
    minutes: list[list[int]]
    overdue: int
    buckets: list[int]
    later: int


def history(
    k: QueueKeys, now: str, *, minutes: int, bucket_ms: int, buckets: int
) -> Call[HistoryReply]:
    """The last ``minutes`` of per-minute counts and a due-time histogram, as one snapshot."""

    def parse(reply: Any) -> HistoryReply:
        counts = [int(x) for x in reply[1 : 1 + minutes * 6]]
        rest = [int(x) for x in reply[1 + minutes * 6 :]]
        rows = [counts[i : i + 6] for i in range(0, len(counts), 6)]
        return HistoryReply(int(reply[0]), rows, rest[0], rest[1:-1], rest[-1])

    keys = [k.history, k.due, k.parked, *k.upper_due]
    return Call("history", keys, [now, minutes, bucket_ms, buckets], parse)


#: How many tenants of a fair queue stats.lua reports: the most due, and the most claimed.
STATS_TENANTS = 10


def stats(k: QueueKeys, now: str) -> Call[QueueStats]:
    """Counts per state, timing and counters, as one snapshot."""
    keys = [k.due, k.leased, k.dead, k.stats, k.tasks, k.config, k.parked, k.waiting]
    keys += [k.fair, k.fair_due, k.fair_claims0, k.fair_claims1]
    return Call("stats", [*keys, *k.upper_due], [now, STATS_TENANTS], queue_stats)


# -- configure.lua -----------------------------------------------------------------------------


def configure(k: QueueKeys, changes: Sequence[tuple[str, str]]) -> Call[QueueSettings]:
    """Set (or, with an empty value, remove) settings of the queue; the reply is the settings
    after the change. Consumers are woken. A change of key limits counts the live leases of
    the keys that have a limit after it (a lease of a key without one is not counted)."""
    args: list[Any] = []
    for setting, value in changes:
        args += (setting, value)
    keys = [k.config, k.wake, k.stats, k.leased, k.meta, k.tasks, k.key_state, k.claims]
    return Call("configure", keys, args, _parse_configure)


def _parse_configure(reply: Any) -> QueueSettings:
    refused = int(reply[0])
    if refused:
        raise ConfigurationError(
            f"a queue keeps at most {MAX_KEY_LIMITS} key limits; this change would leave "
            f"{refused} (nothing was changed): remove some first"
        )
    return settings_from_reply(list(reply[1:]))


# -- dead.lua ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeadReply:
    status: Status  # OK or NOT_DEAD
    count: int  # tasks moved (OK)
    missing: list[str]  # ids that were not dead (NOT_DEAD)


def _parse_dead(reply: Any) -> DeadReply:
    count = int(reply[0])
    if count < 0:
        return DeadReply(Status.NOT_DEAD, 0, [text(x) for x in reply[1:]])
    return DeadReply(Status.OK, count, [])


def _dead(k: QueueKeys, now: str, action: str, args: list[Any]) -> Call[DeadReply]:
    keys = [k.dead, k.due, k.tasks, k.meta, k.errors, k.stats, k.wake, k.steps, *k.upper_due]
    return Call("dead", keys, [now, action, *args], _parse_dead)


def dead_ids(k: QueueKeys, now: str, action: str, ids: Sequence[str]) -> Call[DeadReply]:
    """Replay or purge exactly these dead ids (all or nothing)."""
    return _dead(k, now, action, ["ids", *ids])


def dead_oldest(k: QueueKeys, now: str, action: str, count: int) -> Call[DeadReply]:
    """Replay or purge up to ``count`` dead tasks, oldest first."""
    return _dead(k, now, action, ["oldest", count])


# -- cron_add.lua, cron_remove.lua, cron_advance.lua -------------------------------------------

#: cron_add.lua's reply: what became of the definition, or None for a conflict.
_CRON_ADDED = {0: "unchanged", 1: "added", 2: "replaced", 3: "restored"}


def _parse_cron_add(reply: Any) -> str | None:
    return _CRON_ADDED.get(int(reply))


def cron_add(
    k: QueueKeys,
    now: str,
    name: str,
    definition_json: str,
    *,
    replace: bool,
    next_ms: int | None,
    next_id: str,
    envelope: bytes,
    next_due_ms: int | None = None,
) -> Call[str | None]:
    """Store a definition and schedule its next occurrence (``next_ms`` None: its window has
    no more slots, it is stored finished); None when a different definition exists and
    ``replace`` is off."""
    keys = [k.cron, k.cron_state, k.cron_paused, k.due, k.tasks, k.meta, k.errors, k.stats, k.wake]
    keys += [k.history, k.cron_runs, *k.upper_due]
    due = next_ms if next_due_ms is None else next_due_ms
    args: list[Any] = [now, name, definition_json, "1" if replace else "0"]
    args += [_ms_or_empty(next_ms), next_id, envelope, _ms_or_empty(due)]
    return Call("cron_add", keys, args, _parse_cron_add)


def _ms_or_empty(ms: int | None) -> int | str:
    return "" if ms is None else ms


def cron_remove(k: QueueKeys, now: str, name: str) -> Call[bool]:
    """Delete a definition and its pending occurrence; the reply says whether it existed."""
    keys = [k.cron, k.cron_state, k.cron_paused, k.due, k.tasks, k.meta, k.errors, k.stats]
    keys += [k.cron_last, k.cron_runs, k.cron_filled, *k.upper_due]
    return Call("cron_remove", keys, [now, name], lambda reply: bool(int(reply)))


class CronAdvance(enum.IntEnum):
    """cron_advance.lua's status per entry."""

    REFUSED = -1  # the entry's numbers were out of range: nothing changed for it
    NOT_PENDING = 0  # not the pending slot (or the definition is gone): it just runs
    ADVANCED = 1  # the schedule moved on
    REBUILT = 2  # the state was unreadable and was rebuilt; the occurrence runs
    PAUSED = 3  # the definition is paused: the occurrence runs, nothing is scheduled
    SKIPPED = 4  # overlap: the previous occurrence still runs, this one was dropped
    BUFFERED = 5  # overlap buffer_one: it waits in due until the previous one ends
    FINISHED = 6  # limit reached or window ended: dropped
    FAILED_PAUSE = 7  # pause_after_failures reached: paused now, this one dropped
    EXPIRED = 8  # past its expiry (expires=): back in due, the next claim ends it "expired"

    @property
    def runs(self) -> bool:
        """Whether the claimed occurrence runs (the others are no longer this claim's)."""
        return self < CronAdvance.SKIPPED


class CronEntry(NamedTuple):
    """One claimed occurrence for cron_advance.lua."""

    name: str
    slot_ms: int
    occurrence_id: str
    token: str
    drop: bool  # a missed slot that must not run
    envelope: bytes
    next_ms: int | None  # None: the definition's window has no more slots
    next_due_ms: int | None
    next_id: str
    missed_now: Sequence[tuple[int, str]]  # (due ms, id) of missed occurrences to run now
    overlap: str = "allow_all"
    limit: int | None = None
    pause_after: int | None = None


class CronAdvanced(NamedTuple):
    """cron_advance.lua's reply: the earliest due time it added (None: none), and a status
    per entry."""

    earliest_ms: int | None
    statuses: list[CronAdvance]


def _parse_cron_advance(reply: Any) -> CronAdvanced:
    earliest = int(reply[0])
    return CronAdvanced(
        None if earliest < 0 else earliest, [CronAdvance(int(x)) for x in reply[1:]]
    )


def cron_advance(k: QueueKeys, now: str, entries: Sequence[CronEntry]) -> Call[CronAdvanced]:
    """Move the schedules of claimed occurrences on, compare-and-set, in one call, and apply
    their definitions' policies."""
    args: list[Any] = [now]
    for e in entries:
        args += (e.name, e.slot_ms, e.occurrence_id, e.token, "1" if e.drop else "0")
        args += (e.envelope, _ms_or_empty(e.next_ms), e.next_id, _policies(e), len(e.missed_now))
        for due_ms, task_id in e.missed_now:
            args += (due_ms, task_id)
    keys = [k.cron, k.cron_state, k.due, k.tasks, k.meta, k.errors, k.leased, k.stats, k.wake]
    keys += [k.cron_paused, k.history, k.cron_runs, k.cron_last, k.cancelled, k.key_state]
    keys += [k.key_wait, k.config, k.results, k.finished, k.ended, k.events, *_batch_keys(k)]
    keys += [*_after_keys(k), k.dead, k.claims, *k.upper_due]
    return Call("cron_advance", keys, args, _parse_cron_advance)


def _policies(e: CronEntry) -> str:
    """An entry's policies as cron_advance.lua takes them: "" for a definition without any."""
    if (
        e.overlap == "allow_all"
        and e.limit is None
        and e.pause_after is None
        and e.next_due_ms == e.next_ms
    ):
        return ""
    limits = (e.next_due_ms, e.overlap, e.limit, e.pause_after)
    return "|".join("" if v is None else str(v) for v in limits)


def cron_backfill(
    k: QueueKeys,
    now: str,
    name: str,
    definition_json: bytes | str,
    envelope: bytes,
    slots: Sequence[tuple[int, int, str]],
) -> Call[int]:
    """Schedule the occurrences of ``slots`` ((slot ms, due ms, id)) once per slot; the reply
    is the count added, -1 for an unknown name, -2 when the definition changed."""
    keys = [k.cron, k.cron_filled, k.due, k.tasks, k.stats, k.wake, k.history, *k.upper_due]
    args: list[Any] = [now, name, definition_json, envelope]
    for slot in slots:
        args += slot
    return Call("cron_backfill", keys, args, int)


# -- cron_control.lua ----------------------------------------------------------------------------


class CronControl(enum.IntEnum):
    """cron_control.lua's reply."""

    CHANGED = -2  # the definition changed since the caller read it: nothing done, read again
    UNKNOWN = -1  # no definition of that name
    UNCHANGED = 0  # already paused, not paused, or the run-now id exists
    DONE = 1


def cron_control(
    k: QueueKeys,
    now: str,
    action: str,
    name: str,
    definition_json: bytes | str = "",
    *,
    next_ms: int | str | None = "",
    occurrence_id: str = "",
    envelope: bytes = b"",
    next_due_ms: int | None = None,
    pause_after: int | None = None,
) -> Call[CronControl]:
    """Pause (``action="pause"``, no other arguments), resume (the next slot, None when the
    window has no more, its id, envelope, due time and the pause_after_failures count) or run
    now (the extra occurrence's id and envelope) one definition; resume and run now change
    nothing unless the definition is still ``definition_json``."""
    keys = [
        k.cron,
        k.cron_state,
        k.cron_paused,
        k.due,
        k.tasks,
        k.meta,
        k.errors,
        k.stats,
        k.wake,
        k.history,
        k.cron_runs,
        k.cron_last,
        *k.upper_due,
    ]
    next_text = "" if next_ms is None else next_ms
    due = next_text if next_due_ms is None else next_due_ms
    args = [now, action, name, definition_json, next_text, occurrence_id, envelope, due]
    args.append(_ms_or_empty(pause_after))
    return Call("cron_control", keys, args, lambda reply: CronControl(int(reply)))


# -- heartbeat.lua and the registry's read (dueq.registry) -------------------------------------


def heartbeat(
    k: QueueKeys, now: str, worker: str, entry_json: str, *, ttl_ms: int, leave: bool = False
) -> Call[int]:
    """Write (or, with ``leave``, remove) one worker's registry entry, a JSON object without
    ``last_seen_ms``; stale entries are pruned. The reply counts the live entries."""
    args = [now, worker, "leave" if leave else "beat", entry_json, ttl_ms]
    return Call("heartbeat", [k.workers, k.workers_info], args, int)


def score_pairs(reply: Any) -> list[tuple[Any, Any]]:
    """ZRANGE ... WITHSCORES as (member, score) pairs: RESP2 sends a flat list, RESP3 pairs."""
    if reply and isinstance(reply[0], (list, tuple)):
        return [(member, score) for member, score in reply]
    return list(zip(reply[::2], reply[1::2], strict=False))


def workers_read(k: QueueKeys) -> Batch:
    """The registry and the server clock in one round trip: [TIME (epoch ms), ZRANGE workers
    WITHSCORES (expiry pairs), HGETALL workers_info] (``dueq.registry.parse_workers``)."""
    return Batch(
        (
            command("TIME", parse=lambda t: int(t[0]) * 1000 + int(t[1]) // 1000),
            command("ZRANGE", k.workers, 0, -1, "WITHSCORES", parse=score_pairs),
            command("HGETALL", k.workers_info),
        )
    )


# -- doctor.lua (Queue.doctor) -----------------------------------------------------------------

#: The phases of a doctor run, in order; each runs until its cursor comes back "".
DOCTOR_PHASES = ("keys", "waits", "fair", "rate", "orphans", "cycles")


class DoctorReply(NamedTuple):
    cursor: str  # "" when the phase is done
    looked_at: int
    note: str  # "" or what this call did not check
    findings: list[DoctorFinding]


def _doctor_value(value: Any) -> int | str | None:
    if value is None or isinstance(value, int):
        return value
    return bytes(value).decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _parse_doctor(queue: str) -> Callable[[Any], DoctorReply]:
    def parse(reply: Any) -> DoctorReply:
        rows = reply[3:]
        findings = [
            DoctorFinding(
                what=text(rows[i]),
                subject=str(_doctor_value(rows[i + 1])),
                found=_doctor_value(rows[i + 2]),
                expected=_doctor_value(rows[i + 3]),
                fixed=int(rows[i + 4]) == 1,
                queue=queue,
            )
            for i in range(0, len(rows), 5)
        ]
        return DoctorReply(text(reply[0]), int(reply[1]), text(reply[2]), findings)

    return parse


def doctor(
    k: QueueKeys,
    now: str,
    phase: str,
    cursor: str,
    *,
    batch: int,
    fix: bool,
    lease_cap: int,
    edge_cap: int,
) -> Call[DoctorReply]:
    """One bounded batch of a doctor run's ``phase`` (see doctor.lua), from ``cursor``."""
    keys = [k.due, k.leased, k.tasks, k.meta, k.stats, k.rate, k.key_state, k.parked]
    keys += [k.key_wait, *_after_keys(k), k.dead, k.errors, k.config, k.events, k.ended]
    keys += [k.history, k.wake, *_batch_keys(k), k.fair, *k.upper_due]
    args = [now, phase, cursor, batch, "1" if fix else "", lease_cap, edge_cap]
    return Call("doctor", keys, args, _parse_doctor(k.queue))


# -- events_read.lua (events.stream: a consumer group member's read) ----------------------------


class EventsRead(NamedTuple):
    #: events trimmed before the group read them, counted now (None: the server cannot tell)
    lost: int | None
    #: the XREADGROUP reply (None: nothing new)
    reply: Any


def events_read(
    k: QueueKeys, group: str, consumer: str, count: int, trimmed_pending: int
) -> Call[EventsRead]:
    """Count what ``group`` lost to the events retention (with ``trimmed_pending``, entries a
    member found trimmed while pending), then read up to ``count`` new events, in one step."""

    def parse(reply: Any) -> EventsRead:
        lost = int(reply[0])
        return EventsRead(None if lost < 0 else lost, reply[1] if len(reply) > 1 else None)

    args = [group, consumer, count, trimmed_pending]
    return Call("events_read", [k.events, k.stats], args, parse)


# -- step.lua, park.lua, signal.lua: durable tasks (issue 39) ------------------------------------

_STEP_STATUS = {1: Status.OK, 0: Status.LEASE_LOST, 3: Status.CANCELLED, 5: Status.STEP_POSITION}

#: step.lua's ops: they read the log, or write a step's record, and keep the lease.
StepOp = Literal["read", "commit", "fail"]
#: park.lua's ops: they end the attempt (the task handed back), or a wait takes a signal.
ParkOp = Literal["fail", "sleep", "again", "wait"]
#: What a durable run asks its queue to write (``dueq._flows.steps`` picks the script).
DurableOp = Literal["read", "commit", "fail", "sleep", "again", "wait"]


class StepReply(NamedTuple):
    status: Status  # OK, LEASE_LOST, CANCELLED or STEP_POSITION
    #: what the op did (park.lua's header): the log for a read, "" for step.lua's writes;
    #: the due ms a task was handed back to ("-1": not handed back) for fail, sleep and
    #: again; for a wait "P<deadline ms>"
    #: (handed back), "=<payload JSON>" (a signal taken) or "~" (timed out); with
    #: STEP_POSITION the count of committed steps the log has
    value: str


def _parse_step(reply: Any) -> StepReply:
    value = reply[1]  # a number comes back as an int, a string as bytes
    return StepReply(
        _STEP_STATUS[int(reply[0])], str(value) if isinstance(value, int) else text(value)
    )


def step(
    k: QueueKeys,
    now: str,
    task_id: str,
    token: str,
    op: StepOp,
    position: int,
    head: str,
    value: str,
) -> Call[StepReply]:
    """Write a durable task's step record under its lease (step.lua): ``position`` is how
    many steps the caller found committed, ``head`` the record's JSON object without its
    closing brace, ``value`` the result (commit) or the error (fail), as JSON."""
    keys = [k.leased, k.meta, k.cancelled, k.steps]
    return Call("step", keys, [now, task_id, token, op, position, head, value], _parse_step)


def park(
    k: QueueKeys,
    now: str,
    task_id: str,
    token: str,
    op: ParkOp,
    position: int,
    head: str,
    value: str,
    extra: str = "",
) -> Call[StepReply]:
    """End a durable task's attempt under its lease (park.lua's ``op``): ``value`` the error,
    delay or wake ms, ``extra`` a fail's hand-back delay ms or a wait's signal name."""
    keys = [k.due, k.leased, k.meta, k.stats, k.wake, k.cancelled, k.tasks, k.key_state]
    keys += [k.key_wait, k.config, k.steps, k.claims, *k.upper_due]
    args = [now, task_id, token, op, position, head, value, extra]
    return Call("park", keys, args, _parse_step)


class SignalStatus(enum.IntEnum):
    """signal.lua's verdict."""

    GONE = 0  # no live task of that id: nothing written
    KEPT = 1  # kept until the task's wait_for takes it
    WOKEN = 2  # kept, and the task waiting for it is due now
    FULL = 4  # the task holds the most signals it may: nothing written


class SignalReply(NamedTuple):
    status: SignalStatus
    pending: int  # the task's signals not yet taken (this one included when kept)


def _parse_signal(reply: Any) -> SignalReply:
    return SignalReply(SignalStatus(int(reply[0])), int(reply[1]))


def signal(
    k: QueueKeys, now: str, task_id: str, name: str, payload: str, *, max_pending: int
) -> Call[SignalReply]:
    """Send signal ``name`` with ``payload`` (JSON) to a live task."""
    keys = [k.steps, k.tasks, k.dead, k.wake, k.due, *k.upper_due]
    return Call("signal", keys, [now, task_id, name, payload, max_pending], _parse_signal)


# -- progress.lua (d.progress) and its readers (q.progress) ------------------------------------

#: Most progress entries a task keeps (its history, read first by ``q.progress``).
PROGRESS_KEPT = 20


class ProgressReply(NamedTuple):
    #: "h" written, "c" its task was cancelled while leased, "l" the lease was lost
    verdict: str
    seq: int  # the entry's number (1, 2, ... per task), when written
    at_ms: int


def _parse_progress(reply: Any) -> ProgressReply:
    return ProgressReply(text(reply[0]), int(reply[1]), int(reply[2]))


def progress(
    k: QueueKeys, now: str, task_id: str, token: str, body: str, *, keep: int = PROGRESS_KEPT
) -> Call[ProgressReply]:
    """Append one progress entry (``body``: JSON text without a newline) to a leased task's
    history, kept to its last ``keep``, under the lease ``token``; the entry is published on
    the progress channel, and is a "progress" event while events are on."""
    keys = [k.leased, k.meta, k.cancelled, k.steps, k.config, k.stats, k.events, k.progress]
    return Call("progress", keys, [now, task_id, token, body, keep], _parse_progress)


def progress_field(task_id: str) -> str:
    """The field of the steps hash that holds a task's progress history."""
    return task_id + "\0p"


def _progress_line(task_id: str, line: str) -> Progress | None:
    """One "<seq>\t<ms>\t<JSON>" entry; None for a line that cannot be read."""
    seq, _, rest = line.partition("\t")
    at, _, body = rest.partition("\t")
    try:
        return Progress(task_id, int(seq), ms_datetime(int(at)), json.loads(body))
    except ValueError:
        return None


def progress_history(k: QueueKeys, task_id: str) -> Command[list[Progress]]:
    """A task's kept progress entries, oldest first ([] when it has none)."""

    def parse(reply: Any) -> list[Progress]:
        if not reply:
            return []
        found = (_progress_line(task_id, line) for line in text(reply).split("\n"))
        return [entry for entry in found if entry is not None]

    return Command(("HGET", k.steps, progress_field(task_id)), parse)


def progress_message(data: bytes | str) -> Progress | None:
    """The entry a message of the progress channel carries (progress.lua publishes the id
    packed as struct '>Hc0', then the entry's line); None when it cannot be read."""
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    if len(raw) < 2:
        return None
    (size,) = struct.unpack_from(">H", raw, 0)
    if len(raw) < 2 + size:
        return None
    task_id = raw[2 : 2 + size].decode("utf-8", "replace")
    return _progress_line(task_id, raw[2 + size :].decode("utf-8", "replace"))


# -- reshard.lua (a reshard's mover: ``dueq.sharding.reshard``) ---------------------------------


def _reshard_keys(k: QueueKeys) -> list[str]:
    return [
        k.tasks,
        k.meta,
        k.errors,
        k.leased,
        k.dead,
        k.results,
        k.finished,
        k.done,
        k.steps,
        k.debounce,
        k.batch_of,
        k.after,
        k.moving,
        k.wake,
        k.arrived,
        k.cron,
        k.cron_state,
        k.cron_paused,
        k.cron_last,
        k.cron_runs,
        k.cron_filled,
        k.key_state,
        k.due,
        *k.upper_due,  # (last: the script finds them from the end)
    ]


class Taken(NamedTuple):
    """What ``reshard_take`` took off a shard: each task's (id, record), and how many of the
    ids asked for stayed because leased, or because keyed, batched or waiting for parents."""

    records: list[tuple[str, bytes]]
    leased: int
    kept: int


def reshard_take(k: QueueKeys, now: str, ids: Sequence[str]) -> Call[Taken]:
    """Take the tasks ``ids`` (their whole state) off this shard into its ``moving`` records."""

    return Call("reshard", _reshard_keys(k), [now, "take", *ids], _taken)


def _taken(reply: Any) -> Taken:
    flat = reply[2:]
    pairs = [(text(flat[i]), bytes(flat[i + 1])) for i in range(0, len(flat), 2)]
    return Taken(pairs, int(reply[0]), int(reply[1]))


def reshard_take_crons(k: QueueKeys, now: str, names: Sequence[str]) -> Call[Taken]:
    """Take the cron definitions ``names`` (each with its pending occurrence) off this shard
    into its ``moving`` records (under ``"\0cron\0<name>"``: ``moving_cron``)."""
    return Call("reshard", _reshard_keys(k), [now, "take_crons", *names], _taken)


#: The ``moving`` field of a cron definition's record (no task id holds a NUL).
CRON_MOVING = "\0cron\0"


def moving_cron(field: str) -> str | None:
    """The definition name of a ``moving`` field that holds a cron definition, else None."""
    return field[len(CRON_MOVING) :] if field.startswith(CRON_MOVING) else None


def cron_names_scan(k: QueueKeys, cursor: int, count: int) -> Command[tuple[int, list[str]]]:
    """One HSCAN step over a shard's cron definitions: the next cursor (0: done), names."""

    def parse(reply: Any) -> tuple[int, list[str]]:
        cursor, found = reply
        return int(cursor), [text(name) for name in found]

    return command("HSCAN", k.cron, cursor, "COUNT", count, parse=parse)


def reshard_put(
    k: QueueKeys, now: str, records: Sequence[tuple[str, bytes]]
) -> Call[tuple[int, int]]:
    """Write taken records on their new shard: (tasks put, ids this shard had already)."""
    args: list[Any] = [now, "put"]
    for task_id, record in records:
        args += (task_id, record)
    return Call("reshard", _reshard_keys(k), args, lambda r: (int(r[0]), int(r[1])))


def reshard_drop(k: QueueKeys, now: str, ids: Sequence[str]) -> Call[int]:
    """Delete the ``moving`` records of ``ids`` (put on their new shard): how many were there."""
    return Call("reshard", _reshard_keys(k), [now, "drop", *ids], int)


def moving_scan(
    k: QueueKeys, cursor: int, count: int
) -> Command[tuple[int, list[tuple[str, bytes]]]]:
    """One HSCAN step over a shard's ``moving`` records: the next cursor (0: done), (id, record)."""

    def parse(reply: Any) -> tuple[int, list[tuple[str, bytes]]]:
        cursor, found = reply
        return int(cursor), [(text(i), bytes(r)) for i, r in found.items()]

    return command("HSCAN", k.moving, cursor, "COUNT", count, parse=parse)


def members_scan(key: str, cursor: int, count: int) -> Command[tuple[int, list[str]]]:
    """One ZSCAN step over a sorted set's members (scores dropped): next cursor, members."""

    def parse(reply: Any) -> tuple[int, list[str]]:
        cursor, pairs = reply
        return int(cursor), [text(member) for member, _ in pairs]

    return command("ZSCAN", key, cursor, "COUNT", count, parse=parse)


# -- reseal.lua (key rotation, ``_flows.rotate``) -------------------------------------------------

#: Where a value key rotation re-seals lives: the tasks hash ("t"), the results hash ("r"),
#: the errors hash ("e"), the steps hash ("s") or the cron definitions hash ("c").
RotationHash = Literal["t", "r", "e", "s", "c"]
#: The key of each RotationHash, by its index in reseal.lua's KEYS.
_ROTATION_KEYS = {"t": 0, "r": 1, "e": 2, "s": 3, "c": 4}


def _rotation_keys(k: QueueKeys) -> list[str]:
    """reseal.lua's KEYS, in _ROTATION_KEYS' order."""
    return [k.tasks, k.results, k.errors, k.steps, k.cron]


class Reseal(NamedTuple):
    """One value to replace: where, its id, the value read (compared by SHA-1 in the script)
    and the value to write in its place."""

    where: RotationHash
    task_id: str
    read: bytes
    resealed: bytes


def reseal(k: QueueKeys, entries: Sequence[Reseal]) -> Call[str]:
    """Write each re-sealed value only if its field still holds the value read; the reply is
    one character per entry, in order: "w" written, "s" skipped (gone or changed meanwhile)."""
    args: list[Any] = []
    for e in entries:
        args += (e.where, e.task_id, hashlib.sha1(e.read).hexdigest(), e.resealed)
    return Call("reseal", _rotation_keys(k), args, text)


def rotation_scan(
    k: QueueKeys, where: RotationHash, cursor: int, count: int
) -> Command[tuple[int, list[tuple[str, bytes]]]]:
    """One HSCAN step over the hash ``where`` names (RotationHash; the cron definitions'
    fields are names, the steps hash's ``<id>`` and ``<id>\\0<letter>``): the next cursor
    (0: done) and the (field, stored value) pairs it returned."""

    def parse(reply: Any) -> tuple[int, list[tuple[str, bytes]]]:
        after, found = reply  # redis-py parses HSCAN into (cursor, dict)
        pairs = [
            (text(task_id), value if isinstance(value, bytes) else str(value).encode("utf-8"))
            for task_id, value in found.items()
        ]
        return int(after), pairs

    key = _rotation_keys(k)[_ROTATION_KEYS[where]]
    return command("HSCAN", key, cursor, "COUNT", count, parse=parse)


#: The counterpart of every script that a front end can call, by script name (for the
#: key-order test: each builds its call for a sample queue).
SAMPLES: dict[str, Callable[[QueueKeys], Call[Any]]] = {
    "schedule": lambda k: schedule(k, "", b"", replace=False, window_ms=0),
    "claim": lambda k: claim(
        k,
        "",
        limit=1,
        lease_ms=1,
        max_attempts=1,
        reclaim_limit=1,
        dead_max_count=1,
        dead_max_age_ms=1,
        backoff_ms=[0],
    ),
    "ack": lambda k: ack(k, "", [("id", "1")], window_ms=0),
    "fail": lambda k: fail(
        k, "", "id", "1", "{}", dead=False, delay_ms=0, dead_max_count=1, dead_max_age_ms=1
    ),
    "extend": lambda k: extend(k, "", [("id", "1")], 1),
    "release": lambda k: release(k, "", "id", "1", 0),
    "reschedule": lambda k: reschedule(k, "", "id", absolute=False, due_ms=0),
    "cancel": lambda k: cancel(k, "", "id"),
    "inspect": lambda k: inspect_ids(k, "", ["id"]),
    "stats": lambda k: stats(k, ""),
    "list_tasks": lambda k: list_tasks(k, "", "dead", "", 1, 1, ListFilter()),
    "history": lambda k: history(k, "", minutes=1, bucket_ms=1, buckets=1),
    "dead": lambda k: dead_ids(k, "", "purge", ["id"]),
    "cron_add": lambda k: cron_add(
        k, "", "n", "{}", replace=False, next_ms=0, next_id="cron:n:x", envelope=b"1:null"
    ),
    "cron_remove": lambda k: cron_remove(k, "", "n"),
    "cron_advance": lambda k: cron_advance(k, "", []),
    "cron_backfill": lambda k: cron_backfill(k, "", "n", "{}", b"1:null", []),
    "cron_control": lambda k: cron_control(k, "", "pause", "n"),
    "configure": lambda k: configure(k, [("paused", "1")]),
    "heartbeat": lambda k: heartbeat(k, "", "w", "{}", ttl_ms=1),
    "close_batch": lambda k: close_batch(k, "", "b", b""),
    "batch_gather": lambda k: gather_parts(k, "", "b", [0]),
    "events_read": lambda k: events_read(k, "g", "c", 1, 0),
    "progress": lambda k: progress(k, "", "id", "1", "null"),
    "doctor": lambda k: doctor(k, "", "keys", "", batch=1, fix=False, lease_cap=1, edge_cap=1),
    "step": lambda k: step(k, "", "id", "1", "commit", 0, "{", "null"),
    "park": lambda k: park(k, "", "id", "1", "sleep", 0, "{", "0"),
    "signal": lambda k: signal(k, "", "id", "n", "null", max_pending=1),
    "reseal": lambda k: reseal(k, [Reseal("t", "id", b"1:null", b"1:null")]),
    "reshard": lambda k: reshard_drop(k, "", ["id"]),
}


# -- spark_stage.lua, spark_commit.lua, spark_abort.lua (dueq.spark's DueqDataSource) ----------


class StageReply(NamedTuple):
    #: records staged now, and records whose id this batch had staged before (a task retry)
    staged: int
    duplicates: int
    #: the batch is sealed or committed (a replay, or a late attempt): nothing was staged
    refused: bool


def _parse_stage(reply: Any) -> StageReply:
    staged, duplicates = int(reply[0]), int(reply[1])
    return StageReply(max(staged, 0), duplicates, staged < 0)


def spark_stage(
    sk: SparkBatchKeys, now: str, query: str, batch: int, ttl_ms: int, blob: bytes
) -> Call[StageReply]:
    """Stage packed task records for one micro-batch of one streaming query."""
    keys = [sk.rows, sk.ids, sk.batches]
    return Call("spark_stage", keys, [now, query, batch, ttl_ms, blob], _parse_stage)


class CommitState(enum.IntEnum):
    """What a spark_commit step found (a step that scheduled records is ``PROMOTED``)."""

    PROMOTED = 0
    COMMITTED = -1  # the batch is committed now
    COMMITTED_BEFORE = -2  # a replay of a committed batch: nothing scheduled
    EARLIER_UNFINISHED = -3  # batch ``batch`` of this query was sealed and never finished


class CommitStep(NamedTuple):
    state: CommitState
    #: the records this step scheduled (PROMOTED only)
    scheduled: ScheduleReply | None = None
    batch: int = -1


def _parse_commit(reply: Any) -> CommitStep:
    head = int(reply[0])
    if head >= 0:
        return CommitStep(CommitState.PROMOTED, _parse_schedule(reply))
    state = CommitState(head)
    if state is CommitState.EARLIER_UNFINISHED:
        return CommitStep(state, batch=int(reply[1]))
    return CommitStep(state)


def spark_commit(
    k: QueueKeys,
    sk: SparkBatchKeys,
    now: str,
    *,
    query: str,
    batch: int,
    memory_ms: int,
    window_ms: int,
) -> Call[CommitStep]:
    """One step of committing a staged micro-batch: schedule one staged element, or settle
    the batch's state. spark_commit.lua schedules with schedule.lua's body (the include
    schedule_records), so its keys and arguments start with schedule's."""
    base = schedule(k, now, b"", replace=False, window_ms=window_ms)
    # schedule's own keys, the stage's, then the priority levels (scripts read them last)
    # (schedule's steps key is not among them: a Spark batch replaces no task)
    keys = [*base.keys[:-12], sk.rows, sk.ids, sk.batches, sk.queries, k.fair, k.fair_due]
    keys += base.keys[-9:]
    args = [*base.args, query, batch, memory_ms]
    return Call("spark_commit", keys, args, _parse_commit)


def spark_abort(sk: SparkBatchKeys, now: str, query: str, batch: int) -> Call[bool]:
    """Drop a failed micro-batch's staged records unless its commit has begun; True if dropped."""
    keys = [sk.rows, sk.ids, sk.batches]
    return Call("spark_abort", keys, [now, query, batch], lambda reply: int(reply) == 1)


def _spark_sample_keys(k: QueueKeys) -> SparkBatchKeys:
    return SparkBatchKeys.for_batch(k.queue, "query", 0)


SAMPLES["spark_stage"] = lambda k: spark_stage(_spark_sample_keys(k), "", "query", 0, 1, b"")
SAMPLES["spark_commit"] = lambda k: spark_commit(
    k, _spark_sample_keys(k), "", query="query", batch=0, memory_ms=1, window_ms=0
)
SAMPLES["spark_abort"] = lambda k: spark_abort(_spark_sample_keys(k), "", "query", 0)


# -- the parked set (claim.lua parks due tasks whose key is at a limit) -------------------------


def parked_id(member: bytes | str) -> str:
    """The task id of a member of the parked ZSET, ``<key>\\0<9 - priority><due ms, 15
    digits><id>`` (a key holds no control characters, so the first NUL ends it)."""
    raw = member.encode("utf-8") if isinstance(member, str) else bytes(member)
    _key, _, rest = raw.partition(b"\0")
    return rest[16:].decode("utf-8", "replace")


def state_zsets(k: QueueKeys, state: str) -> list[str]:
    """The sorted sets that hold the tasks of one state: a scheduled task waits in the due set
    of its priority or, due but held back by its key's limits, in the parked set (whose members
    ``parked_id`` reads)."""
    if state == "scheduled":
        return [*k.due_levels, k.parked]
    return [k.leased if state == "leased" else k.dead]
