"""Sharded queues: one logical queue over N hash tags, so a Redis Cluster spreads it.

``Queue(name, client, shards=N)`` (and ``AsyncQueue``) returns a ``ShardedQueue``
(``ShardedAsyncQueue``): a ``Queue`` whose flows (``dueq._core``) dispatch to N ordinary
queues, its *shards*. Every shard is a plain queue with its own hash tag, so every Lua script
still touches one slot and runs unchanged; the shards only differ from other queues by name.
``shards=1`` (or no ``shards``) is exactly the plain queue: same class, same keys, no cost.

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
by a fresh one of the same shard (drawn until it hashes there).

N is part of the data
---------------------
A sharded queue records N in ``dueq:{<name>#}:shards`` (a tag no shard and no sharded queue
can have) the first time it is used (SETNX), and every ``Queue(..., shards=N)`` object
compares, once, before its first operation: a different N raises ConfigurationError, as
does a sharded queue opened over a plain queue of the same name that holds tasks (its
``dueq:{<name>}:...`` keys). A plain ``Queue(name)`` opened over a sharded queue is refused
at its first schedule or claim (``QueueCore._plain_check_flow``: one GET of the layout key
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

Sending: a step that goes to several shards at once (``_Each``) is awaited concurrently by
``ShardedAsyncQueue`` (one coroutine per shard: the nodes work in parallel). ``ShardedQueue``
sends the first shard's step from the calling thread and the others from a small pool of
threads shared by every sharded queue of the process (``SEND_THREADS``; made again in a forked
child, whose copy has no threads), so a ``schedule_many`` or ``ack_many`` over N shards takes
one round trip, not N. A client with ``single_connection_client=True`` cannot be shared by
threads: its steps go in turn.

Failover: ``tests/test_shards_failover.py`` drains a queue of 3 shards on 3 primaries + 3
replicas (AOF, ``wait_replicas=1``) while one primary is failed over (``CLUSTER FAILOVER``, or
SIGKILL and election): nothing acked is delivered again, nothing is lost.

TODO (later slices; each raises ConfigurationError "... is not available on a sharded queue
yet" until it lands):
- per-key limits (``configure(key_rate=, key_concurrency=)``): they need a key's tasks on one
  shard (shard by limit key instead of id when a task has a key: then get/cancel by id need
  the key, or an id -> shard index).
- ``list_tasks`` in the state's order across shards (a cursor per shard packed in one, each
  page merged by the ordering score: priority and due time, lease deadline, died-at; the
  scripts' cursors must then resume after any task, not only at a page's end).
- skip shards known idle: remember each shard's next due (monotonic) and skip it until then
  unless a wake message named it (the wake payload would need the shard).
- ``wait_replicas`` with a ``redis.asyncio`` ``RedisCluster`` (the blocking one runs script
  and WAIT on the shard's primary, ``dueq.scripts.Scripts._run_on_node``).
- ``dueq reshard NAME --to M``: tasks cannot move between shards atomically (two shards
  are two primaries), so: mark the layout key "N->M" (every process refuses both N and M
  meanwhile), pause every shard, wait until nothing is leased, then per task copy it to its
  new shard with its state (a new script: envelope, attempt record, errors, due or dead
  score; idempotent by id) and only then delete it from the old one; a crash in between
  leaves a task in both, and the copy step run again finds it present (nothing lost, no
  duplicate delivery since nothing is claimed while paused). Then write M and resume.
- ``check_server`` on every primary (today: the node the client picks).
- ``scripts/bench/shards.py`` (slice 1 measures one client process and projects from each
  primary's server time): add several producer and consumer processes, and a machine with a
  core per primary, to measure the scaling instead of projecting it.
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
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import astuple, dataclass, replace
from datetime import datetime
from functools import cache
from typing import Any, TypeVar

import redis.crc

from . import _protocol as protocol
from ._async import AsyncQueue
from ._core import MAX_CLAIM_BATCH, ClaimBatch, Flow, QueueCore, _raise_not_held
from .checks import whole_number
from .clock import Duration
from .cron import OCCURRENCE_PREFIX, AsyncCrons, CronDefinition, Crons, CronsCore, Occurrence
from .cron import validate_name as validate_cron_name
from .dead import MAX_OFFSET, AsyncDeadLetters, DeadLetters, DeadLettersCore, _distinct_ids
from .doctor import DoctorReport
from .envelope import generated_ids
from .exceptions import ConfigurationError, InvalidTaskError, LeaseLost
from .keys import QueueKeys, layout_key
from .queue import Queue
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

__all__ = ["MAX_SHARDS", "layout_key", "shard_names", "shard_of", "task_shard"]

#: Most shards one queue may have (placing N shards costs about N * N CRC16s, once).
MAX_SHARDS = 256
#: Redis Cluster's hash slots.
SLOTS = 16384
#: Most tags tried per shard before giving up on the slot range (never reached in practice:
#: a try misses with probability 1 - 1/N).
MAX_TAG_TRIES = 64 * MAX_SHARDS


def shard_of(task_id: str, shards: int) -> int:
    """The shard (0 to ``shards - 1``) that holds ``task_id``: BLAKE2b-64 of its UTF-8, mod N."""
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
class _Each:
    """Steps for several shards at once; the reply is one ``(ok, value or error)`` per step."""

    steps: tuple[protocol.Step, ...]


def _together(flows: Sequence[Flow[Any]]) -> Flow[list[Any]]:
    """Run flows side by side: each round sends every pending step in one ``_Each``; an
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
        replies: list[tuple[bool, Any]] = yield _Each(tuple(pending[i] for i in order))  # type: ignore[misc]
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


