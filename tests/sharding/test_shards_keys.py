"""Per-key limits on sharded queues (issue 43): every task of a limit key lies on the shard of
its key (``shard_of(key, N)``), so that shard's claim script sees all of the key's leases and
``key_concurrency``/``key_rate`` hold exactly across the cluster. Generated ids of keyed tasks
are drawn on the key's shard; an explicit id on another shard is refused (``dueq.keyed_id``
makes one that fits). Contract tests on both front ends, on one Redis and on a local Redis
Cluster."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
from internals_support import shards
from redis.cluster import RedisCluster

import dueq
from dueq import shard_of
from dueq._wire.keys import QueueKeys
from dueq.sharding.layout import task_shard

N = 3
KEY = "tenant-a"


def stored_ids(r: Any, name: str = "q") -> list[set[str]]:
    """The ids in each shard's tasks hash, in shard order."""
    return [
        {i.decode() for i in r.hkeys(QueueKeys.for_queue(n).tasks)}
        for n in shards.shard_names(name, N)
    ]


def other_shard_id(key: str, prefix: str = "order-") -> str:
    """An id whose shard is not the shard of ``key``."""
    return next(
        f"{prefix}{i}"
        for i in itertools.count()
        if task_shard(f"{prefix}{i}", N) != shard_of(key, N)
    )


# -- keyed_id (no Redis) ---------------------------------------------------------------------


def test_a_keyed_id_carries_its_keys_route_so_it_lies_with_its_key_for_every_count() -> None:
    made = dueq.keyed_id(KEY, "order-1", N)
    assert made == dueq.keyed_id(KEY, "order-1") == dueq.keyed_id(KEY, made, 7)
    assert made.startswith("order-1~k") and len(made) == len("order-1") + 18
    for key in ("a", "b", "tenant:42", "\u00fc", KEY):
        made = dueq.keyed_id(key, "order-1")
        assert all(task_shard(made, count) == shard_of(key, count) for count in range(1, 40))
    # a key that is itself routed (a keyed id used as a workflow's key) passes its route on
    nested = dueq.keyed_id(dueq.keyed_id(KEY, "wf-1"), "step-1")
    assert all(task_shard(nested, c) == shard_of(KEY, c) for c in range(1, 20))


def test_keyed_id_refuses_a_bad_shard_count() -> None:
    with pytest.raises(dueq.ConfigurationError):
        dueq.keyed_id(KEY, "order-1", 0)


# -- one Redis, both front ends --------------------------------------------------------------


def test_key_concurrency_holds_across_the_shards_and_the_keys_tasks_share_its_shard(
    make_queue: Callable[..., Any], r: Any
) -> None:
    consumers = [make_queue("q", shards=N) for _ in range(3)]
    q = consumers[0]
    assert q.configure(key_concurrency=1).key_concurrency == 1
    keyed = q.schedule_many(dueq.Task({"i": i}, key=KEY) for i in range(30)).ids
    loose = q.schedule_many(dueq.Task({"j": j}) for j in range(30)).ids
    home = shard_of(KEY, N)
    assert {task_shard(i, N) for i in keyed} == {home}
    for count in (2, 5, 7):  # and for every other count (so a reshard moves them with the key)
        assert {task_shard(i, count) for i in keyed} == {shard_of(KEY, count)}
    on_shards = stored_ids(r)
    assert set(keyed) <= on_shards[home]
    assert all(not set(keyed) & ids for s, ids in enumerate(on_shards) if s != home)
    assert len({task_shard(i, N) for i in loose}) > 1  # tasks without a key spread by id

    done_of_key = 0
    for _ in range(40):
        # new queue objects each round: one that saw a shard idle (a parked key) would skip
        # it for up to IDLE_RECHECK_S, as no wake listener runs here
        leased: list[Any] = []
        for consumer in [make_queue("q", shards=N) for _ in range(2)] + consumers:
            leased += consumer.claim(5)
            assert sum(d.key == KEY for d in leased) <= 1
        for d in leased:
            done_of_key += d.key == KEY
            d.ack()
    assert done_of_key == 30  # and every task of the key ran, one at a time


def test_key_rate_holds_across_the_shards(make_queue: Callable[..., Any], clock: Any) -> None:
    consumers = [make_queue("q", shards=N) for _ in range(3)]
    consumers[0].configure(key_rate=dueq.Rate(2, per=1.0))  # a claim of a key per 0.5 s
    consumers[0].schedule_many(dueq.Task({"i": i}, key=KEY) for i in range(20))
    times: list[float] = []
    for step in range(16):  # 4 s in quarter seconds
        for consumer in consumers:
            for d in consumer.claim(10):
                times.append(step * 0.25)
                d.ack()
        clock.advance(0.25)
    assert len(times) >= 7
    for start in range(16):
        window = [t for t in times if start * 0.25 <= t < start * 0.25 + 1.0]
        assert len(window) <= 2


