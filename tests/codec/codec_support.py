"""Helpers of the codec tests: read a queue's events with its own reader, on either front end."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

from async_support import Blocking
from reactivex import operators as ops


def read_events(q: Any, count: int, since: datetime) -> list[Any]:
    """The first ``count`` events of ``q``'s stream from ``since``, read by the queue's own
    events reader (``Queue.events``' thread, or ``AsyncQueue.events`` on the test's loop)."""
    if not isinstance(q, Blocking):
        return list(q.events(since=since).pipe(ops.take(count), ops.to_list()).run())
    target = object.__getattribute__(q, "_target")
    loop: asyncio.AbstractEventLoop = object.__getattribute__(q, "_loop")

    async def main() -> list[Any]:
        found: list[Any] = []
        reader = target.events(since=since)
        try:
            async for ev in reader:
                found.append(ev)
                if len(found) == count:
                    break
        finally:
            await reader.aclose()
        return found

    return loop.run_until_complete(asyncio.wait_for(main(), 30))
