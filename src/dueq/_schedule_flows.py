"""The scheduling flows: encode and schedule tasks in batches, cancel, reschedule."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from datetime import datetime

from . import _protocol as protocol
from . import _tracing
from ._drive import Flow
from ._queue_base import QueueBase
from .clock import Duration, datetime_ms, duration_ms
from .envelope import (
    FLAG_ABSOLUTE,
    FLAG_DEBOUNCE,
    FLAG_EXPIRES_RELATIVE,
    FLAG_GENERATED_ID,
    encode_envelope,
    generated_ids,
    pack_task,
    repack_with_id,
    validate_id,
    validate_task_name,
)
from .exceptions import DueqError, InvalidTaskError, PayloadError
from .task import ScheduleResult, Task

logger = logging.getLogger("dueq.queue")

#: Most tasks and bytes sent in one schedule call (Redis refuses arguments over
#: proto-max-bulk-len, 512 MB by default, and a long script blocks it).
SCHEDULE_BATCH = 1000
SCHEDULE_BATCH_BYTES = 8 * 1024 * 1024
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
                max_wait_ms = None
                if task.at is None and task.delay is None:
                    time_flag, due_ms = 0, 0  # due now
                else:
                    time_flag, due_ms = due(task.at, task.delay)
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
                if task.task is None:
                    envelope = encode_envelope(task.payload, max_bytes, options, trace)
                else:
                    envelope = encode_envelope(
                        task.payload, max_bytes, options, trace, self._named(task)
                    )
            except (InvalidTaskError, PayloadError) as exc:
                raise type(exc)(f"task {position} ({task_id!r}): {exc}") from exc
            records.append(pack_task(flags | time_flag, due_ms, task_id, envelope, max_wait_ms))
            ids.append(task_id)
        return (yield from self.schedule_records_flow(ids, records, replace, fresh_ids))

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
