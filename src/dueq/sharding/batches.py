"""Batches on a sharded queue (issue 43): members on every shard, the completion task once.

A batch's members are spread by id like any task, so no one script sees them all. Every shard
keeps its own *part* of the batch exactly as a plain queue keeps a whole batch
(``lua/include/batches.lua``): its schedule script counts the members it adds, the scripts that
end them count outcomes, atomically with the end. What crosses shards is only "this part has
completed", and it travels as a task, so it has a task's durability:

1. ``close_batch`` first *opens* the batch on its **home shard**, ``shard_of(batch id)``
   (``lua/batch_gather.lua``: it records how many parts there are, and the completion task,
   refusing an id a task already has, writing nothing then), then closes every shard's part
   with a **note task** as that part's completion task (``dueq-batch:<batch>:<part>``, an id
   that lies on the part's shard). The plain close script schedules a part's note when the
   part has nothing pending (at once, for an empty part), else the script that ends its last
   member does, exactly once per part.
2. The sharded core's claim takes every note out of what it claimed (a consumer never sees
   one) and tells the home shard which parts have completed, in one script call per claim,
   then acks the notes. The home marks each part once; the call that marks the last one
   schedules the completion task, exactly once: that script is atomic on the home shard, a
   part marked before changes nothing, and the completion record is deleted as it is
   scheduled. A consumer killed between the two steps leaves its notes leased: they are
   claimed again when the lease lapses and marked again, which changes nothing. A close that
   is interrupted (after the open, before every part is closed) is finished by calling
   ``close_batch`` again: every step is idempotent, and the first completion task is kept.
   ``close_batch`` also marks at once the parts its own calls completed, so a batch whose
   members had all ended completes inside ``close_batch``, as on a plain queue.

So the completion task lies on the home shard, and its id must too (it is found by id): the
default is ``batch:<batch id>`` and the batch's route (``completion_id``, the same as
``dueq.keyed_id(batch, "batch:" + batch)``), so it lies on the batch's shard for every shard
count; an explicit id on another shard is refused with the one that fits. ``q.batch(id)``
reads every part and the home record side by side and adds them up (``merged``);
``q.batches()`` scans them all.

What differs from a plain queue, and why: a member scheduled after ``close_batch`` into a
shard whose part has already completed is refused (``BatchCompleted``), even while other parts
are pending: that part's note may already have been counted, and no script could take it back
atomically with the home's count. Schedule every member before closing (as Spark's
``schedule_dataframe`` does). The notes are tasks of the queue: they count in ``scheduled`` and
``acked`` (one per shard per batch), and show in the events stream while events are on. A
note takes the most attempts a task may have (``MAX_TASK_ATTEMPTS``), whatever the queue's
retry policy, as only a lapsed lease (a killed consumer) makes it try again; one that went dead
all the same is put right by replaying it (``q.dead.replay([note id])``).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from dueq._flows.core import QueueCore
from dueq._flows.drive import Flow
from dueq._flows.schedule import completion_taken
from dueq._util.clock import ms_datetime
from dueq._wire import protocol
from dueq._wire.envelope import MAX_ID_BYTES, MAX_TASK_ATTEMPTS, validate_id
from dueq.delivery import DeliveryBase
from dueq.exceptions import InvalidTaskError, LeaseLost
from dueq.model import BatchInfo, Task
from dueq.sharding.fanout import together
from dueq.sharding.layout import (
    ShardLayout,
    id_on,
    key_route,
    shard_of,
    task_shard,
)

__all__ = ["NOTE_PREFIX", "ShardedBatches", "completion_id", "note_id"]

#: The id prefix of the note tasks (refused for other tasks of a sharded queue).
NOTE_PREFIX = "dueq-batch:"
#: A sharded queue's batch ids leave this many bytes of a task id for the note's prefix, part
#: index and ``~n`` (and the completion's ``batch:`` and route, 24).
_NOTE_ROOM = 32
MAX_BATCH_ID_BYTES = MAX_ID_BYTES - _NOTE_ROOM


def completion_id(batch: str, count: int) -> str:
    """The default id of ``batch``'s completion task on a queue of ``count`` shards."""
    del count  # (it lies on the batch's shard for every count: it carries the batch's route)
    return f"batch:{batch}{key_route(batch)}"  # (a batch id may be longer than a limit key)


def note_id(batch: str, part: int, count: int) -> str:
    """The id of the note task of ``batch``'s part on shard ``part``."""
    return id_on(f"{NOTE_PREFIX}{batch}:{part}", part, count)


