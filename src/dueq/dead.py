"""The dead-letter queue of one Queue: list, count, replay and purge dead tasks.

Replay and purge by id are all-or-nothing. One script call checks and moves up to
``DEAD_BATCH`` ids atomically (Lua's ``unpack`` bounds a call); beyond that, every id is
checked first, so an unknown id raises TaskNotFound before anything moves. Only a change
made by someone else between that check and the batches (another replay, purge or trim of
the same ids) can still stop a later batch; the error then says how many were moved.

Both front ends share the flows of ``DeadLettersCore``; ``DeadLetters`` (``Queue.dead``)
drives them with blocking calls and ``AsyncDeadLetters`` (``AsyncQueue.dead``) awaits them.
A sharded queue's ``q.dead`` drives its layout's flows instead (``dueq.sharding.flows``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

from dueq._util.checks import whole_number
from dueq._wire import protocol as protocol
from dueq._wire.envelope import validate_id
from dueq._wire.ports import AwaitsFlows, DrivesFlows, QueueFlows
from dueq.exceptions import InvalidTaskError

if TYPE_CHECKING:
    from dueq._wire.protocol import Flow
    from dueq.model import TaskInfo, TaskPage

#: Most dead tasks moved by one script call when replaying or purging everything.
DEAD_BATCH = 1000
#: Largest offset ``list`` accepts (an offset beyond the cap is empty anyway).
MAX_OFFSET = 2**40


class ListsDead(QueueFlows, Protocol):
    """What the dead letters need of their queue (``QueueCore`` has it): its keys and clock, and
    its listing flow for the pages of ``replay``/``purge`` by error type."""

    def list_flow(
        self, state: Literal["dead"], *, limit: int, cursor: str | None, error_type: str | None
    ) -> Flow[TaskPage]: ...


class DrivesDead(ListsDead, DrivesFlows, Protocol):
    """A blocking front end whose dead letters these are (``Queue``)."""


class AwaitsDead(ListsDead, AwaitsFlows, Protocol):
    """An asyncio front end whose dead letters these are (``AsyncQueue``)."""


class DeadLettersCore:
    """Dead tasks keep their payload, attempt count and every attempt's error."""

    def __init__(self, queue: ListsDead) -> None:
        self._core = queue

    def list_flow(self, limit: int, offset: int) -> Flow[list[TaskInfo]]:
        whole_number(limit, "limit", low=0, high=MAX_OFFSET)
        whole_number(offset, "offset", low=0, high=MAX_OFFSET)
        if limit == 0:
            return []
        q = self._core
        found: list[TaskInfo] = yield protocol.inspect_dead(
            q.keys, q.now_arg(), offset, limit, q.payload_codec
        )
        return found

    def count_flow(self) -> Flow[int]:
        count: int = yield protocol.command("ZCARD", self._core.keys.dead, parse=int)
        return count

    def move_flow(
        self, action: str, ids: Iterable[str] | None, error_type: str | None = None
    ) -> Flow[int]:
        q = self._core
        if error_type is not None:
            if ids is not None:
                raise InvalidTaskError("give ids or error_type, not both")
            return (yield from self.move_matching_flow(action, error_type))
        if ids is not None:
            wanted = distinct_ids(ids)
            if len(wanted) > DEAD_BATCH:
                yield from self.check_dead_flow(wanted)
            moved = 0
            for start in range(0, len(wanted), DEAD_BATCH):
                batch = wanted[start : start + DEAD_BATCH]
                reply: protocol.DeadReply = yield protocol.dead_ids(
                    q.keys, q.now_arg(), action, batch
                )
                if reply.status is not protocol.Status.OK:
                    already = f" ({moved} of the ids before them were moved)" if moved else ""
                    protocol.raise_for(
                        reply.status,
                        f"not in the dead-letter queue: {reply.missing[:10]}{already}",
                        reply.missing,
                    )
                moved += reply.count
            return moved
        remaining: int = yield from self.count_flow()
        moved = 0
        while remaining > 0:
            reply = yield protocol.dead_oldest(
                q.keys, q.now_arg(), action, min(remaining, DEAD_BATCH)
            )
            if reply.count == 0:
                break
            moved += reply.count
            remaining -= reply.count
        return moved

    def move_matching_flow(self, action: str, error_type: str) -> Flow[int]:
        """Move the dead tasks whose last error has ``error_type``, a listing page at a time
        (each page found by ``list_tasks``, then moved in one all-or-nothing call; ids that
        left the dead-letter queue in between are skipped)."""
        if not isinstance(error_type, str) or not error_type:
            raise InvalidTaskError(f"error_type must be a non-empty string, got {error_type!r}")
        q = self._core
        moved, cursor = 0, None
        while True:
            page = yield from q.list_flow(
                "dead", limit=DEAD_BATCH, cursor=cursor, error_type=error_type
            )
            batch = [info.id for info in page.tasks]
            while batch:
                reply: protocol.DeadReply = yield protocol.dead_ids(
                    q.keys, q.now_arg(), action, batch
                )
                if reply.status is protocol.Status.OK:
                    moved += reply.count
                    break
                gone = set(reply.missing)  # replayed, purged or trimmed meanwhile: skip them
                batch = [i for i in batch if i not in gone]
            cursor = page.cursor
            if cursor is None:
                return moved

    def check_dead_flow(self, wanted: Sequence[str]) -> Flow[None]:
        """TaskNotFound (listing them) if any of ``wanted`` is not dead; writes nothing."""
        dead_key = self._core.keys.dead
        replies: list[Any] = yield protocol.Batch(
            tuple(
                protocol.command("ZMSCORE", dead_key, *wanted[start : start + DEAD_BATCH])
                for start in range(0, len(wanted), DEAD_BATCH)
            )
        )
        scores = [score for reply in replies for score in reply]
        missing = [i for i, score in zip(wanted, scores, strict=True) if score is None]
        if missing:
            protocol.raise_for(
                protocol.Status.NOT_DEAD, f"not in the dead-letter queue: {missing[:10]}", missing
            )


