"""Fair claiming between tenants (``configure(fairness="key")``): a claim shares its leases
between the tenants with due tasks (a task's ``fair_key``, else its ``key``, else one default
tenant) in weighted fair order, ``KeyLimit(weight=)`` their shares; one tenant's backlog never
holds back another's next task. Contract tests on both front ends (and the sharded queue where
it says so)."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import redis

import dueq
from dueq._wire.keys import QueueKeys

#: The bound on a drain by a real worker (a busy 2-core machine included).
BOUND_S = 60.0


def backlog(q: Any, tenant: str, n: int, **options: Any) -> None:
    q.schedule_many(
        dueq.Task({"i": i}, id=f"{tenant}-{i:05d}", key=tenant, **options) for i in range(n)
    )


def claim_keys(q: Any, claims: int, batch: int = 100) -> Counter[str | None]:
    """Claim ``claims`` batches, acking each; how many tasks each key got."""
    got: Counter[str | None] = Counter()
    for _ in range(claims):
        deliveries = q.claim(batch)
        got.update(d.key for d in deliveries)
        if deliveries:
            q.ack_many(deliveries)
    return got


def test_one_task_of_a_second_tenant_is_claimed_in_the_first_claim_behind_a_backlog(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue()
    q.configure(fairness="key")
    backlog(q, "a", 5000)
    clock.advance(1)
    q.schedule({"n": 1}, id="b-only", key="b")  # due after every task of a
    first = q.claim(100)
    assert "b-only" in [d.id for d in first]
    assert Counter(d.key for d in first) == {"a": 99, "b": 1}


def test_without_fairness_the_same_task_waits_behind_the_whole_backlog(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue()
    backlog(q, "a", 500)
    clock.advance(1)
    q.schedule({"n": 1}, id="b-only", key="b")
    assert "b-only" not in [d.id for d in q.claim(100)]


def test_three_tenants_of_weights_1_2_5_get_their_shares_within_5_percent(
    make_queue: Callable[..., Any],
) -> None:
    q = make_queue()
    q.configure(
        fairness="key",
        key_limits={"two": dueq.KeyLimit(weight=2), "five": dueq.KeyLimit(weight=5)},
    )
    for tenant in ("one", "two", "five"):
        backlog(q, tenant, 10_000)
    got = claim_keys(q, 100)  # 10,000 claims
    assert sum(got.values()) == 10_000
    for tenant, share in (("one", 1 / 8), ("two", 2 / 8), ("five", 5 / 8)):
        assert abs(got[tenant] / 10_000 - share) <= 0.05 * share, got


def test_a_tenant_spread_over_100_keys_with_one_fair_key_gets_one_share(
    make_queue: Callable[..., Any],
) -> None:
    q = make_queue()
    q.configure(fairness="key")
    q.schedule_many(
        dueq.Task({"i": i}, key=f"spread/{i % 100}", fair_key="spread") for i in range(3000)
    )
    backlog(q, "single", 3000)
    got = claim_keys(q, 20)
    spread = sum(n for key, n in got.items() if key and key.startswith("spread/"))
    assert (spread, got["single"]) == (1000, 1000)
    # without the fair key the 100 keys are 100 tenants: the single key gets 1 share in 101
    q2 = make_queue("q2")
    q2.configure(fairness="key")
    q2.schedule_many(dueq.Task({"i": i}, key=f"spread/{i % 100}") for i in range(3000))
    backlog(q2, "single", 3000)
    assert claim_keys(q2, 20)["single"] < 100


def test_a_tenant_that_comes_back_after_idling_gets_its_share_and_no_credit(
    make_queue: Callable[..., Any],
) -> None:
    q = make_queue()
    q.configure(fairness="key")
    backlog(q, "busy", 5000)
    assert claim_keys(q, 10) == {"busy": 1000}  # alone: every claim is its
    backlog(q, "back", 2000)
    got = claim_keys(q, 1)
    # half each, within a turn's quantum (a claim of 100 gives turns of ceil(100 / 25) = 4)
    assert sum(got.values()) == 100 and abs(got["busy"] - got["back"]) <= 8, got


def test_priorities_order_a_tenants_own_tasks_and_every_tenant_keeps_its_share(
    make_queue: Callable[..., Any],
) -> None:
    q = make_queue()
    q.configure(fairness="key")
    q.schedule_many(dueq.Task({"i": i}, id=f"low-{i}", key="a") for i in range(10))
    q.schedule_many(dueq.Task({"i": i}, id=f"high-{i}", key="a", priority=5) for i in range(3))
    backlog(q, "b", 10)
    got = q.claim(8)
    assert [d.id for d in got if d.key == "a"] == ["high-0", "high-1", "high-2", "low-0"]
    assert Counter(d.key for d in got) == {"a": 4, "b": 4}


def test_tasks_without_a_key_share_one_default_tenant(make_queue: Callable[..., Any]) -> None:
    q = make_queue()
    q.configure(fairness="key")
    q.schedule_many(dueq.Task({"i": i}) for i in range(300))
    backlog(q, "keyed", 300)
    assert claim_keys(q, 2) == {None: 100, "keyed": 100}


def test_a_task_that_falls_due_later_joins_its_tenants_lane_then(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue()
    q.configure(fairness="key")
    backlog(q, "a", 300)
    q.schedule({"n": 1}, id="later", key="b", delay=5)
    assert claim_keys(q, 4) == {"a": 300}  # not due yet: a alone
    batch = q.claim_batch(10)
    assert batch.deliveries == [] and batch.next_due_ms == q.get("later").due_at.timestamp() * 1000
    clock.advance(6)
    assert "later" in [d.id for d in q.claim(10)]


def test_a_failed_task_is_retried_through_its_lane_and_ends_dead_after_its_attempts(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue()
    q.configure(fairness="key")
    q.schedule({"n": 1}, id="flaky", key="a", max_attempts=2)
    backlog(q, "b", 50)
    for attempt in (1, 2):
        (d,) = [d for d in q.claim(100) if d.id == "flaky"]
        assert d.attempt == attempt
        d.fail(ValueError("no"), retry_in=1)
        clock.advance(2)
    info = q.get("flaky")
    assert info is not None and info.state == "dead"


def test_a_laned_task_can_be_read_cancelled_rescheduled_and_replaced(
    make_queue: Callable[..., Any], clock: Any, r: redis.Redis
) -> None:
    q = make_queue()
    q.configure(fairness="key")
    for name in ("read", "cancel", "move", "swap"):
        q.schedule({"n": name}, id=name, key="t")
    q.schedule({"n": 0}, id="plain")  # the default tenant
    assert r.zcard(QueueKeys.for_queue("q").fair) == 2  # both tenants have lanes
    info = q.get("read")
    assert info is not None and info.state == "scheduled"
    assert q.cancel("cancel") and q.get("cancel") is None
    assert q.cancel("plain")
    assert q.reschedule("move", delay=60)
    q.schedule({"n": "new"}, id="swap", key="u", replace=True)
    assert q.stats().scheduled == 3
    got = {d.id: d for d in q.claim(10)}
    assert sorted(got) == ["read", "swap"]
    assert got["swap"].payload == {"n": "new"} and got["swap"].key == "u"
    q.ack_many(list(got.values()))
    clock.advance(61)
    assert [d.id for d in q.claim(10)] == ["move"]
    assert q.list_tasks("scheduled").tasks == []


def test_listing_shows_laned_tasks_as_scheduled(make_queue: Callable[..., Any]) -> None:
    q = make_queue()
    q.configure(fairness="key")
    backlog(q, "t", 3)
    page = q.list_tasks("scheduled")
    assert sorted(t.id for t in page.tasks) == ["t-00000", "t-00001", "t-00002"]


def test_key_concurrency_holds_with_fairness_and_a_limited_tenant_steps_aside(
    make_queue: Callable[..., Any],
) -> None:
    q = make_queue()
    q.configure(fairness="key", key_limits={"capped": dueq.KeyLimit(concurrency=3, weight=5)})
    backlog(q, "capped", 100)
    backlog(q, "free", 100)
    first = q.claim(20)
    counts = Counter(d.key for d in first)
    assert counts["capped"] == 3 and counts["free"] >= 3
    assert Counter(d.key for d in q.claim(20))["capped"] == 0  # at its limit
    q.ack_many([d for d in first if d.key == "capped"][:1])
    assert Counter(d.key for d in q.claim(20))["capped"] == 1


def test_turning_fairness_off_moves_the_lanes_back_and_loses_nothing(
    make_queue: Callable[..., Any], r: redis.Redis
) -> None:
    q = make_queue()
    q.configure(fairness="key")
    backlog(q, "a", 3000)
    backlog(q, "b", 2000)
    claimed = [d.id for d in q.claim(100)]
    assert q.configure(fairness=False).fairness is None
    while batch := q.claim(1000):
        claimed += [d.id for d in batch]
        q.ack_many(batch)
    assert len(claimed) == len(set(claimed)) == 5000
    keys = QueueKeys.for_queue("q")
    assert not r.exists(keys.fair) and r.hget(keys.config, "fairness") is None
    assert r.zcard(keys.parked) == 0


def test_a_paused_fair_queue_leases_nothing_until_resumed(make_queue: Callable[..., Any]) -> None:
    q = make_queue()
    q.configure(fairness="key")
    backlog(q, "a", 10)
    q.pause()
    assert q.claim(10) == []
    q.resume()
    assert len(q.claim(10)) == 10


def test_a_laned_task_past_its_expiry_ends_expired_not_leased(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue()
    q.configure(fairness="key")
    q.schedule({"n": 1}, id="stale", key="a", expires=5)
    clock.advance(6)
    assert q.claim(10) == []
    info = q.get("stale")
    assert info is None or info.state == "expired"
    assert q.stats().scheduled == 0


def test_fairness_settings_are_shown_and_bad_ones_refused_before_anything_is_written(
    make_queue: Callable[..., Any],
) -> None:
    q = make_queue()
    settings = q.configure(fairness="key", key_limits={"a": dueq.KeyLimit(weight=3, concurrency=2)})
    assert settings.fairness == "key"
    assert settings.key_limits == {"a": dueq.KeyLimit(concurrency=2, weight=3)}
    assert q.configure(key_limits={"a": dueq.KeyLimit(weight=4)}).key_limits == {
        "a": dueq.KeyLimit(weight=4)
    }
    with pytest.raises(dueq.ConfigurationError, match="fairness"):
        q.configure(fairness="tenant", paused=True)
    with pytest.raises(dueq.ConfigurationError, match="weight"):
        dueq.KeyLimit(weight=0)
    with pytest.raises(dueq.ConfigurationError, match="weight"):
        dueq.KeyLimit(weight=1001)
    assert q.settings().paused is False and q.settings().fairness == "key"
    assert q.configure(key_limits={"a": None}).key_limits == {}


def test_a_bad_fair_key_is_refused_and_nothing_is_written(make_queue: Callable[..., Any]) -> None:
    q = make_queue()
    for bad in ("", "a\x1fb", "x" * 201, 5):
        with pytest.raises(dueq.InvalidTaskError, match="fair_key"):
            q.schedule({"n": 1}, key="k", fair_key=bad)
    assert q.stats().scheduled == 0


def test_a_fair_key_is_kept_with_the_task_and_the_same_as_its_key_costs_nothing(
    make_queue: Callable[..., Any], r: redis.Redis
) -> None:
    q = make_queue()
    q.schedule({"n": 1}, id="both", key="acme/reports", fair_key="acme")
    q.schedule({"n": 1}, id="same", key="acme", fair_key="acme")
    q.schedule({"n": 1}, id="only", fair_key="acme")
    tasks = QueueKeys.for_queue("q").tasks
    assert r.hget(tasks, "both") == b'2:0|||acme/reports\x1facme\n{"n":1}'
    assert r.hget(tasks, "same") == b'2:0|||acme\n{"n":1}'
    assert r.hget(tasks, "only") == b'2:0|||\x1facme\n{"n":1}'
    got = {d.id: d.key for d in q.claim(10)}
    assert got == {"both": "acme/reports", "same": "acme", "only": None}


def test_a_worker_drains_a_fair_queue_of_many_tenants_exactly_once(r: redis.Redis) -> None:
    q = dueq.Queue("fair-drain", r)
    q.configure(fairness="key", key_limits={"t3": dueq.KeyLimit(weight=4)})
    for t in range(10):
        backlog(q, f"t{t}", 200)
    seen: list[str] = []
    lock = threading.Lock()
    done = threading.Event()

    def handle(d: dueq.Delivery) -> None:
        with lock:
            seen.append(d.id)
            if len(seen) == 2000:
                done.set()

    worker = dueq.Worker(q, handle, concurrency=4)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        assert done.wait(BOUND_S), f"{len(seen)} of 2000 handled"
    finally:
        worker.stop()
        thread.join()
    assert len(seen) == len(set(seen)) == 2000
    assert q.stats().scheduled == 0


def test_an_async_worker_drains_a_fair_queue_of_many_tenants_exactly_once(
    redis_server: Any,
) -> None:
    import redis.asyncio

    seen: list[str] = []

    async def main() -> None:
        client = redis.asyncio.Redis.from_url(redis_server.url)
        aq = dueq.AsyncQueue("fair-drain-async", client)
        await aq.configure(fairness="key")
        for t in range(10):
            await aq.schedule_many(
                dueq.Task({"i": i}, id=f"t{t}-{i}", key=f"t{t}") for i in range(200)
            )
        done = asyncio.Event()

        async def handle(d: dueq.AsyncDelivery) -> None:
            seen.append(d.id)
            if len(seen) == 2000:
                done.set()

        worker = dueq.AsyncWorker(aq, handle, concurrency=16)
        running = asyncio.create_task(worker.run())
        try:
            await asyncio.wait_for(done.wait(), BOUND_S)
        finally:
            worker.stop()
            await running
            await client.aclose()

    asyncio.run(main())
    assert len(seen) == len(set(seen)) == 2000


def test_a_sharded_queue_is_fair_within_each_shard_and_takes_weights(r: redis.Redis) -> None:
    q = dueq.Queue("fair-shards", r, shards=3)
    settings = q.configure(fairness="key", key_limits={"big": dueq.KeyLimit(weight=3)})
    assert settings.fairness == "key" and settings.key_limits == {"big": dueq.KeyLimit(weight=3)}
    # a keyed task lies on its key's shard: "big" and "low" share shard 0, "lone" is on 2
    assert [dueq.shard_of(k, 3) for k in ("big", "low", "lone")] == [0, 0, 2]
    for tenant in ("big", "low"):
        q.schedule_many(dueq.Task({"i": i}, key=tenant) for i in range(6000))
    q.schedule({"n": 1}, id=dueq.keyed_id("lone", "lone"), key="lone")
    got = claim_keys(q, 20)  # 20 claims of 100 over 3 shards
    assert got["lone"] == 1
    assert abs(got["big"] / got["low"] - 3) < 0.3, got
    for shard in q.shard_names:
        assert r.hget(QueueKeys.for_queue(shard).config, "fairness") == b"key"


def test_stats_show_the_tenants_with_the_most_due_tasks_and_their_share_of_claims(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue()
    q.configure(fairness="key", key_limits={"big": dueq.KeyLimit(weight=3)})
    backlog(q, "big", 3000)
    backlog(q, "small", 1000)
    q.schedule_many(dueq.Task({"i": i}) for i in range(10))  # the default tenant ""
    stats = q.stats()
    assert (stats.fair_lanes, stats.fair_claimed) == (3, 0)
    assert [(t.tenant, t.due, t.claimed) for t in stats.tenants] == [
        ("big", 3000, 0),
        ("small", 1000, 0),
        ("", 10, 0),
    ]
    claim_keys(q, 4)  # 400 claimed: the default tenant's 10, then 3 : 1
    stats = q.stats()
    shares = {t.tenant: (t.due, t.claimed, t.share) for t in stats.tenants}
    assert stats.fair_claimed == 400 and stats.scheduled == 3610
    assert shares[""] == (0, 10, 0.025)
    assert shares["big"][0] + shares["big"][1] == 3000 and shares["big"][1] in range(290, 295)
    assert sum(t.claimed for t in stats.tenants) == 400
    clock.advance(120)  # two minutes on: the claims are out of the window
    assert q.stats().fair_claimed == 0
    assert next(t.to_json() for t in q.stats().tenants)["tenant"] == "big"


def test_cancelling_rescheduling_and_replacing_laned_tasks_keeps_the_tenants_counts(
    make_queue: Callable[..., Any],
) -> None:
    q = make_queue()
    q.configure(fairness="key")
    backlog(q, "t", 5)
    q.cancel("t-00000")
    q.reschedule("t-00001", delay=60)
    q.schedule({"n": 1}, id="t-00002", key="u", replace=True)
    assert {t.tenant: t.due for t in q.stats().tenants} == {"t": 2, "u": 1}
    claim_keys(q, 1)
    assert {t.tenant: (t.due, t.claimed) for t in q.stats().tenants} == {"t": (0, 2), "u": (0, 1)}


def test_a_lane_emptied_by_cancel_reschedule_or_replace_leaves_the_fair_set(
    make_queue: Callable[..., Any], r: redis.Redis
) -> None:
    q = make_queue()
    q.configure(fairness="key")
    for tenant in ("gone", "moved", "swapped"):
        q.schedule({"n": 1}, id=tenant, key=tenant)
    fair = QueueKeys.for_queue("q").fair
    assert r.zcard(fair) == 3
    q.cancel("gone")
    q.reschedule("moved", delay=60)
    q.schedule({"n": 2}, id="swapped", key="other", replace=True)
    assert [m.decode() for m in r.zrange(fair, 0, -1)] == ["other"]
    assert q.doctor().consistent


def test_a_claim_of_many_tenants_gives_turns_of_a_few_tasks_and_keeps_the_shares(
    make_queue: Callable[..., Any], r: redis.Redis, admin: redis.Redis
) -> None:
    q = make_queue()
    q.configure(fairness="key")
    for t in range(200):
        backlog(q, f"t{t:03d}", 8)
    before = admin.info("commandstats").get("cmdstat_zrangebylex", {}).get("calls", 0)
    got = claim_keys(q, 1)
    lookups = admin.info("commandstats")["cmdstat_zrangebylex"]["calls"] - before
    assert sum(got.values()) == 100 and set(got.values()) == {4}  # 25 tenants, 4 each
    assert lookups <= 26  # one per lane served (plus none wasted), not one per task
    rest = claim_keys(q, 15)  # 1,500 more: every tenant ends with its 8
    assert sum(rest.values()) == 1500
    assert all(got[k] + rest[k] == 8 for k in rest)


def test_a_lane_whose_count_went_wrong_is_still_served_whole(
    make_queue: Callable[..., Any], r: redis.Redis
) -> None:
    q = make_queue()
    q.configure(fairness="key")
    backlog(q, "t", 30)
    r.zadd(QueueKeys.for_queue("q").fair_due, {"t": 0})  # a count gone wrong (hand-edited)
    got = claim_keys(q, 30, batch=10)
    assert got == {"t": 30}


def test_a_tasks_fair_key_is_shown_by_get_listing_json_and_its_delivery(
    make_queue: Callable[..., Any],
) -> None:
    q = make_queue()
    q.configure(fairness="key")
    q.schedule({"n": 1}, id="r", key="acme/reports", fair_key="acme")
    info = q.get("r")
    assert (info.key, info.fair_key) == ("acme/reports", "acme")
    assert info.to_json("q")["fair_key"] == "acme"
    assert [t.fair_key for t in q.list_tasks("scheduled").tasks] == ["acme"]
    (d,) = q.claim(1)
    assert (d.key, d.fair_key) == ("acme/reports", "acme")


def test_stats_of_a_fair_queue_see_the_wait_of_its_oldest_laned_task(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue()
    q.configure(fairness="key")
    backlog(q, "old", 5)
    clock.advance(30)
    backlog(q, "new", 5)
    clock.advance(10)
    stats = q.stats()
    assert stats.due_now == 10 and stats.oldest_due_lag_s == 40.0
    assert stats.next_due_at is not None
