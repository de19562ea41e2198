"""The scheduling flows: encode and schedule tasks in batches, cancel, reschedule."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Iterator
from datetime import datetime

from dueq._flows.base import QueueBase
from dueq._flows.drive import Flow
from dueq._util import tracing as _tracing
from dueq._util.clock import Duration, datetime_ms, duration_ms
from dueq._wire import protocol as protocol
from dueq._wire.envelope import (
    FLAG_ABSOLUTE,
    FLAG_DEBOUNCE,
    FLAG_EXPIRES_RELATIVE,
    FLAG_GENERATED_ID,
    encode_envelope,
    generated_ids,
    pack_task,
    record_extras,
    repack_with_id,
    route_ending,
    validate_id,
    validate_task_name,
)
from dueq.exceptions import (
    BatchCompleted,
    BatchCompletionTaken,
    DependencyCycle,
    DueqError,
    InvalidTaskError,
    PayloadError,
)
from dueq.model import BatchInfo, ScheduleResult, Task

logger = logging.getLogger("dueq.queue")

#: Most tasks and bytes sent in one schedule call (Redis refuses arguments over
#: proto-max-bulk-len, 512 MB by default, and a long script blocks it).
SCHEDULE_BATCH = 1000
SCHEDULE_BATCH_BYTES = 8 * 1024 * 1024
#: Most parents one task may wait for (``Task.after``).
MAX_PARENTS = 1000
#: Most dependency edges schedule.lua follows to refuse a cycle (dependencies.lua's CYCLE_WALK).
CYCLE_WALK_EDGES = 2_000
#: Rounds of fresh ids for generated ids that already existed (72-bit ids: one is plenty).
ID_RETRIES = 5


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


class SentRecords:
    """What the schedule calls of one ``schedule_many`` did, and the ids they refused (a plain
    class: an internal record made on import costs no dataclass)."""

    def __init__(self, counts: ScheduleResult) -> None:
        self.counts = counts
        #: ids not written because their batch had completed
        self.refused: list[str] = []
        #: ids not written because their parents wait for them (a dependency cycle)
        self.cyclic: list[str] = []
        #: ids not written because the cycle check reached its bound
        self.unchecked: list[str] = []

    def add(self, reply: protocol.ScheduleReply, ids: list[str], sent: list[int]) -> None:
        """Count one call's reply (``sent``: the positions in ``ids`` of its records, in
        order; only the refused ones are looked up)."""
        c = self.counts
        self.counts = dataclasses.replace(
            c,
            added=c.added + reply.added,
            existing=c.existing + reply.existing,
            replaced=c.replaced + reply.replaced,
        )
        self.refused += [ids[sent[p]] for p in reply.refused]
        self.cyclic += [ids[sent[p]] for p in reply.cyclic]
        self.unchecked += [ids[sent[p]] for p in reply.unchecked]

    def merge(self, other: SentRecords) -> None:
        """Add another shard's calls (its ids are placed by the caller)."""
        c, o = self.counts, other.counts
        self.counts = dataclasses.replace(
            c,
            added=c.added + o.added,
            existing=c.existing + o.existing,
            replaced=c.replaced + o.replaced,
        )
        self.refused += other.refused
        self.cyclic += other.cyclic
        self.unchecked += other.unchecked

    def result(self) -> ScheduleResult:
        """The counts, or the error for the records refused (the others were written)."""
        c = self.counts
        others = f"the other {c.added + c.existing + c.replaced} of the call were"
        if self.refused:
            raise BatchCompleted(
                f"{len(self.refused)} task(s) not scheduled: their batch (on a sharded queue, "
                f"its part on their shard) has completed ({others})",
                self.refused,
            )
        if self.cyclic or self.unchecked:
            why = []
            if self.cyclic:
                why.append(
                    f"{self.cyclic[:10]!r} would each wait for itself through its parents "
                    "(a dependency cycle)"
                )
            if self.unchecked:
                why.append(
                    f"{self.unchecked[:10]!r} have more than {CYCLE_WALK_EDGES:,} dependency "
                    "edges above them, too many to check for a cycle"
                )
            raise DependencyCycle(
                f"{len(self.cyclic) + len(self.unchecked)} task(s) not scheduled: "
                f"{'; '.join(why)} ({others})",
                self.cyclic,
                self.unchecked,
            )
        return c


