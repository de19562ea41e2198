"""Sharded queues: one logical queue over N hash tags, so a Redis Cluster spreads it.

``Queue(name, client, shards=N)`` (and ``AsyncQueue``) with N > 1 is an ordinary ``Queue``
(``type(q) is Queue``) that holds a *layout*: a ``Sharded`` object of this module, made by the
front end with a factory that builds N ordinary queues of the same front end and settings,
its *shards* (``make_shard(name)``; this module never names the front ends, and imports
neither ``dueq.queue`` nor ``dueq._async``). The flows of ``dueq._core`` that reach the data
(schedule, claim, ack, extend, inspect, list, stats, settings, registry, ...) start with one
test, ``self._sharded is not None``, and hand a sharded queue's call to the layout, which runs
the shards' own flows, side by side where it can (``Each``, below). ``q.dead`` and ``q.cron``
are the front end's ``DeadLetters``/``Crons`` over the layout's flows (``ShardedDeadFlows``,
``ShardedCronFlows``), chosen once in ``QueueCore.__init__``. Every shard is a plain queue with
its own hash tag, so every Lua script still touches one slot and runs unchanged; the shards
only differ from other queues by name. ``shards=1`` (or no ``shards``) is exactly the plain
queue: no layout, same keys, and the flows as they were. Every queue says what it is by plain
attributes: ``shard_count`` (1 for a plain queue), ``shard_names`` (``(name,)``) and
``shard(task_id)`` (the queue of the shard that holds an id; a plain queue itself).

Shard names
-----------
Shard ``i`` of ``emails`` is the queue ``emails#i`` (keys ``dueq:{emails#i}:due`` ...), or
``emails#i.k`` for the smallest ``k >= 1`` that places it (below). A sharded queue's name may
not contain ``#``, so a shard name splits at its only ``#`` into the logical name and the
shard: ``emails#2`` (or ``emails#2.5``) is shard 2 of ``emails`` and nothing else. A plain
``Queue("emails#2")`` is therefore a view of that one shard (an operator may inspect it that
way); it is not a second queue that could collide with it.

Placement. Redis Cluster maps a key to slot ``CRC16(tag) mod 16384`` and gives each primary
contiguous slot ranges (``redis-cli --cluster create`` deals them out in N equal runs, in
order). Shard ``i`` of N therefore takes the first tag ``emails#i``, ``emails#i.1``,
``emails#i.2`` ... whose slot lies in the i-th of N equal slot ranges,
``[i * 16384 // N, (i + 1) * 16384 // N)`` (``shard_names``). With N a multiple of the
number of primaries M (and the default equal slot allocation), each primary holds exactly N/M
shards; with other N they spread as evenly as the ranges overlap the primaries'. Each try
lands in the wanted range with probability 1/N, so a shard costs about N CRC16s (0.35 µs
each), computed once per (name, N). For ``emails`` and N = 3 (ranges 0-5460, 5461-10921,
10922-16383; slot = ``redis.crc.key_slot(b"{tag}")``)::

    shard 0: emails#0   -> slot  1360  in 0-5460: taken
    shard 1: emails#1   -> slot  5489  in 5461-10921: taken
    shard 2: emails#2   -> slot  9490  not in 10922-16383
             emails#2.1 -> slot  7855  not in 10922-16383
             emails#2.2 -> slot 11980  taken

so a 3-primary cluster made by ``redis-cli --cluster create`` holds one shard per primary
(plain ``emails#0..2`` would have put two on the middle one);
``test_shard_tags_land_in_their_slot_ranges`` pins the rule. The tags depend on N, which is
one reason N cannot change on a live queue.

Which shard holds a task
------------------------
``shard_of(id, N) = int.from_bytes(blake2b(id.encode("utf-8"), digest_size=8), "big") % N``:
a stable hash (unlike Python's ``hash``, the same in every process, version and language that
has BLAKE2b, e.g. a Spark executor or a JVM), uniform enough that ``mod N`` is even for
sequential ids too. So idempotency, ``get``, ``cancel``, ``reschedule`` and ``run_now`` work
by id on one shard (``task_shard``: cron occurrences go with their definition, below).
Generated ids are random, so they spread evenly; a generated id that was taken is replaced
by a fresh one of the same shard (drawn until it hashes there). ``dueq.shard_of`` is the
public name of this function (for producers that partition work by shard themselves).

N is part of the data
---------------------
A sharded queue records N in ``dueq:{<name>#}:shards`` (a tag no shard and no sharded queue
can have) the first time it is used (SETNX), and every ``Queue(..., shards=N)`` object
compares, once, before its first operation: a different N raises ConfigurationError, as
does a sharded queue opened over a plain queue of the same name that holds tasks (its
``dueq:{<name>}:...`` keys). A plain ``Queue(name)`` opened over a sharded queue is refused
at its first schedule or claim (``QueueCore.plain_check_flow``: one GET of the layout key
per queue object; the layout key's slot is not the queue's, so the scripts cannot read it);
its read-only calls see an empty queue. Whatever opens a queue by name (the CLI, the
Prometheus collector, the dashboard) uses ``dueq.discovery.open_queue``, which reads N from
the layout key, and discovery lists a sharded queue once, under its logical name.

Consuming
---------
A claim visits the shards in turn, starting at the shard after the one this queue object
started its last claim at (the first start is random, so consumers do not all begin at
shard 0), and stops once ``limit`` tasks are leased; a claim of 0 (a full consumer) visits
every shard, to return their lapsed leases. The next due time it reports is the earliest over
the shards it visited (or "now" when it stopped early: there may be more). Each shard judges
due times and leases by its own server's clock, so never-early, fencing and bounded retries
hold per task exactly as on a plain queue. Deliveries belong to their shard's queue
(``d.queue`` is ``emails#i``), so ack, fail, extend and release go straight to their shard;
``ack_many`` and ``extend_many`` on the logical queue group by shard. Consumers listen to
every shard's wake channel by sharded Pub/Sub (``dueq.wake``): SSUBSCRIBE on the node that
holds the shard, where the shard's scripts SPUBLISH, so no wake is broadcast over the cluster.

Dead letters (``q.dead``): ``list`` takes each shard's newest ``offset + limit`` and merges
them by died-at (newest first), ``count`` sums, ``replay``/``purge`` by id check every id on its
shard before moving any (all-or-nothing, as on one queue), and all or by ``error_type`` run on
every shard.

Settings: ``configure(paused=, remember_done=)``, ``pause``, ``resume`` write every shard
(all validated before any is written); ``settings`` reads every shard. A queue-wide ``rate``
is split: shard i keeps ``n // N`` (+1 for the first ``n % N``) per the same window in its
own config (``rate_shares``), and its claim script counts its own leases, so the shards
together never lease more than n in any window, with no cross-slot step and no extra round
trip; the price is that a shard's unused share cannot go to another (n is reached only while
every shard has due tasks), and n must be at least N. ``settings`` and ``stats`` add the
shares back up (``_logical_settings``). The shards change one after another (at once with the
async front end), so a claim in that moment may find some shards paused (or with the new
share) and others not; every claim after the call returns sees the new settings. Per-key
limits are refused: a key's tasks lie on every shard (the id picks the shard) and a key's
count cannot span slots; placing keyed tasks by key instead would break lookup by id.

Cron: a definition lives on shard ``shard_of(name)``, so its occurrences are scheduled,
claimed and advanced there by the shard's own cron keeper (``dueq.cron``, unchanged);
``task_shard`` sends an occurrence's id (``cron:<name>:...``) to that shard, so ``get`` and
``cancel`` of an occurrence find it. ``q.cron.list()`` merges every shard's definitions.

Views: ``list_tasks``/``iter_tasks`` list shard by shard (each page comes from one shard,
in the state's order within it; the cursor names the shard and that shard's cursor), so
every task is listed once but not in one global order. ``history`` sums each minute's
counts over the shards (minutes matched by their start), ``due_histogram`` sums the buckets
(each shard counts from its own clock's now).

Spark: ``schedule_rows`` (batch writes) opens the queue with ``discovery.open_queue``, so its
batches go through the logical queue; the data source's streaming writer stages and commits
each micro-batch per shard, and its reader partitions each shard's sorted sets
(``_spark_source._queue_names``: the shards, read on the driver).

Sending: a step that goes to several shards at once (``Each``) is sent by the front end's
``_send``: ``AsyncQueue`` awaits its steps concurrently (``send_each_async``: one coroutine
per shard, the nodes work in parallel); ``Queue`` sends the first shard's step from the
calling thread and the others from a small pool of threads shared by every sharded queue of
the process (``send_each``; ``SEND_THREADS``, made again in a forked child, whose copy has no
threads), so a ``schedule_many`` or ``ack_many`` over N shards takes one round trip, not N. A
client with ``single_connection_client=True`` cannot be shared by threads: its steps go in
turn. A plain queue never yields an ``Each``, and its ``_send`` tests for one last.

Failover: ``tests/test_shards_failover.py`` drains a queue of 3 shards on 3 primaries + 3
replicas (AOF, ``wait_replicas=1``) while one primary is failed over (``CLUSTER FAILOVER``, or
SIGKILL and election): nothing acked is delivered again, nothing is lost.

Not yet
-------
Per-key limits (``configure(key_rate=, key_concurrency=)``) and ``q.keys`` raise
ConfigurationError ("... not available on a sharded queue"); the other gaps (listing in one
global order, skipping idle shards, ``wait_replicas`` on an asyncio ``RedisCluster``,
resharding, ``check_server`` on every primary, a multi-process benchmark) are left to later
issues.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import logging
import os
import random
import threading
import warnings
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import astuple, dataclass, replace
from datetime import datetime
from functools import cache
from typing import Any, TypeVar

import redis.crc

from . import _protocol as protocol
from ._core import QueueCore
from ._drive import Flow
from ._lease_flows import MAX_CLAIM_BATCH, ClaimBatch, raise_not_held
from .checks import whole_number
from .clock import Duration
from .cron import OCCURRENCE_PREFIX, CronDefinition, CronsCore, Occurrence
from .cron import validate_name as validate_cron_name
from .dead import MAX_OFFSET, DeadLettersCore, _distinct_ids
from .doctor import DoctorReport
from .envelope import generated_ids
from .exceptions import ConfigurationError, InvalidTaskError, LeaseLost
from .keys import QueueKeys, layout_key
from .registry import WorkerInfo, merge_workers
from .snapshot import text
from .task import (
    DeliveryBase,
    DueHistogram,
    HistoryPoint,
    Outcome,
    QueueSettings,
    QueueStats,
    Rate,
    ScheduleResult,
    TaskInfo,
    TaskPage,
    TaskState,
)

logger = logging.getLogger("dueq.queue")

T = TypeVar("T")

__all__ = [
    "MAX_SHARDS",
    "Each",
    "Sharded",
    "layout_key",
    "send_each",
    "send_each_async",
    "shard_names",
    "shard_of",
    "sharded_layout",
    "task_shard",
]

#: Most shards one queue may have (placing N shards costs about N * N CRC16s, once).
MAX_SHARDS = 256
#: Redis Cluster's hash slots.
SLOTS = 16384
#: Most tags tried per shard before giving up on the slot range (never reached in practice:
#: a try misses with probability 1 - 1/N).
MAX_TAG_TRIES = 64 * MAX_SHARDS


def shard_of(task_id: str, shards: int) -> int:
    """The shard (0 to ``shards - 1``) that holds ``task_id`` in a queue of ``shards`` shards:
    BLAKE2b-64 of its UTF-8, mod N (the same in every process and language; see
    ``dueq._shards``). A cron occurrence goes with its definition instead (``task_shard``)."""
    digest = hashlib.blake2b(task_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shards


def task_shard(task_id: str, shards: int) -> int:
    """The shard that holds ``task_id``: ``shard_of(id)``, except that a cron occurrence's id
    (``cron:<name>:<slot>`` or ``cron:<name>:now:<second>:<random>``) goes with its
    definition, on ``shard_of(name)``: the cron keeper schedules each next occurrence on the
    shard that claimed the last one."""
    name = _cron_name(task_id)
    return shard_of(task_id if name is None else name, shards)


def _cron_name(task_id: str) -> str | None:
    if not task_id.startswith(OCCURRENCE_PREFIX):
        return None
    occurrence = Occurrence.from_id(task_id)
    return None if occurrence is None else occurrence.name


@cache
def shard_names(name: str, shards: int) -> tuple[str, ...]:
    """The queue names of the shards of ``name``: shard ``i`` is ``name#i`` or ``name#i.k``
    for the smallest k whose hash-tag slot lies in the i-th of ``shards`` equal slot ranges."""
    names = []
    for i in range(shards):
        low, high = i * SLOTS // shards, (i + 1) * SLOTS // shards
        chosen = f"{name}#{i}"
        for k in range(MAX_TAG_TRIES):
            tag = f"{name}#{i}" if k == 0 else f"{name}#{i}.{k}"
            if low <= redis.crc.key_slot(f"{{{tag}}}".encode()) < high:
                chosen = tag
                break
        names.append(chosen)
    return tuple(names)


def _not_yet(what: str) -> ConfigurationError:
    return ConfigurationError(f"{what} is not available on a sharded queue yet")


@dataclass(frozen=True)
class Each:
    """Steps for several shards at once (``_together``); the front end's ``_send`` answers
    one ``(ok, value or error)`` per step (``send_each``, ``send_each_async``)."""

    steps: tuple[protocol.Step, ...]


def _together(flows: Sequence[Flow[Any]]) -> Flow[list[Any]]:
    """Run flows side by side: each round sends every pending step in one ``Each``; an
    error of a step is thrown into its own flow. Returns the flows' results in order."""
    results: list[Any] = [None] * len(flows)
    pending: dict[int, protocol.Step] = {}
    for i, flow in enumerate(flows):
        try:
            pending[i] = next(flow)
        except StopIteration as stop:
            results[i] = stop.value
    while pending:
        order = list(pending)
        replies: list[tuple[bool, Any]] = yield Each(tuple(pending[i] for i in order))  # type: ignore[misc]
        for i, (ok, value) in zip(order, replies, strict=True):
            try:
                pending[i] = flows[i].send(value) if ok else flows[i].throw(value)
            except StopIteration as stop:
                results[i] = stop.value
                del pending[i]
    return results


