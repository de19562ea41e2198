"""The dead-letter queue of one Queue: list, count, replay and purge dead tasks."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from .checks import whole_number
from .envelope import validate_id
from .exceptions import TaskNotFound
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

        With ``ids`` it is all-or-nothing: TaskNotFound (listing them) if any id is not dead.
        Without, every task dead at the time of the call is replayed, in batches.
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
            wanted = [validate_id(i) for i in ids]
            moved = 0
            for start in range(0, len(wanted), DEAD_BATCH):
                reply = q._run("dead", keys, action, "ids", *wanted[start : start + DEAD_BATCH])
                if int(reply[0]) < 0:
                    missing = [text(x) for x in reply[1:]]
                    raise TaskNotFound(f"not in the dead-letter queue: {missing[:10]}", missing)
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
