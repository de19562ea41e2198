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


def values_of_queue(r: Any, name: str) -> list[bytes]:
    """Every stored value of every key of queue ``name``, read by its type (members, fields,
    list items, stream entries and strings)."""
    values: list[bytes] = []
    for key in r.scan_iter(match=f"dueq:{{{name}}}:*"):
        kind = r.type(key).decode()
        if kind == "string":
            values.append(r.get(key))
        elif kind == "hash":
            for field, value in r.hgetall(key).items():
                values += (field, value)
        elif kind == "zset":
            values += r.zrange(key, 0, -1)
        elif kind == "set":
            values += list(r.smembers(key))
        elif kind == "list":
            values += r.lrange(key, 0, -1)
        elif kind == "stream":
            for _, fields in r.xrange(key):
                for field, value in fields.items():
                    values += (field, value)
    return values
