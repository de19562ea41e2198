"""AsyncQueue.deliveries(): the asyncio consumer, on the test's own loop, against real Redis.

Timing is judged by the queue's clock (Redis TIME, recorded in each delivery), never by the
wall clock: a delivery is on time when it was claimed at or after its due time. Waits on the
test side are upper bounds that keep a broken consumer from hanging the suite.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from conftest import async_mirror

import dueq
from dueq.server import RedisServer

BOUND_S = 10.0  # the most a test waits for something that should come at once


def _client(server: RedisServer) -> redis.asyncio.Redis:
    return async_mirror(server.client())


def test_every_task_is_yielded_at_or_after_its_due_time_never_early(r, redis_server):
    async def main() -> list[dueq.AsyncDelivery]:
        client = _client(redis_server)
        q = dueq.AsyncQueue("on-time", client)
        await q.schedule_many(dueq.Task({"n": i}, id=f"t{i}", delay=i * 0.02) for i in range(20))
        got: list[dueq.AsyncDelivery] = []
        async with asyncio.timeout(BOUND_S):
            async for d in q.deliveries():
                got.append(d)
                await d.ack()
                if len(got) == 20:
                    break
        await client.aclose()
        return got

    got = asyncio.run(main())
    assert sorted(d.id for d in got) == sorted(f"t{i}" for i in range(20))
    assert all(d.claimed_ms >= d.due_ms for d in got)  # by the server's clock
    assert [d.id for d in got] == sorted((d.id for d in got), key=lambda i: int(i[1:]))


def test_a_sleeping_iterator_is_woken_by_an_earlier_schedule(r, redis_server):
    async def main() -> dueq.AsyncDelivery:
        client = _client(redis_server)
        q = dueq.AsyncQueue("wake", client)
        await q.schedule("later", id="later", delay=3600)
        it = q.deliveries(heartbeat=3600)  # only the wake channel can bring it in time
        waiting = asyncio.ensure_future(anext(it))
        await asyncio.sleep(0.2)  # the iterator has claimed nothing and sleeps
        assert not waiting.done()
        producer = dueq.AsyncQueue("wake", _client(redis_server))
        await producer.schedule("now", id="now")
        async with asyncio.timeout(BOUND_S):
            d = await waiting
        await d.ack()
        await it.aclose()
        await producer.redis.aclose()
        await client.aclose()
        return d

    assert asyncio.run(main()).id == "now"


def test_backpressure_holds_max_in_flight_until_one_is_settled(r, redis_server):
    async def main() -> None:
        client = _client(redis_server)
        q = dueq.AsyncQueue("bp", client)
        await q.schedule_many(dueq.Task(i, id=f"t{i:02}") for i in range(10))
        it = q.deliveries(max_in_flight=3)
        held = [await anext(it) for _ in range(3)]
        fourth = asyncio.ensure_future(anext(it))
        await asyncio.sleep(0.3)
        assert not fourth.done()  # three unsettled: it claims no more
        assert (await q.stats()).leased == 3
        await held[0].ack()
        async with asyncio.timeout(BOUND_S):
            d = await fourth
        assert d.id == "t03"
        await it.aclose()
        await client.aclose()

    asyncio.run(main())


def test_a_full_hold_claims_again_once_a_quarter_is_free_not_at_each_ack(r, redis_server):
    async def main() -> None:
        client = _client(redis_server)
        q = dueq.AsyncQueue("refill", client)
        await q.schedule_many(dueq.Task(i, id=f"t{i:02}") for i in range(20))
        it = q.deliveries(max_in_flight=8, wake=False)
        held = [await anext(it) for _ in range(8)]
        ninth = asyncio.ensure_future(anext(it))
        await held[0].ack()  # one free slot of eight: not worth a claim yet
        await asyncio.sleep(0.3)
        assert not ninth.done()
        await held[1].ack()  # a quarter free: claim
        async with asyncio.timeout(BOUND_S):
            d = await ninth
        assert d.id == "t08"
        await it.aclose()
        await client.aclose()

    asyncio.run(main())


def test_the_last_few_slots_are_not_claimed_right_after_a_big_claim(r, redis_server):
    async def main() -> None:
        client = _client(redis_server)
        q = dueq.AsyncQueue("tail", client)
        await q.schedule_many(dueq.Task(i) for i in range(1100))
        it = q.deliveries(max_in_flight=1024, wake=False)
        held = [await anext(it) for _ in range(1000)]  # one claim leases at most 1,000
        more = asyncio.ensure_future(anext(it))
        await asyncio.sleep(0.3)
        assert not more.done()  # 24 free of 1,024: not worth a round trip
        assert (await q.stats()).leased == 1000
        for d in held[:232]:  # 256 free: claim
            await d.ack()
        async with asyncio.timeout(BOUND_S):
            await more
        await it.aclose()
        await client.aclose()

    asyncio.run(main())


def test_leaving_the_loop_releases_what_was_claimed_but_not_yielded(r, redis_server):
    async def main() -> None:
        client = _client(redis_server)
        q = dueq.AsyncQueue("leave", client)
        await q.schedule_many(dueq.Task(i, id=f"t{i:02}") for i in range(10))
        async with contextlib.aclosing(q.deliveries(max_in_flight=10)) as it:
            async for d in it:
                await d.ack()
                break  # one handled; nine were claimed with it
        stats = await q.stats()
        assert (stats.scheduled, stats.leased) == (9, 0)
        info = await q.get("t05")
        assert info is not None and info.attempt == 0  # the release did not count
        await client.aclose()

    asyncio.run(main())


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    server = RedisServer(appendonly=True).start()
    yield server
    server.stop()


def test_the_iterator_waits_out_a_redis_restart_and_goes_on(own_server: RedisServer):
    async def main() -> list[str]:
        client = _client(own_server)
        q = dueq.AsyncQueue("outage", client)
        await q.schedule("before", id="before")
        got: list[str] = []
        it = q.deliveries(heartbeat=0.2)
        async with asyncio.timeout(BOUND_S):
            d = await anext(it)
        await d.ack()
        got.append(d.id)
        own_server.restart(kill=True)
        blocking = own_server.client()
        dueq.Queue("outage", blocking).schedule("after", id="after")
        blocking.close()
        async with asyncio.timeout(BOUND_S * 3):
            d = await anext(it)
        await d.ack()
        got.append(d.id)
        await it.aclose()
        await client.aclose()
        return got

    assert asyncio.run(main()) == ["before", "after"]


def test_bad_iterator_settings_are_configuration_errors(r, redis_server):
    async def main() -> None:
        client = _client(redis_server)
        q = dueq.AsyncQueue("bad", client)
        for kwargs in ({"max_in_flight": 0}, {"heartbeat": -1}, {"max_in_flight": 10**9}):
            with pytest.raises(dueq.ConfigurationError):
                await anext(q.deliveries(**kwargs))  # type: ignore[arg-type]
        await client.aclose()

    asyncio.run(main())


def _wake_subscribers(r: redis.Redis, channel: str) -> int:
    """How many clients listen on a wake channel (SSUBSCRIBE from Redis 7.0, else SUBSCRIBE)."""
    _, version = dueq.server.server_build(r)
    if dueq._consume.wake.sharded_pubsub(version):
        return int(r.pubsub_shardnumsub(channel)[0][1])
    return int(r.pubsub_numsub(channel)[0][1])


#: Runs of the dispose sweep, each disposing ``run % 11`` ms after the listener subscribed.
SWEEP_RUNS = 40


@pytest.mark.parametrize(
    "poll_s", [dueq._consume.wake.POLL_S, 0.001], ids=["poll-500ms", "poll-1ms"]
)
def test_disposing_observe_while_its_wake_listener_reads_always_ends_the_listener(
    r, redis_server, monkeypatch, poll_s
):
    """Issue 37: a cancel that reaches the listener inside redis-py's ``get_message`` could be
    swallowed (the read's own timeout turns it into "no message"), leaving the task
    "cancelling" for ever and ``asyncio.run`` hung. A sweep of disposals 0-10 ms after the
    subscription (and with a 1 ms read, so that the cancel meets the read's timeout often);
    each run is bounded, so a listener that does not end fails the test instead of hanging."""
    monkeypatch.setattr(dueq._consume.wake, "POLL_S", poll_s)

    async def one_run(delay_s: float) -> set[asyncio.Task[object]]:
        client = _client(redis_server)
        q = dueq.AsyncQueue("sweep", client)
        before = asyncio.all_tasks()
        sub = q.observe(heartbeat=3600).subscribe()
        ours = asyncio.all_tasks() - before
        deadline = asyncio.get_running_loop().time() + BOUND_S
        while _wake_subscribers(r, q.keys.wake) == 0:  # the listener is in get_message now
            assert asyncio.get_running_loop().time() < deadline, "the listener never subscribed"
            await asyncio.sleep(0.001)
        await asyncio.sleep(delay_s)
        sub.dispose()
        ours |= {t for t in asyncio.all_tasks() - before if t is not asyncio.current_task()}
        _, pending = await asyncio.wait(ours, timeout=BOUND_S)  # (the listener is among them)
        await client.aclose()
        return pending

    hung: list[int] = []
    for run in range(SWEEP_RUNS):
        loop = asyncio.new_event_loop()
        try:
            pending = loop.run_until_complete(one_run((run % 11) / 1000))
            if pending:
                hung.append(run)
                for task in pending:  # one more cancel, bounded: the run must not hang either
                    task.cancel()
                loop.run_until_complete(asyncio.wait(pending, timeout=1.0))
        finally:
            loop.close()
    assert hung == []


class CancelSwallowingPubSub(redis.asyncio.client.PubSub):
    """A redis-py PubSub whose read turns a cancellation into "no message", as redis-py's own
    read does when its timeout and a cancel meet (the task is left "cancelling", with nothing
    to raise): the client's behaviour the listener must survive, not Redis's."""

    async def get_message(self, *args: object, **kwargs: object) -> object:
        try:
            return await super().get_message(*args, **kwargs)  # type: ignore[arg-type]
        except asyncio.CancelledError:
            return None


def _left_running_though_cancels_are_swallowed(
    r: redis.Redis, redis_server: RedisServer, name: str, start: Callable[[dueq.AsyncQueue], Any]
) -> set[asyncio.Task[object]]:
    """Start a consumer on a client whose pubsub reads swallow every cancel (``start(q)``
    returns its stop function), wait until its wake listener reads, stop it, and return the
    tasks it started that are still pending after BOUND_S (bounded: the test must not hang)."""

    async def main() -> set[asyncio.Task[object]]:
        client = _client(redis_server)
        client.pubsub = lambda **kw: CancelSwallowingPubSub(client.connection_pool, **kw)  # type: ignore[method-assign]
        q = dueq.AsyncQueue(name, client)
        before = asyncio.all_tasks()
        stop = start(q)
        deadline = asyncio.get_running_loop().time() + BOUND_S
        while _wake_subscribers(r, q.keys.wake) == 0:  # the listener is in get_message now
            assert asyncio.get_running_loop().time() < deadline, "the listener never subscribed"
            await asyncio.sleep(0.001)
        ours = {t for t in asyncio.all_tasks() - before if t is not asyncio.current_task()}
        stop()
        _, pending = await asyncio.wait(ours, timeout=BOUND_S)
        for task in pending:
            task.cancel()
        if pending:  # one more cancel, bounded: the test must not hang either
            await asyncio.wait(pending, timeout=1.0)
        await client.aclose()
        return pending

    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


def test_the_wake_listener_ends_when_cancelled_even_if_the_client_swallows_the_cancel(
    r, redis_server
):
    """Deterministic form of the sweep above: every cancel that reaches the listener's read is
    swallowed by the client; disposing must still end the listener (and the loop)."""

    def start(q: dueq.AsyncQueue) -> Callable[[], None]:
        return q.observe(heartbeat=3600).subscribe().dispose

    assert _left_running_though_cancels_are_swallowed(r, redis_server, "swallow", start) == set()


def test_an_async_worker_stops_even_if_the_client_swallows_every_cancel(r, redis_server):
    """As the test above, for ``AsyncWorker`` (``consume``): stop() ends its claim loop (run())
    and wake listener though every cancel that reaches a pubsub read is swallowed."""
    runs: list[asyncio.Future[None]] = []

    def start(q: dueq.AsyncQueue) -> Callable[[], None]:
        worker = dueq.AsyncWorker(q, lambda d: None, heartbeat=3600)
        runs.append(asyncio.ensure_future(worker.run()))
        return worker.stop

    pending = _left_running_though_cancels_are_swallowed(r, redis_server, "swallow-worker", start)
    assert pending == set()
    assert runs[0].done()
