"""Changing a sharded queue's shard count online: ``q.reshard(M)`` and ``dueq reshard``.

The layout record (``dueq.sharding.layout``: the layout key ``dueq:{<name>#}:shards`` and the
reshard HASH beside it) says where tasks are. A reshard from N to M shards runs in three
parts, each safe to stop (SIGKILL included) and to run again, which resumes it:

1. **Start** (``start_flow``). Refused while the queue has what a reshard cannot move yet
   (below). The new shards get the queue's settings (each shard's config HASH copied from
   shard 0, then the queue-wide rate and concurrency cap split again over every shard of
   both layouts), the HASH records the old and new counts, every count the queue has had
   (``past``), the start time and a cursor, and the layout key becomes ``"N>M"``.
2. **Move** (``step_flow``, one bounded step a call). Every queue object reads the record at
   least once a second (``LAYOUT_RECHECK_S``) and follows it: it writes new tasks by the new
   layout, claims from the shards of both, and finds a task by id on its old shard while it
   is still there (``ShardedCore.where_flow``). The mover walks each shard's sorted sets
   (``moving`` records first, then the due levels, dead, kept results, done marks, leases)
   with ZSCAN, ``batch`` ids a step, and moves each task that lies on a shard other than its
   new one with ``lua/reshard.lua``: "take" on its shard (the whole state into one
   ``moving`` record there, atomically), "put" on its new shard (a part that shard has
   already wins), "drop" on the old one. A leased task is not taken: it is counted
   ``waiting`` and moved by a later pass once it settles (acked: nothing to move; failed:
   back in due). The cursor and the counts are written to the HASH after every step, and a
   restarted mover first puts and drops what a killed one left in ``moving`` (a record it had
   put already is skipped: the new shard keeps each put record's token in ``arrived`` until
   the end, so a task that ran and ended there since is not brought back; the 200,000-task
   soak, ``scripts/chaos/reshard.py``, found 179 such re-runs before the tokens).
3. **Finish**, at the end of a pass that found nothing to move and nothing waiting, began at
   least ``2 * LAYOUT_RECHECK_S`` after the start (so no queue object still writes by the old
   layout), and sees every old shard the new layout drops without tasks: the layout key
   becomes ``"M"``.

So no task is lost or copied (a task is on exactly one shard but for the instants between
take and drop, when lookups wait for it: ``where_flow``), none runs early (its due time
moves with it), and its attempts, errors, steps, signals, result and done mark move with it.

Refused for now, with the reason (docs/sharding.md, "Resharding"): a queue with per-key limits
or fairness (a key's tasks and its counts would have to move together while none is leased,
with the key's claims fenced meanwhile), open batches (each shard counts its part), tasks
waiting for parents (their edges live on their shard), and outcome events (a reader's per-shard
streams are fixed when it is made); turning on a key limit or fairness while a reshard runs is
refused too (``ShardedCore.configure_flow``). A keyed task moves like any other: its id
carries its key's route (``dueq.sharding.layout``, "Keyed tasks"), so its new shard is its
key's. One whose id lacks the route (stored by an earlier dueq) or whose key has a state on its
shard (a ``KeyCooldown``'s mark) is not moved (``kept``): it runs where it is (claims cover both
layouts) and the reshard ends once it has ended. Batches and changes to cron definitions wait
until the reshard is done (refused meanwhile).

Cron definitions move (the ``cron`` walk, before a shard's tasks): a definition and its
pending occurrence in one record ("take_crons"), so the claim that takes the occurrence on the
new shard finds the definition there and schedules the next one; an occurrence whose
definition is still on its shard is not taken by the task walks (``_with_definition_flow``). A
definition whose latest occurrence has not ended (or has one buffered) waits: that
occurrence's outcome is noted where it runs. One mover at a time: two movers of
one reshard move nothing twice (every step is idempotent), but their counts add up wrong.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from dueq._flows.drive import Flow
from dueq._util.checks import whole_number
from dueq._wire import protocol
from dueq._wire.keys import QueueKeys, layout_key, reshard_key
from dueq._wire.snapshot import text
from dueq.cron.flows import Occurrence
from dueq.exceptions import ConfigurationError
from dueq.model import QueueSettings, Rate, ReshardReport
from dueq.sharding.fanout import together
from dueq.sharding.layout import (
    LAYOUT_RECHECK_S,
    MAX_SHARDS,
    LayoutRecord,
    ShardLayout,
    shard_of,
)

if TYPE_CHECKING:
    from dueq._flows.core import QueueCore

__all__ = ["IDLE_S", "Resharder"]

#: The sorted sets (and the ``moving`` HASH) the mover walks on each shard, in order: a shard's
#: ``moving`` records (left by a killed mover) first, the sets whose tasks it moves, then the
#: leases, which it only counts.
WALK = ("moving", "cron", *(f"due{p}" for p in range(10)), "dead", "finished", "done", "leased")
#: How long the front ends wait after a pass that moved nothing (leases out, or the start's
#: grace for writers of the old layout) before the next step (seconds).
IDLE_S = 0.2
#: The counters of the reshard HASH (reset when a reshard starts).
COUNTS = ("moved", "existing", "pass_moved", "pass_waiting", "pass_kept")
#: Most ids a step looks at (ZSCAN's COUNT is a hint: a step may see a few more).
MAX_BATCH = 10_000


def _number(fields: dict[str, Any], name: str) -> int:
    raw = fields.get(name)
    return 0 if raw is None else int(text(raw))


class ReshardCore(Protocol):
    """What a reshard uses of the sharded core (``dueq.sharding.flows.ShardedCore``)."""

    layout: ShardLayout

    def forget_layout_read(self) -> None: ...
    def layout_flow(self) -> Flow[None]: ...
    def follow(self, record: LayoutRecord) -> None: ...
    def stirred_names(self, *names: str) -> None: ...
    def settings_flow(self) -> Flow[QueueSettings]: ...
    def configure_flow(
        self, *, rate: Any = None, concurrency: Any = None
    ) -> Flow[QueueSettings]: ...


class Resharder:
    """The flows of one reshard of a sharded queue (its ``ShardedCore``): ``start_flow``, then
    ``step_flow`` until its report is ``done``; the front ends drive them (``q.reshard``)."""

    def __init__(self, core: ReshardCore) -> None:
        self._core = core
        self._name = core.layout.name
        self._key = reshard_key(self._name)

    # -- start -------------------------------------------------------------------------------

    def start_flow(self, to: int) -> Flow[ReshardReport]:
        """Begin (or resume) the reshard to ``to`` shards; the report of where it stands."""
        whole_number(to, "shards", low=1, high=MAX_SHARDS)
        if to == 1:
            raise ConfigurationError(
                "a sharded queue cannot become a plain one (shards=1 has other keys): reshard "
                "to 2 or more"
            )
        core = self._core
        core.forget_layout_read()
        yield from core.layout_flow()
        record = core.layout.record
        if record.former is not None:
            if record.count != to:
                raise ConfigurationError(
                    f"queue {self._name!r} is being resharded {record.text()}: finish that "
                    f"first (q.reshard({record.count}), or dueq reshard {self._name} --to "
                    f"{record.count})"
                )
            return (yield from self.report_flow())
        if record.count == to:
            return ReshardReport(self._name, to, to, done=True)
        settings = yield from self._refusals_flow(LayoutRecord(to, record.count))
        yield from self._copy_config_flow(record.count, to)
        past = ",".join(str(n) for n in dict.fromkeys((*record.past, record.count, to)))
        migrating = LayoutRecord(to, record.count, tuple(int(n) for n in past.split(",")))
        yield protocol.Batch(
            (
                _hset(
                    self._key,
                    {
                        "past": past,
                        "from": record.count,
                        "to": to,
                        "started_ms": int(time.time() * 1000),
                        "pass_started_ms": int(time.time() * 1000),
                        "cursor": "0/0/0",
                        "passes": 1,
                        **dict.fromkeys(COUNTS, 0),  # (a reshard before this one counted too)
                        # the queue-wide limits, split again over the new shards at the end
                        "rate_n": settings.rate.n if settings.rate else 0,
                        "rate_per_ms": settings.rate.per_ms if settings.rate else 0,
                        "concurrency": settings.concurrency or 0,
                    },
                ),
                protocol.command("SET", layout_key(self._name), migrating.text()),
            )
        )
        core.follow(migrating)
        if settings.rate is not None or settings.concurrency is not None:
            # the queue-wide rate and cap split again over the shards of both layouts
            yield from core.configure_flow(rate=settings.rate, concurrency=settings.concurrency)
        return (yield from self.report_flow())

    def _refusals_flow(self, migrating: LayoutRecord) -> Flow[QueueSettings]:
        """ConfigurationError naming what this queue holds that a reshard to ``migrating``
        cannot move yet; else the queue's settings."""
        core = self._core
        settings = yield from core.settings_flow()
        reasons = []
        both = len(migrating.names(self._name))  # the shards while the reshard runs
        if settings.rate is not None and settings.rate.n < both:
            reasons.append(
                f"the rate {settings.rate} is split over the {both} shards of both layouts "
                f"while the reshard runs, so it needs n >= {both}"
            )
        if settings.concurrency is not None and settings.concurrency < both:
            reasons.append(
                f"the concurrency cap {settings.concurrency} is split over the {both} shards "
                f"of both layouts while the reshard runs, so it needs to be >= {both}"
            )
        if settings.key_rate or settings.key_concurrency or settings.key_limits:
            reasons.append("per-key limits are set (key_rate, key_concurrency, key_limits)")
        if settings.fairness:
            reasons.append("fairness is on")
        if settings.events:  # a reader's streams (one per shard) are fixed when it is made
            reasons.append("outcome events are on (configure(events=False) first)")
        counts: list[tuple[int, ...]] = yield from together(
            [_holdings_flow(s.keys) for s in core.layout.queues]
        )
        batches, waiting, keys = (sum(c[i] for c in counts) for i in range(3))
        if batches:
            reasons.append(f"{batches} records of open batches (let them complete first)")
        if waiting:
            reasons.append(f"{waiting} tasks wait for their parents (after=)")
        if keys:
            reasons.append(f"{keys} limit keys hold leases or parked tasks")
        if reasons:
            raise ConfigurationError(
                f"queue {self._name!r} cannot be resharded yet: "
                + "; ".join(reasons)
                + " (docs/sharding.md, 'Resharding')"
            )
        return settings

    def _copy_config_flow(self, count: int, to: int) -> Flow[None]:
        """Give the new shards the queue's settings: shard 0's config HASH copied to each (the
        start then splits the rate and concurrency cap again over the shards of both layouts,
        as ``configure`` splits them while the reshard runs)."""
        core = self._core
        config = yield protocol.command("HGETALL", core.layout.queues[0].keys.config)
        new = [n for n in LayoutRecord(to, count).names(self._name) if n not in core.layout.names]
        if config and new:
            copies = [_hset(QueueKeys.for_queue(n).config, config) for n in new]
            yield from together([_command_flow(c) for c in copies])

    # -- move --------------------------------------------------------------------------------

    def report_flow(self) -> Flow[ReshardReport]:
        """Where the reshard stands, from its HASH and the layout key."""
        core = self._core
        core.forget_layout_read()
        yield from core.layout_flow()
        fields = yield protocol.command("HGETALL", self._key)
        fields = {text(k): v for k, v in (fields or {}).items()}
        record = core.layout.record
        if record.former is None:
            return ReshardReport(
                self._name,
                _number(fields, "from") or record.count,
                record.count,
                _number(fields, "moved"),
                _number(fields, "existing"),
                passes=_number(fields, "passes"),
                done=True,
            )
        return ReshardReport(
            self._name,
            record.former,
            record.count,
            _number(fields, "moved"),
            _number(fields, "existing"),
            _number(fields, "pass_waiting"),
            _number(fields, "pass_kept"),
            _number(fields, "passes"),
            cursor=text(fields.get("cursor", b"0/0/0")),
            left=_number(fields, "left"),
        )

    def step_flow(self, batch: int) -> Flow[ReshardReport]:
        """One bounded step of the mover at its cursor (see the module docstring); at the end
        of a pass, the finish or the next pass."""
        whole_number(batch, "batch", low=1, high=MAX_BATCH)
        core = self._core
        yield from core.layout_flow()
        layout = core.layout
        if layout.former is None:
            return (yield from self.report_flow())
        fields = yield protocol.command("HGETALL", self._key)
        fields = {text(k): v for k, v in (fields or {}).items()}
        shard_index, set_index, cursor = (
            int(p) for p in text(fields.get("cursor", b"0/0/0")).split("/")
        )
        shards = layout.queues
        if shard_index >= len(shards):
            shard_index, set_index, cursor = 0, 0, 0
        shard = shards[shard_index]
        walk = WALK[set_index]
        moved = existing = waiting = kept = 0
        if walk == "moving":
            cursor, records = yield protocol.moving_scan(shard.keys, cursor, batch)
            moved, existing = yield from self._put_flow(shard, records)
        elif walk == "cron":  # definitions, each with its pending occurrence, before the tasks
            cursor, names = yield protocol.cron_names_scan(shard.keys, cursor, batch)
            leaving = [n for n in names if _cron_home(layout, n) is not shard]
            if leaving:
                crons: protocol.Taken = yield protocol.reshard_take_crons(
                    shard.keys, shard.now_arg(), leaving
                )
                waiting, kept = crons.leased, crons.kept
                moved, existing = yield from self._put_flow(shard, crons.records)
        else:
            key = _walk_key(shard.keys, walk)
            cursor, members = yield protocol.members_scan(key, cursor, batch)
            misplaced = [m for m in dict.fromkeys(members) if layout.shard(m) is not shard]
            held = yield from _with_definition_flow(shard, misplaced)
            kept = len(held)  # cron occurrences whose definition is still here: they go with it
            misplaced = [m for m in misplaced if m not in held]
            if walk == "leased":
                waiting = len(misplaced)
            elif misplaced:
                taken: protocol.Taken = yield protocol.reshard_take(
                    shard.keys, shard.now_arg(), misplaced
                )
                waiting, kept = taken.leased, kept + taken.kept
                moved, existing = yield from self._put_flow(shard, taken.records)
        if cursor == 0:  # this set is done: the next one, or the next shard
            set_index += 1
            if set_index == len(WALK):
                set_index, shard_index = 0, shard_index + 1
        counts = {  # (COUNTS)
            "moved": moved,
            "existing": existing,
            "pass_moved": moved,
            "pass_waiting": waiting,
            "pass_kept": kept,
        }
        place = f"{shard_index}/{set_index}/{cursor}"
        yield protocol.Batch(
            (
                *(protocol.command("HINCRBY", self._key, f, n) for f, n in counts.items() if n),
                protocol.command("HSET", self._key, "cursor", place),
            )
        )
        idle = False
        if shard_index == len(shards):
            idle = yield from self._pass_end_flow()
        report = yield from self.report_flow()
        return replace(report, idle=idle)

    def _put_flow(
        self, shard: QueueCore, records: Sequence[tuple[str, bytes]]
    ) -> Flow[tuple[int, int]]:
        """Put taken ``records`` (off ``shard``) on their new shards, side by side, then drop
        them on ``shard``: (tasks put, ids a new shard had already)."""
        if not records:
            return 0, 0
        layout = self._core.layout
        groups: dict[QueueCore, list[tuple[str, bytes]]] = defaultdict(list)
        for field, record in records:
            name = protocol.moving_cron(field)
            if name is not None and "cron" in json.loads(record):  # a definition's record
                groups[_cron_home(layout, name)].append((field, record))
            else:
                groups[layout.shard(field)].append((field, record))
        results: list[tuple[int, int]] = yield from together(
            [
                _call_flow(protocol.reshard_put(home.keys, home.now_arg(), group))
                for home, group in groups.items()
            ]
        )
        yield protocol.reshard_drop(shard.keys, shard.now_arg(), [i for i, _ in records])
        self._core.stirred_names(*(home.name for home in groups))
        return sum(r[0] for r in results), sum(r[1] for r in results)

    def _pass_end_flow(self) -> Flow[bool]:
        """A pass over every shard ended: finish when it moved nothing, found nothing waiting
        or kept, began after the old layout's writers had time to follow, and every shard the
        new layout drops is empty; else begin the next pass. Whether the pass moved nothing
        (the mover may wait a little before the next)."""
        core = self._core
        layout = core.layout
        fields = yield protocol.command("HGETALL", self._key)
        fields = {text(k): v for k, v in (fields or {}).items()}
        quiet = not any(_number(fields, f) for f in ("pass_moved", "pass_waiting", "pass_kept"))
        grace_ms = 2000 * LAYOUT_RECHECK_S
        settled = _number(fields, "pass_started_ms") >= _number(fields, "started_ms") + grace_ms
        left: list[tuple[int, int]] = yield from together(
            [_left_flow(s.keys) for s in layout.queues]
        )
        dropped = left[layout.count :]  # the old layout's shards the new one lacks
        empty = all(held == 0 for held, _ in dropped) and all(m == 0 for _, m in left)
        held_back = sum(held for held, _ in dropped)
        if quiet and settled and empty:
            record = LayoutRecord(layout.count, None, layout.record.past)
            yield protocol.Batch(
                (
                    protocol.command("SET", layout_key(self._name), record.text()),
                    *(protocol.command("DEL", q.keys.arrived) for q in layout.queues),
                    protocol.command("HDEL", self._key, "cursor", "pass_started_ms"),
                    protocol.command("HSET", self._key, "done_ms", int(time.time() * 1000)),
                )
            )
            core.follow(record)
            rate_n, per_ms = _number(fields, "rate_n"), _number(fields, "rate_per_ms")
            concurrency = _number(fields, "concurrency")
            if rate_n or concurrency:  # the queue-wide limits over the new shards alone
                yield from core.configure_flow(
                    rate=Rate(rate_n, per=per_ms / 1000) if rate_n else None,
                    concurrency=concurrency or None,
                )
            return False
        yield protocol.Batch(
            (
                protocol.command("HDEL", self._key, "pass_moved", "pass_waiting", "pass_kept"),
                _hset(
                    self._key,
                    {
                        "cursor": "0/0/0",
                        "pass_started_ms": int(time.time() * 1000),
                        "left": held_back,
                    },
                ),
                protocol.command("HINCRBY", self._key, "passes", 1),
            )
        )
        return not _number(fields, "pass_moved")


