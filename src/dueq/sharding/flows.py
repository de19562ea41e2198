"""Sharded queues: one logical queue over N hash tags, so a Redis Cluster spreads it.

``Queue(name, client, shards=N)`` (and ``AsyncQueue``) with N > 1 is an ordinary ``Queue``
(``type(q) is Queue``) that holds a *layout*: a ``Sharded`` object of this module, made by the
front end with a factory that builds N ordinary queues of the same front end and settings,
its *shards* (``make_shard(name)``; this module never names the front ends, and imports
neither ``dueq.queue`` nor ``dueq.async_queue``). The layout makes the queue's *core* once, when
the queue is made: a ``ShardedCore`` (``dueq._flows.core`` says why a core, and the rule for flows
that use other flows), whose flows that reach the data (schedule, claim, ack, extend,
inspect, list, stats, settings, registry, ...) run the shards' own flows, side by side where
they can (``dueq.sharding.fanout``); a plain queue is its own core, so no flow asks which it
is. ``q.dead`` and ``q.cron`` are the front end's ``DeadLetters``/``Crons`` over the sharded
core's ``ShardedDeadFlows`` and ``ShardedCronFlows``, chosen with it. Every shard is a
plain queue with its own hash tag, so every Lua script still touches one slot and runs
unchanged; the shards only differ from other queues by name. ``shards=1`` (or no ``shards``)
is exactly the plain queue: no layout, same keys, and the flows as they were. Every queue
says what it is by plain attributes: ``shard_count`` (1 for a plain queue), ``shard_names``
(``(name,)``) and ``shard(task_id)`` (the queue of the shard that holds an id; a plain queue
itself).


Where the shards are and which one holds a task: ``dueq.sharding.layout`` (its ``ShardLayout``
is this module's ``Sharded`` without the core: ``ShardedCore`` holds the logical queue and
its layout, and the flows of the logical queue over them). How several shards are sent to at once:
``dueq.sharding.fanout``.

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
every shard's wake channel by sharded Pub/Sub (``dueq._consume.wake``): SSUBSCRIBE on the node that
holds the shard, where the shard's scripts SPUBLISH, so no wake is broadcast over the cluster.

Idle shards (issue 43). A claim does not ask a shard that its last claim (by this queue
object) found idle: with nothing due before its next due time (in its reply, or none), and no
lease out (settling a lease may make a task due at once: an ack releases a child, and a
delivery's own ``d.ack()``/``d.fail()``/``d.release()`` goes to its shard's queue object, which
this core does not see). The shard is asked again once its clock (that reply's now plus the
local monotonic time since the claim was sent, or the queue's injected clock) reaches that
time; once a wake message comes on its channel (the listener tells the core which:
``note_wake(channel)``; after every (re)subscription, all shards, as it may have missed some);
once this queue object writes onto it (schedule, reschedule, run_now, ``q.release_many``,
``q.fail``, configure: a resume; a signal, a dead-letter replay, a cron definition's add,
resume, run_now or backfill); and at the latest ``IDLE_RECHECK_S`` (1 s) after it was last
asked. Pub/Sub may lose a message (a reconnect, a script that could not SPUBLISH), and another
process's write is only heard by its wake, so that bound is the most latency a lost wake
costs: never a task lost or stuck. The next due time a claim reports includes the skipped
shards' (a consumer sleeps until the earliest). A claim of 0 asks every shard, as before. So
a consumer of one busy shard among N sends one claim script per claim, not N; an idle
consumer (heartbeat 5 s, above the bound) still asks every shard at each heartbeat.

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
limits (``key_rate``, ``key_concurrency``, ``key_limits``) go to every shard whole, not split:
every task of a key lies on the shard of its key (``ShardedCore.task_id_for``: a keyed task's
id ends in its key's route, which places it with the key for every shard count; a generated
id gets it, an explicit id without it is refused, and ``dueq.keyed_id`` makes one that has
it), so one claim script counts all of a key's leases, and lookup stays by id. Cron
occurrences keep their definition's shard, so a keyed cron's limit holds exactly only when
``shard_of(key) == shard_of(name)``.

Cron: a definition lives on shard ``shard_of(name)``, so its occurrences are scheduled,
claimed and advanced there by the shard's own cron keeper (``dueq.cron.flows``, unchanged);
``task_shard`` sends an occurrence's id (``cron:<name>:...``) to that shard, so ``get`` and
``cancel`` of an occurrence find it. ``q.cron.list()`` merges every shard's definitions.

Views: ``list_tasks``/``iter_tasks`` list shard by shard (each page comes from one shard,
in the state's order within it; the cursor names the shard and that shard's cursor), so
every task is listed once but not in one global order. ``history`` sums each minute's
counts over the shards (minutes matched by their start), ``due_histogram`` sums the buckets
(each shard counts from its own clock's now).

Resharding (``dueq.sharding.reshard``): every operation reads the layout record first, at
most once a second (``layout_flow``), and follows a change (``follow``): while a reshard runs
the layout holds the shards of both counts, writes go by the new one, and a lookup by id asks
the task's old shard first (``where_flow``). The idle and stir records are kept by shard name,
so a claim in flight while the layout changes marks nothing on the wrong shard.

Batches: every shard counts its own part of a batch, and the batch's home shard completes it
once every part has (``dueq.sharding.batches``: the note tasks, which ``claim_flow`` takes out
of what it claimed).

Spark: ``schedule_rows`` (batch writes) opens the queue with ``discovery.open_queue``, so its
batches go through the logical queue; the data source's streaming writer stages and commits
each micro-batch per shard, and its reader partitions each shard's sorted sets
(``_spark_source._queue_names``: the shards, read on the driver).

Server check (``check_server_flow``): each shard's version and ``maxmemory-policy`` are read
from the primary that holds it (the commands routed by one of its keys), side by side; any
shard before 6.2 refuses the queue, a risky policy is logged naming its shards, and the lowest
version decides sharded Pub/Sub. Once per queue object, one INFO pair per shard (shards on
one primary each ask it: the flows do not know which node holds which shard).

Failover: ``tests/sharding/test_shards_failover.py`` drains a queue of 3 shards on 3 primaries + 3
replicas (AOF, ``wait_replicas=1``) while one primary is failed over (``CLUSTER FAILOVER``, or
SIGKILL and election): nothing acked is delivered again, nothing is lost.

Not yet
-------
``q.keys`` (the Redis keys of a plain queue) raises ConfigurationError ("... not available on
a sharded queue": each shard has its own, ``q.shard(id).keys``); the other gaps (listing in one
global order, ``wait_replicas`` on an asyncio ``RedisCluster``, dependencies across shards,
resharding a queue with per-key limits, batches or cron definitions, the streaming Spark
writer's batches) are left to later issues
(``scripts/bench/shard_scaling.py`` is the multi-process benchmark).
"""

from __future__ import annotations