class ScheduleFlows(QueueBase):
    """The flows of producing: schedule (encode, batch, draw fresh ids), cancel, reschedule."""

    @staticmethod
    def _due(at: datetime | None, delay: Duration | None) -> tuple[int, int]:
        """(FLAG_ABSOLUTE, epoch ms) for at=, (0, delay ms) for delay= or neither."""
        if at is not None:
            if delay is not None:
                raise InvalidTaskError("give at= or delay=, not both")
            return FLAG_ABSOLUTE, datetime_ms(at)
        return 0, 0 if delay is None else duration_ms(delay, "delay")

    def schedule_many_flow(
        self, tasks: Iterable[Task], replace: bool, batch: str | None = None
    ) -> Flow[ScheduleResult]:
        """Schedule ``tasks``, inside a ``send`` span when tracing (see ``_tracing``); ``batch``
        is the batch of every task that names none."""
        send = _tracing.producer(self.name)
        if send is None:
            return (yield from self.encode_and_schedule_flow(tasks, replace, b"", batch))
        try:
            result = yield from self.encode_and_schedule_flow(tasks, replace, send.line, batch)
        except BaseException as exc:  # the span records any failure; the caller gets it
            send.failed(exc)
            raise
        send.sent(result.ids)
        return result

    def encode_and_schedule_flow(
        self, tasks: Iterable[Task], replace: bool, trace: bytes, batch: str | None = None
    ) -> Flow[ScheduleResult]:
        ids: list[str] = []
        records: list[bytes] = []
        fresh_ids = generated_ids()
        if batch is not None:
            batch = self._core.batch_id(batch)
        try:
            iterator = iter(tasks)
        except TypeError:
            raise InvalidTaskError(
                f"tasks must be an iterable of dueq.Task, got {type(tasks).__name__}"
            ) from None
        for position, task in enumerate(iterator):
            if not isinstance(task, Task):
                raise InvalidTaskError(f"task {position} is a {type(task).__name__}, not dueq.Task")
            task_id = self._core.task_id_for(position, task, fresh_ids)
            records.append(self._encode_task(position, task, task_id, trace, batch))
            ids.append(task_id)
        return (yield from self._core.schedule_records_flow(ids, records, replace, fresh_ids))

    def _encode_task(
        self, position: int, task: Task, task_id: str, trace: bytes, batch: str | None
    ) -> bytes:
        """One task as a packed schedule record (``task_id``: its id, or a generated one)."""
        flags = FLAG_GENERATED_ID if task.id is None else 0
        try:
            max_wait_ms = None
            if task.at is None and task.delay is None:
                time_flag, due_ms = 0, 0  # due now
            else:
                time_flag, due_ms = self._due(task.at, task.delay)
            if task.debounce is not None or task.max_wait is not None:
                debounced = task.debounce_ms()
                if debounced is not None:
                    due_ms, max_wait_ms = debounced
                    time_flag |= FLAG_DEBOUNCE
            if task.expires is None:
                options = task.options()
            else:
                expires_ms, relative = task.expiry()
                options = task.options(expires_ms)
                if relative:
                    time_flag |= FLAG_EXPIRES_RELATIVE
            max_bytes = self.max_payload_bytes
            if task.task is None:
                envelope = encode_envelope(
                    task.payload,
                    max_bytes,
                    options,
                    trace,
                    None,
                    self.payload_codec,
                    self.name,
                    task_id,
                )
            else:
                envelope = encode_envelope(
                    task.payload,
                    max_bytes,
                    options,
                    trace,
                    self._named(task),
                    self.payload_codec,
                    self.name,
                    task_id,
                )
            extra_flags, extra = self._task_extras(task, task_id, batch)
        except (InvalidTaskError, PayloadError) as exc:
            raise type(exc)(f"task {position} ({task_id!r}): {exc}") from exc
        flags |= time_flag | extra_flags
        return pack_task(flags, due_ms, task_id, envelope, max_wait_ms, extra)

    def _task_extras(self, task: Task, task_id: str, batch: str | None) -> tuple[int, bytes]:
        """The flags and bytes that name a task's batch and parents (``record_extras``)."""
        if task.batch is not None:
            batch = self._core.batch_id(task.batch)
        if batch is None and not task.after:
            return 0, b""
        return record_extras(batch, self._parents(task, task_id), task.after_policy == "run")

    def _parents(self, task: Task, task_id: str) -> list[str]:
        """A task's checked parents: ids, at most MAX_PARENTS, in its own shard (the core's
        ``check_parents``)."""
        after = task.after
        if isinstance(after, str) or not isinstance(after, (list, tuple)):
            raise InvalidTaskError(f"after must be a list of task ids, got {after!r}")
        if task.after_policy not in ("fail", "run"):
            raise InvalidTaskError(
                f"after_policy must be 'fail' or 'run', got {task.after_policy!r}"
            )
        if len(after) > MAX_PARENTS:
            raise InvalidTaskError(f"a task waits for at most {MAX_PARENTS} parents")
        parents = list(dict.fromkeys(validate_id(p) for p in after))
        if parents:
            self._core.check_parents(task_id, parents, task.id is None)
        return parents

    def task_id_for(self, position: int, task: Task, fresh_ids: Iterator[str]) -> str:
        """The id task ``position`` of a schedule call is written under, as the core of its
        tasks: its own (checked), else the next of ``fresh_ids``. A sharded queue's core also
        places keyed tasks on their key's shard (``ShardedCore.task_id_for``)."""
        return next(fresh_ids) if task.id is None else validate_id(task.id)

    def check_parents(self, task_id: str, parents: list[str], generated: bool) -> None:
        """As the core of its tasks: a plain queue holds every parent, so any will do
        (``generated``: ``task_id`` was drawn, not given)."""

    def batch_id(self, batch: object) -> str:
        """A usable batch id (the rules of task ids), as the core of a plain queue (a
        sharded queue has no batches: ``ShardedCore.batch_id`` raises)."""
        try:
            return validate_id(batch)
        except InvalidTaskError as exc:
            raise InvalidTaskError(str(exc).replace("task id", "batch id")) from None

    def _named(self, task: Task) -> str:
        """The name of a named task, its payload checked: a dict of arguments, and, when the
        name is registered on this queue, arguments its function's signature accepts."""
        name = validate_task_name(task.task)
        function = self.tasks.get(name)
        if function is not None:
            function.check_arguments(task.payload)
        elif not isinstance(task.payload, dict):
            raise InvalidTaskError(
                f"the payload of named task {name!r} is a dict of its arguments, "
                f"got {type(task.payload).__name__}"
            )
        return name

    def schedule_records_flow(
        self, ids: list[str], records: list[bytes], replace: bool, fresh_ids: Iterator[str]
    ) -> Flow[ScheduleResult]:
        """Send packed records in batches; generated ids that were taken are drawn again.
        Raises BatchCompleted or DependencyCycle, after every batch was sent, for the records
        the script refused."""
        sent = yield from self.send_records_flow(ids, records, replace, fresh_ids)
        return sent.result()

    def send_records_flow(
        self, ids: list[str], records: list[bytes], replace: bool, fresh_ids: Iterator[str]
    ) -> Flow[SentRecords]:
        """``schedule_records_flow`` on this (plain) queue, refusals returned, not raised: a
        sharded queue sends every shard's records before it raises."""
        yield from self.plain_check_flow()
        sent = SentRecords(ScheduleResult(added=0, existing=0, replaced=0, ids=ids))
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
                sent.add(reply, ids, pending)
                pending = [pending[p] for p in reply.collided]
                if not pending:
                    break
                for i in pending:  # a generated id that was taken: draw another (a keyed
                    ids[i] = next(fresh_ids) + route_ending(ids[i])  # one keeps its key's route)
                    records[i] = repack_with_id(records[i], ids[i], self.payload_codec, self.name)
            else:
                raise DueqError(f"no unused id found for {len(pending)} task(s)")
        return sent

    def cancel_flow(self, task_id: str) -> Flow[bool]:
        existed: bool = yield protocol.cancel(self.keys, self.now_arg(), validate_id(task_id))
        return existed

    def reschedule_flow(
        self, task_id: str, at: datetime | None, delay: Duration | None
    ) -> Flow[bool]:
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

    def completion_record(
        self, batch: str, on_complete: Task | None, default_id: str
    ) -> tuple[str, bytes]:
        """The id and packed record (as for schedule) of ``batch``'s completion task, its id
        ``default_id`` unless it has one; ("", b"") for none."""
        if on_complete is None:
            return "", b""
        if not isinstance(on_complete, Task):
            raise InvalidTaskError(
                f"on_complete must be a dueq.Task, got {type(on_complete).__name__}"
            )
        if on_complete.batch is not None:
            raise InvalidTaskError("a completion task cannot join a batch")
        task_id = validate_id(default_id if on_complete.id is None else on_complete.id)
        done = dataclasses.replace(on_complete, id=task_id)
        return task_id, self._encode_task(0, done, task_id, b"", None)

    def close_batch_flow(self, batch: str, on_complete: Task | None) -> Flow[BatchInfo]:
        """Close ``batch``; its completion task ``on_complete`` is scheduled once every member
        has ended (now, when they all have). A batch closed before keeps its first one."""
        batch = self._core.batch_id(batch)
        task_id, record = self.completion_record(batch, on_complete, f"batch:{batch}")
        yield from self.plain_check_flow()
        reply: protocol.CloseBatchReply = yield protocol.close_batch(
            self.keys, self.now_arg(), batch, record
        )
        if reply.taken:
            assert on_complete is not None  # only a completion task's id can be taken
            raise completion_taken(batch, task_id)
        return reply.info


def completion_taken(batch: str, task_id: str) -> BatchCompletionTaken:
    """close_batch's refusal of a completion task's id that a task has."""
    return BatchCompletionTaken(
        f"batch {batch!r} was not closed: its completion task's id {task_id!r} is "
        "already a task of the queue (scheduled, leased, waiting or dead), so it could "
        "never be scheduled; give the completion task another id",
        task_id,
    )
