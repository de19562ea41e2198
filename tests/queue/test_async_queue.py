"""AsyncQueue: the asyncio front end over the same protocol and Redis data as Queue.

The contract tests (test_claim, test_schedule, test_retry, test_dead, test_cron, ...) run on
both front ends through the ``make_queue`` fixture; these tests cover what is particular to
asyncio: both front ends on one queue, the client types, and a loop that is never blocked.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import redis
import redis.asyncio
from conftest import async_mirror

import dueq
from dueq.server import RedisServer


@pytest.fixture
def aclient(redis_server: RedisServer, r: redis.Redis):
    return lambda: async_mirror(redis_server.client())


def test_a_task_scheduled_by_one_front_end_is_consumed_by_the_other(r, aclient):
    sync_q = dueq.Queue("both", r)

    async def main() -> None:
        client = aclient()
        async_q = dueq.AsyncQueue("both", client)
        await async_q.schedule({"from": "async"}, id="a1")
        sync_q.schedule({"from": "sync"}, id="s1")
        [d] = sync_q.claim(limit=1)  # the earliest due, whichever wrote it
        got = [(await async_q.claim())[0], d]
        assert {x.id for x in got} == {"a1", "s1"}
        assert {x.payload["from"] for x in got} == {"async", "sync"}
        await got[0].ack()
        got[1].ack()
        assert (await async_q.stats()).scheduled == 0 and sync_q.stats().counters["acked"] == 2
        await client.aclose()

    asyncio.run(main())


def test_async_deliveries_fail_extend_release_and_are_fenced(aclient):
    async def main() -> None:
        client = aclient()
        q = dueq.AsyncQueue("fenced", client, lease=30, retry=dueq.RetryPolicy(max_attempts=2))
        await q.schedule("x", id="t")
        [d] = await q.claim()
        await d.extend(60)
        outcome = await d.fail(RuntimeError("boom"), retry_in=0)
        assert outcome.kind == "retried"
        with pytest.raises(dueq.LeaseLost):
            await d.ack()
        [again] = await q.claim()
        assert isinstance(again, dueq.AsyncDelivery) and again.attempt == 2
        await again.release()
        info = await q.get("t")
        assert info is not None and info.state == "scheduled"
        assert info.errors[-1].message == "boom"
        await client.aclose()

    asyncio.run(main())


def test_async_dead_letters_and_cron_are_awaited(aclient):
    async def main() -> None:
        client = aclient()
        q = dueq.AsyncQueue("dl", client, retry=dueq.RetryPolicy(max_attempts=1))
        await q.schedule("x", id="t")
        [d] = await q.claim()
        await d.fail(dueq.Unrecoverable("no"))
        assert await q.dead.count() == 1
        assert [i.id for i in await q.dead.list()] == ["t"]
        assert await q.dead.replay(["t"]) == 1
        assert await q.cron.add("hourly", "@hourly") == "added"
        assert [c.name for c in await q.cron.list()] == ["hourly"]
        assert await q.cron.remove("hourly") is True
        await client.aclose()

    asyncio.run(main())


def test_each_front_end_refuses_the_other_kind_of_client_by_name(r, aclient):
    client = aclient()
    with pytest.raises(dueq.ConfigurationError, match=r"redis\.asyncio.*use dueq\.AsyncQueue"):
        dueq.Queue("q", client)  # type: ignore[arg-type]
    with pytest.raises(dueq.ConfigurationError, match=r"redis\.asyncio\.Redis.*use dueq\.Queue"):
        dueq.AsyncQueue("q", r)  # type: ignore[arg-type]
    asyncio.run(client.aclose())


def test_bad_input_is_refused_before_anything_is_awaited(r, aclient):
    client = aclient()
    q = dueq.AsyncQueue("q", client)
    with pytest.raises(dueq.InvalidTaskError):
        asyncio.run(q.schedule("x", delay=-1))
    with pytest.raises(dueq.PayloadError):
        asyncio.run(q.schedule({"x": object()}))
    assert r.dbsize() == 0


def test_the_loop_is_never_blocked_while_redis_is_paused(admin: redis.Redis, aclient):
    """While Redis holds writes for 1 s (as a failover does), an awaited schedule waits for
    it, and a ticker on the same loop keeps ticking meanwhile (a blocked loop would tick not
    once until the schedule returned). Counted in ticks, not timed."""

    async def main() -> tuple[float, int, bool]:
        client = aclient()
        q = dueq.AsyncQueue("paused", client)
        await q.schedule("warm-up")  # scripts loaded, connection open
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        admin.execute_command("CLIENT", "PAUSE", 1000, "WRITE")  # the default user
        tick = asyncio.create_task(ticker())
        started = time.monotonic()
        schedule = asyncio.create_task(q.schedule("during the pause"))
        while ticks < 5 and not schedule.done():
            await asyncio.sleep(0.01)
        pending_after_ticks = not schedule.done()
        await schedule
        waited = time.monotonic() - started
        tick.cancel()
        await asyncio.gather(tick, return_exceptions=True)
        await client.aclose()
        return waited, ticks, pending_after_ticks

    waited, ticks, pending_after_ticks = asyncio.run(main())
    assert waited >= 0.5  # the schedule really waited for Redis
    assert pending_after_ticks and ticks >= 5  # the loop ran while it waited
    assert dueq.Queue("paused", admin).stats().scheduled == 2  # both schedules landed


def test_wait_replicas_is_refused_for_an_async_cluster_client():
    cluster = redis.asyncio.RedisCluster(host="127.0.0.1", port=1)  # never connected
    with pytest.raises(dueq.ConfigurationError, match="RedisCluster"):
        dueq.AsyncQueue("q", cluster, wait_replicas=1)
