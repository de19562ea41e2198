"""The dead-letter queue of one Queue: list, count, replay and purge dead tasks.

Replay and purge by id are all-or-nothing. One script call checks and moves up to
``DEAD_BATCH`` ids atomically (Lua's ``unpack`` bounds a call); beyond that, every id is
checked first, so an unknown id raises TaskNotFound before anything moves. Only a change
made by someone else between that check and the batches (another replay, purge or trim of
the same ids) can still stop a later batch; the error then says how many were moved.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from .checks import whole_number
from .envelope import validate_id
from .exceptions import InvalidTaskError, TaskNotFound
from .snapshot import text

if TYPE_CHECKING:
    from .queue import Queue
    from .task import TaskInfo

#: Most dead tasks moved by one script call when replaying or purging everything.
DEAD_BATCH = 1000


class DeadLetters:
    """Dead tasks keep their payload, attempt count and every attempt's error."""

    def __init__(self, queue: Queue) -> None:
        self._queue = queue

    def list(self, limit: int = 50, offset: int = 0) -> list[TaskInfo]:
        """Dead tasks, most recently died first."""
        whole_number(limit, "limit", low=0)
        whole_number(offset, "offset", low=0)
        if limit == 0:
            return []
        return self._queue._inspect("dead", offset, limit)

    def count(self) -> int:
        """How many tasks are dead."""
        return int(self._queue.redis.zcard(self._queue.keys.dead))

    def replay(self, ids: Iterable[str] | None = None) -> int:
        """Put dead tasks back in due now with attempts and errors reset; returns the count.

        With ``ids`` (an iterable of ids, each counted once; a bare str is refused with
        InvalidTaskError) it is all-or-nothing: TaskNotFound (listing them) if any id is not
        dead. Without, every task dead at the time of the call is replayed, in batches.
        """
        return self._move("replay", ids)

    def purge(self, ids: Iterable[str] | None = None) -> int:
        """Delete dead tasks for good; returns the count. ``ids`` as for ``replay``."""
        return self._move("purge", ids)

    def _move(self, action: str, ids: Iterable[str] | None) -> int:
        q = self._queue
        k = q.keys
        keys = [k.dead, k.due, k.tasks, k.meta, k.errors, k.stats, k.wake]
        if ids is not None:
            wanted = _distinct_ids(ids)
            if len(wanted) > DEAD_BATCH:
                self._check_dead(wanted)
            moved = 0
            for start in range(0, len(wanted), DEAD_BATCH):
                reply = q._run("dead", keys, action, "ids", *wanted[start : start + DEAD_BATCH])
                if int(reply[0]) < 0:
                    missing = [text(x) for x in reply[1:]]
                    already = f" ({moved} of the ids before them were moved)" if moved else ""
                    raise TaskNotFound(
                        f"not in the dead-letter queue: {missing[:10]}{already}", missing
                    )
                moved += int(reply[0])
            return moved
        remaining, moved = self.count(), 0
        while remaining > 0:
            count = int(q._run("dead", keys, action, "oldest", min(remaining, DEAD_BATCH))[0])
            if count == 0:
                break
            moved += count
            remaining -= count
        return moved

    def _check_dead(self, wanted: Sequence[str]) -> None:
        """TaskNotFound (listing them) if any of ``wanted`` is not dead; writes nothing."""
        pipe = self._queue.redis.pipeline(transaction=False)
        for start in range(0, len(wanted), DEAD_BATCH):
            pipe.zmscore(self._queue.keys.dead, [*wanted[start : start + DEAD_BATCH]])
        scores = [score for reply in pipe.execute() for score in reply]
        missing = [i for i, score in zip(wanted, scores, strict=True) if score is None]
        if missing:
            raise TaskNotFound(f"not in the dead-letter queue: {missing[:10]}", missing)


def _distinct_ids(ids: object) -> list[str]:
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
