"""Per-key limits: ``q.configure(key_concurrency=..., key_rate=...)`` applies to each limit key
(``schedule(..., key=)``) separately, across every consumer, inside the claim script. A key at
its limit steps aside (its due tasks are parked), so it never holds back other keys; its parked
tasks come back when a lease of that key ends or its rate admits the next claim. Contract tests
on both front ends."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import redis
from fairness_support import MODES, fairness_param
from servers_support import subscribe_wake

import dueq
from dueq._consume.wake import WAKE_TYPES
from dueq._wire.keys import QueueKeys


@pytest.fixture(params=MODES)
def make_queue(make_queue: Callable[..., Any], request: pytest.FixtureRequest) -> Any:
    """The module's queues with fairness off and on (fairness_support)."""
    return fairness_param(make_queue, request)


BOUND_S = 10.0


def keys_of(deliveries: list[Any]) -> list[str | None]:
    return [d.key for d in deliveries]


def schedule_keyed(q: Any, key: str, n: int, *, delay: float = 0, prefix: str = "") -> None:
    q.schedule_many(
        dueq.Task({"i": i}, id=f"{prefix or key}-{i:03d}", delay=delay, key=key) for i in range(n)
    )


def test_a_hot_key_at_its_concurrency_steps_aside_for_a_cold_key(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue()
    q.configure(key_concurrency=2)
    schedule_keyed(q, "hot", 50)
    clock.advance(1)
    schedule_keyed(q, "cold", 3)  # due later than every hot task
    first = q.claim(10)
    assert sorted(keys_of(first)) == ["cold", "cold", "hot", "hot"]
    assert [d.id for d in first if d.key == "hot"] == ["hot-000", "hot-001"]
    assert q.claim(10) == []  # both keys are at their limit
    stats = q.stats()
    assert (stats.scheduled, stats.due_now, stats.leased) == (49, 49, 4)


def test_an_ended_lease_lets_the_keys_next_task_in_due_order_be_claimed(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue(lease=5)
    q.configure(key_concurrency=1)
    schedule_keyed(q, "k", 4)
    [a] = q.claim(10)
    assert a.id == "k-000" and q.claim(10) == []
    a.ack()
    [b] = q.claim(10)
    assert b.id == "k-001"
    b.fail(ValueError("x"), retry_in=3600)  # a failure ends the lease too
    [c] = q.claim(10)
    assert c.id == "k-002"
    c.release(delay=3600)
    [d] = q.claim(10)
    assert d.id == "k-003"
    clock.advance(6)  # its lease expires: the claim that reclaims it frees the slot
    assert q.claim(10) == []  # nothing else of the key is due now
    assert q.stats().leased == 0


def test_key_concurrency_holds_across_consumers(make_queue: Callable[..., Any]) -> None:
    one, two = make_queue(), make_queue()
    one.configure(key_concurrency=3)
    for key in ("a", "b"):
        schedule_keyed(one, key, 10)
    got = one.claim(4) + two.claim(10) + one.claim(10)
    assert sorted(keys_of(got)) == ["a", "a", "a", "b", "b", "b"]


def test_key_rate_spaces_one_keys_claims_and_the_consumer_sleeps_until_its_next_slot(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue()
    q.configure(key_rate=dueq.Rate(2, per=1.0))  # one claim of a key per 0.5 s
    schedule_keyed(q, "k", 5)
    schedule_keyed(q, "other", 1)
    batch = q.claim_batch(10)
    assert sorted(keys_of(batch.deliveries)) == ["k", "other"]
    assert batch.next_due_ms == batch.now_ms + 500
    clock.advance(0.499)
    assert q.claim(10) == []
    clock.advance(0.001)
    assert keys_of(q.claim(10)) == ["k"]
    claimed = 3
    for _ in range(10):
        clock.advance(0.5)
        claimed += len(q.claim(10))
    assert claimed == 6  # every task, one per half second


def test_parked_tasks_can_be_read_cancelled_rescheduled_and_replaced(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue()
    q.configure(key_concurrency=1)
    schedule_keyed(q, "k", 4)
    [held] = q.claim(10)  # the other three are parked by this claim
    parked = q.get("k-001")
    assert parked is not None and parked.state == "scheduled" and parked.key == "k"
    assert parked.due_at is not None
    assert q.cancel("k-001") and q.get("k-001") is None
    assert q.reschedule("k-002", delay=60)
    info = q.get("k-002")
    assert info is not None and info.state == "scheduled"
    q.schedule({"new": True}, id="k-003", replace=True)  # no key any more: not limited
    assert [d.id for d in q.claim(10)] == ["k-003"]
    assert q.stats().scheduled == 1
    held.ack()
    clock.advance(60)
    assert [d.id for d in q.claim(10)] == ["k-002"]


def test_parked_tasks_come_back_by_priority_then_due(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue()
    q.configure(key_concurrency=1)
    q.schedule({}, id="first", key="k")
    q.schedule({}, id="low", key="k")
    q.schedule({}, id="high", key="k", priority=5)
    [d] = q.claim(10)
    assert d.id == "high"  # the claim takes priority 5 first
    d.ack()
    order = []
    for _ in range(2):
        [d] = q.claim(10)
        order.append(d.id)
        d.ack()
    assert order == ["first", "low"]


def test_an_ack_that_frees_a_slot_of_a_key_with_parked_tasks_wakes_consumers(
    make_queue: Callable[..., Any], r: redis.Redis
) -> None:
    q = make_queue()
    q.configure(key_concurrency=1)
    schedule_keyed(q, "k", 2)
    [d] = q.claim(10)
    pubsub = subscribe_wake(r, QueueKeys.for_queue("q").wake, ignore_subscribe_messages=True)
    try:
        d.ack()
        deadline = time.monotonic() + BOUND_S
        message = None
        while message is None and time.monotonic() < deadline:
            message = pubsub.get_message(timeout=0.1)
        assert message is not None and message["type"] in WAKE_TYPES
    finally:
        pubsub.close()


def test_removing_the_limit_lets_parked_tasks_go_when_the_keys_lease_ends(
    make_queue: Callable[..., Any],
) -> None:
    q = make_queue()
    q.configure(key_concurrency=1)
    schedule_keyed(q, "k", 3)
    [d] = q.claim(10)
    settings = q.configure(key_concurrency=False)
    assert settings.key_concurrency is None
    d.ack()
    assert sorted(x.id for x in q.claim(10)) == ["k-001", "k-002"]


def test_settings_show_the_key_limits(make_queue: Callable[..., Any]) -> None:
    q = make_queue()
    settings = q.configure(key_rate=dueq.Rate(5, per=2), key_concurrency=4)
    assert (settings.key_rate, settings.key_concurrency) == (dueq.Rate(5, per=2), 4)
    assert q.settings() == settings


def test_an_unreadable_key_limit_is_ignored_not_crashing_the_claim(
    make_queue: Callable[..., Any], r: redis.Redis
) -> None:
    q = make_queue()
    r.hset(QueueKeys.for_queue("q").config, mapping={"key_concurrency": "x", "key_rate": "1/0"})
    schedule_keyed(q, "k", 3)
    assert len(q.claim(10)) == 3
    settings = q.settings()
    assert settings.key_concurrency is None and settings.key_rate is None


def test_bad_key_limits_raise_configuration_errors(make_queue: Callable[..., Any]) -> None:
    q = make_queue()
    for bad in (0, -1, True, 1.5, "2"):
        try:
            q.configure(key_concurrency=bad)
        except dueq.ConfigurationError:
            pass
        else:
            raise AssertionError(f"key_concurrency={bad!r} was accepted")
    for bad_rate in (5, "5/1", True):
        try:
            q.configure(key_rate=bad_rate)
        except dueq.ConfigurationError:
            pass
        else:
            raise AssertionError(f"key_rate={bad_rate!r} was accepted")
    assert replace(q.settings(), fairness=None) == dueq.QueueSettings()  # (fairness_param's)


# -- what the batched key bookkeeping relies on (claim.lua, ack.lua, the prelude's hset_many) --


def key_states(r: redis.Redis, name: str = "q") -> dict[str, str]:
    return {
        f.decode(): v.decode() for f, v in r.hgetall(QueueKeys.for_queue(name).key_state).items()
    }


def expired_leases(
    make_queue: Callable[..., Any], clock: Any, concurrency: int, **tasks: int
) -> tuple[Any, list[Any]]:
    """A queue (lease 5 s, retries in 10 s) whose keyed tasks were leased and whose leases then
    expired and were reclaimed (by one claim, which leased nothing); and the stale deliveries."""
    q = make_queue(lease=5)
    q.configure(key_concurrency=concurrency)
    for key, n in tasks.items():
        schedule_keyed(q, key, n)
    stale = q.claim(10)
    clock.advance(6)
    assert q.claim(10) == []
    return q, stale


def test_an_ack_batch_releases_the_key_slots_of_held_leases_only_and_refuses_stale_tokens(
    make_queue: Callable[..., Any], clock: Any, r: redis.Redis
) -> None:
    q, stale = expired_leases(make_queue, clock, 10, k=3)
    clock.advance(10)
    fresh = q.claim(10)
    assert sorted(d.id for d in fresh) == sorted(d.id for d in stale)
    assert key_states(r) == {"k": "3||0"}
    try:
        q.ack_many([*stale, fresh[0]])
    except dueq.LeaseLost as exc:
        assert sorted(exc.ids) == sorted(d.id for d in stale)
    else:
        raise AssertionError("stale tokens were not refused")
    assert key_states(r) == {"k": "2||0"}  # one slot freed: the held lease's, not the stale ones
    assert q.stats().leased == 2
    assert q.ack_many(fresh[1:]) == 2
    assert key_states(r) == {}


def test_leases_of_one_key_that_expire_together_all_free_their_slots_in_the_reclaiming_claim(
    make_queue: Callable[..., Any], clock: Any, r: redis.Redis
) -> None:
    q, stale = expired_leases(make_queue, clock, 4, k=3, j=2)
    assert len(stale) == 5
    assert key_states(r) == {}  # all five reclaimed in one call, back in due in 10 s
    clock.advance(10)
    assert len(q.claim(10)) == 5
    assert key_states(r) == {"k": "3||0", "j": "2||0"}


def test_a_claim_over_many_keys_writes_each_keys_state_exactly_and_no_helper_field(
    make_queue: Callable[..., Any], r: redis.Redis
) -> None:
    q = make_queue()
    q.configure(key_concurrency=1)
    q.schedule_many(dueq.Task({"i": i}, id=f"t{i:04d}", key=f"k{i % 300:03d}") for i in range(600))
    leased = q.claim(1000)  # one lease per key; the other task of each key is parked
    assert len(leased) == 300 and len({d.key for d in leased}) == 300
    k = QueueKeys.for_queue("q")
    assert key_states(r) == {f"k{i:03d}": "1||1" for i in range(300)}
    # 300 leases and 300 parked tasks, nothing else (hset_many's helper field is gone)
    assert sorted(r.hkeys(k.meta)) == [f"t{i:04d}".encode() for i in range(600)]
    assert q.ack_many(leased) == 300
    assert key_states(r) == {f"k{i:03d}": "0||1" for i in range(300)}
    assert r.zcard(k.key_wait) == 300


@pytest.mark.parametrize("tail", [b"|", b"x", b"|k|"], ids=["bar-no-key", "junk", "other-key"])
def test_an_ack_reads_the_key_of_a_lease_from_its_meta_and_refuses_an_unreadable_key_part(
    make_queue: Callable[..., Any], r: redis.Redis, tail: bytes
) -> None:
    q = make_queue()
    q.configure(key_concurrency=5)
    q.schedule({}, id="a", key="k")
    [d] = q.claim(1)
    k = QueueKeys.for_queue("q")
    meta = r.hget(k.meta, "a")
    assert meta is not None and meta.endswith(b"|k")
    assert key_states(r) == {"k": "1||0"}
    r.hset(k.meta, "a", meta[: -len(b"|k")] + tail)
    if tail == b"|k|":  # a readable key part, naming another key: that key's slot is freed
        assert q.ack_many([d]) == 1
        assert key_states(r) == {"k": "1||0"}
        return
    with pytest.raises(dueq.LeaseLost):
        q.ack_many([d])
    assert key_states(r) == {"k": "1||0"}  # nothing released on an unreadable record


# -- a lease is counted against its key only while the key has a limit (the prelude's notes) --


def meta_of(r: redis.Redis, task_id: str) -> str:
    value = r.hget(QueueKeys.for_queue("q").meta, task_id)
    assert value is not None
    return value.decode()


def test_keyed_tasks_of_a_queue_without_key_limits_leave_no_key_state(
    make_queue: Callable[..., Any], r: redis.Redis
) -> None:
    q = make_queue()
    schedule_keyed(q, "k", 3)
    q.schedule({}, id="j-000", key="j")
    leased = q.claim(10)
    assert sorted(keys_of(leased)) == ["j", "k", "k", "k"]  # no limit: all four at once
    assert key_states(r) == {}
    # not counted, so no key in its lease record (a first lease has none at all, unless its
    # task waited in a fair queue's lane, whose meta value it keeps)
    meta = r.hget(QueueKeys.for_queue("q").meta, "k-000")
    assert meta is None or not meta.endswith(b"|k")
    assert q.ack_many(leased) == 4
    assert key_states(r) == {} and q.stats().leased == 0


def test_a_key_limit_set_while_leases_are_held_counts_them_at_once(
    make_queue: Callable[..., Any], r: redis.Redis
) -> None:
    q = make_queue()
    schedule_keyed(q, "k", 2)
    held = q.claim(10)
    assert len(held) == 2 and key_states(r) == {}
    schedule_keyed(q, "k", 1, prefix="later")
    q.schedule({}, id="other", key="j")
    q.configure(key_concurrency=2)
    assert key_states(r) == {"k": "2||0"}
    assert meta_of(r, "k-000").endswith("|k") and meta_of(r, "k-001").endswith("|k")
    assert keys_of(q.claim(10)) == ["j"]  # k holds its two leases: its next task is parked
    held[0].ack()
    assert [d.id for d in q.claim(10)] == ["later-000"]
    assert key_states(r) == {"k": "2||0", "j": "1||0"}


def test_a_lease_claimed_without_a_limit_never_frees_the_slot_of_a_counted_one(
    make_queue: Callable[..., Any], r: redis.Redis
) -> None:
    q = make_queue()
    q.configure(key_concurrency=1)
    q.schedule({}, id="a", key="k")
    [a] = q.claim(10)
    q.configure(key_concurrency=False)
    q.schedule({}, id="b", key="k")
    [b] = q.claim(10)  # the limit is gone: leased beside a, not counted
    assert key_states(r) == {"k": "1||0"}
    b.ack()
    assert key_states(r) == {"k": "1||0"}  # a's lease still counts
    q.configure(key_concurrency=1)  # b is gone and a was counted: nothing to add
    assert key_states(r) == {"k": "1||0"}
    q.schedule({}, id="c", key="k")
    assert q.claim(10) == []  # a holds k's one slot
    a.ack()
    assert [d.id for d in q.claim(10)] == ["c"]


def test_only_the_leases_of_keys_with_their_own_limit_are_counted(
    make_queue: Callable[..., Any], r: redis.Redis
) -> None:
    q = make_queue()
    schedule_keyed(q, "big", 2)
    schedule_keyed(q, "small", 2)
    held = q.claim(10)
    assert len(held) == 4
    q.configure(key_limits={"big": dueq.KeyLimit(concurrency=2)})
    assert key_states(r) == {"big": "2||0"}  # small has no limit: its leases are not counted
    schedule_keyed(q, "big", 1, prefix="big-later")
    schedule_keyed(q, "small", 1, prefix="small-later")
    assert [d.id for d in q.claim(10)] == ["small-later-000"]
    assert key_states(r) == {"big": "2||1"}
    q.ack_many(held)
    assert [d.id for d in q.claim(10)] == ["big-later-000"]