def _join_cursor(index: int, inner: str | None) -> str:
    return base64.urlsafe_b64encode(f"{index}|{inner or ''}".encode()).decode()


def _split_cursor(cursor: object, shards: int) -> tuple[int, str | None]:
    """(shard, that shard's cursor) of a sharded listing's cursor; InvalidTaskError if it is
    not one such a listing returned."""
    if cursor is None:
        return 0, None
    try:
        raw = base64.urlsafe_b64decode(str(cursor).encode()).decode()
        index_text, separator, inner = raw.partition("|")
        index = int(index_text) if separator else -1
    except (binascii.Error, UnicodeDecodeError, ValueError):
        index = -1
    if not isinstance(cursor, str) or not 0 <= index < shards:
        raise InvalidTaskError(f"cursor {cursor!r} is not one a listing of this queue returned")
    return index, inner or None


def _sum_stats(parts: Sequence[QueueStats]) -> QueueStats:
    """The stats of the logical queue: counts summed, the earliest next due, the largest lag."""
    counters: dict[str, int] = defaultdict(int)
    for part in parts:
        for name, value in part.counters.items():
            counters[name] += value
    due_ats = [p.next_due_at for p in parts if p.next_due_at is not None]
    return replace(
        parts[0],
        settings=_logical_settings([p.settings for p in parts]),
        scheduled=sum(p.scheduled for p in parts),
        due_now=sum(p.due_now for p in parts),
        leased=sum(p.leased for p in parts),
        dead=sum(p.dead for p in parts),
        next_due_at=min(due_ats) if due_ats else None,
        oldest_due_lag_s=max(p.oldest_due_lag_s for p in parts),
        now=max(p.now for p in parts),
        counters=dict(counters),
        missing=sum(p.missing for p in parts),
    )


