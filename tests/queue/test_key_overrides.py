"""Per-key overrides: ``q.configure(key_limits={"tenant:big": dueq.KeyLimit(...)})`` gives
named keys their own concurrency and/or rate over the queue-wide key_concurrency / key_rate
defaults; kept in the queue's config in Redis, enforced by the claim script across every
consumer, shown by ``settings()``, removed with None, at most 1,000. Contract tests on both
front ends."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis
from fairness_support import MODES, fairness_param

import dueq


@pytest.fixture(params=MODES)
def make_queue(make_queue: Callable[..., Any], request: pytest.FixtureRequest) -> Any:
    """The module's queues with fairness off and on (fairness_support)."""
    return fairness_param(make_queue, request)


def schedule_keyed(q: Any, key: str, n: int) -> None:
    q.schedule_many(dueq.Task({"i": i}, id=f"{key}-{i:03d}", key=key) for i in range(n))


def claimed_keys(q: Any, limit: int = 100) -> dict[str, int]:
    counts: dict[str, int] = {}
    for d in q.claim(limit):
        counts[d.key] = counts.get(d.key, 0) + 1
    return counts


def test_a_named_key_gets_its_own_concurrency_over_the_default(
    make_queue: Callable[..., Any],
) -> None:
    q = make_queue()
    q.configure(key_concurrency=2, key_limits={"big": dueq.KeyLimit(concurrency=5)})
    for key in ("big", "small"):
        schedule_keyed(q, key, 10)
    assert claimed_keys(q) == {"big": 5, "small": 2}
    assert q.claim(100) == []  # both at their limits, across consumers
    assert make_queue().claim(100) == []


def test_an_override_applies_without_a_queue_wide_default(make_queue: Callable[..., Any]) -> None:
    q = make_queue()
    q.configure(key_limits={"big": dueq.KeyLimit(concurrency=1)})
    for key in ("big", "other"):
        schedule_keyed(q, key, 4)
    assert claimed_keys(q) == {"big": 1, "other": 4}


def test_a_named_key_gets_its_own_rate(make_queue: Callable[..., Any], clock: Any) -> None:
    q = make_queue()
    q.configure(
        key_rate=dueq.Rate(1, per=1.0),
        key_limits={"fast": dueq.KeyLimit(rate=dueq.Rate(10, per=1.0))},
    )
    for key in ("fast", "slow"):
        schedule_keyed(q, key, 30)
    got = {"fast": 0, "slow": 0}
    for _ in range(20):  # two seconds in steps of 100 ms
        for key, n in claimed_keys(q).items():
            got[key] += n
        clock.advance(0.1)
    assert got == {"fast": 20, "slow": 2}  # one per 100 ms, one per second


def test_an_override_with_only_a_rate_keeps_the_default_concurrency(
    make_queue: Callable[..., Any],
) -> None:
    q = make_queue()
    q.configure(key_concurrency=1, key_limits={"k": dueq.KeyLimit(rate=dueq.Rate(1000, per=1.0))})
    schedule_keyed(q, "k", 5)
    assert claimed_keys(q) == {"k": 1}


def test_settings_show_overrides_and_none_removes_one(make_queue: Callable[..., Any]) -> None:
    q = make_queue()
    big = dueq.KeyLimit(concurrency=5, rate=dueq.Rate(50, per=1.0))
    small = dueq.KeyLimit(concurrency=1)
    assert q.configure(key_limits={"big": big, "small": small}).key_limits == {
        "big": big,
        "small": small,
    }
    assert q.configure(key_limits={"small": None}).key_limits == {"big": big}
    assert q.settings().key_limits == {"big": big}
    schedule_keyed(q, "small", 3)
    assert claimed_keys(q) == {"small": 3}  # no limit left for it
    q.configure(key_limits={"big": None})
    assert q.settings().key_limits == {}


def test_the_number_of_overrides_is_bounded(make_queue: Callable[..., Any], r: redis.Redis) -> None:
    q = make_queue()
    one = dueq.KeyLimit(concurrency=1)
    q.configure(key_limits={f"k{i}": one for i in range(1000)})
    with pytest.raises(dueq.ConfigurationError, match="at most 1000"):
        q.configure(key_limits={"one-more": one})
    assert len(q.settings().key_limits) == 1000
    # a change that removes as many as it adds fits
    assert len(q.configure(key_limits={"k0": None, "one-more": one}).key_limits) == 1000
    with pytest.raises(dueq.ConfigurationError, match="at most 1000"):
        q.configure(key_limits={f"x{i}": one for i in range(1001)})


@pytest.mark.parametrize(
    "bad",
    [
        {"k": 5},
        {"": dueq.KeyLimit(concurrency=1)},
        {"a\nb": dueq.KeyLimit(concurrency=1)},
        [("k", dueq.KeyLimit(concurrency=1))],
    ],
)
def test_bad_key_limits_are_refused_before_anything_is_written(
    make_queue: Callable[..., Any], bad: Any
) -> None:
    q = make_queue()
    with pytest.raises(dueq.ConfigurationError):
        q.configure(key_limits=bad)
    assert q.settings().key_limits == {}


def test_a_key_limit_needs_a_limit() -> None:
    with pytest.raises(dueq.ConfigurationError):
        dueq.KeyLimit()
    with pytest.raises(dueq.ConfigurationError):
        dueq.KeyLimit(concurrency=0)


def test_a_sharded_queue_gives_key_limits_whole_to_every_shard(r: redis.Redis) -> None:
    q = dueq.Queue("sharded-kl", r, shards=2)
    q.configure(key_limits={"k": dueq.KeyLimit(concurrency=1)})
    for shard in q.shard_names:  # each key lies on one shard, whose script holds its limit
        assert dueq.Queue(shard, r).settings().key_limits == {"k": dueq.KeyLimit(concurrency=1)}
