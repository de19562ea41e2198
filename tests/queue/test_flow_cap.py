"""The queue-wide concurrency cap: ``q.configure(concurrency=N)`` holds the live leases of a
queue across every consumer to N, inside the claim script. A capped consumer sleeps until a
lease ends (ack, fail and release publish on the wake channel when the queue was at its cap) or
the next lease deadline. Contract tests on both front ends, and one across three processes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from conftest import async_mirror
from fairness_support import MODES, fairness_param
from internals_support import shards
from paths_support import SRC
from servers_support import subscribe_wake
from waiting_support import wait_for, when_still, when_still_async

import dueq
from dueq._consume.wake import WAKE_TYPES
from dueq.server import RedisServer


@pytest.fixture(params=MODES)
def make_queue(make_queue: Callable[..., Any], request: pytest.FixtureRequest) -> Any:
    """The module's queues with fairness off and on (fairness_support)."""
    return fairness_param(make_queue, request)


def schedule(q: Any, n: int, prefix: str = "t") -> None:
    q.schedule_many(dueq.Task({"i": i}, id=f"{prefix}-{i:03d}") for i in range(n))


def test_a_claim_never_leases_past_the_concurrency_cap(make_queue: Callable[..., Any]) -> None:
    one, two = make_queue(), make_queue()
    assert one.configure(concurrency=3).concurrency == 3
    schedule(one, 10)
    first = one.claim(10)
    assert len(first) == 3
    assert two.claim(10) == [] and one.claim(10) == []  # every consumer: at the cap
    first[0].ack()
    first[1].fail(ValueError("x"), retry_in=3600)
    assert len(two.claim(10)) == 2  # each ended lease is one slot
    assert one.stats().leased == 3


def test_an_expired_lease_frees_its_slot(make_queue: Callable[..., Any], clock: Any) -> None:
    q = make_queue(lease=5)
    q.configure(concurrency=2)
    schedule(q, 5)
    assert len(q.claim(10)) == 2
    clock.advance(6)  # both leases expired: the claim reclaims them, then leases two again
    again = q.claim(10)
    assert len(again) == 2 and q.stats().leased == 2


def test_a_capped_claim_reports_no_due_time_so_consumers_wait_for_a_lease_to_end(
    make_queue: Callable[..., Any],
) -> None:
    q = make_queue(lease=60)
    q.configure(concurrency=1)
    schedule(q, 3)
    batch = q.claim_batch(10)
    assert len(batch.deliveries) == 1
    # more is due now, but the queue is at its cap: no due time (sleep until a wake), and the
    # lease deadline (an expiry frees the slot)
    assert batch.next_due_ms is None
    assert batch.next_lease_deadline_ms == batch.now_ms + 60_000


def test_a_lease_ending_at_the_cap_wakes_consumers_and_one_below_it_does_not(
    make_queue: Callable[..., Any], r: redis.Redis, request: pytest.FixtureRequest
) -> None:
    if "fairness-on" in request.node.name:
        pytest.skip(
            "on a fair queue the due tasks wait in lanes and the levels are empty, so a task "
            "given back for later is earlier than the levels' head and wakes consumers once: "
            "one claim more, never a lease past the cap"
        )
    q = make_queue()
    q.configure(concurrency=2)
    schedule(q, 4)
    a, b = q.claim(10)
    pubsub = subscribe_wake(r, q.keys.wake)
    try:

        def wakes() -> int:
            n = 0
            while (m := pubsub.get_message(timeout=0.2)) is not None:
                n += m["type"] in WAKE_TYPES
            return n

        wakes()  # the subscribe confirmation
        a.ack()  # the queue was at its cap: a capped consumer must hear of it
        assert wakes() == 1
        b.release(delay=3600)  # one lease left of a cap of two: nobody is capped, no wake
        assert wakes() == 0
    finally:
        pubsub.close()


@pytest.mark.parametrize("off", [False, 0])
def test_removing_the_cap_lets_claims_lease_again(make_queue: Callable[..., Any], off: Any) -> None:
    q = make_queue()
    q.configure(concurrency=1)
    schedule(q, 3)
    assert len(q.claim(10)) == 1
    settings = q.configure(concurrency=off)
    assert settings.concurrency is None and q.settings().concurrency is None
    assert len(q.claim(10)) == 2


@pytest.mark.parametrize("bad", [-1, 1.5, "3", True, 1_000_001])
def test_a_bad_concurrency_is_refused(make_queue: Callable[..., Any], bad: Any) -> None:
    q = make_queue()
    with pytest.raises(dueq.ConfigurationError):
        q.configure(concurrency=bad)
    assert q.settings().concurrency is None


