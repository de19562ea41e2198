"""A dueq key that holds the wrong type of value (written by hand or by another program).

A key that only feeds statistics (the per-minute history, the stats counters) never stops a
script: the queue works on without those numbers. A key the queue cannot work without (due,
leased, tasks, meta, config, ...) stops the call with ``dueq.CorruptQueue``, whose message
names the key, the type it holds and the type dueq keeps there.
"""

from __future__ import annotations

import uuid

import pytest
import redis

import dueq


def _queue_name() -> str:
    return f"wt-{uuid.uuid4().hex[:10]}"


@pytest.mark.parametrize("key", ["history", "stats"])
def test_a_statistics_key_of_the_wrong_type_never_stops_the_queue(make_queue, r, clock, key):
    q = make_queue(_queue_name())
    r.set(getattr(q.keys, key), "not a hash")
    ids = [q.schedule({"n": i}, key="tenant") for i in range(3)]
    q.configure(rate=dueq.Rate(100, per=1.0), key_concurrency=2)
    got = q.claim(limit=10)
    assert len(got) == 2  # the per-key limit still holds
    assert len({d.token for d in got}) == 1 and got[0].token
    got[0].fail(RuntimeError("again"))
    got[1].ack()
    clock.advance(60)
    rest = q.claim(limit=10)
    assert sorted(d.id for d in rest) == sorted(set(ids) - {got[1].id})
    assert rest[0].token != got[0].token  # tokens still fence
    q.ack_many(rest)
    assert q.stats().scheduled == 0
    assert q.history(minutes=2) is not None
    assert r.type(getattr(q.keys, key)) == b"string"  # left for an operator to look at


@pytest.mark.parametrize(("key", "expected"), [("due", "zset"), ("leased", "zset")])
def test_an_essential_key_of_the_wrong_type_raises_an_error_naming_it(make_queue, r, key, expected):
    q = make_queue(_queue_name())
    q.schedule({"a": 1})
    name = getattr(q.keys, key)
    r.delete(name)
    r.set(name, "not a sorted set")
    with pytest.raises(dueq.CorruptQueue) as raised:
        q.claim()
    message = str(raised.value)
    assert name in message and "string" in message and expected in message, message
    assert raised.value.key == name
    assert (raised.value.actual_type, raised.value.expected_type) == ("string", expected)
    assert isinstance(raised.value, redis.ResponseError)  # code that caught WRONGTYPE still does


def test_the_tasks_hash_of_the_wrong_type_is_named_by_schedule(make_queue, r):
    q = make_queue(_queue_name())
    r.rpush(q.keys.tasks, "x")
    with pytest.raises(dueq.CorruptQueue, match=r"tasks.*list.*hash"):
        q.schedule({"a": 1})