def test_an_explicit_id_off_its_keys_shard_is_refused_before_anything_is_written(
    make_queue: Callable[..., Any], r: Any
) -> None:
    q = make_queue("q", shards=N)
    bad = other_shard_id(KEY)
    with pytest.raises(dueq.InvalidTaskError, match=rf"{bad}.*{KEY}.*keyed_id"):
        q.schedule({"x": 1}, id=bad, key=KEY)
    good = dueq.keyed_id(KEY, bad, N)
    with pytest.raises(dueq.InvalidTaskError, match="keyed_id"):
        q.schedule_many(
            [
                dueq.Task({"x": 0}, id=good, key=KEY),
                dueq.Task({"x": 1}, key=KEY),
                dueq.Task({"x": 2}),
                dueq.Task({"x": 3}, id=bad, key=KEY),
            ]
        )
    assert stored_ids(r) == [set(), set(), set()]
    assert q.stats().scheduled == 0


def test_an_explicit_id_that_only_happens_to_lie_on_its_keys_shard_is_refused(
    make_queue: Callable[..., Any], r: Any
) -> None:
    """Such an id would part from its key at a reshard: a keyed task's id carries its key's
    route (``dueq.keyed_id``), whatever the shard count."""
    q = make_queue("q", shards=N)
    fits = next(f"n{i}" for i in itertools.count() if shard_of(f"n{i}", N) == shard_of(KEY, N))
    other = dueq.keyed_id("tenant-b", "order-1")
    for bad in (fits, other):
        with pytest.raises(dueq.InvalidTaskError, match=r"keyed_id\('tenant-a'"):
            q.schedule({"x": 1}, id=bad, key=KEY)
    assert stored_ids(r) == [set(), set(), set()]


def test_a_keyed_id_schedules_once_and_is_found_by_id(make_queue: Callable[..., Any]) -> None:
    q = make_queue("q", shards=N)
    q.configure(key_concurrency=1)
    first, second = dueq.keyed_id(KEY, "order-1", N), dueq.keyed_id(KEY, "order-2", N)
    assert (
        q.schedule_many(
            [dueq.Task({"o": 1}, id=first, key=KEY), dueq.Task({"o": 2}, id=second, key=KEY)]
        ).added
        == 2
    )
    again = q.schedule_many([dueq.Task({"o": 1}, id=dueq.keyed_id(KEY, "order-1", N), key=KEY)])
    assert (again.added, again.existing) == (0, 1)  # a producer re-running stays idempotent
    info = q.get(first)
    assert info is not None and info.key == KEY and info.payload == {"o": 1}
    [d] = q.claim(10)  # key_concurrency=1: one of the two
    assert d.id in (first, second) and q.claim(10) == []
    other = second if d.id == first else first
    assert q.cancel(other) and q.get(other) is None
    d.ack()
    assert q.get(d.id) is None or q.get(d.id).state == "done"
    assert q.stats().scheduled == 0


def test_weights_alone_and_keys_without_limits_still_configure(
    make_queue: Callable[..., Any],
) -> None:
    q = make_queue("q", shards=N)
    settings = q.configure(
        key_concurrency=2,
        key_rate=dueq.Rate(5, per=1.0),
        key_limits={"big": dueq.KeyLimit(concurrency=4, rate=dueq.Rate(10, per=1.0))},
    )
    assert (settings.key_concurrency, settings.key_rate) == (2, dueq.Rate(5, per=1.0))
    assert settings.key_limits["big"].concurrency == 4  # whole on every shard, not split
    assert q.configure(key_concurrency=False, key_rate=False).key_concurrency is None


# -- a real Redis Cluster ----------------------------------------------------------------------


def test_key_concurrency_on_a_redis_cluster(cluster: RedisCluster) -> None:
    name = "keyed-cluster"
    dueq.Queue(name, cluster, shards=N).configure(key_concurrency=1)
    producer = dueq.Queue(name, cluster, shards=N)
    ids = producer.schedule_many(dueq.Task({"i": i}, key=KEY) for i in range(6)).ids
    producer.schedule_many(dueq.Task({"j": j}) for j in range(10))
    home = shards.shard_names(name, N)[shard_of(KEY, N)]
    assert set(ids) <= {i.decode() for i in cluster.hkeys(QueueKeys.for_queue(home).tasks)}
    seen = 0
    for _ in range(12):
        one, two = dueq.Queue(name, cluster, shards=N), dueq.Queue(name, cluster, shards=N)
        got = one.claim(10) + two.claim(10)
        assert sum(d.key == KEY for d in got) <= 1
        seen += sum(d.key == KEY for d in got)
        for d in got:
            d.ack()
    assert seen == 6


def test_dependencies_on_a_sharded_queue_share_a_shard_by_keyed_ids_of_one_group(
    make_queue: Callable[..., Any],
) -> None:
    # parents and children must share a shard (one script records and releases the edges):
    # ids made by keyed_id with one group (here the workflow's id) always do
    q = make_queue("deps", shards=3)
    loose = [f"w{i}" for i in range(10)]
    parent, child = next((a, b) for a in loose for b in loose if q.shard(a).name != q.shard(b).name)
    with pytest.raises(dueq.InvalidTaskError, match="keyed_id"):
        q.schedule({"n": 2}, id=child, after=[parent])
    parent, child = (dueq.keyed_id("order-7", name, 3) for name in ("charge", "ship"))
    q.schedule({"n": 1}, id=parent)
    q.schedule({"n": 2}, id=child, after=[parent])
    [d] = q.claim(limit=10)
    assert d.id == parent
    d.ack()
    assert [d.id for d in q.claim(limit=10)] == [child]
