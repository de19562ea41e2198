"""``fail_many``: many failed deliveries recorded in one script call, each decided and settled
as ``fail`` settles it alone (retried, dead, expired, released with its key held, cancelled,
lost), on both front ends and on a sharded queue."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import redis
from counting_support import script_calls

import dueq


def _errors(q: Any, task_id: str) -> list[tuple[int, str, str, Any]]:
    info = q.get(task_id)
    return [(e.attempt, e.type, e.message, e.at) for e in info.errors] if info else []


def _events(r: redis.Redis, q: Any) -> list[dict[bytes, bytes]]:
    return [fields for _, fields in r.xrange(q.keys.events)]


def _events_at_clock(r: redis.Redis) -> bool:
    """Whether the server writes an event at the queue clock's ms (XADD <ms>-*, Redis 7 and
    Valkey): Redis 6.2 writes it at its own time, so under the tests' manual clock (in 2027)
    the retention trims it at once, whatever the script did."""
    return int(str(r.info("server")["redis_version"]).split(".")[0]) >= 7


def _fail_scene(q: Any, clock: Any) -> list[Any]:
    """Six failing deliveries of one claim, with their errors: two retried (one with
    retry_in), one dead at its last attempt, one Unrecoverable, one expired, one message."""
    q.configure(events=timedelta(hours=1))
    for i in range(3):
        q.schedule({"n": i}, id=f"t{i}")
    q.schedule({}, id="last", max_attempts=1)
    q.schedule({}, id="bad")
    q.schedule({}, id="late", expires=timedelta(seconds=5))
    held = {d.id: d for d in q.claim(10)}
    assert len(held) == 6
    return [
        (held["t0"], ValueError("boom")),
        (held["t1"], KeyError("k"), 30),
        (held["last"], RuntimeError("no more")),
        (held["bad"], dueq.Unrecoverable("never")),
        (held["late"], ValueError("too late")),
        (held["t2"], "a plain message", None),
    ]


def _state(r: redis.Redis, q: Any, ids: list[str]) -> dict[str, Any]:
    return {
        "errors": {i: _errors(q, i) for i in ids},
        "infos": {i: (info.state, info.attempt) if (info := q.get(i)) else None for i in ids},
        "counters": q.stats().counters,
        "events": [(f[b"id"], f[b"kind"], f[b"attempt"], f.get(b"error")) for f in _events(r, q)]
        if _events_at_clock(r)
        else "(not kept by this server under a manual clock)",
    }


def test_fail_many_gives_the_outcomes_records_and_events_of_as_many_single_fails(
    make_queue: Any, r: redis.Redis, clock: Any
) -> None:
    one, many = make_queue("one"), make_queue("many")
    singles = [
        one.fail(d, error, retry_in=item[2] if len(item) == 3 else None)
        for item in _fail_scene(one, clock)
        for d, error in [item[:2]]
    ]
    outcomes = many.fail_many(_fail_scene(many, clock))
    assert outcomes == singles
    assert [(o.id, o.kind) for o in outcomes] == [
        ("t0", "retried"),
        ("t1", "retried"),
        ("last", "dead"),
        ("bad", "dead"),
        ("late", "expired"),
        ("t2", "retried"),
    ]
    assert outcomes[1].at is not None and outcomes[0].at is not None
    assert (outcomes[1].at - outcomes[0].at).total_seconds() == 20  # retry_in 30 s, policy 10
    ids = ["t0", "t1", "t2", "last", "bad", "late"]
    assert _state(r, many, ids) == _state(r, one, ids)
    assert [d.id for d in many.dead.list()] == [d.id for d in one.dead.list()]
    assert many.dead.count() == 2
    if _events_at_clock(r):
        assert _events(r, many)[0][b"kind"] == b"retried"


def test_one_call_settles_retried_dead_expired_cancelled_and_lost_deliveries(
    make_queue: Any, r: redis.Redis, admin: redis.Redis, clock: Any
) -> None:
    q = make_queue()
    items = _fail_scene(q, clock)
    q.schedule({}, id="gone")
    q.schedule({}, id="lost")
    q.schedule({}, id="warm")
    extra = {d.id: d for d in q.claim(10)}
    q.fail(extra["warm"], "loads the script")  # (the first call may load it: not counted)
    assert q.cancel("gone")
    q.ack_many([extra["lost"]])
    items += [(extra["gone"], ValueError("x")), (extra["lost"], ValueError("y"))]
    items.append((items[0][0], ValueError("again")))  # a repeated lease: held the first time
    before = script_calls(admin)
    outcomes = q.fail_many(items)
    assert script_calls(admin) - before == 1
    assert [(o.id, o.kind) for o in outcomes] == [
        ("t0", "retried"),
        ("t1", "retried"),
        ("last", "dead"),
        ("bad", "dead"),
        ("late", "expired"),
        ("t2", "retried"),
        ("gone", "cancelled"),
        ("lost", "lost"),
        ("t0", "lost"),
    ]
    assert outcomes[6].error == "ValueError: x" and outcomes[6].at is None
    assert _errors(q, "t0") == [(1, "ValueError", "boom", outcomes[0].at - timedelta(seconds=10))]
    counters = q.stats().counters
    assert (counters.get("retried"), counters.get("dead")) == (4, 2)  # warm's retry counted
    if not _events_at_clock(r):
        return  # (the outcomes, records and counters above are the call's; its events: 7+)
    kinds = [(f[b"id"], f[b"kind"]) for f in _events(r, q)]
    assert kinds[-6:] == [
        (b"t0", b"retried"),
        (b"t1", b"retried"),
        (b"last", b"dead"),
        (b"bad", b"dead"),
        (b"late", b"expired"),
        (b"t2", b"retried"),
    ]


def test_fail_many_of_nothing_makes_no_call(make_queue: Any, admin: redis.Redis) -> None:
    q = make_queue()
    q.stats()  # (the first use checks the server)
    before = script_calls(admin)
    assert q.fail_many([]) == []
    assert script_calls(admin) == before


def test_a_key_cooldown_in_fail_many_releases_its_delivery_with_its_key_held(
    make_queue: Any, clock: Any
) -> None:
    q = make_queue()
    q.schedule({}, id="hot", key="k")
    q.schedule({}, id="cold")
    held = {d.id: d for d in q.claim(10)}
    outcomes = q.fail_many([(held["hot"], dueq.KeyCooldown(30)), (held["cold"], ValueError(), 60)])
    assert [(o.id, o.kind) for o in outcomes] == [("hot", "released"), ("cold", "retried")]
    info = q.get("hot")
    assert info is not None and info.state == "scheduled" and info.attempt == 0
    q.schedule({}, id="next", key="k")
    clock.advance(29)
    assert q.claim(10) == []  # the key is held
    clock.advance(1)
    assert sorted(d.id for d in q.claim(10)) == ["hot", "next"]


def test_a_bad_item_or_retry_in_records_none_of_the_failures(make_queue: Any) -> None:
    q = make_queue()
    q.schedule({}, id="a")
    q.schedule({}, id="b")
    a, b = q.claim(10)
    with pytest.raises(ValueError):
        q.fail_many([(a, ValueError()), (b, ValueError(), -5)])
    with pytest.raises(TypeError, match="fail_many item"):
        q.fail_many([(a,)])
    assert q.stats().counters.get("retried") is None
    assert q.fail_many([(a, ValueError()), (b, ValueError())])[1].kind == "retried"


def test_a_sharded_queue_fails_many_in_one_call_per_shard_in_the_order_given(
    make_queue: Any, admin: redis.Redis, clock: Any
) -> None:
    q = make_queue("sh", shards=3)
    ids = [f"t{i:02d}" for i in range(30)]
    for task_id in ids:
        q.schedule({}, id=task_id)
    q.schedule({}, id="warm")
    held = q.claim(100)
    assert len(held) == 31
    q.fail_many([(d, "loads the script") for d in held if d.id == "warm"])
    deliveries = sorted((d for d in held if d.id != "warm"), key=lambda d: d.id, reverse=True)
    shards_used = len({d.queue.name for d in deliveries})
    before = script_calls(admin)
    outcomes = q.fail_many(
        [
            (d, dueq.Unrecoverable("x") if i % 2 else ValueError("y"))
            for i, d in enumerate(deliveries)
        ]
    )
    assert script_calls(admin) - before == shards_used
    assert [o.id for o in outcomes] == [d.id for d in deliveries]
    assert [o.kind for o in outcomes] == ["retried", "dead"] * 15
    assert q.stats().dead == 15