def rate_shares(rate: Rate, shards: int) -> list[Rate]:
    """The queue-wide ``rate`` split over ``shards``: shard i gets ``n // N`` (one more for the
    first ``n % N``) per the same window, so the shards together never lease more than n in
    any window (each counts its own leases, atomically in its claim script). ConfigurationError
    when n < N: some shard would get no share and never lease."""
    if rate.n < shards:
        raise ConfigurationError(
            f"a rate on a queue of {shards} shards is split over the shards (each claims on "
            f"its own primary), so it needs at least one claim per window per shard: n must "
            f"be at least {shards}, got {rate}"
        )
    base, extra = divmod(rate.n, shards)
    return [Rate(base + (1 if i < extra else 0), rate.per) for i in range(shards)]


def _logical_settings(parts: Sequence[QueueSettings]) -> QueueSettings:
    """The settings of the logical queue from its shards': shard 0's, with the rate the
    shards' shares add up to (while a change is half written, shard 0's share)."""
    rates = [p.rate for p in parts]
    first = rates[0]
    if first is None or any(r is None or r.per_ms != first.per_ms for r in rates):
        return parts[0]
    return replace(parts[0], rate=Rate(sum(r.n for r in rates if r is not None), first.per))


class Sharded:
    """The layout of a sharded queue: its shards, and the flows of the logical queue over
    them (``QueueCore``'s flows hand a sharded queue's calls to these; see the module
    docstring). Made once per queue object by ``sharded_layout``."""

    def __init__(self, name: str, count: int, make_shard: Callable[[str], QueueCore]) -> None:
        """Check the name and make the shards, ``make_shard(shard_name)`` each: queues of the
        front end that asks, on its client, with its settings."""
        if "#" in name:
            raise ConfigurationError(
                f"a sharded queue's name cannot contain '#' (it separates the name from the "
                f"shard in the shards' names, {name}#0 ...), got {name!r}"
            )
        self.name = name
        self.count = count
        self.names = shard_names(name, count)
        with warnings.catch_warnings():  # the deprecated remember_done= warns once, for the queue
            warnings.simplefilter("ignore", DeprecationWarning)
            #: the shards' queues (of the front end that made this layout), in shard order
            self.queues = [make_shard(n) for n in self.names]
        self._by_name = {s.name: s for s in self.queues}
        self._checked = False
        self._start = random.randrange(count)  # where the next claim begins
        self._start_lock = threading.Lock()

    def no_keys(self) -> ConfigurationError:
        """What ``q.keys`` raises: no key set names the logical queue, so a flow not written
        for shards must not run on ``{name}`` keys, where it would silently miss every task."""
        return _not_yet(f"a single key set for {self.name!r} (each shard has its own)")

    def wake_channels(self) -> list[str]:
        return [s.keys.wake for s in self.queues]

    def shard(self, task_id: str) -> QueueCore:
        """The shard's queue (a plain ``Queue`` or ``AsyncQueue``) that holds ``task_id``."""
        return self.queues[task_shard(task_id, self.count)]

    def dead_flows(self, queue: QueueCore) -> DeadLettersCore:
        """The dead-letter flows of the logical ``queue`` (for its ``q.dead``)."""
        return ShardedDeadFlows(queue, self)

    def cron_flows(self, queue: QueueCore) -> CronsCore:
        """The cron flows of the logical ``queue`` (for its ``q.cron``)."""
        return ShardedCronFlows(queue, self)

    def _owner(self, delivery: DeliveryBase) -> QueueCore:
        """The shard a delivery settles on (by name: any queue object of that shard will do)."""
        name = delivery.queue_name
        owner = self._by_name.get(name)
        if owner is None:
            raise ConfigurationError(
                f"delivery of task {delivery.id!r} came from queue {name!r}, not from a shard "
                f"of {self.name!r}"
            )
        return owner

    def check_flow(self) -> Flow[None]:
        """Once per queue object: refuse a different N, or a plain queue of this name with
        tasks; record N when the queue is new."""
        if self._checked:
            return
        plain = QueueKeys.for_queue(self.name)
        held: int = yield protocol.command("EXISTS", plain.tasks, plain.dead, plain.cron)
        if held:
            raise ConfigurationError(
                f"queue {self.name!r} holds tasks as a plain (unsharded) queue; a sharded queue "
                f"of that name would not see them. Drain it first, or keep shards=1"
            )
        key = layout_key(self.name)
        _, recorded = yield protocol.Batch(
            (
                protocol.command("SETNX", key, str(self.count)),
                protocol.command("GET", key),
            )
        )
        found = None if recorded is None else text(recorded)
        if found != str(self.count):
            raise ConfigurationError(
                f"queue {self.name!r} has {found} shards in Redis ({key}); it was opened with "
                f"shards={self.count}. Changing N on a live queue would hide every task "
                f"whose id hashes to another shard: open it with shards={found}"
            )
        self._checked = True

    # -- scheduling --------------------------------------------------------------------------

    def schedule_records_flow(
        self, ids: list[str], records: list[bytes], replace: bool
    ) -> Flow[ScheduleResult]:
        """Group the records by shard and send each group to its shard (batches as a plain
        queue's); the shards' calls of a round go together."""
        yield from self.check_flow()
        groups: dict[int, list[int]] = defaultdict(list)
        for position, task_id in enumerate(ids):
            groups[task_shard(task_id, self.count)].append(position)
        flows = [
            self.queues[i].schedule_records_flow(
                [ids[p] for p in positions],
                [records[p] for p in positions],
                replace,
                self._fresh_ids(i),
            )
            for i, positions in groups.items()
        ]
        results: list[ScheduleResult] = yield from _together(flows)
        out = list(ids)
        for positions, result in zip(groups.values(), results, strict=True):
            for p, task_id in zip(positions, result.ids, strict=True):
                out[p] = task_id  # a generated id that was taken got a fresh one
        return ScheduleResult(
            added=sum(r.added for r in results),
            existing=sum(r.existing for r in results),
            replaced=sum(r.replaced for r in results),
            ids=out,
        )

    def _fresh_ids(self, shard: int) -> Iterator[str]:
        """Generated ids that hash to ``shard``."""
        return (i for i in generated_ids() if task_shard(i, self.count) == shard)

    def cancel_flow(self, task_id: str) -> Flow[bool]:
        yield from self.check_flow()
        return (yield from self.shard(task_id).cancel_flow(task_id))

    def reschedule_flow(
        self, task_id: str, at: datetime | None, delay: Duration | None
    ) -> Flow[bool]:
        yield from self.check_flow()
        return (yield from self.shard(task_id).reschedule_flow(task_id, at, delay))

    def run_now_flow(self, task_id: str) -> Flow[bool]:
        yield from self.check_flow()
        return (yield from self.shard(task_id).run_now_flow(task_id))

    # -- consuming ---------------------------------------------------------------------------

    def claim_flow(
        self, limit: int, lease: Duration | None, holder: str | None = None
    ) -> Flow[ClaimBatch]:
        """Claim from the shards in turn until ``limit`` are leased (a claim of 0 visits all)."""
        whole_number(limit, "limit", low=0, high=MAX_CLAIM_BATCH)
        yield from self.check_flow()
        with self._start_lock:
            start = self._start
            self._start = (start + 1) % self.count
        deliveries: list[Any] = []
        batches: list[ClaimBatch] = []
        for step in range(self.count):
            shard = self.queues[(start + step) % self.count]
            batch: ClaimBatch = yield from shard.claim_flow(limit - len(deliveries), lease, holder)
            batches.append(batch)
            deliveries += batch.deliveries
            if limit and len(deliveries) >= limit:
                break
        first = batches[0]
        waits_ms = []  # from each shard's own claim and clock; anchored on the first claim
        for b in batches:
            upcoming = [ms for ms in (b.next_due_ms, b.next_lease_deadline_ms) if ms is not None]
            if upcoming:
                waits_ms.append(min(upcoming) - b.now_ms - b.now_fraction_ms)
        if len(batches) < self.count:
            waits_ms.append(0.0)  # stopped early: the shards not visited may have work now
        next_due_ms = (
            int(first.now_ms + first.now_fraction_ms + min(waits_ms)) if waits_ms else None
        )
        return ClaimBatch(
            deliveries,
            first.now_ms,
            next_due_ms,
            None,
            first.now_fraction_ms,
            all(b.paused for b in batches),
        )

    def ack_flow(self, deliveries: Sequence[DeliveryBase]) -> Flow[int]:
        groups: dict[str, list[DeliveryBase]] = defaultdict(list)
        for d in deliveries:
            groups[self._owner(d).name].append(d)
        flows = [_refusals(self._by_name[k].ack_flow(group)) for k, group in groups.items()]
        results = yield from _together(flows)
        _raise_combined("acked", deliveries, results)
        return sum(
            len(group) - len(refused) if acked is None else acked
            for group, (acked, refused, _) in zip(groups.values(), results, strict=True)
        )

    def extend_many_flow(
        self, deliveries: Sequence[DeliveryBase], seconds: Duration
    ) -> Flow[datetime]:
        groups: dict[str, list[DeliveryBase]] = defaultdict(list)
        for d in deliveries:
            groups[self._owner(d).name].append(d)
        flows = [
            _refusals(self._by_name[k].extend_many_flow(group, seconds))
            for k, group in groups.items()
        ]
        results = yield from _together(flows)
        _raise_combined("extended", deliveries, results)
        deadlines: list[datetime] = [r[0] for r in results]
        return min(deadlines)  # every lease was held, or _raise_combined raised

    def extend_flow(self, delivery: DeliveryBase, seconds: Duration) -> Flow[datetime]:
        return (yield from self._owner(delivery).extend_flow(delivery, seconds))

    def fail_flow(
        self, delivery: DeliveryBase, error: BaseException | str, retry_in: Duration | None
    ) -> Flow[Outcome]:
        return (yield from self._owner(delivery).fail_flow(delivery, error, retry_in))

    def release_flow(self, delivery: DeliveryBase, delay: Duration) -> Flow[Outcome]:
        return (yield from self._owner(delivery).release_flow(delivery, delay))

    # -- inspection --------------------------------------------------------------------------

    def inspect_ids_flow(self, ids: Sequence[str]) -> Flow[list[TaskInfo]]:
        yield from self.check_flow()
        groups: dict[int, list[str]] = defaultdict(list)
        for task_id in ids:
            groups[task_shard(task_id, self.count)].append(task_id)
        flows = [self.queues[i].inspect_ids_flow(group) for i, group in groups.items()]
        found = {info.id: info for part in (yield from _together(flows)) for info in part}
        return [found[i] for i in dict.fromkeys(ids) if i in found]

    def stats_flow(self) -> Flow[QueueStats]:
        yield from self.check_flow()
        parts: list[QueueStats] = yield from _together([s.stats_flow() for s in self.queues])
        return _sum_stats(parts)

    def doctor_flow(self, fix: bool, batch: int) -> Flow[DoctorReport]:
        """Each shard checked on its own keys (findings name their shard), side by side."""
        yield from self.check_flow()
        parts: list[DoctorReport] = yield from _together(
            [s.doctor_flow(fix, batch) for s in self.queues]
        )
        return DoctorReport(
            self.name,
            fix,
            [f for part in parts for f in part.findings],
            list(dict.fromkeys(note for part in parts for note in part.notes)),
        )

    def list_flow(
        self, state: TaskState, *, limit: int, cursor: str | None, **filters: Any
    ) -> Flow[TaskPage]:
        """One page of one shard's listing; the cursor names the shard and its cursor, and
        moves to the next shard when one is done (shard by shard, see the module docstring)."""
        index, inner = _split_cursor(cursor, self.count)
        yield from self.check_flow()
        page: TaskPage = yield from self.queues[index].list_flow(
            state, limit=limit, cursor=inner, **filters
        )
        if page.cursor is not None:
            after: str | None = _join_cursor(index, page.cursor)
        else:
            after = _join_cursor(index + 1, None) if index + 1 < self.count else None
        return TaskPage(page.tasks, after, page.looked_at)

    def history_flow(self, minutes: int) -> Flow[list[HistoryPoint]]:
        """Each minute's counts summed over the shards (minutes matched by their start)."""
        yield from self.check_flow()
        parts: list[list[HistoryPoint]] = yield from _together(
            [s.history_flow(minutes) for s in self.queues]
        )
        summed: dict[datetime, list[int]] = {}
        for part in parts:
            for point in part:
                row = summed.setdefault(point.minute, [0] * 6)
                for i, value in enumerate(astuple(point)[1:]):
                    row[i] += value
        latest = sorted(summed)[-minutes:]
        return [HistoryPoint(minute, *summed[minute]) for minute in latest]

    def due_histogram_flow(self, bucket: Duration, buckets: int) -> Flow[DueHistogram]:
        """Bucket counts summed over the shards (each counts from its own clock's now)."""
        yield from self.check_flow()
        parts: list[DueHistogram] = yield from _together(
            [s.due_histogram_flow(bucket, buckets) for s in self.queues]
        )
        return replace(
            parts[0],
            overdue=sum(p.overdue for p in parts),
            counts=[sum(column) for column in zip(*(p.counts for p in parts), strict=True)],
            later=sum(p.later for p in parts),
        )

    # -- settings ----------------------------------------------------------------------------

    def configure_flow(
        self,
        *,
        paused: Any,
        remember_done: Any,
        rate: Any,
        key_rate: Any,
        key_concurrency: Any,
        keep_results: Any = None,
    ) -> Flow[QueueSettings]:
        """``paused`` and ``remember_done`` written to every shard, and ``rate`` split over
        them (``rate_shares``); everything is validated before any shard is written. Per-key
        limits are refused: a key's tasks lie on every shard (the id picks the shard), so no
        one claim script could count a key's leases (see README, "Sharded queues")."""
        if key_rate not in (None, False) or key_concurrency not in (None, False):
            raise ConfigurationError(
                "key_rate and key_concurrency are not available on a sharded queue: a key's "
                "tasks are spread over the shards by id, and each shard's claim script sees "
                "only its own leases, so a per-key limit would hold per shard, N times over. "
                "Keep keyed tasks on a plain queue (one per tenant group, for example)"
            )
        shares: list[Any] = [rate] * self.count
        if rate is not None and rate is not False:
            if not isinstance(rate, Rate):
                raise ConfigurationError(f"rate must be a dueq.Rate or False, got {rate!r}")
            shares = rate_shares(rate, self.count)
        yield from self.check_flow()
        flows = [
            s.configure_flow(
                paused=paused,
                remember_done=remember_done,
                keep_results=keep_results,
                rate=share,
                key_rate=key_rate,
                key_concurrency=key_concurrency,
            )
            for s, share in zip(self.queues, shares, strict=True)
        ]
        settings: list[QueueSettings] = yield from _together(flows)
        return _logical_settings(settings)

    def settings_flow(self) -> Flow[QueueSettings]:
        yield from self.check_flow()
        settings: list[QueueSettings] = yield from _together(
            [s.settings_flow() for s in self.queues]
        )
        return _logical_settings(settings)

    # -- worker registry ---------------------------------------------------------------------

    def workers_flow(self) -> Flow[list[WorkerInfo]]:
        """Every shard's registry merged: a worker beats into each shard, so one entry per
        worker id, from its latest beat."""
        yield from self.check_flow()
        parts: list[list[WorkerInfo]] = yield from _together(
            [s.workers_flow() for s in self.queues]
        )
        return merge_workers(parts)

    def heartbeat_flow(self, entry_json: str, ttl_ms: int, leave: bool) -> Flow[int]:
        """The beat (or the leave) on every shard, so each shard's own view shows the worker
        too; returns the most live workers any shard counts."""
        yield from self.check_flow()
        live: list[int] = yield from _together(
            [s.heartbeat_flow(entry_json, ttl_ms, leave) for s in self.queues]
        )
        return max(live)