def batch_id(batch: object) -> str:
    """A usable batch id on a sharded queue: the rules of task ids, with room for a note's id."""
    try:
        batch = validate_id(batch)
    except InvalidTaskError as exc:
        raise InvalidTaskError(str(exc).replace("task id", "batch id")) from None
    if len(batch.encode("utf-8")) > MAX_BATCH_ID_BYTES:
        raise InvalidTaskError(
            f"batch id is longer than {MAX_BATCH_ID_BYTES} bytes (a sharded queue's batch ids "
            f"leave {_NOTE_ROOM} bytes of a task id for its notes' ids)"
        )
    return batch


def _note_of(delivery: DeliveryBase) -> tuple[str, int] | None:
    """(batch, part) when ``delivery`` is a note task, else None."""
    if not delivery.id.startswith(NOTE_PREFIX) or delivery.task_name is not None:
        return None
    payload = delivery.payload
    if not isinstance(payload, dict) or set(payload) != {"dueq_batch", "part"}:
        return None
    batch, part = payload["dueq_batch"], payload["part"]
    if not isinstance(batch, str) or not isinstance(part, int):
        return None
    return batch, part


def _time(ms: int | None) -> datetime | None:
    return None if ms is None else ms_datetime(ms)


def merged(
    batch: str, parts: Sequence[BatchInfo | None], home: protocol.Gathered | None
) -> BatchInfo | None:
    """The batch as a whole: its parts' counts added up, closed and complete as its home
    record says (a part completes on its own shard; the batch once every part has)."""
    found = [p for p in parts if p is not None]
    if not found and home is None:
        return None
    created = [p.created_at for p in found if p.created_at is not None]
    if home is not None and home.created_ms is not None:
        created.append(ms_datetime(home.created_ms))
    total, acked, dead, cancelled, expired = (
        sum(getattr(p, field) for p in found)
        for field in ("total", "acked", "dead", "cancelled", "expired")
    )
    return BatchInfo(
        id=batch,
        total=total,
        acked=acked,
        dead=dead,
        cancelled=cancelled,
        expired=expired,
        pending=sum(p.pending for p in found),
        complete=home is not None and home.completed_ms is not None,
        created_at=min(created) if created else None,
        closed_at=None if home is None else _time(home.closed_ms),
        completed_at=None if home is None else _time(home.completed_ms),
        completion_taken=home is not None and home.taken,
    )


