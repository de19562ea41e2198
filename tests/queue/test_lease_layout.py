"""The lease layout (lua/include/claims.lua): a task leased for its first attempt gets no meta
value; its lease is its leased entry, fenced by its claim's deadline, which no other claim of
the queue has. What must hold: a holder of an earlier lease of the same id is refused (after an
ack or a cancel and the id scheduled again, also when two claims' deadlines would meet), and
every script that reads a lease reads a first lease as the meta value it would have had
(attempt 1, its holder, its first-claim time): extend, fail, release, cancel, expiry, listings
and a key limit set while it is held."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import redis
from internals_support import script_runner

import dueq
from dueq._wire import protocol


def _ack_verdicts(q: dueq.Queue, pairs: list[tuple[str, str]]) -> str:
    """ack.lua's verdict per (id, token) pair, sent as given (no Delivery's own checks)."""
    call = protocol.ack(q.keys, q.now_arg(), pairs, window_ms=0)
    return call.parse(script_runner(q).run(call.script, call.keys, call.args)).verdicts


def test_a_claim_of_first_attempts_writes_no_meta_value_and_the_ack_leaves_nothing(
    make_queue: Any, r: redis.Redis
) -> None:
    q = make_queue()
    q.schedule_many([dueq.Task({"n": i}) for i in range(300)])
    held = q.claim(300)
    assert len(held) == 300 and r.hlen(q.keys.meta) == 0
    assert len({d.token for d in held}) == 1  # one token per claim
    assert q.ack_many(held) == 300
    assert q.stats().leased == 0 and r.hlen(q.keys.tasks) == 0 and r.hlen(q.keys.meta) == 0


def test_an_ack_under_the_token_of_an_earlier_lease_of_a_rescheduled_id_is_refused(
    r: redis.Redis, clock: Any
) -> None:
    q = dueq.Queue("fence", r, clock=clock)
    q.schedule("one", id="a")
    [old] = q.claim()
    old.ack()
    clock.advance(1)
    q.schedule("two", id="a")
    [new] = q.claim()
    assert new.token != old.token
    # the old holder's ack again (a retried ack whose reply was lost, say): refused
    assert _ack_verdicts(q, [("a", old.token)]) == "l"
    assert q.get("a").state == "leased"
    assert _ack_verdicts(q, [("a", new.token)]) == "h"


def test_two_claims_whose_deadlines_would_meet_get_different_ones(
    r: redis.Redis, clock: Any
) -> None:
    # a 60 s lease taken at t and a 30 s lease taken at t + 30 s would end at the same ms: the
    # second claim's deadline moves on by 1 ms, so the first holder's token names neither
    long = dueq.Queue("meet", r, clock=clock, lease=60)
    short = dueq.Queue("meet", r, clock=clock, lease=30)
    long.schedule("one", id="a")
    [old] = long.claim()
    assert long.cancel("a")
    long.schedule("two", id="a")
    clock.advance(30)
    [new] = short.claim()
    assert new.lease_deadline == old.lease_deadline + timedelta(milliseconds=1)
    assert _ack_verdicts(short, [("a", old.token)]) == "c"  # revoked: told so, not acked
    assert short.get("a").state == "leased"
    assert _ack_verdicts(short, [("a", new.token)]) == "h"


def test_an_extended_first_lease_keeps_its_token_and_its_record(
    make_queue: Any, r: redis.Redis, clock: Any
) -> None:
    q = make_queue(lease=30)
    q.schedule("x", id="a")
    [d] = q.claim()
    claimed = q.get("a").first_claimed_at
    clock.advance(20)
    q.extend(d, 30)
    assert r.hget(q.keys.meta, "a") is not None  # the deadline no longer names the token
    clock.advance(20)  # past the first deadline, within the extended one
    info = q.get("a")
    assert (info.state, info.attempt, info.first_claimed_at) == ("leased", 1, claimed)
    d.ack()
    assert q.get("a") is None


def test_a_failed_first_lease_counts_attempt_one_and_keeps_its_first_claim_time(
    make_queue: Any, clock: Any
) -> None:
    q = make_queue()
    q.schedule("x", id="a")
    [d] = q.claim()
    claimed = q.get("a").first_claimed_at
    assert claimed is not None
    clock.advance(1)
    d.fail(ValueError("boom"))
    clock.advance(10)
    [again] = q.claim()
    assert (again.attempt, q.get("a").first_claimed_at) == (2, claimed)
    again.ack()


def test_a_released_first_lease_is_not_counted(make_queue: Any, clock: Any) -> None:
    q = make_queue()
    q.schedule("x", id="a")
    [d] = q.claim()
    d.release()
    assert q.get("a").attempt == 0
    [again] = q.claim()
    assert again.attempt == 1
    again.ack()


def test_a_first_lease_cancelled_while_held_tells_its_holder(make_queue: Any) -> None:
    q = make_queue()
    q.schedule("x", id="a")
    [d] = q.claim()
    assert q.cancel("a")
    with pytest.raises(dueq.TaskCancelled):
        d.ack()


def test_an_expired_first_lease_is_attempt_one_and_names_its_holder(
    make_queue: Any, clock: Any
) -> None:
    q = make_queue(lease=30)
    q.schedule("x", id="a")
    q.claim_batch(1, holder="w7")
    clock.advance(31)
    assert q.claim() == []  # reclaimed: retried after the 10 s backoff
    info = q.get("a")
    assert (info.state, info.attempt) == ("scheduled", 1)
    [error] = info.errors
    assert (error.type, error.attempt, error.worker) == ("LeaseExpired", 1, "w7")


def test_a_first_lease_is_listed_with_its_holder(make_queue: Any) -> None:
    q = make_queue()
    q.schedule("x", id="a")
    q.claim_batch(1, holder="w3")
    info = q.get("a")
    assert (info.state, info.attempt, info.holder) == ("leased", 1, "w3")
    [listed] = q.list_tasks("leased").tasks
    assert (listed.id, listed.holder, listed.attempt) == ("a", "w3", 1)


def test_a_key_limit_set_while_first_leases_are_held_counts_them(make_queue: Any) -> None:
    q = make_queue()
    for i in range(3):
        q.schedule({}, id=f"k{i}", key="k")
    held = q.claim(2)
    q.configure(key_concurrency=2)
    assert q.claim(1) == []  # the two first leases count against the new limit
    held[0].ack()
    [third] = q.claim(1)
    assert third.id == "k2"
    assert q.ack_many([held[1], third]) == 2


def test_a_claim_acked_a_few_at_a_time_and_then_the_rest_is_acked_whole(
    make_queue: Any, r: redis.Redis
) -> None:
    # ack.lua reads a claim's ids at its deadline as one range when it acks most of them, and
    # each id's deadline when it acks a few of many (lease_pairs.lua): both must judge alike
    q = make_queue()
    q.schedule({}, id="again")
    [first] = q.claim()
    first.release()
    [again] = q.claim()  # a second delivery: it has a meta value
    q.schedule_many([dueq.Task({"n": i}) for i in range(200)])
    held = q.claim(200)
    assert q.ack_many(held[:5]) == 5
    with pytest.raises(dueq.LeaseLost):  # acked already: lost, never acked twice
        q.ack_many(held[:1])
    assert q.ack_many([again, *held[5:10]]) == 6
    assert q.ack_many(held[10:]) == 190
    assert q.stats().leased == 0 and r.hlen(q.keys.tasks) == 0


def test_claims_records_are_kept_ten_minutes_past_their_deadline_unless_there_are_many(
    make_queue: Any, r: redis.Redis, clock: Any
) -> None:
    # a record names its holder for the reclaim of its leases after an outage of up to ten
    # minutes; past 10,000 records a claim keeps only the live ones (lua/include/claims.lua)
    q = make_queue(lease=30)
    q.schedule("x", id="a")
    q.claim()[0].ack()
    clock.advance(30 + 599)
    q.schedule("y", id="b")
    q.claim()[0].ack()
    assert r.zcard(q.keys.claims) == 2  # the first's deadline is 599 s past: kept
    clock.advance(2)
    q.schedule("z", id="c")
    [live] = q.claim()
    assert r.zcard(q.keys.claims) == 2  # the first's is 601 s past: dropped
    past = int(clock() * 1000) - 1000
    r.zadd(q.keys.claims, {f"{past - n}|{past - n}|old": past - n for n in range(10_001)})
    q.schedule("w", id="d")
    [newest] = q.claim()
    # only the records whose deadline is ahead are left: b's (acked, its 30 s not over), c's
    # and this claim's
    assert r.zcard(q.keys.claims) == 3
    assert q.ack_many([live, newest]) == 2
