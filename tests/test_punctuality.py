"""Punctuality (issue 31): a consumer sleeping until the next due time counts the sleep from
when it sent the claim that reported it, so its next claim reaches Redis about when the task
is due, not a whole round trip later (the reply's way back and its parsing were lag on every
delivery: a median 0.5 ms, measured).

A claim here takes a simulated round trip with the queue's clock read half way, as Redis reads
TIME inside the script. Lag is judged by the queue's clock (``claimed_ms - due_ms``).
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone
from typing import Any

import redis
from conftest import async_mirror
from reactivex.testing import TestScheduler

import dueq
from dueq.server import RedisServer

START = 1_800_000_000.0
TASKS = 3


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(START + seconds, tz=timezone.utc)


def test_threaded_next_claim_reaches_redis_within_half_a_round_trip_of_the_due_time(
    r: redis.Redis,
) -> None:
    ts = TestScheduler()
    ts.advance_to(START)
    q = dueq.Queue("punctual", r, clock=lambda: ts.now.timestamp())
    original = q.claim_batch
    half_trip_s = 0.005

    def slow_claim(*args: Any, **kwargs: Any) -> dueq.ClaimBatch:
        ts.sleep(half_trip_s)  # on its way to Redis
        batch = original(*args, **kwargs)  # reads the queue's clock here
        ts.sleep(half_trip_s)  # the reply on its way back
        return batch

    q.claim_batch = slow_claim  # type: ignore[method-assign]
    q.schedule_many(dueq.Task({"i": i}, id=f"t{i}", at=at(1 + i)) for i in range(TASKS))
    got: list[dueq.Delivery] = []
    sub = q.observe(scheduler=ts, wake=False).subscribe(on_next=got.append)
    ts.advance_by(TASKS + 1.0)
    sub.dispose()
    assert sorted(d.id for d in got) == [f"t{i}" for i in range(TASKS)]
    lags_ms = [d.claimed_ms - d.due_ms for d in got]
    # never early; late by a quarter of the round trip (2.5 ms), was the whole of it (10 ms)
    assert all(0 <= lag <= half_trip_s * 1000 for lag in lags_ms), lags_ms


def test_async_next_claim_reaches_redis_within_half_a_round_trip_of_the_due_time(
    redis_server: RedisServer, r: redis.Redis
) -> None:
    half_trip_s = 0.25  # large against the loop's own delays (the test's margin)

    async def main() -> list[dueq.AsyncDelivery]:
        client = async_mirror(r)
        q = dueq.AsyncQueue("punctual-async", client, clock=time.time)
        original = q.claim_batch

        async def slow_claim(*args: Any, **kwargs: Any) -> dueq.ClaimBatch:
            await asyncio.sleep(half_trip_s)
            batch = await original(*args, **kwargs)
            await asyncio.sleep(half_trip_s)
            return batch

        q.claim_batch = slow_claim  # type: ignore[method-assign]
        await q.schedule_many(
            dueq.Task({"i": i}, id=f"t{i}", delay=1.5 + 1.5 * i) for i in range(TASKS)
        )
        got: list[dueq.AsyncDelivery] = []
        async with asyncio.timeout(60):
            async for d in q.deliveries(wake=False):
                got.append(d)
                await d.ack()
                if len(got) == TASKS:
                    break
        await client.aclose()
        return got

    got = asyncio.run(main())
    assert sorted(d.id for d in got) == [f"t{i}" for i in range(TASKS)]
    lags_ms = [d.claimed_ms - d.due_ms for d in got]
    # late by about a quarter of the round trip (125 ms), was the whole of it (500 ms)
    assert all(0 <= lag < half_trip_s * 1000 for lag in lags_ms), lags_ms


def test_a_claim_quicker_to_reach_redis_than_the_last_does_not_arrive_before_the_due_time(
    r: redis.Redis,
) -> None:
    """The next claim is timed for the quickest recent way to Redis, so a claim that happens
    to be quicker than the one before does not arrive early and lease nothing."""
    ts = TestScheduler()
    ts.advance_to(START)
    q = dueq.Queue("punctual-ways", r, clock=lambda: ts.now.timestamp())
    original = q.claim_batch
    ways_s = [0.005, 0.001]  # the way to Redis takes turns: slow, quick, slow, ...
    claims: list[int] = []

    def claim(*args: Any, **kwargs: Any) -> dueq.ClaimBatch:
        ts.sleep(ways_s[len(claims) % 2])
        batch = original(*args, **kwargs)
        claims.append(len(batch.deliveries))
        ts.sleep(0.002)  # the way back
        return batch

    q.claim_batch = claim  # type: ignore[method-assign]
    q.schedule_many(dueq.Task({"i": i}, id=f"t{i}", at=at(1 + i)) for i in range(6))
    got: list[dueq.Delivery] = []
    sub = q.observe(scheduler=ts, wake=False, heartbeat=3600).subscribe(on_next=got.append)
    ts.advance_by(8.0)
    sub.dispose()
    assert len(got) == 6
    assert all(d.claimed_ms >= d.due_ms for d in got)
    # the first claim (nothing due yet), one per task, and at most one early claim while
    # the consumer had not yet seen a quick way
    assert claims.count(0) <= 2, claims
