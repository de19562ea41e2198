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
    it, and a ticker on the same loop keeps ticking: no gap over 250 ms."""

    async def main() -> tuple[float, float]:
        client = aclient()
        q = dueq.AsyncQueue("paused", client)
        await q.schedule("warm-up")  # scripts loaded, connection open
        gaps: list[float] = []
        done = asyncio.Event()

        async def ticker() -> None:
            last = time.monotonic()
            while not done.is_set():
                await asyncio.sleep(0.01)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        admin.execute_command("CLIENT", "PAUSE", 1000, "WRITE")  # the default user
        tick = asyncio.create_task(ticker())
        started = time.monotonic()
        await q.schedule("during the pause")
        waited = time.monotonic() - started
        done.set()
        await tick
        await client.aclose()
        return waited, max(gaps)

    waited, largest_gap = asyncio.run(main())
    assert waited >= 0.5  # the schedule really waited for Redis
    assert largest_gap < 0.25


def test_wait_replicas_is_refused_for_an_async_cluster_client():
    cluster = redis.asyncio.RedisCluster(host="127.0.0.1", port=1)  # never connected
    with pytest.raises(dueq.ConfigurationError, match="RedisCluster"):
        dueq.AsyncQueue("q", cluster, wait_replicas=1)
