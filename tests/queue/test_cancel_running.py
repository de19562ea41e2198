"""Honest cancel: ``q.cancel(id)`` of a leased task tells its holder "cancelled", never
"lost", on both front ends; ``process`` tells the handler and reports the outcome
``cancelled``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import redis
from conftest import async_mirror
from waiting_support import WAIT_S, Blocker, wait_for

import dueq


def held(make_queue: Callable[..., Any]) -> tuple[Any, Any]:
    q = make_queue("c", lease=30)
    q.schedule({"n": 1}, id="job")
    (d,) = q.claim(1)
    assert q.cancel("job")
    return q, d


def test_the_holders_ack_of_a_cancelled_task_raises_task_cancelled(
    make_queue: Callable[..., Any],
) -> None:
    q, d = held(make_queue)
    with pytest.raises(dueq.TaskCancelled) as caught:
        d.ack()
    assert isinstance(caught.value, dueq.LeaseLost)  # code that catches LeaseLost still works
    assert caught.value.ids == caught.value.cancelled == ["job"]
    assert d.cancelled and q.get("job") is None
    assert q.stats().counters.get("acked", 0) == 0


@pytest.mark.parametrize("call", ["fail", "extend", "release"])
def test_the_holders_fail_extend_and_release_of_a_cancelled_task_raise_task_cancelled(
    make_queue: Callable[..., Any], call: str
) -> None:
    q, d = held(make_queue)
    with pytest.raises(dueq.TaskCancelled, match="cancelled while leased"):
        {"fail": lambda: d.fail("boom"), "extend": lambda: d.extend(30), "release": d.release}[
            call
        ]()
    assert d.cancelled and q.get("job") is None and q.dead.count() == 0


def test_a_new_holder_of_the_same_id_is_not_mistaken_for_the_cancelled_one(
    make_queue: Callable[..., Any],
) -> None:
    q, old = held(make_queue)
    q.schedule({"n": 2}, id="job")  # the same id again, leased to someone else
    (new,) = q.claim(1)
    with pytest.raises(dueq.TaskCancelled):
        old.ack()
    new.ack()  # the new lease is untouched
    assert q.stats().counters["acked"] == 1


def test_a_lease_that_only_ran_out_is_lost_not_cancelled(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue("c", lease=30)
    q.schedule({}, id="job")
    (d,) = q.claim(1)
    clock.advance(31)
    with pytest.raises(dueq.LeaseLost) as caught:
        d.ack()
    assert not isinstance(caught.value, dueq.TaskCancelled) and not d.cancelled


def test_a_cancel_after_the_lease_ran_out_but_before_reclaim_tells_the_holder_cancelled(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue("c", lease=30)
    q.schedule({}, id="job")
    (d,) = q.claim(1)
    clock.advance(31)  # the lease ran out; no claim has reclaimed it yet
    assert q.cancel("job")  # the task existed, so cancel says so ...
    with pytest.raises(dueq.TaskCancelled) as caught:  # ... and its holder is told the same
        d.ack()
    assert caught.value.cancelled == ["job"] and d.cancelled
    assert q.get("job") is None and q.dead.count() == 0
    assert q.claim(10) == []  # and nothing comes back from the reclaim


def test_a_batch_ack_names_cancelled_and_lost_leases_apart(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue("c", lease=30)
    q.schedule_many(dueq.Task({}, id=f"t{i}") for i in range(3))
    (t0,) = q.claim(1, lease=5)
    t1, t2 = q.claim(2)
    q.cancel("t1")
    clock.advance(6)  # t0's short lease ran out
    with pytest.raises(dueq.LeaseLost) as caught:
        q.ack_many([t0, t1, t2])
    assert sorted(caught.value.ids) == ["t0", "t1"] and caught.value.cancelled == ["t1"]
    assert q.stats().counters["acked"] == 1


def test_revoked_leases_are_forgotten_an_hour_after_their_deadline(
    make_queue: Callable[..., Any], r: redis.Redis, clock: Any
) -> None:
    q, _ = held(make_queue)
    assert r.zcard(q.keys.cancelled) == 1
    clock.advance(30 + 3601)
    q.schedule({}, id="other")
    q.claim(1)
    q.cancel("other")  # each cancel trims what is past keeping
    assert [m.decode().split("|")[0] for m in r.zrange(q.keys.cancelled, 0, -1)] == ["other"]


def test_an_async_handler_is_cancelled_when_its_task_is_cancelled(r: redis.Redis) -> None:
    async def main() -> tuple[list[dueq.Outcome], list[str]]:
        client = async_mirror(r)
        q = dueq.AsyncQueue("ca", client, lease=0.6)  # the keeper looks every 0.2 s
        await q.schedule({}, id="long")
        seen: list[str] = []
        items: list[dueq.Outcome] = []
        done, running = asyncio.Event(), asyncio.Event()

        async def handle(d: dueq.AsyncDelivery) -> None:
            running.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                seen.append(f"cancelled, d.cancelled={d.cancelled}")
                raise

        def on_next(o: dueq.Outcome) -> None:
            items.append(o)
            done.set()

        sub = q.observe().pipe(dueq.operators.process(handle)).subscribe(on_next=on_next)
        await asyncio.wait_for(running.wait(), 10)
        assert await q.cancel("long")
        await asyncio.wait_for(done.wait(), 10)
        sub.dispose()
        await client.aclose()
        return items, seen

    items, seen = asyncio.run(main())
    assert [(o.id, o.kind) for o in items] == [("long", "cancelled")]
    assert seen == ["cancelled, d.cancelled=True"]


# -- a cancelled task held unstarted is dropped, never run (issue 37) --------------------------


def test_a_cancelled_task_waiting_for_a_thread_handler_is_dropped_not_run(
    r: redis.Redis,
) -> None:
    q = dueq.Queue("cw", r, lease=0.6)  # the keeper looks every 0.2 s
    q.schedule({}, id="blocker")
    q.schedule({}, id="held", delay=0.001)
    outcomes: list[dueq.Outcome] = []
    blocker = Blocker()
    sub = (
        q.observe(max_in_flight=2)
        .pipe(dueq.operators.process(blocker.sync, concurrency=1))
        .subscribe(on_next=outcomes.append)
    )
    try:
        assert blocker.running.wait(WAIT_S)
        wait_for(lambda: q.stats().leased == 2, "both held")
        assert q.cancel("held")
        # dropped while the only handler is still busy: its outcome comes before the blocker's
        wait_for(lambda: [(o.id, o.kind) for o in outcomes] == [("held", "cancelled")], "drop")
        blocker.go_on.set()
        wait_for(lambda: len(outcomes) == 2, "the blocker's outcome")
    finally:
        blocker.go_on.set()
        sub.dispose()
    assert blocker.seen == ["blocker"]
    assert [(o.id, o.kind) for o in outcomes] == [("held", "cancelled"), ("blocker", "acked")]


@pytest.mark.parametrize("handler_kind", ["async", "sync"])
def test_a_cancelled_task_waiting_for_an_async_runner_is_dropped_not_run(
    r: redis.Redis, handler_kind: str
) -> None:
    outcomes: list[dueq.Outcome] = []
    blocker = Blocker()

    async def main() -> None:
        client = async_mirror(r)
        q = dueq.AsyncQueue("cwa", client, lease=0.6)  # the keeper looks every 0.2 s
        await q.schedule({}, id="blocker")
        await q.schedule({}, id="held", delay=0.001)
        sub = (
            q.observe(max_in_flight=2)
            .pipe(dueq.operators.process(blocker.handler(handler_kind), concurrency=1))
            .subscribe(on_next=outcomes.append)
        )
        try:
            async with asyncio.timeout(WAIT_S):
                while not (blocker.running.is_set() and (await q.stats()).leased == 2):
                    await asyncio.sleep(0.01)
                assert await q.cancel("held")
                while [(o.id, o.kind) for o in outcomes] != [("held", "cancelled")]:
                    await asyncio.sleep(0.01)  # dropped while the only runner is still busy
                blocker.go_on.set()
                while len(outcomes) < 2:
                    await asyncio.sleep(0.01)
        finally:
            blocker.go_on.set()
            sub.dispose()
            await asyncio.sleep(0.05)  # the processor's close, on this loop
            await client.aclose()

    asyncio.run(main())
    assert blocker.seen == ["blocker"]
    assert [(o.id, o.kind) for o in outcomes] == [("held", "cancelled"), ("blocker", "acked")]
