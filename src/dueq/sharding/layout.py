"""Where a sharded queue's tasks live: the shards' names, the shard of a task, and the
layout object (``ShardLayout``) that holds the shards' queues and checks N against Redis.
``dueq.sharding.flows`` runs the logical queue's flows over it; ``dueq.sharding.fanout`` sends them.

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
``test_shard_tags_land_in_their_slot_ranges`` pins the rule. The tags depend on N, so a
reshard (below) moves tasks between tags, not only between ids' shards.

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

Keyed tasks
-----------
A task with a limit key (``Task(key=)``) lies on the shard of its key, ``shard_of(key, N)``
(the same hash as ids), so that one shard's claim script sees every lease of the key and
``key_concurrency``/``key_rate`` hold exactly across the cluster with no cross-slot step.
Lookup stays by id, so a keyed task's id carries its key's *route*: it ends in ``~k`` and the
16 hex digits of the key's BLAKE2b-64 (``key_route``), and ``route(id)`` reads that number
back instead of hashing the id, so the id lies with its key for every N, not only today's (a
reshard moves the key's tasks to the key's new shard by id). A generated keyed id is a random
id with that ending; an explicit one must have it (``ShardedCore.task_id_for`` refuses one
that does not, even one that happens to hash to the key's shard today), and
``keyed_id(key, name)`` makes it from any name, deterministically, so a producer that re-runs
stays idempotent. A key that itself ends in a route (a keyed id used as a workflow's key)
passes that route on. 18 bytes per keyed id buy this; an id that merely ends in ``~k`` and 16
hex digits by chance is placed by them too, which is as good a spread as the hash.

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

N can change (``q.reshard(M)``, ``dueq.sharding.reshard``): while tasks move, the layout key
reads ``"N>M"`` and the layout is *migrating* (``LayoutRecord``): its queues are the M shards
of the new layout (in shard order, so ``shard(id)`` is the new placement) and then the old
layout's shards that the new one lacks; writes go by the new layout, and what looks up a task
by id asks its old shard first (``former_shard``). Once every task has moved, the key reads
``"M"``. The reshard HASH beside it (``reshard_key``) keeps every count the queue has had
(``past``): a queue object opened with one of them follows the record (a process started
before a reshard keeps working), and one opened with any other count is refused as before.
A dueq before resharding reads ``"N>M"`` as no count and refuses the queue.

"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

import redis.crc

from dueq._flows.drive import Flow
from dueq._util.checks import whole_number
from dueq._wire import protocol as protocol
from dueq._wire.envelope import (
    ROUTE_MARK,
    generated_ids,
    route_ending,
    validate_id,
    validate_key,
)
from dueq._wire.keys import QueueKeys, layout_key, reshard_key
from dueq._wire.snapshot import text
from dueq.cron.flows import OCCURRENCE_PREFIX, Occurrence
from dueq.delivery import DeliveryBase
from dueq.exceptions import ConfigurationError

if TYPE_CHECKING:
    from dueq._flows.core import QueueCore

__all__ = [
    "LAYOUT_RECHECK_S",
    "MAX_SHARDS",
    "ROUTE_MARK",
    "LayoutRecord",
    "ShardLayout",
    "id_on",
    "key_route",
    "keyed_id",
    "route",
    "shard_names",
    "shard_of",
    "task_shard",
]

#: Longest a queue object uses the layout it last read before reading it again (seconds): a
#: reshard's mover waits twice this long before it counts a shard empty, so that every queue
#: object in use writes by the new layout by then (``dueq.sharding.reshard``).
LAYOUT_RECHECK_S = 1.0
#: Most shards one queue may have (placing N shards costs about N * N CRC16s, once).
MAX_SHARDS = 256
#: Redis Cluster's hash slots.
SLOTS = 16384
#: Most tags tried per shard before giving up on the slot range (never reached in practice:
#: a try misses with probability 1 - 1/N).
MAX_TAG_TRIES = 64 * MAX_SHARDS


def route(text: str) -> int:
    """The 64-bit number whose ``mod N`` places ``text`` (a task id, a limit key, a batch or
    cron name) on shard ``route mod N`` of every count N: the route that ``text`` carries
    when it ends in ``~k<16 hex>`` (``keyed_id``), else BLAKE2b-64 of its UTF-8."""
    ending = route_ending(text)
    if ending:
        return int(ending[2:], 16)
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def shard_of(task_id: str, shards: int) -> int:
    """The shard (0 to ``shards - 1``) that holds ``task_id`` in a queue of ``shards`` shards:
    its ``route`` (BLAKE2b-64 of its UTF-8, or the route a keyed id carries) mod N, the same in
    every process and language (see the module docstring). A cron occurrence goes with its
    definition instead (``task_shard``)."""
    return route(task_id) % shards


def task_shard(task_id: str, shards: int) -> int:
    """The shard that holds ``task_id``: ``shard_of(id)``, except that a cron occurrence's id
    (``cron:<name>:<slot>`` or ``cron:<name>:now:<second>:<random>``) goes with its
    definition, on ``shard_of(name)``: the cron keeper schedules each next occurrence on the
    shard that claimed the last one."""
    name = _cron_name(task_id)
    return shard_of(task_id if name is None else name, shards)


def key_route(key: str) -> str:
    """The end (``~k<16 hex>``) that makes an id lie with limit key ``key`` for every count."""
    return f"{ROUTE_MARK}{route(key):016x}"


def keyed_id(key: str, name: str, shards: int | None = None) -> str:
    """A task id for ``name`` that lies on the shard of limit key ``key`` for every shard
    count: ``name`` itself when it already ends in the key's route, else ``name`` and that
    route (``~k`` and 16 hex digits: ``key_route``). A sharded queue keeps every task of a key
    on the key's shard (so per-key limits hold exactly, and a reshard moves the key's tasks
    together) and finds tasks by id, so a keyed task's explicit id must carry its key's
    route; this gives one, the same on every call and in every process, so scheduling it
    again is idempotent. ``shards`` is checked when given; the id does not depend on it."""
    if shards is not None:
        whole_number(shards, "shards", low=1, high=MAX_SHARDS)
    name, ending = validate_id(name), key_route(validate_key(key))
    return name if name.endswith(ending) else validate_id(name + ending)


def id_on(name: str, shard: int, shards: int) -> str:
    """``name`` when it lies on ``shard`` of ``shards``, else ``f"{name}~{n}"`` for the
    smallest ``n >= 1`` that does (about ``shards`` tries; the same in every process)."""
    candidate, n = name, 0
    while task_shard(candidate, shards) != shard:  # each try hits with probability 1/N
        n += 1
        candidate = f"{name}~{n}"
    return validate_id(candidate)


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


@dataclass(frozen=True)
class LayoutRecord:
    """What a sharded queue's layout key says: ``count`` shards (the new count while a reshard
    runs), ``former`` the old count while it runs (else None), and ``past``: every count the
    queue has had (from its reshard HASH; the counts a queue object may be opened with)."""

    count: int
    former: int | None = None
    past: tuple[int, ...] = ()

    @classmethod
    def parse(cls, name: str, raw: object, past: object = None) -> LayoutRecord:
        """The record of ``name`` from its layout key's value ("N" or "N>M") and its reshard
        HASH's ``past`` field ("3,5"); ConfigurationError for anything else."""
        value = text(raw) if isinstance(raw, bytes) else str(raw)
        before, arrow, after = value.partition(">")
        counts = [before, after] if arrow else [before]
        if not all(c.isdigit() and 1 <= int(c) <= MAX_SHARDS for c in counts):
            raise ConfigurationError(
                f"queue {name!r} records {value!r} shards in Redis ({layout_key(name)}), not a "
                f"count of 1 to {MAX_SHARDS} (or 'N>M' while a reshard runs)"
            )
        history = text(past) if isinstance(past, bytes) else (past or "")
        known = tuple(int(c) for c in str(history).split(",") if c.isdigit())
        if arrow:
            return cls(int(after), int(before), known)
        return cls(int(before), None, known)

    def text(self) -> str:
        """The layout key's value for this record."""
        return str(self.count) if self.former is None else f"{self.former}>{self.count}"

    def opens_with(self, shards: int) -> bool:
        """Whether a queue object given ``shards=`` may use this layout (it follows it)."""
        return shards in (self.count, self.former) or shards in self.past

    def names(self, name: str) -> tuple[str, ...]:
        """The shards' queue names: the new layout's in shard order, then the old layout's
        that the new one lacks."""
        own = shard_names(name, self.count)
        if self.former is None:
            return own
        return own + tuple(n for n in shard_names(name, self.former) if n not in own)


