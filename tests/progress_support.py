"""A progress follower on a thread of its own, on either front end, for tests that write
entries while it follows (``q.progress`` blocks; ``aq.progress`` runs on a loop of the
follower's thread, with a client of its own)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

import redis
from conftest import async_mirror

import dueq


class Follower:
    """``q.progress(task_id, timeout=)`` of a queue ``name`` (``options``: the queue's, e.g.
    ``shards=``) on ``front_end``, run on a thread: ``entries`` fills as they come; ``done``
    is set when the iterator ended (``error`` holds what it raised)."""

    def __init__(
        self,
        front_end: str,
        r: redis.Redis,
        task_id: str,
        *,
        name: str = "q",
        timeout: float | None = None,
        **options: Any,
    ) -> None:
        self.entries: list[dueq.Progress] = []
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._args = (front_end, r, task_id, name, timeout, options)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def seqs(self) -> list[int]:
        return [e.seq for e in self.entries]

    def _run(self) -> None:
        front_end, r, task_id, name, timeout, options = self._args
        try:
            if front_end == "sync":
                for entry in dueq.Queue(name, r, **options).progress(task_id, timeout=timeout):
                    self.entries.append(entry)
            else:
                asyncio.run(self._follow_async(r, task_id, name, timeout, options))
        except BaseException as exc:  # handed to the test
            self.error = exc
        finally:
            self.done.set()

    async def _follow_async(
        self, r: redis.Redis, task_id: str, name: str, timeout: float | None, options: Any
    ) -> None:
        client = async_mirror(r)
        try:
            q = dueq.AsyncQueue(name, client, **options)
            async with contextlib.aclosing(q.progress(task_id, timeout=timeout)) as entries:
                async for entry in entries:
                    self.entries.append(entry)
        finally:
            await client.aclose()

    def join(self, wait_s: float = 30.0) -> list[int]:
        """Wait for the follow to end; its seqs (AssertionError if it did not end)."""
        assert self.done.wait(wait_s), "the follower did not end"
        if self.error is not None:
            raise self.error
        return self.seqs