class ShardedBatches:
    """The batch flows of a sharded queue (``ShardedCore`` holds one; see the module
    docstring). ``stirred(*shards)`` tells the core that tasks became due on those shards."""

    def __init__(
        self,
        layout: ShardLayout,
        stirred: Callable[..., None],
        check: Callable[[], Flow[ShardLayout]],
    ) -> None:
        self._layout = layout
        self._stirred = stirred
        #: the sharded core's read of the layout: the layout now (refused while a reshard runs)
        self._check = check

    def check_task_id(self, task_id: str) -> str:
        """``task_id`` unless it is a note's: the note tasks' ids are reserved, no other task
        may take one (a task that looked like a note would mark a part complete)."""
        if task_id.startswith(NOTE_PREFIX):
            raise InvalidTaskError(
                f"task id {task_id[:60]!r}: ids starting {NOTE_PREFIX!r} are reserved for the "
                "notes of a sharded queue's batches"
            )
        return task_id

    def close_flow(self, batch: str, on_complete: Task | None) -> Flow[BatchInfo]:
        """Open the batch on its home shard, then close every shard's part with its note (see
        the module docstring); the parts this call completed are marked at once."""
        batch = batch_id(batch)
        layout = yield from self._check()
        count = layout.count
        home_index = shard_of(batch, count)
        home = layout.queues[home_index]
        task_id, record = home.completion_record(batch, on_complete, completion_id(batch, count))
        if on_complete is not None and task_shard(task_id, count) != home_index:
            raise InvalidTaskError(
                f"completion task id {task_id!r} is on shard {task_shard(task_id, count)}, and "
                f"batch {batch!r} completes on shard {home_index} of {count} (the shard of its "
                f"id): leave the id out (it defaults to {completion_id(batch, count)!r}), or "
                f"use dueq.keyed_id({batch!r}, {task_id!r}) = {task_id + key_route(batch)!r}"
            )
        opened: protocol.GatherReply = yield protocol.gather_open(
            home.keys, home.now_arg(), batch, count, record
        )
        if opened.status == -1:
            raise completion_taken(batch, task_id)
        notes = [
            Task(
                {"dueq_batch": batch, "part": part},
                id=note_id(batch, part, count),
                max_attempts=MAX_TASK_ATTEMPTS,  # a lapsed lease is a killed consumer: again
            )
            for part in range(count)
        ]
        infos: list[BatchInfo] = yield from together(
            [
                shard.close_batch_flow(batch, note)
                for shard, note in zip(layout.queues, notes, strict=True)
            ]
        )
        self._stirred(*range(count))
        completed = [part for part, info in enumerate(infos) if info.complete]
        gathered = opened.record
        if completed:
            marked: protocol.GatherReply = yield protocol.gather_parts(
                home.keys, home.now_arg(), batch, completed
            )
            gathered = marked.record
        info = merged(batch, infos, gathered)
        assert info is not None  # the home record was written
        return info

    def take_notes_flow(self, deliveries: list[Any]) -> Flow[tuple[list[Any], bool]]:
        """``deliveries`` without their note tasks, which are marked on their batches' home
        shards (one script call per batch) and acked (one call per shard); also whether a
        batch completed (its completion task is due on its home shard now)."""
        notes = [(d, _note_of(d)) for d in deliveries]
        if all(note is None for _, note in notes):
            return deliveries, False
        layout = self._layout
        count = layout.count
        parts: dict[str, set[int]] = defaultdict(set)
        for _, note in notes:
            if note is not None:
                parts[note[0]].add(note[1])
        marks = []
        for batch, done in parts.items():
            home = layout.queues[shard_of(batch, count)]
            marks.append(_mark_flow(home, batch, sorted(done)))
        completed: list[bool] = yield from together(marks)
        self._stirred(*(shard_of(b, count) for b, c in zip(parts, completed, strict=True) if c))
        by_shard: dict[QueueCore, list[DeliveryBase]] = defaultdict(list)
        for d, note in notes:
            if note is not None:
                by_shard[layout.owner(d)].append(d)
        yield from together([_ack_notes_flow(shard, group) for shard, group in by_shard.items()])
        return [d for d, note in notes if note is None], any(completed)

    def read_flow(self, batch: str) -> Flow[BatchInfo | None]:
        """Every part and the home record, side by side, added up."""
        layout = self._layout
        batch = validate_id(batch)
        home = layout.queues[shard_of(batch, layout.count)]
        found = yield from together(
            [_read_part_flow(s, batch) for s in layout.queues] + [_read_home_flow(home, batch)]
        )
        return merged(batch, found[:-1], found[-1])

    def list_flow(self, limit: int) -> Flow[list[BatchInfo]]:
        """Up to ``limit`` batches over every shard (open ones first, then newest first)."""
        scans = yield from together(
            [_scan_flow(s, protocol.batches_scan) for s in self._layout.queues]
            + [_scan_flow(s, protocol.gather_scan) for s in self._layout.queues]
        )
        count = self._layout.count
        parts: dict[str, list[BatchInfo]] = defaultdict(list)
        homes: dict[str, protocol.Gathered] = {}
        for scan in scans[:count]:
            for info in scan:
                parts[info.id].append(info)
        for scan in scans[count:]:
            homes.update(scan)
        found = []
        for batch in dict.fromkeys([*homes, *parts]):
            info = merged(batch, parts.get(batch, []), homes.get(batch))
            if info is not None:
                found.append(info)
        found.sort(
            key=lambda b: (b.complete, -b.created_at.timestamp() if b.created_at else 0, b.id)
        )
        return found[:limit]


def _mark_flow(home: QueueCore, batch: str, parts: list[int]) -> Flow[bool]:
    reply: protocol.GatherReply = yield protocol.gather_parts(
        home.keys, home.now_arg(), batch, parts
    )
    return reply.status == 1


def _ack_notes_flow(shard: QueueCore, notes: list[DeliveryBase]) -> Flow[None]:
    # LeaseLost: another consumer holds it now (its lease lapsed here): that one marks it again
    with contextlib.suppress(LeaseLost):
        yield from shard.ack_flow(notes)


def _read_part_flow(shard: QueueCore, batch: str) -> Flow[BatchInfo | None]:
    info: BatchInfo | None = yield protocol.batch_read(shard.keys, batch)
    return info


def _read_home_flow(home: QueueCore, batch: str) -> Flow[protocol.Gathered | None]:
    found: protocol.Gathered | None = yield protocol.gather_read(home.keys, batch)
    return found


def _scan_flow(shard: QueueCore, scan: Callable[..., Any]) -> Flow[list[Any]]:
    """Every item of one shard's HSCAN (batch records, or (batch, home record) pairs)."""
    cursor, out = 0, []
    while True:
        cursor, found = yield scan(shard.keys, cursor, 500)
        out += found
        if cursor == 0:
            return out
