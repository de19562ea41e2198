"""Plain-function handlers with ``timeout=`` on the asyncio consumer (``AsyncWorker``, and
``process`` subscribed on a loop): an attempt's timeout measures the handler's own run, never
the wait for a thread; a handler abandoned at its timeout never takes a live thread's place
(up to the bound on abandoned threads); its late result is refused with a log line.

Every hanging handler waits on an Event the test sets at the end, so no thread outlives its
test. Waits are upper bounds, never measurements.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from collections.abc import Callable
from typing import Any

import pytest
import redis
from conftest import async_mirror
from paths_support import DOCS
from waiting_support import wait_for

import dueq
from dueq.server import RedisServer

BOUND_S = 30.0
REFUSED = "handler returned after its timeout; its result is refused"


def no_wait(state: Any) -> float:
    return 0.0


def an_hour(state: Any) -> float:
    return 3600.0


async def until(condition: Callable[[], Any], what: str) -> None:
    """Wait (on the loop) until ``condition()`` is true; fail naming ``what`` after BOUND_S."""
    try:
        async with asyncio.timeout(BOUND_S):
            while not condition():
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


class Consumer:
    """A plain-function handler on an AsyncQueue, either through ``AsyncWorker`` or through
    ``q.observe().pipe(process(...))``; ``outcomes`` lists every outcome it emitted."""

    def __init__(self, how: str, q: dueq.AsyncQueue, handler: Any, **settings: Any) -> None:
        self.how = how
        self.outcomes: list[dueq.Outcome] = []
        self._worker: dueq.AsyncWorker | None = None
        self._running: asyncio.Future[None] | None = None
        self._sub: Any = None
        if how == "worker":
            self._worker = dueq.AsyncWorker(q, handler, handle_signals=False, **settings)
        else:
            self._stream = q.observe().pipe(dueq.operators.process(handler, **settings))

    def start(self) -> None:
        if self._worker is not None:
            self._running = asyncio.ensure_future(self._worker.run())
        else:
            self._sub = self._stream.subscribe(on_next=self.outcomes.append)

    def kinds(self) -> dict[str, int]:
        if self._worker is not None:
            return dict(self._worker.outcomes)
        counts: dict[str, int] = {}
        for o in self.outcomes:
            counts[o.kind] = counts.get(o.kind, 0) + 1
        return counts

    async def stop(self) -> None:
        if self._worker is not None:
            assert self._running is not None
            self._worker.stop()
            self._worker.stop()  # (no grace wanted: cut it short)
            async with asyncio.timeout(BOUND_S):
                await self._running
        else:
            self._sub.dispose()


@pytest.mark.parametrize("how", ["worker", "operator"])
def test_quick_tasks_run_and_are_acked_while_two_sync_handlers_hang_past_their_timeout(
    r: redis.Redis, how: str
) -> None:
    # the red team's scenario: concurrency 1, timeout 0.2 s, two handlers stuck well past it
    release = threading.Event()
    hung: list[str] = []
    returned: list[str] = []
    ran: list[str] = []

    def handle(d: dueq.AsyncDelivery) -> None:
        if d.payload == "hang":
            hung.append(d.id)
            release.wait(BOUND_S)  # stuck until the test ends
            returned.append(d.id)
        else:
            ran.append(d.id)

    async def main() -> None:
        client = async_mirror(r)
        q = dueq.AsyncQueue("att", client, lease=30, retry=dueq.RetryPolicy(1, wait=no_wait))
        consumer = Consumer(how, q, handle, concurrency=1, timeout=0.2)
        try:
            await q.schedule("hang", id="hang-1")
            await q.schedule("hang", id="hang-2")
            consumer.start()
            await until(lambda: len(hung) == 2, "both hanging handlers to start")
            quick = [f"quick-{i}" for i in range(5)]
            for tid in quick:
                await q.schedule("quick", id=tid)
            await until(lambda: consumer.kinds().get("acked", 0) == 5, "five acks")
            assert sorted(ran) == quick
            for tid in quick:
                assert await q.get(tid) is None  # acked: gone
            dead = await q.dead.list()
            assert sorted(t.id for t in dead) == ["hang-1", "hang-2"]
            assert all([e.type for e in t.errors] == ["TaskTimeout"] for t in dead)
            assert consumer.kinds() == {"acked": 5, "dead": 2}
        finally:
            release.set()
            await consumer.stop()
            await client.aclose()

    asyncio.run(main())
    wait_for(lambda: len(returned) == len(hung), "the hanging handlers to return")


def test_a_sync_handler_returning_after_its_timeout_on_the_loop_logs_that_its_result_is_refused(
    r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dueq")
    release, returned = threading.Event(), threading.Event()

    def handle(d: dueq.AsyncDelivery) -> None:
        release.wait(BOUND_S)
        returned.set()

    def refused() -> list[logging.LogRecord]:  # (other tests' threads may log meanwhile)
        return [
            rec
            for rec in caplog.records
            if REFUSED in rec.getMessage() and "'atl'" in rec.getMessage()
        ]

    async def main() -> None:
        client = async_mirror(r)
        q = dueq.AsyncQueue("atl", client, lease=30, retry=dueq.RetryPolicy(5, wait=an_hour))
        consumer = Consumer("operator", q, handle, concurrency=1, timeout=0.2)
        try:
            tid = await q.schedule({})
            consumer.start()
            await until(lambda: consumer.outcomes, "the timeout's outcome")
            assert refused() == []  # still running: nothing refused yet
            release.set()  # the abandoned handler returns now: its result is refused
            await until(refused, "the 'result is refused' log line")
            assert returned.is_set()
            (record,) = refused()
            assert f"task {tid!r} attempt 1" in record.getMessage()
            assert [(o.kind, o.attempt) for o in consumer.outcomes] == [("retried", 1)]
            info = await q.get(tid)
            assert info is not None and info.state == "scheduled"
            assert (await q.stats()).counters.get("acked", 0) == 0
        finally:
            release.set()
            await consumer.stop()
            await client.aclose()

    asyncio.run(main())


def test_past_the_bound_on_abandoned_threads_a_slot_waits_and_its_task_does_not_time_out(
    r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # concurrency 1 keeps at most 8 abandoned threads: the 9th hanging handler is not
    # replaced, so the quick task waits for a thread, and that wait is no part of its attempt
    caplog.set_level(logging.WARNING, logger="dueq")
    release = threading.Event()
    hung: list[str] = []
    returned: list[str] = []
    ran: list[str] = []

    def handle(d: dueq.AsyncDelivery) -> None:
        if d.payload == "hang":
            hung.append(d.id)
            release.wait(BOUND_S)
            returned.append(d.id)
        else:
            ran.append(d.id)

    def handler_threads() -> int:
        return sum(t.name.startswith("dueq-handler") for t in threading.enumerate())

    async def main() -> None:
        client = async_mirror(r)
        q = dueq.AsyncQueue("atb", client, lease=30, retry=dueq.RetryPolicy(1, wait=no_wait))
        consumer = Consumer("operator", q, handle, concurrency=1, timeout=0.2)
        try:
            await q.schedule_many(dueq.Task("hang", id=f"hang-{i}") for i in range(9))
            before = handler_threads()
            consumer.start()
            await until(lambda: len(hung) == 9, "nine hanging handlers to start")
            await until(
                lambda: any("not replaced" in rec.getMessage() for rec in caplog.records),
                "the log line saying the thread is not replaced",
            )
            await q.schedule("quick", id="quick")
            await asyncio.sleep(0.5)  # longer than its timeout: it must still be waiting
            assert ran == [] and handler_threads() - before <= 9  # none added past the bound
            assert await q.get("quick") is not None
            release.set()
            await until(lambda: ran == ["quick"], "the quick task to run")
            await until(lambda: consumer.kinds().get("acked", 0) == 1, "its ack")
            assert await q.get("quick") is None
            assert consumer.kinds() == {"acked": 1, "dead": 9}
        finally:
            release.set()
            await consumer.stop()
            await client.aclose()

    asyncio.run(main())
    wait_for(lambda: len(returned) == len(hung), "the hanging handlers to return")


def test_the_timeouts_page_example_runs_as_written(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    page = (DOCS / "timeouts.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    assert len(blocks) == 1
    scope: dict[str, Any] = {"REDIS_URL": redis_server.url}
    exec(compile(blocks[0], "docs/timeouts.md", "exec"), scope)  # its asserts are the test
    assert scope["outcomes"] == {"dead": 1, "acked": 1}


@pytest.mark.parametrize("front", ["sync", "async"])
def test_key_concurrency_counts_leases_so_a_handler_abandoned_at_its_timeout_overlaps_its_keys_next(
    r: redis.Redis, front: str
) -> None:
    # what docs/timeouts.md says: the limit is 1, yet the key's second task starts while the
    # first one's handler, abandoned at its timeout, still runs
    release = threading.Event()
    running: list[str] = []
    most: list[int] = [0]
    lock = threading.Lock()

    def handle(d: Any) -> None:
        with lock:
            running.append(d.id)
            most[0] = max(most[0], len(running))
        try:
            if d.id == "first":
                release.wait(BOUND_S)
        finally:
            with lock:
                running.remove(d.id)

    policy = dueq.RetryPolicy(1, wait=no_wait)
    if front == "sync":
        q = dueq.Queue("atk", r, retry=policy)
        q.configure(key_concurrency=1)
        q.schedule(0, id="first", key="k")
        q.schedule(1, id="second", key="k", delay=0.05)
        worker = dueq.Worker(q, handle, concurrency=1, timeout=0.2)
        thread = threading.Thread(target=worker.run)
        thread.start()
        try:
            wait_for(lambda: worker.outcomes["acked"] == 1, "the second task's ack")
        finally:
            release.set()
            worker.stop()
            thread.join(BOUND_S)
    else:

        async def main() -> None:
            client = async_mirror(r)
            aq = dueq.AsyncQueue("atk", client, retry=policy)
            await aq.configure(key_concurrency=1)
            await aq.schedule(0, id="first", key="k")
            await aq.schedule(1, id="second", key="k", delay=0.05)
            consumer = Consumer("worker", aq, handle, concurrency=1, timeout=0.2)
            consumer.start()
            try:
                await until(lambda: consumer.kinds().get("acked") == 1, "the second task's ack")
            finally:
                release.set()
                await consumer.stop()
                await client.aclose()

        asyncio.run(main())
    wait_for(lambda: not running, "the abandoned handler to return")
    assert most[0] == 2
