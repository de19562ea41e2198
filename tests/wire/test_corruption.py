"""Property test: random corruption of any stored value never crashes a consumer or a reader,
and never holds back the tasks it does not belong to (guarantee 8).

Each example builds a queue with tasks in every state (scheduled, leased, dead, with error
histories), overwrites one stored value (an envelope, an attempt record, an error history, a
score in any sorted set, a counter) with something hostile, then drains the queue through
``claim`` while moving the clock past every lease and backoff. Every task that was not
corrupted must end acked exactly as a healthy queue would; the corrupted one may be delivered,
dead or dropped, but ``claim``, ``get``, ``stats`` and ``dead.list`` never raise.
"""

from __future__ import annotations

import json
import math

import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dueq

K = "dueq:{c}:"
IDS = [f"t{i}" for i in range(6)]

hostile_text = st.one_of(
    st.binary(max_size=60),
    st.text(max_size=60).map(lambda s: s.encode("utf-8", "surrogatepass")),
    st.sampled_from(
        [
            b"",
            b"1:",
            b"1:{",
            b"2:{}",
            b"1:" + b"[" * 5000,
            b"1:" + b"[" * 3000 + b"]" * 3000,
            b"99999999999999999999|||",
            b"1|tok|x|y",
            b"|||",
            b"-5|||",
            b"5",
            b"[]",
            b'[{"attempt":"x"}]',
            b'[{"at":1e300,"attempt":1e300,"type":null}]',
            b"9" * 30,
            b"1.5",
            b"-1",
            json.dumps({"a": [1] * 10}).encode(),
        ]
    ),
)
hostile_score = st.one_of(
    st.floats(allow_nan=False),
    st.sampled_from([math.inf, -math.inf, 1.5, -1e20, 1e300, 0.0, 2.0**53 + 1]),
)
target = st.one_of(
    st.tuples(st.sampled_from(["tasks", "meta", "errors"]), st.sampled_from(IDS), hostile_text),
    st.tuples(st.sampled_from(["due", "leased", "dead"]), st.sampled_from(IDS), hostile_score),
    st.tuples(
        st.just("stats"),
        st.sampled_from(["claimed", "acked", "lease_seq", "expired", "dead", "retried"]),
        hostile_text,
    ),
)


def _build(q: dueq.Queue, clock) -> None:
    """t0, t1 scheduled; t2 leased; t3 retrying (has an error); t4 dead; t5 scheduled later."""
    q.schedule_many(dueq.Task({"id": task_id}, id=task_id) for task_id in IDS[:5])
    q.schedule({"id": "t5"}, id="t5", delay=100)
    ds = {d.id: d for d in q.claim(limit=5)}
    for task_id in ("t0", "t1"):
        ds[task_id].release()
    ds["t3"].fail(RuntimeError("first failure"))
    ds["t4"].fail(dueq.Unrecoverable("dead on purpose"))


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(corruption=target)
def test_corrupting_any_stored_value_never_crashes_and_never_blocks_other_tasks(
    r: redis.Redis, admin: redis.Redis, clock, corruption
):
    admin.flushall()
    q = dueq.Queue(
        "c", r, clock=clock, lease=30, retry=dueq.RetryPolicy(max_attempts=3, wait=lambda s: 1)
    )
    _build(q, clock)
    kind, member, value = corruption
    if kind in ("tasks", "meta", "errors"):
        r.hset(K + kind, member, value)
    elif kind == "stats":
        r.hset(K + "stats", member, value)
    elif r.zscore(K + kind, member) is not None:  # re-score only where the id really is
        r.zadd(K + kind, {member: value})
    corrupted = member if kind != "stats" else None

    # readers never raise, whatever is stored
    for task_id in IDS:
        q.get(task_id)
    q.stats()
    q.dead.list()

    acked: list[str] = []
    for _ in range(12):  # bounded: each round moves the clock past every lease and backoff
        for d in q.claim(limit=100):
            if d.id == "t4":  # only a corrupted score can bring the dead task back
                assert corrupted == "t4"
            d.ack()
            acked.append(d.id)
        clock.advance(200)

    healthy = {"t0", "t1", "t2", "t3", "t5"} - {corrupted}
    assert healthy <= set(acked), f"held back by {corruption!r}: acked {acked}"
    assert len(acked) == len(set(acked))  # each acked once
    stats = q.stats()  # a corrupted score may be a valid time far in the future
    assert stats.scheduled + stats.leased <= (1 if corrupted else 0)
    for task_id in healthy:
        assert q.get(task_id) is None
    for info in q.dead.list():
        assert info.id in {"t4", corrupted}