import base64
import binascii
import math
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import astuple, replace
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

from dueq._consume.wake import WakeSubscription
from dueq._flows.core import QueueCore
from dueq._flows.drive import Flow
from dueq._flows.lease import MAX_CLAIM_BATCH, raise_not_held
from dueq._flows.schedule import SentRecords
from dueq._util.checks import whole_number
from dueq._util.clock import Duration, clock_ms
from dueq._wire import protocol
from dueq._wire.envelope import validate_id, validate_key
from dueq._wire.protocol import STATS_TENANTS, DurableOp, StepReply
from dueq._wire.server_check import log_eviction_policy, server_version_ok
from dueq._wire.snapshot import text
from dueq.cron.flows import CronDefinition, CronsCore
from dueq.cron.flows import validate_name as validate_cron_name
from dueq.dead import MAX_OFFSET, DeadLettersCore, distinct_ids
from dueq.delivery import DeliveryBase, FailItem
from dueq.doctor import DoctorFinding, DoctorReport
from dueq.exceptions import ConfigurationError, InvalidTaskError, LeaseLost, TaskNotFound
from dueq.model import (
    MAX_CONCURRENCY,
    BatchInfo,
    ClaimBatch,
    DueHistogram,
    HistoryPoint,
    KeyRotation,
    Outcome,
    Progress,
    QueueSettings,
    QueueStats,
    Rate,
    ScheduleResult,
    ShardStats,
    StepInfo,
    Task,
    TaskInfo,
    TaskPage,
    TaskState,
    TenantShare,
)
from dueq.registry import WorkerInfo, merge_workers
from dueq.sharding.batches import ShardedBatches, batch_id
from dueq.sharding.fanout import together
from dueq.sharding.layout import (
    LAYOUT_RECHECK_S,
    MAX_SHARDS,
    LayoutRecord,
    ShardLayout,
    key_route,
    keyed_id,
    shard_names,
    shard_of,
    task_shard,
)
from dueq.sharding.reshard import Resharder

T = TypeVar("T")

#: Longest a claim skips a shard found idle without asking it again (seconds, local monotonic
#: time): a wake message lost by Pub/Sub (a reconnect, a script that could not SPUBLISH) or a
#: task another process wrote without one costs at most this much latency. Below the
#: consumers' default heartbeat (5 s), so an idle consumer's claims still ask every shard.
IDLE_RECHECK_S = 1.0

__all__ = [
    "Sharded",
    "ShardedCore",
    "ShardedCronFlows",
    "ShardedDeadFlows",
    "rate_shares",
    "sharded_layout",
]


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
        waiting=sum(p.waiting for p in parts),
        fair_lanes=sum(p.fair_lanes for p in parts),
        fair_claimed=sum(p.fair_claimed for p in parts),
        tenants=_sum_tenants(parts),
    )


def _shard_stats(name: str, part: QueueStats) -> ShardStats:
    """One shard's stats as its logical queue's ``QueueStats.shards`` lists them."""
    return ShardStats(
        name,
        part.scheduled,
        part.due_now,
        part.waiting,
        part.leased,
        part.dead,
        part.next_due_at,
        part.oldest_due_lag_s,
        part.missing,
    )


def _sum_tenants(parts: Sequence[QueueStats]) -> tuple[TenantShare, ...]:
    """The tenants of the shards' stats, each tenant's counts summed over the shards that
    reported it, its share of every shard's claims (the most due first, at most as many as a
    shard reports)."""
    due: dict[str, int] = defaultdict(int)
    claimed: dict[str, int] = defaultdict(int)
    for part in parts:
        for t in part.tenants:
            due[t.tenant] += t.due
            claimed[t.tenant] += t.claimed
    total = sum(p.fair_claimed for p in parts)
    merged = [
        TenantShare(
            name, due[name], claimed[name], round(claimed[name] / total, 4) if total else 0.0
        )
        for name in due
    ]
    merged.sort(key=lambda t: (-t.due, -t.claimed, t.tenant))
    return tuple(merged[: 2 * STATS_TENANTS])


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


def concurrency_shares(concurrency: int, shards: int) -> list[int]:
    """The queue-wide concurrency cap split over ``shards`` like ``rate_shares``: each shard's
    claim script counts only its own leases, so shard i caps at ``n // N`` (one more for the
    first ``n % N``) and the shards together never hold more than n. A shard's share may sit
    idle while another shard has more due work than its share. ConfigurationError when n < N."""
    whole_number(concurrency, "concurrency", low=1, high=MAX_CONCURRENCY)
    if concurrency < shards:
        raise ConfigurationError(
            f"a concurrency cap on a queue of {shards} shards is split over the shards (each "
            f"counts its own leases), so it must be at least {shards}, got {concurrency}"
        )
    base, extra = divmod(concurrency, shards)
    return [base + (1 if i < extra else 0) for i in range(shards)]


def _logical_settings(parts: Sequence[QueueSettings]) -> QueueSettings:
    """The settings of the logical queue from its shards': shard 0's, with the rate and the
    concurrency cap the shards' shares add up to (while a change is half written, shard 0's)."""
    first_part = parts[0]
    caps = [p.concurrency for p in parts]
    if all(c is not None for c in caps):
        first_part = replace(first_part, concurrency=sum(c for c in caps if c is not None))
    rates = [p.rate for p in parts]
    first = rates[0]
    if first is None or any(r is None or r.per_ms != first.per_ms for r in rates):
        return first_part
    return replace(first_part, rate=Rate(sum(r.n for r in rates if r is not None), first.per))


class _Idle(NamedTuple):
    """What a shard's last claim said when it had nothing due (``ShardedCore._claimed``)."""

    until_ms: float  # its next due time or lease deadline (its clock), inf when it has none
    now_ms: float  # its clock when that claim ran
    sent_s: float  # time.monotonic() when that claim was sent
    paused: bool
    fair: bool


class Sharded(ShardLayout):
    """The layout a front end makes for a sharded queue (``sharded_layout``), which makes the
    queue's core once (``QueueCore._choose_core``)."""

    def core(self, queue: QueueCore) -> ShardedCore:
        """The core of the logical ``queue`` over this layout."""
        return ShardedCore(queue, self)


