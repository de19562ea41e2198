"""claim.lua's reply and ack.lua's request: what crosses between Lua and the client per task
(issue 31: fewer Redis instructions per claim + ack)."""

from __future__ import annotations

from internals_support import protocol, script_runner

import dueq
from dueq._wire.keys import QueueKeys


def _raw_claim(q: dueq.Queue, limit: int) -> list:
    call = protocol.claim(
        q.keys,
        q.now_arg(),
        limit=limit,
        lease_ms=30_000,
        max_attempts=3,
        reclaim_limit=100,
        dead_max_count=1000,
        dead_max_age_ms=86_400_000,
        backoff_ms=[0],
    )
    return script_runner(q).run(call.script, call.keys, call.args)


def test_a_claim_reply_carries_two_elements_per_task_and_one_column_for_the_rest(r, clock):
    q = dueq.Queue("reply", r, clock=clock)
    q.schedule_many([dueq.Task(i) for i in range(3)])
    raw = _raw_claim(q, 10)
    # the head, then one column (due, attempt and first-claimed of every task, as text), then
    # (id, envelope) per task
    assert len(raw) == 10 + 2 * 3  # 9 head fields and the column
    rows = protocol.claim(
        q.keys,
        "",
        limit=0,
        lease_ms=1,
        max_attempts=1,
        reclaim_limit=1,
        dead_max_count=1,
        dead_max_age_ms=1,
        backoff_ms=[0],
    ).parse(raw)
    now_ms = int(raw[0])
    assert [row[2:] for row in rows.rows] == [(1, now_ms, now_ms)] * 3


def test_claimed_rows_keep_each_due_attempt_and_first_claim(make_queue, clock):
    q = make_queue(lease=30, retry=dueq.RetryPolicy(max_attempts=5, wait=lambda s: 0))
    early = q.schedule("early")
    clock.advance(1)
    later = q.schedule("later")
    got = {d.id: d for d in q.claim(10)}
    t1 = got[early].first_claimed_ms
    t0 = t1 - 1000
    assert {tid: (d.attempt, d.due_ms, d.first_claimed_ms) for tid, d in got.items()} == {
        early: (1, t0, t1),
        later: (1, t1, t1),
    }
    clock.advance(30)  # both leases expire: back due at once (no backoff), attempt 2 next
    new = q.schedule("new")
    t2 = t1 + 30_000
    got = {d.id: d for d in q.claim(10)}
    assert {tid: (d.attempt, d.due_ms, d.first_claimed_ms) for tid, d in got.items()} == {
        early: (2, t2, t1),
        later: (2, t2, t1),
        new: (1, t2, t2),
    }


def test_an_ack_of_one_claims_leases_sends_its_token_once(r, clock):
    pairs = [(f"task-{i}", "123456@worker-host:4242") for i in range(1000)]
    packed = protocol.pack_pairs(pairs)
    # each id with its 2-byte length, then the token once (2-byte length, 4-byte count)
    ids_bytes = sum(2 + len(task_id) for task_id, _ in pairs)
    assert len(packed) == ids_bytes + 2 + len("123456@worker-host:4242") + 4


def test_an_ack_judges_each_pair_by_its_own_token_when_claims_interleave(r, clock):
    q = dueq.Queue("interleaved", r, clock=clock)
    q.schedule_many([dueq.Task(i) for i in range(4)])
    a, b = q.claim(2)
    c, d = q.claim(2)
    # pairs as given: the two claims' tokens interleaved, a repeated pair, an id under a token
    # that is not its lease's
    pairs = [(a.id, a.token), (c.id, c.token), (c.id, a.token), (b.id, b.token), (a.id, a.token)]
    call = protocol.ack(q.keys, q.now_arg(), pairs, window_ms=0)
    reply = call.parse(script_runner(q).run(call.script, call.keys, call.args))
    assert (reply.acked, reply.verdicts) == (3, "hhlhh")
    assert q.get(d.id).state == "leased"


def test_ack_many_of_two_claims_interleaved_acks_each(make_queue, clock):
    q = make_queue(lease=30)
    q.schedule_many([dueq.Task(i) for i in range(6)])
    first = q.claim(3)
    second = q.claim(3)
    mixed = [first[0], second[0], first[1], second[1], first[2], second[2]]
    assert q.ack_many(mixed) == 6
    assert q.stats().leased == 0


def test_a_lease_whose_attempt_record_is_past_the_most_attempts_cannot_be_acked(r, clock):
    # ack reads the attempt of each lease's meta value only to refuse a corrupted one: ten
    # digits or more are compared as a number, fewer always fit (a first lease has no meta
    # value: each is given the one a second delivery would have, with the attempt set)
    q = dueq.Queue("attempts", r, clock=clock)
    q.schedule_many([dueq.Task(i) for i in range(3)])
    fits, too_many, padded = q.claim(3)
    for delivery, attempt in (
        (fits, "999999999"),
        (too_many, "1000000001"),
        (padded, "0" * 12 + "7"),
    ):
        assert r.hget(q.keys.meta, delivery.id) is None
        r.hset(q.keys.meta, delivery.id, f"{attempt}|{delivery.token}|1|1")
    pairs = [(d.id, d.token) for d in (fits, too_many, padded)]
    call = protocol.ack(q.keys, q.now_arg(), pairs, window_ms=0)
    reply = call.parse(script_runner(q).run(call.script, call.keys, call.args))
    assert reply.verdicts == "hlh"


def test_an_ack_of_more_ids_than_one_unpack_step_reads_every_one(r, clock):
    # leases_unpack reads a run's ids 200 at a time: 450 ids are two full steps and a part
    q = dueq.Queue("steps", r, clock=clock)
    q.schedule_many([dueq.Task(i) for i in range(450)])
    held = q.claim(450)
    pairs = [(d.id, d.token) for d in held] + [(held[0].id, held[0].token)]
    call = protocol.ack(q.keys, q.now_arg(), pairs, window_ms=0)
    reply = call.parse(script_runner(q).run(call.script, call.keys, call.args))
    assert (reply.acked, reply.verdicts) == (450, "h" * 451)
    assert q.stats().leased == 0


def test_bulk_schedules_and_claims_leave_exactly_their_tasks_in_the_sets(r, clock):
    """Batches of more than 128 members go into a set behind a helper member that makes Redis
    build a skiplist at once (the prelude's zadd_many: a listpack filled member by member until
    it converts cost 1.6k Redis instructions per task); the helper is gone when the call ends,
    also for a batch over more than one ZADD chunk (2,000 members each)."""
    keys = QueueKeys.for_queue("bulk")
    q = dueq.Queue("bulk", r, clock=clock)
    ids = [f"t{i:04d}" for i in range(2500)]
    q.schedule_many([dueq.Task(i, id=tid) for i, tid in enumerate(ids)])
    assert r.object("encoding", keys.due) == b"skiplist"
    assert sorted(r.zrange(keys.due, 0, -1)) == [tid.encode() for tid in ids]
    leased = q.claim(1000)
    assert len(leased) == 1000
    assert sorted(r.zrange(keys.leased, 0, -1)) == sorted(d.id.encode() for d in leased)
    assert r.zcard(keys.due) == 1500
    assert q.ack_many(leased) == 1000
    assert not r.exists(keys.leased)
    # a small batch keeps Redis's own choice (a listpack for a new set of a few members)
    small = dueq.Queue("small", r, clock=clock)
    small.schedule_many([dueq.Task(i) for i in range(5)])
    assert r.object("encoding", QueueKeys.for_queue("small").due) == b"listpack"