class ShardLayout:
    """The layout of a sharded queue: its name, N, the shards' names and queues (of the front
    end that made it), which shard holds a task or a delivery, and the read of its record in
    Redis. ``dueq.sharding.flows.ShardedCore`` runs the flows of the logical queue over them,
    and moves to another layout (``follow``) when the record changes (a reshard)."""

    def __init__(
        self,
        name: str,
        count: int,
        make_shard: Callable[[str], QueueCore],
        record: LayoutRecord | None = None,
        opened: int | None = None,
    ) -> None:
        """Check the name and make the shards, ``make_shard(shard_name)`` each: queues of the
        front end that asks, on its client, with its settings. ``record``: the layout in Redis
        (default: ``count`` shards, no reshard); ``opened``: the count the queue object was
        opened with (default ``count``)."""
        if "#" in name:
            raise ConfigurationError(
                f"a sharded queue's name cannot contain '#' (it separates the name from the "
                f"shard in the shards' names, {name}#0 ...), got {name!r}"
            )
        self.name = name
        self.record = LayoutRecord(count) if record is None else record
        #: the count writes and lookups hash ids by (the new count while a reshard runs)
        self.count = self.record.count
        #: the old count while a reshard runs, else None
        self.former = self.record.former
        self.opened = count if opened is None else opened
        self.names = self.record.names(name)
        self.make_shard = make_shard
        with warnings.catch_warnings():  # the deprecated remember_done= warns once, for the queue
            warnings.simplefilter("ignore", DeprecationWarning)
            #: the shards' queues (of the front end that made this layout): the layout's in
            #: shard order, then (while a reshard runs) the old layout's that it lacks
            self.queues = [make_shard(n) for n in self.names]
        self._by_name = {s.name: s for s in self.queues}
        self._former_names = None if self.former is None else shard_names(name, self.former)
        self._opened_once = False

    def follow(self, record: LayoutRecord) -> ShardLayout:
        """The layout of ``record``, keeping the shards' queue objects this one has."""
        known = self._by_name

        def make(shard_name: str) -> QueueCore:
            return known[shard_name] if shard_name in known else self.make_shard(shard_name)

        layout = ShardLayout(self.name, record.count, make, record, self.opened)
        layout.make_shard = self.make_shard
        layout._opened_once = True
        return layout

    def former_shard(self, task_id: str) -> QueueCore | None:
        """While a reshard runs, the old layout's shard of ``task_id`` when it is not the new
        one (the task may still be there), else None."""
        if self._former_names is None or self.former is None:
            return None
        former = self._by_name[self._former_names[task_shard(task_id, self.former)]]
        return None if former is self.shard(task_id) else former

    def read_flow(self) -> Flow[LayoutRecord]:
        """The layout record in Redis. The first time: refuse a plain queue of this name with
        tasks, and record ``opened`` when the queue is new. ConfigurationError when the record
        is not one this queue object may follow (``LayoutRecord.opens_with``)."""
        key = layout_key(self.name)
        if not self._opened_once:
            plain = QueueKeys.for_queue(self.name)
            held: int = yield protocol.command("EXISTS", plain.tasks, plain.dead, plain.cron)
            if held:
                raise ConfigurationError(
                    f"queue {self.name!r} holds tasks as a plain (unsharded) queue; a sharded "
                    f"queue of that name would not see them. Drain it first, or keep shards=1"
                )
            yield protocol.command("SETNX", key, str(self.opened))
        recorded, past = yield protocol.Batch(
            (
                protocol.command("GET", key),
                protocol.command("HGET", reshard_key(self.name), "past"),
            )
        )
        record = None if recorded is None else LayoutRecord.parse(self.name, recorded, past)
        if record is None or not record.opens_with(self.opened):
            found = None if record is None else record.text()
            raise ConfigurationError(
                f"queue {self.name!r} has {found} shards in Redis ({key}); it was opened with "
                f"shards={self.opened}. Changing N on a live queue would hide every task "
                f"whose id hashes to another shard: open it with shards={found}, or change N "
                f"with q.reshard(M) (dueq reshard QUEUE --to M)"
            )
        self._opened_once = True
        return record

    def wake_channels(self) -> list[str]:
        return [s.keys.wake for s in self.queues]

    def shard(self, task_id: str) -> QueueCore:
        """The shard's queue (a plain ``Queue`` or ``AsyncQueue``) that holds ``task_id``."""
        return self.queues[task_shard(task_id, self.count)]

    def owner(self, delivery: DeliveryBase) -> QueueCore:
        """The shard a delivery settles on (by name: any queue object of that shard will do)."""
        name = delivery.queue_name
        owner = self._by_name.get(name)
        if owner is None:
            raise ConfigurationError(
                f"delivery of task {delivery.id!r} came from queue {name!r}, not from a shard "
                f"of {self.name!r}"
            )
        return owner

    # -- scheduling --------------------------------------------------------------------------

    def fresh_ids(self, shard: int) -> Iterator[str]:
        """Generated ids that hash to ``shard``."""
        return (i for i in generated_ids() if task_shard(i, self.count) == shard)