def sharded_layout(
    name: str, shards: int, make_shard: Callable[[str], QueueCore]
) -> Sharded | None:
    """The layout ``Queue(name, ..., shards=)`` (or ``AsyncQueue``) holds: None for 1 shard
    (a plain queue), else ``Sharded`` over shards ``make_shard`` builds. ConfigurationError
    for a count that is not 1 to MAX_SHARDS, or a name with '#'."""
    whole_number(shards, "shards", low=1, high=MAX_SHARDS)
    if shards == 1:
        return None
    return Sharded(name, shards, make_shard)


def _refusals(flow: Flow[T]) -> Flow[tuple[T | None, list[str], list[str]]]:
    """A settling flow's result, or the leases it found not held: (result, refused, cancelled)."""
    try:
        result = yield from flow
    except LeaseLost as exc:  # the others of the group were settled; report them all at the end
        return None, exc.ids, exc.cancelled
    return result, [], []


def _raise_combined(done: str, deliveries: Sequence[DeliveryBase], results: list[Any]) -> None:
    refused_ids = {i for r in results for i in r[1]}
    cancelled = {i for r in results for i in r[2]}
    refused = [d.id for d in deliveries if d.id in refused_ids]
    raise_not_held(done, refused, [i for i in refused if i in cancelled])