def test_a_sharded_queue_splits_the_cap_over_its_shards(r: redis.Redis) -> None:
    q = dueq.Queue("capped", r, shards=3)
    assert q.configure(concurrency=7).concurrency == 7
    shares = [dueq.Queue(n, r).settings().concurrency for n in shards.shard_names("capped", 3)]
    assert shares == [3, 2, 2]
    with pytest.raises(dueq.ConfigurationError, match="at least 3"):
        q.configure(concurrency=2)


# -- a capped consumer is woken, not polling ---------------------------------------------------


def script_calls(admin: redis.Redis) -> int:
    stats = admin.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


def test_a_capped_sync_consumer_gets_the_task_when_a_lease_ends(
    r: redis.Redis, admin: redis.Redis
) -> None:
    q = dueq.Queue("capwake", r, lease=3600)
    q.configure(concurrency=1)
    schedule(q, 2)
    [held] = q.claim(1)
    got: list[dueq.Delivery] = []
    arrived = threading.Event()
    sub = q.observe(heartbeat=3600).subscribe(on_next=lambda d: (got.append(d), arrived.set()))
    try:
        wait_for(lambda: admin.pubsub_shardnumsub(q.keys.wake)[0][1] == 1, "the subscription")
        before = when_still(lambda: script_calls(admin), own=0)  # the consumer asleep
        time.sleep(1.0)  # capped and asleep: no claim calls while nothing changes
        assert script_calls(admin) == before
        assert not got
        held.ack()  # the only wake: a heartbeat of an hour, a lease of an hour
        assert arrived.wait(30)
        assert [d.id for d in got] == ["t-001"]
        got[0].ack()
    finally:
        sub.dispose()


def test_a_capped_async_consumer_gets_the_task_when_a_lease_ends(
    r: redis.Redis, admin: redis.Redis
) -> None:
    async def main() -> None:
        client = async_mirror(r)
        q = dueq.AsyncQueue("acapwake", client, lease=3600)
        await q.configure(concurrency=1)
        await q.schedule_many(dueq.Task({"i": i}, id=f"t-{i:03d}") for i in range(2))
        [held] = await q.claim(1)
        it = q.deliveries(heartbeat=3600)
        waiting = asyncio.ensure_future(it.__anext__())
        for _ in range(1500):  # 30 s
            if admin.pubsub_shardnumsub(q.keys.wake)[0][1] == 1:
                break
            await asyncio.sleep(0.02)
        before = await when_still_async(lambda: script_calls(admin), own=0)  # asleep
        await asyncio.sleep(1.0)  # capped and asleep: no claim calls while nothing changes
        assert script_calls(admin) == before
        assert not waiting.done()
        await held.ack()  # the only wake: a heartbeat of an hour, a lease of an hour
        d = await asyncio.wait_for(waiting, 30)
        assert d.id == "t-001"
        await d.ack()
        await it.aclose()
        await client.aclose()

    asyncio.run(main())


# -- across processes ---------------------------------------------------------------------------

WORKER = """
import sys, time, redis, dueq
url, front = sys.argv[1], sys.argv[2]
r = redis.Redis.from_url(url)
# live leases of handlers: +1 at start, -1 at the end; the highest value seen is kept
MARK = r.register_script(
    "local n = redis.call('INCRBY', KEYS[1], ARGV[1]) "
    "if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end "
    "return n")

def handle(d):
    MARK(keys=["live", "max_live"], args=[1])
    time.sleep(0.05)
    MARK(keys=["live", "max_live"], args=[-1])
    r.incr("done")

if front == "sync":
    q = dueq.Queue("cap3", r, lease=30)
    worker = dueq.Worker(q, handle, concurrency=4, heartbeat=1)
else:
    import redis.asyncio
    q = dueq.AsyncQueue("cap3", redis.asyncio.Redis.from_url(url), lease=30)
    worker = dueq.AsyncWorker(q, handle, concurrency=4, heartbeat=1)
r.incr("ready")
worker.run() if front == "sync" else __import__("asyncio").run(worker.run())
"""


@pytest.fixture
def workers(redis_server: RedisServer) -> Iterator[Callable[[str], None]]:
    procs: list[subprocess.Popen[bytes]] = []
    env = {**os.environ, "PYTHONPATH": str(SRC)}

    def start(front: str) -> None:
        for _ in range(3):
            procs.append(
                subprocess.Popen([sys.executable, "-c", WORKER, redis_server.url, front], env=env)
            )

    yield start
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@pytest.mark.parametrize("front", ["sync", "async"])
def test_the_cap_holds_across_three_worker_processes(
    r: redis.Redis, workers: Callable[[str], None], front: str
) -> None:
    q = dueq.Queue("cap3", r)
    q.configure(concurrency=3)
    workers(front)  # three processes of four slots each: twelve could run at once
    wait_for(lambda: int(r.get("ready") or 0) == 3, "three workers started")
    schedule(q, 60)
    wait_for(lambda: int(r.get("done") or 0) == 60, "every task done", wait_s=60)
    max_live = int(r.get("max_live") or 0)
    assert 1 <= max_live <= 3