class DeadLetters:
    """The dead-letter queue of a ``Queue``: list, count, replay and purge dead tasks."""

    def __init__(self, queue: DrivesDead, flows: DeadLettersCore | None = None) -> None:
        self._queue = queue
        #: the flows it drives: the queue's own, or a sharded queue's (``dueq.sharding.flows``)
        self._flows = DeadLettersCore(queue) if flows is None else flows

    def list(self, limit: int = 50, offset: int = 0) -> list[TaskInfo]:
        """Dead tasks, most recently died first."""
        return self._queue.drive(self._flows.list_flow(limit, offset))

    def count(self) -> int:
        """How many tasks are dead."""
        return self._queue.drive(self._flows.count_flow())

    def replay(
        self,
        ids: Iterable[str] | None = None,
        *,
        error_type: str | None = None,
        from_start: bool = False,
    ) -> int:
        """Put dead tasks back in due now with attempts and errors reset; returns the count.
        A durable task goes on from its first unfinished step; ``from_start=True`` drops its
        steps and signals first, so it runs from its first step again.

        With ``ids`` (an iterable of ids, each counted once; a bare str is refused with
        InvalidTaskError) it is all-or-nothing: TaskNotFound (listing them) if any id is not
        dead. Without, every task dead at the time of the call is replayed, in batches.
        With ``error_type`` (instead of ``ids``), only the dead tasks whose last error record
        has that type (e.g. ``"TimeoutError"``), found a page at a time.
        """
        action = "restart" if from_start else "replay"
        return self._queue.drive(self._flows.move_flow(action, ids, error_type))

    def purge(self, ids: Iterable[str] | None = None, *, error_type: str | None = None) -> int:
        """Delete dead tasks for good; returns the count. ``ids`` and ``error_type`` as for
        ``replay``."""
        return self._queue.drive(self._flows.move_flow("purge", ids, error_type))


class AsyncDeadLetters:
    """The dead-letter queue of an ``AsyncQueue``; the methods of ``DeadLetters``, awaited."""

    def __init__(self, queue: AwaitsDead, flows: DeadLettersCore | None = None) -> None:
        self._queue = queue
        #: the flows it drives: the queue's own, or a sharded queue's (``dueq.sharding.flows``)
        self._flows = DeadLettersCore(queue) if flows is None else flows

    async def list(self, limit: int = 50, offset: int = 0) -> list[TaskInfo]:
        """Dead tasks, most recently died first."""
        return await self._queue.drive(self._flows.list_flow(limit, offset))

    async def count(self) -> int:
        """How many tasks are dead."""
        return await self._queue.drive(self._flows.count_flow())

    async def replay(
        self,
        ids: Iterable[str] | None = None,
        *,
        error_type: str | None = None,
        from_start: bool = False,
    ) -> int:
        """As ``DeadLetters.replay``."""
        action = "restart" if from_start else "replay"
        return await self._queue.drive(self._flows.move_flow(action, ids, error_type))

    async def purge(
        self, ids: Iterable[str] | None = None, *, error_type: str | None = None
    ) -> int:
        """As ``DeadLetters.purge``."""
        return await self._queue.drive(self._flows.move_flow("purge", ids, error_type))


def distinct_ids(ids: object) -> list[str]:
    """The ids of an iterable, each once, in order; InvalidTaskError for a bare str or bytes
    (a str is an iterable of one-character ids, which is never what was meant)."""
    if isinstance(ids, (str, bytes, bytearray, memoryview)):
        raise InvalidTaskError(
            f"ids must be an iterable of task ids, not a {type(ids).__name__}; "
            f"did you mean ids=[{ids!r}]?"
        )
    try:
        iterator = iter(ids)  # type: ignore[call-overload]
    except TypeError:
        raise InvalidTaskError(
            f"ids must be an iterable of task ids, got {type(ids).__name__}"
        ) from None
    return list(dict.fromkeys(validate_id(i) for i in iterator))