class ShardedDeadFlows(DeadLettersCore):
    """The dead-letter flows of a sharded queue (its ``q.dead`` drives them): each shard's,
    merged (see the module docstring)."""

    def __init__(self, queue: QueueCore, layout: Sharded) -> None:
        super().__init__(queue)
        self._layout = layout
        self._shard_dead = [DeadLettersCore(s) for s in layout.queues]

    def list_flow(self, limit: int, offset: int) -> Flow[list[TaskInfo]]:
        """Each shard's newest ``offset + limit``, merged newest first, then the page."""
        whole_number(limit, "limit", low=0, high=MAX_OFFSET)
        whole_number(offset, "offset", low=0, high=MAX_OFFSET)
        if limit == 0:
            return []
        yield from self._layout.check_flow()
        flows = [d.list_flow(min(offset + limit, MAX_OFFSET), 0) for d in self._shard_dead]
        parts: list[list[TaskInfo]] = yield from _together(flows)
        merged = sorted(
            (info for part in parts for info in part),
            key=lambda info: info.died_at.timestamp() if info.died_at else 0.0,
            reverse=True,
        )
        return merged[offset : offset + limit]

    def count_flow(self) -> Flow[int]:
        yield from self._layout.check_flow()
        counts: list[int] = yield from _together([d.count_flow() for d in self._shard_dead])
        return sum(counts)

    def move_flow(
        self, action: str, ids: Iterable[str] | None, error_type: str | None = None
    ) -> Flow[int]:
        """By id: every id checked on its shard first (all-or-nothing, as on one queue), then
        moved; all, or by error type: on every shard."""
        yield from self._layout.check_flow()
        shard_dead = self._shard_dead
        if ids is None or error_type is not None:
            if ids is not None:
                raise InvalidTaskError("give ids or error_type, not both")
            flows = [d.move_flow(action, None, error_type) for d in shard_dead]
            return sum((yield from _together(flows)))
        groups: dict[int, list[str]] = defaultdict(list)
        for task_id in _distinct_ids(ids):
            groups[task_shard(task_id, self._layout.count)].append(task_id)
        yield from _together([shard_dead[i].check_dead_flow(g) for i, g in groups.items()])
        moved = yield from _together(
            [shard_dead[i].move_flow(action, g) for i, g in groups.items()]
        )
        return sum(moved)