def _cron_home(layout: ShardLayout, name: str) -> QueueCore:
    """The shard of cron definition ``name`` in the new layout."""
    return layout.queues[shard_of(name, layout.count)]


def _with_definition_flow(shard: QueueCore, ids: list[str]) -> Flow[set[str]]:
    """The cron occurrences among ``ids`` whose definition is still on ``shard``: they move
    with it (its pending one) or after it, never before (the claim that takes an occurrence
    moves its definition's schedule on where it is claimed)."""
    names = {i: o.name for i in ids if (o := Occurrence.from_id(i)) is not None}
    if not names:
        return set()
    distinct = list(dict.fromkeys(names.values()))
    found = yield protocol.command("HMGET", shard.keys.cron, *distinct)
    here = {n for n, definition in zip(distinct, found, strict=True) if definition is not None}
    return {i for i, n in names.items() if n in here}


def _walk_key(k: QueueKeys, walk: str) -> str:
    if walk.startswith("due"):
        return k.due_levels[int(walk[3:])]
    return {"dead": k.dead, "finished": k.finished, "done": k.done, "leased": k.leased}[walk]


def _holdings_flow(k: QueueKeys) -> Flow[tuple[int, ...]]:
    """One shard's open batches (parts and home records: those not yet in their completed
    sets), tasks waiting for parents, limit keys."""
    replies = yield protocol.Batch(
        (
            protocol.command("HLEN", k.batches),
            protocol.command("ZCARD", k.batch_ended),
            protocol.command("HLEN", k.gather),
            protocol.command("ZCARD", k.gather_ended),
            protocol.command("ZCARD", k.waiting),
            protocol.command("HLEN", k.key_state),
        )
    )
    parts, parts_ended, homes, homes_ended, waiting, keys = (int(r) for r in replies)
    return max(parts - parts_ended, 0) + max(homes - homes_ended, 0), waiting, keys


def _left_flow(k: QueueKeys) -> Flow[tuple[int, int]]:
    """What a shard still holds: (tasks, kept results and done marks; ``moving`` records)."""
    replies = yield protocol.Batch(
        (
            protocol.command("HLEN", k.tasks),
            protocol.command("HLEN", k.results),
            protocol.command("ZCARD", k.done),
            protocol.command("HLEN", k.moving),
        )
    )
    tasks, results, done, moving = (int(r) for r in replies)
    return tasks + results + done, moving


def _hset(key: str, fields: dict[Any, Any]) -> protocol.Command[Any]:
    flat: list[Any] = []
    for name, value in fields.items():
        flat += (name, value)
    return protocol.command("HSET", key, *flat)


def _call_flow(call: protocol.Call[Any]) -> Flow[Any]:
    reply = yield call
    return reply


def _command_flow(command: protocol.Command[Any]) -> Flow[Any]:
    reply = yield command
    return reply
