"""Progress entries in the outcome events (issue 39): while the queue's events are on, each
``d.progress(body)`` is a "progress" event (its ``seq`` and ``body``; no ``task``) between the
task's outcomes, read by ``q.events()`` on both front ends; with events off none is written."""

from __future__ import annotations

import asyncio
import threading
from datetime import datetime, timezone
from typing import Any

import redis
from conftest import async_mirror
from waiting_support import wait_for

import dueq

SINCE = datetime(2000, 1, 1, tzinfo=timezone.utc)


def _read_events(front_end: str, r: redis.Redis, count: int) -> list[Any]:
    """The first ``count`` events of queue "q" from the start, read by ``front_end``'s
    ``events()`` (the async one on a loop of its own thread)."""
    found: list[Any] = []
    if front_end == "sync":
        subscription = dueq.Queue("q", r).events(since=SINCE).subscribe(on_next=found.append)
        try:
            wait_for(lambda: len(found) >= count, f"{count} events")
        finally:
            subscription.dispose()
        return found[:count]

    async def read() -> None:
        client = async_mirror(r)
        try:
            async for ev in dueq.AsyncQueue("q", client).events(since=SINCE):
                found.append(ev)
                if len(found) >= count:
                    return
        finally:
            await client.aclose()

    thread = threading.Thread(target=lambda: asyncio.run(asyncio.wait_for(read(), 30)))
    thread.start()
    thread.join(40)
    return found[:count]


def test_progress_entries_are_progress_events_between_the_outcomes(make_queue, r, front_end):
    q = make_queue(clock=None)  # (Redis 6.2 writes an event at its own time)
    q.configure(events=3600)
    q.schedule({"n": 1}, id="t1")
    (d,) = q.claim()
    d.progress({"done": 10})
    d.progress("almost")
    d.ack()
    events = _read_events(front_end, r, 3)
    assert [(e.kind, e.task_id, e.seq, e.body) for e in events] == [
        ("progress", "t1", 1, {"done": 10}),
        ("progress", "t1", 2, "almost"),
        ("acked", "t1", None, None),
    ]
    assert events[0].attempt == 1 and events[0].task is None
    assert events[0].to_json()["kind"] == "progress" and events[0].to_json()["seq"] == 1


def test_with_events_off_progress_writes_no_event(make_queue, r):
    q = make_queue()
    q.schedule({"n": 1}, id="t1")
    (d,) = q.claim()
    assert d.progress("quiet") == 1
    assert r.exists(q.keys.events) == 0