def _named(method: str) -> Callable[..., Flow[Any]]:
    """A cron flow of a sharded queue that goes to the shard of the definition's name."""

    def flow(self: ShardedCronFlows, name: str, *args: Any) -> Flow[Any]:
        name = validate_cron_name(name)
        yield from self._layout.check_flow()
        crons = self._shard_crons[shard_of(name, self._layout.count)]
        return (yield from getattr(crons, method)(name, *args))

    flow.__name__ = method
    return flow


class ShardedCronFlows(CronsCore):
    """The cron flows of a sharded queue (its ``q.cron`` drives them): each definition on
    the shard of its name (see the module docstring); ``list`` merges every shard's. The
    shards' claims keep their own definitions (each shard's queue has its own keeper)."""

    def __init__(self, queue: QueueCore, layout: Sharded) -> None:
        super().__init__(queue)
        self._layout = layout
        self._shard_crons = [CronsCore(s) for s in layout.queues]

    add_flow = _named("add_flow")
    remove_flow = _named("remove_flow")
    get_flow = _named("get_flow")
    pause_flow = _named("pause_flow")
    resume_flow = _named("resume_flow")
    run_now_flow = _named("run_now_flow")

    def list_flow(self) -> Flow[list[CronDefinition]]:
        yield from self._layout.check_flow()
        flows = [c.list_flow() for c in self._shard_crons]
        parts: list[list[CronDefinition]] = yield from _together(flows)
        return sorted((d for part in parts for d in part), key=lambda d: d.name)