class ShardedCore:
    """The core of a sharded queue (``dueq._flows.core.Core``): every operation of the logical
    ``queue`` over the shards of ``layout`` (see the module docstring). The flows that reach
    the data run the shards' own (plain) flows, side by side where they can; the flows that
    only put others together are the queue's (``QueueCore``), which reach their parts
    through ``queue._core``, this object. Made once per queue object."""

    def __init__(self, queue: QueueCore, layout: ShardLayout) -> None:
        #: the logical queue (its settings, its encoding, its flows that put others together)
        self.queue = queue
        #: the layout now (another one once the record in Redis changes: ``layout_flow``)
        self.layout = layout
        self._start = random.randrange(len(layout.queues))  # where the next claim begins
        self._lock = threading.Lock()  # the start, the idle shards and their stirs
        #: the shards the last claim of each found idle (by name; see ``_idle_shard``)
        self._idle: dict[str, _Idle] = {}
        #: per shard (by name), how often it was stirred (woken, written here): a claim sent
        #: before a stir does not mark its shard idle (it may have run before the write)
        self._stirs: dict[str, int] = defaultdict(int)
        self._read_s: float | None = None  # time.monotonic() of the last read of the layout
        self._by_channel = {s.keys.wake: s.name for s in layout.queues}
        self._batches = ShardedBatches(layout, self.stirred, self._batches_layout_flow)

    # -- the layout in Redis --------------------------------------------------------------------

    def layout_flow(self) -> Flow[None]:
        """Before every operation: read the layout record the first time, and again once
        ``LAYOUT_RECHECK_S`` has passed since the last read; when a reshard changed it, follow
        it (``follow``). One GET and one HGET a second, per queue object in use."""
        if self._read_s is not None and time.monotonic() - self._read_s < LAYOUT_RECHECK_S:
            return
        read_s = time.monotonic()
        record = yield from self.layout.read_flow()
        self._read_s = read_s
        if record != self.layout.record:
            self.follow(record)

    def follow(self, record: LayoutRecord) -> None:
        """Use the layout of ``record`` from now on (its shards' queue objects reused); the
        shards it adds are asked at the next claim."""
        layout = self.layout.follow(record)
        with self._lock:
            self.layout = layout
            self._by_channel = {s.keys.wake: s.name for s in layout.queues}
            self._batches = ShardedBatches(layout, self.stirred, self._batches_layout_flow)
            self._start %= len(layout.queues)
        self.queue.shard_count = layout.count
        self.queue.shard_names = layout.names

    def forget_layout_read(self) -> None:
        """Read the layout record again before the next operation (a reshard's flows)."""
        self._read_s = None

    def resharder(self) -> Resharder:
        """The flows of a reshard of this queue (``q.reshard``; ``dueq.sharding.reshard``)."""
        return Resharder(self)

    def _batches_layout_flow(self) -> Flow[ShardLayout]:
        """The layout for a batch's close: refused while a reshard runs (a batch's parts are
        counted per shard, and a reshard moves no batch member: docs/sharding.md)."""
        yield from self.layout_flow()
        layout = self.layout
        if layout.former is not None:
            raise ConfigurationError(
                f"queue {layout.name!r} is being resharded ({layout.record.text()} shards): "
                "batches wait until it is done"
            )
        return layout

    def where_flow(self, ids: Sequence[str]) -> Flow[dict[QueueCore, list[str]]]:
        """The shard that holds each of ``ids`` now, grouped: its shard in the layout; while a
        reshard runs, its old shard as long as the task (or its result, or done mark) is still
        there. A task only moves forward (old shard, then the old shard's ``moving`` record,
        then its new shard), so asking the old shard's keys in that order never misses it; one
        caught moving is asked again (at most ``MOVING_LOOKS`` times, a round trip each: the
        mover puts it in the next call). One pipeline per old shard."""
        layout = self.layout
        out: dict[QueueCore, list[str]] = defaultdict(list)
        asks: dict[QueueCore, list[str]] = defaultdict(list)
        for task_id in ids:
            former = layout.former_shard(task_id)
            (out[layout.shard(task_id)] if former is None else asks[former]).append(task_id)
        for _ in range(MOVING_LOOKS):
            if not asks:
                break
            looks = yield from together([_held_flow(s, group) for s, group in asks.items()])
            again: dict[QueueCore, list[str]] = defaultdict(list)
            for (shard, group), held in zip(asks.items(), looks, strict=True):
                for task_id, state in zip(group, held, strict=True):
                    if state == "here":
                        out[shard].append(task_id)
                    elif state == "moving":
                        again[shard].append(task_id)
                    else:
                        out[layout.shard(task_id)].append(task_id)
            asks = again
        for group in asks.values():  # still moving: its new shard has it by the time it is asked
            for task_id in group:
                out[layout.shard(task_id)].append(task_id)
        return out

    def _by_id_flow(
        self, task_id: str, op: Callable[[QueueCore], Flow[T]], found: Callable[[T], bool]
    ) -> Flow[T]:
        """``op`` on the shard that holds ``task_id`` (``where_flow``); while a reshard runs, a
        task the old shard no longer had when ``op`` ran (moved meanwhile) is asked on its new
        shard too."""
        yield from self.layout_flow()
        [(shard, _)] = (yield from self.where_flow([task_id])).items()
        home = self.layout.shard(task_id)
        if shard is home:
            return (yield from op(shard))
        try:
            result = yield from op(shard)
        except TaskNotFound:  # it moved between the look and the call
            return (yield from op(home))
        return result if found(result) else (yield from op(home))

    # -- placement ---------------------------------------------------------------------------

    def shard_queue(self, task_id: str) -> QueueCore:
        return self.layout.shard(task_id)

    def wake_channels(self) -> list[str]:
        return self.layout.wake_channels()

    def note_wake(self, channel: str | None) -> None:
        """A wake message came on ``channel`` (None: the listener (re)subscribed and may have
        missed some): the next claim asks that shard (every shard) again."""
        with self._lock:
            if channel is None:
                for s in self.layout.queues:
                    self._stir(s.name)
            elif (name := self._by_channel.get(channel)) is not None:
                self._stir(name)

    def _stir(self, name: str) -> None:
        """Shard ``name`` may have work now: the next claim asks it (under ``_lock``)."""
        self._idle.pop(name, None)
        self._stirs[name] += 1

    def stirred(self, *indexes: int) -> None:
        """Shards of the layout now, by index (out of range: a layout just left, ignored)."""
        with self._lock:
            queues = self.layout.queues
            for i in indexes:
                if 0 <= i < len(queues):
                    self._stir(queues[i].name)

    def stirred_names(self, *names: str) -> None:
        with self._lock:
            for name in names:
                self._stir(name)

    def _stirred_by(self, deliveries: Iterable[DeliveryBase]) -> None:
        """The shards of ``deliveries`` (settled here: released or failed back to due)."""
        self.stirred_names(*{d.queue_name for d in deliveries})

    def _idle_shard(self, index: str, now_s: float) -> _Idle | None:
        """What the last claim of shard ``index`` said when the shard is idle now (by its
        clock: its reply's now plus the local time since, or the queue's injected clock),
        else None. An entry older than ``IDLE_RECHECK_S`` is not trusted (under ``_lock``)."""
        idle = self._idle.get(index)
        if idle is None or now_s - idle.sent_s >= IDLE_RECHECK_S:
            return None
        return idle if self._shard_now_ms(idle, now_s) < idle.until_ms else None

    def _shard_now_ms(self, idle: _Idle, now_s: float) -> float:
        """Shard's clock now: the queue's injected clock, or the shard's now at its last claim
        plus the local time since that claim was sent (a little ahead: never a skip too long)."""
        if self.queue.clock is not None:
            return float(clock_ms(self.queue.clock))
        return idle.now_ms + (now_s - idle.sent_s) * 1000

    def _claimed(self, index: str, batch: ClaimBatch, sent_s: float, stirs: int) -> None:
        """Remember whether shard ``index`` is idle after its claim (sent at ``sent_s``,
        after ``stirs`` stirs): nothing due before its next due time, and no lease out. A
        shard with leases out is never idle: settling one (``d.ack()`` releasing a child,
        ``d.fail()`` for a retry now, ``d.release()``) goes to the shard's own queue object,
        which this core does not see, and may make a task due at once."""
        until_ms = math.inf if batch.next_due_ms is None else float(batch.next_due_ms)
        now_ms = batch.now_ms + batch.now_fraction_ms
        leases_out = batch.next_lease_deadline_ms is not None
        with self._lock:
            if leases_out or until_ms <= now_ms or self._stirs[index] != stirs:
                self._idle.pop(index, None)
            else:
                self._idle[index] = _Idle(until_ms, now_ms, sent_s, batch.paused, batch.fair)

    def part_flows(self) -> tuple[DeadLettersCore, CronsCore]:
        """The dead-letter and cron flows of the logical queue (its ``q.dead``, ``q.cron``)."""
        return ShardedDeadFlows(self.queue, self), ShardedCronFlows(self.queue, self)

    def batch_id(self, batch: object) -> str:
        return batch_id(batch)

    def check_parents(self, task_id: str, parents: list[str], generated: bool) -> None:
        """A task's parents must share its shard (the script that records the edges runs on
        one shard), so a task with parents needs an id of its own (``generated``: drawn)."""
        count = self.layout.count
        if generated:
            raise InvalidTaskError(
                "on a sharded queue a task with after= needs an id (its parents must be in "
                f"its shard): make the ids of one workflow with dueq.keyed_id(<workflow id>, "
                f"<name>, {count}), which puts them on one shard"
            )
        home = self.layout.shard(task_id)
        strangers = [p for p in parents if self.layout.shard(p) is not home]
        if strangers:
            raise InvalidTaskError(
                f"parents {strangers[:3]!r} are on another shard than {task_id!r}: on a "
                "sharded queue a task's parents must share its shard (the script that records "
                "and releases the edges runs on one shard). Make the ids of one workflow with "
                f"dueq.keyed_id(<workflow id>, <name>, {count}): they share its shard"
            )

    def task_id_for(self, position: int, task: Task, fresh_ids: Iterator[str]) -> str:
        """A keyed task lies on the shard of its key (``shard_of(key)``, see "Keyed tasks" in
        ``dueq.sharding.layout``), so that shard's claim script counts all of the key's
        leases, for every shard count (a reshard moves it with its key): its id carries the
        key's route (a generated one gets it, ``key_route``), and an explicit id without it is
        refused before the call writes anything (InvalidTaskError, as any bad task of a
        batch), even one that happens to hash to the key's shard today. A task without a key
        keeps its id, spread by id."""
        reserved = self._batches.check_task_id
        if task.key is None:
            return next(fresh_ids) if task.id is None else reserved(validate_id(task.id))
        try:
            ending = key_route(validate_key(task.key))
        except InvalidTaskError:  # the task's encoding refuses it, with its position
            return next(fresh_ids) if task.id is None else reserved(validate_id(task.id))
        if task.id is None:
            return next(fresh_ids) + ending
        task_id = reserved(validate_id(task.id))
        if not task_id.endswith(ending):
            key = task.key
            try:
                fitting = f" (= {keyed_id(key, task_id)!r})"
            except InvalidTaskError:  # no room for the route: the id is at its longest
                fitting = ""
            raise InvalidTaskError(
                f"task {position} ({task_id!r}): on a sharded queue every task of a key lies on "
                f"the shard of its key, for every shard count, so its id ends in the route of "
                f"key {key!r} ({ending!r}), and {task_id!r} does not. Leave the id out, or make "
                f"one with dueq.keyed_id({key!r}, {task_id!r}){fitting}"
            )
        return task_id

    # -- the queue's flows that put others together (they reach their parts through
    # ``queue._core``, this object, so none runs on the logical queue's keys)

    def schedule_many_flow(
        self, tasks: Iterable[Task], replace: bool, batch: str | None = None
    ) -> Flow[ScheduleResult]:
        return self.queue.schedule_many_flow(tasks, replace, batch)

    def check_server_flow(self) -> Flow[None]:
        """The server check of every shard's primary, side by side: each shard's version and
        ``maxmemory-policy`` asked of the node that holds its keys (routed by one of them: a
        command without keys would go to whichever node the cluster client picks, so one
        primary would stand for all). A version before 6.2 on any shard refuses the queue,
        naming the shard; once every shard passed, the queue and each shard are marked
        checked, the queue with the lowest version seen (it decides sharded Pub/Sub), and
        each risky policy is logged once, naming its shards and their primaries' ports."""
        checks = yield from together([self._shard_server_flow(s) for s in self.layout.queues])
        for shard, (version, _, _) in zip(self.layout.queues, checks, strict=True):
            shard.note_server_checked(version)
        versions = [version for version, _, _ in checks if version is not None]
        self.queue.note_server_checked(min(versions) if versions else None)
        where: dict[str, list[str]] = defaultdict(list)
        for shard, (_, policy, port) in zip(self.layout.queues, checks, strict=True):
            if policy is not None:
                where[text(policy)].append(f"{shard.name!r}" + (f" (port {port})" if port else ""))
        for policy, shards in where.items():
            log_eviction_policy(policy, f" on the primary of shard {', '.join(shards)}")

    @staticmethod
    def _shard_server_flow(
        shard: QueueCore,
    ) -> Flow[tuple[tuple[int, ...] | None, Any, str | None]]:
        """One shard's (version, ``maxmemory-policy``, port), asked of its primary."""
        route = shard.keys.due  # any key of the shard's hash tag: its slot's node
        version, port = yield from shard.server_info_flow(route)
        checked = server_version_ok(version, f"the primary of shard {shard.name!r}")
        return checked, (yield from shard.eviction_policy_flow(route)), port

    def wake_subscription_flow(self) -> Flow[WakeSubscription]:
        """The channels of the layout now: the wake listener asks after every read, so an
        idle consumer follows a reshard within a second too (one read of the record a
        second, ``layout_flow``) and listens on the new shards' channels."""
        yield from self.layout_flow()
        return (yield from self.queue.wake_subscription_flow())

    def get_flow(self, task_id: str) -> Flow[TaskInfo | None]:
        return self.queue.get_flow(task_id)

    def get_many_flow(self, task_ids: Iterable[str]) -> Flow[list[TaskInfo]]:
        return self.queue.get_many_flow(task_ids)

    def ended_subscription_flow(self, task_id: str) -> Flow[WakeSubscription]:
        return self.queue.ended_subscription_flow(task_id)

    def wait_check_flow(self, task_id: str) -> Flow[TaskInfo | None]:
        return self.queue.wait_check_flow(task_id)

    def doctor_flow(self, fix: bool, batch: int) -> Flow[DoctorReport]:
        return self.queue.doctor_flow(fix, batch)

    # -- scheduling --------------------------------------------------------------------------

    def schedule_records_flow(
        self, ids: list[str], records: list[bytes], replace: bool, fresh_ids: Iterator[str]
    ) -> Flow[ScheduleResult]:
        """Group the records by shard and send each group to its shard (batches as a plain
        queue's); the shards' calls of a round go together. A generated id that was taken is
        drawn again from the ids of its shard (not from ``fresh_ids``)."""
        yield from self.layout_flow()
        layout = self.layout
        if layout.former is None:
            places = [task_shard(task_id, layout.count) for task_id in ids]
        else:  # a reshard runs: an id still on its old shard is written there (the mover moves it)
            index = {s.name: i for i, s in enumerate(layout.queues)}
            where = yield from self.where_flow(ids)
            at = {task_id: index[s.name] for s, group in where.items() for task_id in group}
            places = [at[task_id] for task_id in ids]
        groups: dict[int, list[int]] = defaultdict(list)
        for position, place in enumerate(places):
            groups[place].append(position)
        flows = [
            layout.queues[i].send_records_flow(
                [ids[p] for p in positions],
                [records[p] for p in positions],
                replace,
                # (a group on an old shard holds ids it has: none is generated, none redrawn)
                layout.fresh_ids(min(i, layout.count - 1)),
            )
            for i, positions in groups.items()
        ]
        shards: list[SentRecords] = yield from together(flows)
        self.stirred(*groups)
        out = list(ids)
        sent = SentRecords(ScheduleResult(added=0, existing=0, replaced=0, ids=out))
        for positions, shard in zip(groups.values(), shards, strict=True):
            for p, task_id in zip(positions, shard.counts.ids, strict=True):
                out[p] = task_id  # a generated id that was taken got a fresh one
            sent.merge(shard)
        return sent.result()

    def close_batch_flow(self, batch: str, on_complete: Task | None) -> Flow[BatchInfo]:
        """Open the batch on its home shard and close every shard's part
        (``dueq.sharding.batches``)."""
        return self._batches.close_flow(batch, on_complete)

    def batch_flow(self, batch: str) -> Flow[BatchInfo | None]:
        return self._batches.read_flow(batch)

    def batches_flow(self, limit: int) -> Flow[list[BatchInfo]]:
        return self._batches.list_flow(limit)

    def cancel_flow(self, task_id: str) -> Flow[bool]:
        return self._by_id_flow(task_id, lambda s: s.cancel_flow(task_id), bool)

    def reschedule_flow(
        self, task_id: str, at: datetime | None, delay: Duration | None
    ) -> Flow[bool]:
        moved = yield from self._by_id_flow(
            task_id, lambda s: self._stirring(s, s.reschedule_flow(task_id, at, delay)), bool
        )
        return moved

    def run_now_flow(self, task_id: str) -> Flow[bool]:
        return self._by_id_flow(task_id, lambda s: self._stirring(s, s.run_now_flow(task_id)), bool)

    def _stirring(self, shard: QueueCore, flow: Flow[T]) -> Flow[T]:
        """``flow``, then ``shard`` stirred (it wrote there: the next claim asks it)."""
        result = yield from flow
        self.stirred_names(shard.name)
        return result

    # -- consuming ---------------------------------------------------------------------------

    def claim_flow(
        self, limit: int, lease: Duration | None, holder: str | None = None
    ) -> Flow[ClaimBatch]:
        """Claim from the shards in turn until ``limit`` are leased (a claim of 0 visits all),
        skipping the shards known idle (see the module docstring: "Idle shards"). The notes of
        batches it leased are taken out (``dueq.sharding.batches``); when they were all it
        leased and they completed a batch, it claims again (at most twice more), so a claim
        that returns nothing still means nothing was due, not "a completion task is due now"."""
        whole_number(limit, "limit", low=0, high=MAX_CLAIM_BATCH)
        yield from self.layout_flow()
        for _ in range(3):
            claimed, completed = yield from self._claim_round(limit, lease, holder)
            if claimed.deliveries or not completed:
                break
        return claimed

    def _claim_round(
        self, limit: int, lease: Duration | None, holder: str | None
    ) -> Flow[tuple[ClaimBatch, bool]]:
        """One claim over the shards; also whether the notes it took completed a batch."""
        layout = self.layout
        count = len(layout.queues)
        completed = False
        with self._lock:
            start = self._start % count
            self._start = (start + 1) % count
        deliveries: list[Any] = []
        batches: list[ClaimBatch] = []
        waits_ms = []  # from each shard's own claim and clock; anchored on the first claim
        skipped: list[_Idle] = []
        for step in range(count):
            index = (start + step) % count
            sent_s = time.monotonic()
            shard = layout.queues[index]
            with self._lock:
                idle = self._idle_shard(shard.name, sent_s) if limit else None
                stirs = self._stirs[shard.name]
            if idle is not None:
                skipped.append(idle)
                if idle.until_ms != math.inf:
                    waits_ms.append(idle.until_ms - self._shard_now_ms(idle, sent_s))
                continue
            batch: ClaimBatch = yield from shard.claim_flow(limit - len(deliveries), lease, holder)
            self._claimed(shard.name, batch, sent_s, stirs)
            batches.append(batch)
            kept, finished = yield from self._batches.take_notes_flow(batch.deliveries)
            deliveries += kept
            completed = completed or finished
            upcoming = [
                ms for ms in (batch.next_due_ms, batch.next_lease_deadline_ms) if ms is not None
            ]
            if upcoming:
                waits_ms.append(min(upcoming) - batch.now_ms - batch.now_fraction_ms)
            if limit and len(deliveries) >= limit:
                break
        if len(batches) + len(skipped) < count:
            waits_ms.append(0.0)  # stopped early: the shards not visited may have work now
        if batches:
            now_ms, fraction_ms = batches[0].now_ms, batches[0].now_fraction_ms
        else:  # every shard skipped: the first one's clock, as its claim would have read it
            clock_now_ms = self._shard_now_ms(skipped[0], time.monotonic())
            now_ms = int(clock_now_ms)
            fraction_ms = clock_now_ms - now_ms
        if completed:
            waits_ms.append(0.0)  # a completion task is due now on its home shard
        next_due_ms = int(now_ms + fraction_ms + min(waits_ms)) if waits_ms else None
        claimed = ClaimBatch(
            deliveries,
            now_ms,
            next_due_ms,
            None,
            fraction_ms,
            all(b.paused for b in batches) and all(i.paused for i in skipped),
            any(b.fair for b in batches) or any(i.fair for i in skipped),
        )
        return claimed, completed

    def ack_flow(self, deliveries: Sequence[DeliveryBase]) -> Flow[int]:
        groups: dict[QueueCore, list[DeliveryBase]] = defaultdict(list)
        for d in deliveries:
            groups[self.layout.owner(d)].append(d)
        flows = [_refusals(shard.ack_flow(group)) for shard, group in groups.items()]
        results = yield from together(flows)
        _raise_combined("acked", deliveries, results)
        return sum(
            len(group) - len(refused) if acked is None else acked
            for group, (acked, refused, _) in zip(groups.values(), results, strict=True)
        )

    def extend_many_flow(
        self, deliveries: Sequence[DeliveryBase], seconds: Duration
    ) -> Flow[datetime]:
        groups: dict[QueueCore, list[DeliveryBase]] = defaultdict(list)
        for d in deliveries:
            groups[self.layout.owner(d)].append(d)
        flows = [_refusals(s.extend_many_flow(group, seconds)) for s, group in groups.items()]
        results = yield from together(flows)
        _raise_combined("extended", deliveries, results)
        deadlines: list[datetime] = [r[0] for r in results]
        return min(deadlines)  # every lease was held, or _raise_combined raised

    def extend_flow(self, delivery: DeliveryBase, seconds: Duration) -> Flow[datetime]:
        return (yield from self.layout.owner(delivery).extend_flow(delivery, seconds))

    def release_many_flow(
        self, deliveries: Sequence[DeliveryBase], delay: Duration, *, hold: bool = False
    ) -> Flow[list[Outcome]]:
        """Each shard's deliveries released in one call per shard, side by side; the
        outcomes in the order given."""
        groups: dict[QueueCore, list[DeliveryBase]] = defaultdict(list)
        for d in deliveries:
            groups[self.layout.owner(d)].append(d)
        flows = [s.release_many_flow(group, delay, hold=hold) for s, group in groups.items()]
        results: list[list[Outcome]] = yield from together(flows)
        self._stirred_by(deliveries)
        by_delivery = {
            id(d): outcome
            for group, outcomes in zip(groups.values(), results, strict=True)
            for d, outcome in zip(group, outcomes, strict=True)
        }
        return [by_delivery[id(d)] for d in deliveries]

    def fail_flow(
        self, delivery: DeliveryBase, error: BaseException | str, retry_in: Duration | None
    ) -> Flow[Outcome]:
        outcome = yield from self.layout.owner(delivery).fail_flow(delivery, error, retry_in)
        self._stirred_by((delivery,))
        return outcome

    def fail_many_flow(self, items: Sequence[FailItem[DeliveryBase]]) -> Flow[list[Outcome]]:
        """Each shard's failures recorded in one call per shard, side by side; the outcomes in
        the order given."""
        groups: dict[QueueCore, list[int]] = defaultdict(list)  # shard -> item positions
        for i, item in enumerate(items):
            groups[self.layout.owner(item[0])].append(i)
        flows = [s.fail_many_flow([items[i] for i in group]) for s, group in groups.items()]
        results: list[list[Outcome]] = yield from together(flows)
        self._stirred_by(item[0] for item in items)
        outcomes: list[Outcome | None] = [None] * len(items)
        for group, shard_outcomes in zip(groups.values(), results, strict=True):
            for i, outcome in zip(group, shard_outcomes, strict=True):
                outcomes[i] = outcome
        return [o for o in outcomes if o is not None]  # (every item has one)

    def release_flow(
        self, delivery: DeliveryBase, delay: Duration, *, hold: bool = False
    ) -> Flow[Outcome]:
        outcome = yield from self.layout.owner(delivery).release_flow(delivery, delay, hold=hold)
        self._stirred_by((delivery,))
        return outcome

    # -- durable tasks: a task's shard holds its steps and signals ---------------------------

    def step_log_flow(self, delivery: DeliveryBase) -> Flow[list[StepInfo]]:
        return (yield from self.layout.owner(delivery).step_log_flow(delivery))

    def step_flow(
        self,
        delivery: DeliveryBase,
        op: DurableOp,
        position: int,
        head: str,
        value: str,
        extra: str = "",
    ) -> Flow[StepReply]:
        owner = self.layout.owner(delivery)
        return (yield from owner.step_flow(delivery, op, position, head, value, extra))

    def signal_flow(self, task_id: str, name: str, payload: object) -> Flow[int]:
        def send(shard: QueueCore) -> Flow[int]:  # a waiting task is due now: stirred
            return self._stirring(shard, shard.signal_flow(task_id, name, payload))

        return self._by_id_flow(task_id, send, lambda pending: True)

    # -- task progress: written on the delivery's shard, followed on the task's ---------------

    def progress_flow(self, delivery: DeliveryBase, obj: Any) -> Flow[int]:
        return (yield from self.layout.owner(delivery).progress_flow(delivery, obj))

    def progress_history_flow(self, task_id: str) -> Flow[list[Progress]]:
        return self.queue.progress_history_flow(task_id)

    def progress_subscription_flow(self, task_id: str) -> Flow[WakeSubscription]:
        return self.queue.progress_subscription_flow(task_id)

    def progress_follow_flow(
        self,
        task_id: str,
        timeout: Duration | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> Generator[Any, Any, None]:
        return self.queue.progress_follow_flow(task_id, timeout, monotonic)

    # -- inspection --------------------------------------------------------------------------

    def inspect_ids_flow(self, ids: Sequence[str]) -> Flow[list[TaskInfo]]:
        """Each id on the shard that holds it (``where_flow``); while a reshard runs, one not
        found on its old shard (moved meanwhile) is asked on its new shard too."""
        yield from self.layout_flow()
        layout = self.layout
        groups = yield from self.where_flow(list(dict.fromkeys(ids)))
        flows = [shard.inspect_ids_flow(group) for shard, group in groups.items()]
        found = {info.id: info for part in (yield from together(flows)) for info in part}
        moved: dict[QueueCore, list[str]] = defaultdict(list)
        for shard, group in groups.items():
            for task_id in group:
                if task_id not in found and shard is not layout.shard(task_id):
                    moved[layout.shard(task_id)].append(task_id)
        if moved:
            flows = [shard.inspect_ids_flow(group) for shard, group in moved.items()]
            found.update({info.id: info for part in (yield from together(flows)) for info in part})
        return [found[i] for i in dict.fromkeys(ids) if i in found]

    def stats_flow(self) -> Flow[QueueStats]:
        yield from self.layout_flow()
        layout = self.layout
        parts: list[QueueStats] = yield from together([s.stats_flow() for s in layout.queues])
        shards = tuple(
            _shard_stats(shard.name, part) for shard, part in zip(layout.queues, parts, strict=True)
        )
        resharding = None if layout.former is None else layout.record.text()
        return replace(_sum_stats(parts), shards=shards, resharding=resharding)

    def derived_state_flow(self, fix: bool, batch: int) -> Flow[DoctorReport]:
        """Each shard checked on its own keys (findings name their shard), side by side."""
        yield from self.layout_flow()
        parts: list[DoctorReport] = yield from together(
            [s.derived_state_flow(fix, batch) for s in self.layout.queues]
        )
        findings = [f for part in parts for f in part.findings]
        notes = list(dict.fromkeys(note for part in parts for note in part.notes))
        layout = self.layout
        moving: list[int] = yield from together(
            [_command_flow(protocol.command("HLEN", s.keys.moving)) for s in layout.queues]
        )
        for shard, count in zip(layout.queues, moving, strict=True):
            if count:
                findings.append(
                    DoctorFinding("moving_records", shard.name, count, 0, False, shard.name)
                )
        if layout.former is not None:
            notes.append(
                f"a reshard runs ({layout.record.text()} shards): `dueq reshard "
                f"{layout.name} --to {layout.count}` shows or resumes it"
            )
        return DoctorReport(layout.name, fix, findings, notes)

    def rotate_key_flow(
        self,
        to: str,
        batch: int,
        cursor: str | None,
        progress: Callable[[KeyRotation], Any] | None,
    ) -> Flow[KeyRotation]:
        """Each shard re-sealed in turn by its own flow (``_flows.rotate``); the cursor names
        the shard and that shard's cursor, as a listing's does, and the reports (and each
        progress report) add up the shards done before."""
        self.queue.rotation_codec(to)  # refused before anything is read
        yield from self.layout_flow()
        queues = self.layout.queues
        index, inner = _split_cursor(cursor, len(queues))
        report = KeyRotation(to, cursor=_join_cursor(index, inner))
        for i in range(index, len(queues)):
            before = report

            def logical(part: KeyRotation, i: int = i, before: KeyRotation = before) -> KeyRotation:
                after = _join_cursor(i, part.cursor) if part.cursor is not None else None
                if after is None and i + 1 < len(queues):
                    after = _join_cursor(i + 1, None)
                return replace(before.plus(part), cursor=after)

            def told(part: KeyRotation, logical: Callable[..., KeyRotation] = logical) -> None:
                if progress is not None:
                    progress(logical(part))

            part = yield from queues[i].rotate_key_flow(
                to, batch, inner if i == index else None, told
            )
            report = logical(part)
        return report

    def list_flow(
        self, state: TaskState, *, limit: int = 100, cursor: str | None = None, **filters: Any
    ) -> Flow[TaskPage]:
        """One page of one shard's listing; the cursor names the shard and its cursor, and
        moves to the next shard when one is done (shard by shard, see the module docstring)."""
        yield from self.layout_flow()
        queues = self.layout.queues
        index, inner = _split_cursor(cursor, len(queues))
        page: TaskPage = yield from queues[index].list_flow(
            state, limit=limit, cursor=inner, **filters
        )
        if page.cursor is not None:
            after: str | None = _join_cursor(index, page.cursor)
        else:
            after = _join_cursor(index + 1, None) if index + 1 < len(queues) else None
        return TaskPage(page.tasks, after, page.looked_at)

    def history_flow(self, minutes: int) -> Flow[list[HistoryPoint]]:
        """Each minute's counts summed over the shards (minutes matched by their start)."""
        yield from self.layout_flow()
        parts: list[list[HistoryPoint]] = yield from together(
            [s.history_flow(minutes) for s in self.layout.queues]
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
        yield from self.layout_flow()
        parts: list[DueHistogram] = yield from together(
            [s.due_histogram_flow(bucket, buckets) for s in self.layout.queues]
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
        paused: Any = None,
        remember_done: Any = None,
        keep_results: Any = None,
        rate: Any = None,
        key_rate: Any = None,
        key_concurrency: Any = None,
        concurrency: Any = None,
        key_limits: Any = None,
        events: Any = None,
        fairness: Any = None,
    ) -> Flow[QueueSettings]:
        """``paused`` and ``remember_done`` written to every shard, and ``rate`` split over
        them (``rate_shares``); everything is validated before any shard is written. Per-key
        limits (``key_rate``, ``key_concurrency``, ``key_limits``) go to every shard whole,
        not split: every task of a key lies on the shard of its key (``task_id_for``), whose
        claim script therefore enforces the key's whole limit (see docs/sharding.md).
        ``fairness`` and ``KeyLimit(weight=)`` go to every shard too: each shard shares its
        own claims between the tenants it holds (docs/fairness.md). While a reshard runs, a
        per-key limit or fairness cannot be turned on: the reshard moves keyed tasks on the
        promise that none is set (its start refuses one; ``dueq.sharding.reshard``)."""
        if rate is not None and rate is not False and not isinstance(rate, Rate):
            raise ConfigurationError(f"rate must be a dueq.Rate or False, got {rate!r}")
        yield from self.layout_flow()
        turned_on = [
            name
            for name, value in (
                ("key_rate", key_rate),
                ("key_concurrency", key_concurrency),
                ("key_limits", key_limits),
                ("fairness", fairness),
            )
            if value not in (None, False, 0) and value != {}
        ]
        if turned_on and self.layout.former is not None:
            raise ConfigurationError(
                f"a reshard of {self.layout.name!r} runs ({self.layout.record.text()} shards): "
                f"{', '.join(turned_on)} can be set once it is done (it moves keyed tasks on the "
                f"promise that no key limit is set; `dueq reshard {self.layout.name} --to "
                f"{self.layout.count}` finishes it)"
            )
        count = len(self.layout.queues)  # (while a reshard runs, the shares of old and new)
        caps: list[Any] = [concurrency] * count
        if concurrency not in (None, False, 0):
            caps = concurrency_shares(concurrency, count)
        shares: list[Any] = [rate] * count
        if rate is not None and rate is not False:
            shares = rate_shares(rate, count)
        flows = [
            s.configure_flow(
                paused=paused,
                remember_done=remember_done,
                keep_results=keep_results,
                events=events,
                rate=share,
                key_rate=key_rate,
                key_concurrency=key_concurrency,
                concurrency=cap,
                key_limits=key_limits or None,
                fairness=fairness,
            )
            for s, share, cap in zip(self.layout.queues, shares, caps, strict=True)
        ]
        settings: list[QueueSettings] = yield from together(flows)
        self.stirred(*range(len(self.layout.queues)))  # (a resume or a looser limit: all)
        return _logical_settings(settings)

    def settings_flow(self) -> Flow[QueueSettings]:
        yield from self.layout_flow()
        settings: list[QueueSettings] = yield from together(
            [s.settings_flow() for s in self.layout.queues]
        )
        return _logical_settings(settings)

    # -- worker registry ---------------------------------------------------------------------

    def workers_flow(self) -> Flow[list[WorkerInfo]]:
        """Every shard's registry merged: a worker beats into each shard, so one entry per
        worker id, from its latest beat."""
        yield from self.layout_flow()
        parts: list[list[WorkerInfo]] = yield from together(
            [s.workers_flow() for s in self.layout.queues]
        )
        return merge_workers(parts)

    def heartbeat_flow(self, entry_json: str, ttl_ms: int, leave: bool) -> Flow[int]:
        """The beat (or the leave) on every shard, so each shard's own view shows the worker
        too; returns the most live workers any shard counts."""
        yield from self.layout_flow()
        live: list[int] = yield from together(
            [s.heartbeat_flow(entry_json, ttl_ms, leave) for s in self.layout.queues]
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


#: Most looks ``ShardedCore.where_flow`` gives a task it finds moving (one round trip each).
MOVING_LOOKS = 50


def _held_flow(shard: QueueCore, ids: list[str]) -> Flow[list[str]]:
    """Whether each of ``ids`` is on ``shard`` ("here": a task, result or done mark), being
    moved off it ("moving"), or neither ("gone"), asked in the order a task leaves."""
    k = shard.keys
    commands: list[protocol.Command[Any]] = []
    for task_id in ids:
        commands += (
            protocol.command("HEXISTS", k.tasks, task_id),
            protocol.command("HEXISTS", k.results, task_id),
            protocol.command("ZSCORE", k.done, task_id),
            protocol.command("HEXISTS", k.moving, task_id),
        )
    replies = yield protocol.Batch(tuple(commands))
    out = []
    for i in range(len(ids)):
        task, result, done, moving = replies[4 * i : 4 * i + 4]
        out.append("here" if task or result or done is not None else "moving" if moving else "gone")
    return out


def _command_flow(command: protocol.Command[T]) -> Flow[T]:
    reply: T = yield command
    return reply


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

    def __init__(self, queue: QueueCore, core: ShardedCore) -> None:
        super().__init__(queue)
        #: the sharded core: its layout now, and its stirs (a replay makes tasks due on their
        #: shards, no longer idle)
        self._sharded = core

    @property
    def _layout(self) -> ShardLayout:
        return self._sharded.layout

    @property
    def _shard_dead(self) -> list[DeadLettersCore]:
        return [DeadLettersCore(s) for s in self._sharded.layout.queues]

    def list_flow(self, limit: int, offset: int) -> Flow[list[TaskInfo]]:
        """Each shard's newest ``offset + limit``, merged newest first, then the page."""
        whole_number(limit, "limit", low=0, high=MAX_OFFSET)
        whole_number(offset, "offset", low=0, high=MAX_OFFSET)
        if limit == 0:
            return []
        yield from self._sharded.layout_flow()
        flows = [d.list_flow(min(offset + limit, MAX_OFFSET), 0) for d in self._shard_dead]
        parts: list[list[TaskInfo]] = yield from together(flows)
        merged = sorted(
            (info for part in parts for info in part),
            key=lambda info: info.died_at.timestamp() if info.died_at else 0.0,
            reverse=True,
        )
        return merged[offset : offset + limit]

    def count_flow(self) -> Flow[int]:
        yield from self._sharded.layout_flow()
        counts: list[int] = yield from together([d.count_flow() for d in self._shard_dead])
        return sum(counts)

    def move_flow(
        self, action: str, ids: Iterable[str] | None, error_type: str | None = None
    ) -> Flow[int]:
        """By id: every id checked on its shard first (all-or-nothing, as on one queue), then
        moved; all, or by error type: on every shard."""
        yield from self._sharded.layout_flow()
        shard_dead = self._shard_dead
        if ids is None or error_type is not None:
            if ids is not None:
                raise InvalidTaskError("give ids or error_type, not both")
            flows = [d.move_flow(action, None, error_type) for d in shard_dead]
            moved_all: list[int] = yield from together(flows)
            self._sharded.stirred(*range(len(self._layout.queues)))
            return sum(moved_all)
        where = yield from self._sharded.where_flow(distinct_ids(ids))
        groups = [(DeadLettersCore(shard), group) for shard, group in where.items()]
        yield from together([dead.check_dead_flow(g) for dead, g in groups])
        moved = yield from together([dead.move_flow(action, g) for dead, g in groups])
        self._sharded.stirred_names(*(shard.name for shard in where))
        return sum(moved)


def _named(method: str) -> Callable[..., Flow[Any]]:
    """A cron flow of a sharded queue that goes to the shard of the definition's name."""

    def flow(self: ShardedCronFlows, name: str, *args: Any) -> Flow[Any]:
        name = validate_cron_name(name)
        yield from self._sharded.layout_flow()
        layout = self._layout
        former = layout.former
        if former is not None and method != "get_flow":
            raise ConfigurationError(
                f"queue {layout.name!r} is being resharded ({layout.record.text()} shards): "
                "cron definitions change once it is done (they move with it)"
            )
        index = shard_of(name, layout.count)
        if former is not None:  # a reshard runs: the definition is on its old shard until moved
            names = [s.name for s in layout.queues]
            old = names.index(shard_names(layout.name, former)[shard_of(name, former)])
            found = yield from self._shard_crons[old].get_flow(name)
            if found is not None:
                return found
        done = yield from getattr(self._shard_crons[index], method)(name, *args)
        self._sharded.stirred(index)  # an occurrence it adds is due on that shard (no longer idle)
        return done

    flow.__name__ = method
    return flow


class ShardedCronFlows(CronsCore):
    """The cron flows of a sharded queue (its ``q.cron`` drives them): each definition on
    the shard of its name (see the module docstring); ``list`` merges every shard's. The
    shards' claims keep their own definitions (each shard's queue has its own keeper)."""

    def __init__(self, queue: QueueCore, core: ShardedCore) -> None:
        super().__init__(queue)
        self._sharded = (
            core  # as ``ShardedDeadFlows``'s: what a definition adds is due on its shard
        )

    @property
    def _layout(self) -> ShardLayout:
        return self._sharded.layout

    @property
    def _shard_crons(self) -> list[CronsCore]:
        return [CronsCore(s) for s in self._sharded.layout.queues]

    add_flow = _named("add_flow")
    remove_flow = _named("remove_flow")
    get_flow = _named("get_flow")
    pause_flow = _named("pause_flow")
    resume_flow = _named("resume_flow")
    run_now_flow = _named("run_now_flow")
    backfill_flow = _named("backfill_flow")

    def list_flow(self) -> Flow[list[CronDefinition]]:
        yield from self._sharded.layout_flow()
        flows = [c.list_flow() for c in self._shard_crons]
        parts: list[list[CronDefinition]] = yield from together(flows)
        return sorted((d for part in parts for d in part), key=lambda d: d.name)