class _Sharded(QueueCore):
    """The flows of a sharded queue, for both front ends (mixed in before ``Queue`` or
    ``AsyncQueue``, whose public methods drive these flows unchanged)."""

    _shards: list[QueueCore]  # the shards' Queue or AsyncQueue, in shard order

    def _setup_shards(
        self, shards: int, front_end: type[QueueCore], client: Any, settings: dict[str, Any]
    ) -> None:
        """Check the name and make the shards: queues of ``front_end`` on the same client."""
        if "#" in self.name:
            raise ConfigurationError(
                f"a sharded queue's name cannot contain '#' (it separates the name from the "
                f"shard in the shards' names, {self.name}#0 ...), got {self.name!r}"
            )
        self.shard_count = shards
        self.shard_names = shard_names(self.name, shards)
        with warnings.catch_warnings():  # the deprecated remember_done= warned once already
            warnings.simplefilter("ignore", DeprecationWarning)
            self._shards = [front_end(n, client, **settings) for n in self.shard_names]  # type: ignore[call-arg]
        self._by_name = {s.name: s for s in self._shards}
        self._layout_checked = False
        self._start = random.randrange(shards)  # where the next claim begins
        self._start_lock = threading.Lock()
        # the front end's DeadLetters and Crons would work on ``{name}`` keys: replaced
        dead = ShardedAsyncDeadLetters if issubclass(front_end, AsyncQueue) else ShardedDeadLetters
        setattr(self, "dead", dead(self))  # type: ignore[arg-type]  # noqa: B010  (self is one)
        crons = ShardedAsyncCrons if issubclass(front_end, AsyncQueue) else ShardedCrons
        setattr(self, "cron", crons(self))  # type: ignore[arg-type]  # noqa: B010  (self is one)

    # No key set names the logical queue: a flow not written for shards must not run on
    # ``{name}`` keys, where it would silently miss every task.
    @property
    def keys(self) -> QueueKeys:
        raise _not_yet(f"a single key set for {self.name!r} (each shard has its own)")

    @keys.setter
    def keys(self, _value: QueueKeys) -> None:
        """QueueCore sets it; a sharded queue keeps none."""

    def _wake_channels(self) -> list[str]:
        return [s.keys.wake for s in self._shards]

    def shard(self, task_id: str) -> QueueCore:
        """The shard's queue (a plain ``Queue`` or ``AsyncQueue``) that holds ``task_id``."""
        return self._shards[task_shard(task_id, self.shard_count)]

    def _owner(self, delivery: DeliveryBase) -> QueueCore:
        """The shard a delivery settles on (by name: any queue object of that shard will do)."""
        name = delivery._queue.name
        owner = self._by_name.get(name)
        if owner is None:
            raise ConfigurationError(
                f"delivery of task {delivery.id!r} came from queue {name!r}, not from a shard "
                f"of {self.name!r}"
            )
        return owner

    def _layout_flow(self) -> Flow[None]:
        """Once per object: refuse a different N, or a plain queue of this name with tasks;
        record N when the queue is new."""
        if self._layout_checked:
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
                protocol.command("SETNX", key, str(self.shard_count)),
                protocol.command("GET", key),
            )
        )
        found = None if recorded is None else text(recorded)
        if found != str(self.shard_count):
            raise ConfigurationError(
                f"queue {self.name!r} has {found} shards in Redis ({key}); it was opened with "
                f"shards={self.shard_count}. Changing N on a live queue would hide every task "
                f"whose id hashes to another shard: open it with shards={found}"
            )
        self._layout_checked = True

    # -- scheduling --------------------------------------------------------------------------

    def _schedule_records_flow(
        self, ids: list[str], records: list[bytes], replace: bool, fresh_ids: Iterator[str]
    ) -> Flow[ScheduleResult]:
        """Group the records by shard and send each group to its shard (batches as a plain
        queue's); the shards' calls of a round go together."""
        yield from self._layout_flow()
        groups: dict[int, list[int]] = defaultdict(list)
        for position, task_id in enumerate(ids):
            groups[task_shard(task_id, self.shard_count)].append(position)
        flows = [
            self._shards[i]._schedule_records_flow(
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
        return (i for i in generated_ids() if task_shard(i, self.shard_count) == shard)

    def _cancel_flow(self, task_id: str) -> Flow[bool]:
        yield from self._layout_flow()
        return (yield from self.shard(task_id)._cancel_flow(task_id))

    def _reschedule_flow(
        self, task_id: str, at: datetime | None, delay: Duration | None
    ) -> Flow[bool]:
        yield from self._layout_flow()
        return (yield from self.shard(task_id)._reschedule_flow(task_id, at, delay))

    def _run_now_flow(self, task_id: str) -> Flow[bool]:
        yield from self._layout_flow()
        return (yield from self.shard(task_id)._run_now_flow(task_id))

    # -- consuming ---------------------------------------------------------------------------

    def _claim_flow(
        self, limit: int, lease: Duration | None, holder: str | None = None
    ) -> Flow[ClaimBatch]:
        """Claim from the shards in turn until ``limit`` are leased (a claim of 0 visits all)."""
        whole_number(limit, "limit", low=0, high=MAX_CLAIM_BATCH)
        yield from self._layout_flow()
        with self._start_lock:
            start = self._start
            self._start = (start + 1) % self.shard_count
        deliveries: list[Any] = []
        batches: list[ClaimBatch] = []
        for step in range(self.shard_count):
            shard = self._shards[(start + step) % self.shard_count]
            batch: ClaimBatch = yield from shard._claim_flow(limit - len(deliveries), lease, holder)
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
        if len(batches) < self.shard_count:
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

    def _ack_flow(self, deliveries: Sequence[DeliveryBase]) -> Flow[int]:
        groups: dict[str, list[DeliveryBase]] = defaultdict(list)
        for d in deliveries:
            groups[self._owner(d).name].append(d)
        flows = [_refusals(self._by_name[k]._ack_flow(group)) for k, group in groups.items()]
        results = yield from _together(flows)
        _raise_combined("acked", deliveries, results)
        return sum(
            len(group) - len(refused) if acked is None else acked
            for group, (acked, refused, _) in zip(groups.values(), results, strict=True)
        )

    def _extend_many_flow(
        self, deliveries: Sequence[DeliveryBase], seconds: Duration
    ) -> Flow[datetime]:
        groups: dict[str, list[DeliveryBase]] = defaultdict(list)
        for d in deliveries:
            groups[self._owner(d).name].append(d)
        flows = [
            _refusals(self._by_name[k]._extend_many_flow(group, seconds))
            for k, group in groups.items()
        ]
        results = yield from _together(flows)
        _raise_combined("extended", deliveries, results)
        deadlines: list[datetime] = [r[0] for r in results]
        return min(deadlines)  # every lease was held, or _raise_combined raised

    def _extend_flow(self, delivery: DeliveryBase, seconds: Duration) -> Flow[datetime]:
        return (yield from self._owner(delivery)._extend_flow(delivery, seconds))

    def _fail_flow(
        self, delivery: DeliveryBase, error: BaseException | str, retry_in: Duration | None
    ) -> Flow[Outcome]:
        return (yield from self._owner(delivery)._fail_flow(delivery, error, retry_in))

    def _release_flow(self, delivery: DeliveryBase, delay: Duration) -> Flow[Outcome]:
        return (yield from self._owner(delivery)._release_flow(delivery, delay))

    # -- inspection --------------------------------------------------------------------------

    def _inspect_ids_flow(self, ids: Sequence[str]) -> Flow[list[TaskInfo]]:
        yield from self._layout_flow()
        groups: dict[int, list[str]] = defaultdict(list)
        for task_id in ids:
            groups[task_shard(task_id, self.shard_count)].append(task_id)
        flows = [self._shards[i]._inspect_ids_flow(group) for i, group in groups.items()]
        found = {info.id: info for part in (yield from _together(flows)) for info in part}
        return [found[i] for i in dict.fromkeys(ids) if i in found]

    def _stats_flow(self) -> Flow[QueueStats]:
        yield from self._layout_flow()
        parts: list[QueueStats] = yield from _together([s._stats_flow() for s in self._shards])
        return _sum_stats(parts)

    def _doctor_flow(self, fix: bool, batch: int) -> Flow[DoctorReport]:
        """Each shard checked on its own keys (findings name their shard), side by side."""
        yield from self._layout_flow()
        parts: list[DoctorReport] = yield from _together(
            [s._doctor_flow(fix, batch) for s in self._shards]
        )
        return DoctorReport(
            self.name,
            fix,
            [f for part in parts for f in part.findings],
            list(dict.fromkeys(note for part in parts for note in part.notes)),
        )

    # -- not yet on a sharded queue ----------------------------------------------------------

    def _list_flow(
        self, state: TaskState, *, limit: int = 100, cursor: str | None = None, **filters: Any
    ) -> Flow[TaskPage]:
        """One page of one shard's listing; the cursor names the shard and its cursor, and
        moves to the next shard when one is done (shard by shard, see the module docstring)."""
        index, inner = _split_cursor(cursor, self.shard_count)
        yield from self._layout_flow()
        page: TaskPage = yield from self._shards[index]._list_flow(
            state, limit=limit, cursor=inner, **filters
        )
        if page.cursor is not None:
            after: str | None = _join_cursor(index, page.cursor)
        else:
            after = _join_cursor(index + 1, None) if index + 1 < self.shard_count else None
        return TaskPage(page.tasks, after, page.looked_at)

    def _history_flow(self, minutes: int) -> Flow[list[HistoryPoint]]:
        """Each minute's counts summed over the shards (minutes matched by their start)."""
        yield from self._layout_flow()
        parts: list[list[HistoryPoint]] = yield from _together(
            [s._history_flow(minutes) for s in self._shards]
        )
        summed: dict[datetime, list[int]] = {}
        for part in parts:
            for point in part:
                row = summed.setdefault(point.minute, [0] * 6)
                for i, value in enumerate(astuple(point)[1:]):
                    row[i] += value
        latest = sorted(summed)[-minutes:]
        return [HistoryPoint(minute, *summed[minute]) for minute in latest]

    def _due_histogram_flow(self, bucket: Duration, buckets: int) -> Flow[DueHistogram]:
        """Bucket counts summed over the shards (each counts from its own clock's now)."""
        yield from self._layout_flow()
        parts: list[DueHistogram] = yield from _together(
            [s._due_histogram_flow(bucket, buckets) for s in self._shards]
        )
        return replace(
            parts[0],
            overdue=sum(p.overdue for p in parts),
            counts=[sum(column) for column in zip(*(p.counts for p in parts), strict=True)],
            later=sum(p.later for p in parts),
        )

    # -- settings ----------------------------------------------------------------------------

    def _configure_flow(
        self,
        *,
        paused: bool | None = None,
        remember_done: Duration | None = None,
        rate: Any = None,
        key_rate: Any = None,
        key_concurrency: Any = None,
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
        shares: list[Any] = [rate] * self.shard_count
        if rate is not None and rate is not False:
            if not isinstance(rate, Rate):
                raise ConfigurationError(f"rate must be a dueq.Rate or False, got {rate!r}")
            shares = rate_shares(rate, self.shard_count)
        yield from self._layout_flow()
        flows = [
            s._configure_flow(
                paused=paused,
                remember_done=remember_done,
                rate=share,
                key_rate=key_rate,
                key_concurrency=key_concurrency,
            )
            for s, share in zip(self._shards, shares, strict=True)
        ]
        settings: list[QueueSettings] = yield from _together(flows)
        return _logical_settings(settings)

    def _settings_flow(self) -> Flow[QueueSettings]:
        yield from self._layout_flow()
        settings: list[QueueSettings] = yield from _together(
            [s._settings_flow() for s in self._shards]
        )
        return _logical_settings(settings)

    # -- worker registry ---------------------------------------------------------------------

    def _workers_flow(self) -> Flow[list[WorkerInfo]]:
        """Every shard's registry merged: a worker beats into each shard, so one entry per
        worker id, from its latest beat."""
        yield from self._layout_flow()
        parts: list[list[WorkerInfo]] = yield from _together(
            [s._workers_flow() for s in self._shards]
        )
        return merge_workers(parts)

    def _heartbeat_flow(self, entry_json: str, ttl_ms: int, leave: bool) -> Flow[int]:
        """The beat (or the leave) on every shard, so each shard's own view shows the worker
        too; returns the most live workers any shard counts."""
        yield from self._layout_flow()
        live: list[int] = yield from _together(
            [s._heartbeat_flow(entry_json, ttl_ms, leave) for s in self._shards]
        )
        return max(live)


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
    _raise_not_held(done, refused, [i for i in refused if i in cancelled])


class _ShardedDead(DeadLettersCore):
    """The dead letters of a sharded queue: each shard's, merged (see the module docstring)."""

    _core: _Sharded

    def _shard_dead(self) -> list[DeadLettersCore]:
        return [s.dead for s in self._core._shards]  # type: ignore[attr-defined]

    def _list_flow(self, limit: int, offset: int) -> Flow[list[TaskInfo]]:
        """Each shard's newest ``offset + limit``, merged newest first, then the page."""
        whole_number(limit, "limit", low=0, high=MAX_OFFSET)
        whole_number(offset, "offset", low=0, high=MAX_OFFSET)
        if limit == 0:
            return []
        yield from self._core._layout_flow()
        flows = [d._list_flow(min(offset + limit, MAX_OFFSET), 0) for d in self._shard_dead()]
        parts: list[list[TaskInfo]] = yield from _together(flows)
        merged = sorted(
            (info for part in parts for info in part),
            key=lambda info: info.died_at.timestamp() if info.died_at else 0.0,
            reverse=True,
        )
        return merged[offset : offset + limit]

    def _count_flow(self) -> Flow[int]:
        yield from self._core._layout_flow()
        counts: list[int] = yield from _together([d._count_flow() for d in self._shard_dead()])
        return sum(counts)

    def _move_flow(
        self, action: str, ids: Iterable[str] | None, error_type: str | None = None
    ) -> Flow[int]:
        """By id: every id checked on its shard first (all-or-nothing, as on one queue), then
        moved; all, or by error type: on every shard."""
        yield from self._core._layout_flow()
        shard_dead = self._shard_dead()
        if ids is None or error_type is not None:
            if ids is not None:
                raise InvalidTaskError("give ids or error_type, not both")
            flows = [d._move_flow(action, None, error_type) for d in shard_dead]
            return sum((yield from _together(flows)))
        groups: dict[int, list[str]] = defaultdict(list)
        for task_id in _distinct_ids(ids):
            groups[task_shard(task_id, self._core.shard_count)].append(task_id)
        yield from _together([shard_dead[i]._check_dead_flow(g) for i, g in groups.items()])
        moved = yield from _together(
            [shard_dead[i]._move_flow(action, g) for i, g in groups.items()]
        )
        return sum(moved)


class ShardedDeadLetters(_ShardedDead, DeadLetters):
    """``q.dead`` of a ``ShardedQueue``."""


class ShardedAsyncDeadLetters(_ShardedDead, AsyncDeadLetters):
    """``q.dead`` of a ``ShardedAsyncQueue``."""


def _named(method: str) -> Callable[..., Flow[Any]]:
    """A cron flow of a sharded queue that goes to the shard of the definition's name."""

    def flow(self: _ShardedCrons, name: str, *args: Any) -> Flow[Any]:
        name = validate_cron_name(name)
        yield from self._core._layout_flow()
        crons = self._core._shards[shard_of(name, self._core.shard_count)].cron  # type: ignore[attr-defined]
        return (yield from getattr(crons, method)(name, *args))

    flow.__name__ = method
    return flow


class _ShardedCrons(CronsCore):
    """The cron definitions of a sharded queue: each on the shard of its name (see the
    module docstring); ``list`` merges every shard's."""

    _core: _Sharded

    _add_flow = _named("_add_flow")
    _remove_flow = _named("_remove_flow")
    _get_flow = _named("_get_flow")
    _pause_flow = _named("_pause_flow")
    _resume_flow = _named("_resume_flow")
    _run_now_flow = _named("_run_now_flow")

    def _list_flow(self) -> Flow[list[CronDefinition]]:
        yield from self._core._layout_flow()
        flows = [s.cron._list_flow() for s in self._core._shards]  # type: ignore[attr-defined]
        parts: list[list[CronDefinition]] = yield from _together(flows)
        return sorted((d for part in parts for d in part), key=lambda d: d.name)


class ShardedCrons(_ShardedCrons, Crons):
    """``q.cron`` of a ``ShardedQueue``."""


class ShardedAsyncCrons(_ShardedCrons, AsyncCrons):
    """``q.cron`` of a ``ShardedAsyncQueue``."""


def _settled_reply(send: Callable[[protocol.Step], Any], step: protocol.Step) -> tuple[bool, Any]:
    try:
        return True, send(step)
    except Exception as exc:  # thrown into the flow of that shard, which decides
        return False, exc


#: Threads that send the steps of an ``_Each`` to shards other than the first (per process).
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


class ShardedQueue(_Sharded, Queue):
    """``Queue(name, client, shards=N)`` with N > 1: see the module docstring."""

    def __init__(self, name: str, redis_client: Any, *, shards: int, **settings: Any) -> None:
        super().__init__(name, redis_client, **settings)
        self._setup_shards(shards, Queue, redis_client, settings)
        # one connection for every call: threads must not share it
        self._in_turn = getattr(redis_client, "connection", None) is not None

    def _send(self, step: Any) -> Any:
        send = super()._send
        if not isinstance(step, _Each):
            return send(step)
        first, *others = step.steps
        if not others or self._in_turn:
            return [_settled_reply(send, s) for s in step.steps]
        pool = _senders()
        futures = [pool.submit(_settled_reply, send, s) for s in others]
        return [_settled_reply(send, first), *(f.result() for f in futures)]


class ShardedAsyncQueue(_Sharded, AsyncQueue):
    """``AsyncQueue(name, client, shards=N)`` with N > 1: see the module docstring."""

    def __init__(self, name: str, redis_client: Any, *, shards: int, **settings: Any) -> None:
        super().__init__(name, redis_client, **settings)
        self._setup_shards(shards, AsyncQueue, redis_client, settings)

    async def _send(self, step: Any) -> Any:
        send = super()._send
        if not isinstance(step, _Each):
            return await send(step)
        replies = await asyncio.gather(*(send(s) for s in step.steps), return_exceptions=True)
        for reply in replies:
            if isinstance(reply, BaseException) and not isinstance(reply, Exception):
                raise reply  # cancelled: not a reply of the shard
        return [(not isinstance(r, Exception), r) for r in replies]


def sharded_class(front_end: type[Any], shards: object) -> type[Any]:
    """The class ``Queue(..., shards=)`` or ``AsyncQueue(..., shards=)`` makes: the front end
    itself for 1 shard, its sharded twin for more (a subclass of a front end cannot shard)."""
    whole_number(shards, "shards", low=1, high=MAX_SHARDS)
    if shards == 1 or issubclass(front_end, _Sharded):
        return front_end
    if front_end is Queue:
        return ShardedQueue
    if front_end is AsyncQueue:
        return ShardedAsyncQueue
    raise ConfigurationError(
        f"shards= is available on dueq.Queue and dueq.AsyncQueue, not on the subclass "
        f"{front_end.__name__}"
    )