# -- sending an Each (the front ends' ``_send``) ------------------------------------------------


def _settled_reply(send: Callable[[protocol.Step], Any], step: protocol.Step) -> tuple[bool, Any]:
    try:
        return True, send(step)
    except Exception as exc:  # thrown into the flow of that shard, which decides
        return False, exc


#: Threads that send the steps of an ``Each`` to shards other than the first (per process).
SEND_THREADS = 16
_send_pool: tuple[int, ThreadPoolExecutor] | None = None
_send_pool_lock = threading.Lock()


def _senders() -> ThreadPoolExecutor:
    """The process's pool of sending threads (a forked child makes its own: the parent's
    threads are not in it)."""
    global _send_pool
    with _send_pool_lock:
        if _send_pool is None or _send_pool[0] != os.getpid():
            pool = ThreadPoolExecutor(SEND_THREADS, thread_name_prefix="dueq-shard-send")
            _send_pool = (os.getpid(), pool)
        return _send_pool[1]


def send_each(
    send: Callable[[protocol.Step], Any], each: Each, *, in_turn: bool
) -> list[tuple[bool, Any]]:
    """The replies to an ``Each`` for a blocking ``send``: the first step from this thread,
    the others from the sending threads at the same time (in turn with ``in_turn``: a client
    of one connection, which threads must not share)."""
    first, *others = each.steps
    if not others or in_turn:
        return [_settled_reply(send, s) for s in each.steps]
    pool = _senders()
    futures = [pool.submit(_settled_reply, send, s) for s in others]
    return [_settled_reply(send, first), *(f.result() for f in futures)]


async def send_each_async(
    send: Callable[[protocol.Step], Awaitable[Any]], each: Each
) -> list[tuple[bool, Any]]:
    """The replies to an ``Each`` for an awaitable ``send``: every step awaited at once."""
    replies = await asyncio.gather(*(send(s) for s in each.steps), return_exceptions=True)
    for reply in replies:
        if isinstance(reply, BaseException) and not isinstance(reply, Exception):
            raise reply  # cancelled: not a reply of the shard
    return [(not isinstance(r, Exception), r) for r in replies]
