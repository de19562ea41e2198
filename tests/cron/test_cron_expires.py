"""Cron expiry (issue 29): ``cron.add(..., expires=)`` makes each occurrence expire that long
after its nominal slot, on both front ends, on the queue's manual clock against a real Redis."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

import dueq
from dueq.cron.flows import occurrence_id, parse_occurrence_id

MINUTE = 60


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, timezone.utc)


def next_slot_s(q: Any, name: str) -> float:
    return q.cron.get(name).next_at.timestamp()


def claim_and_ack(q: Any) -> list[str]:
    """Claim twice (an occurrence the keeper found expired goes back to due and the next claim
    ends it) and ack what runs; the ids that ran."""
    ran: list[str] = []
    for _ in range(2):
        for d in q.claim(limit=100):
            d.ack()
            ran.append(d.id)
    return ran


def expired_count(q: Any) -> int:
    return q.stats().counters.get("expired_tasks", 0)


def test_an_occurrence_claimed_within_its_expiry_runs_and_keeps_it_for_retries(make_queue, clock):
    q = make_queue("x", retry=dueq.RetryPolicy(max_attempts=5, wait=lambda s: 20 * MINUTE))
    q.configure(keep_results=3600)
    q.cron.add("e", "0 * * * *", expires=timedelta(minutes=10))
    slot = next_slot_s(q, "e")
    clock.now = slot + 5 * MINUTE  # within its expiry
    [d] = q.claim(limit=10)
    assert d.id == occurrence_id("e", int(slot * 1000))
    assert q.get(d.id).expires_at == at(slot + 10 * MINUTE)  # written when it was claimed
    assert next_slot_s(q, "e") == slot + 3600  # the schedule moved on
    d.fail(RuntimeError("flaky"))  # its retry would come 20 minutes later: past its expiry
    assert expired_count(q) == 1
    assert q.get(d.id).state == "expired"


def test_an_occurrence_past_its_expiry_ends_expired_and_never_reaches_the_handler(
    make_queue, clock
):
    q = make_queue("x")
    q.configure(keep_results=3600)
    q.cron.add("e", "0 * * * *", expires=timedelta(minutes=10))
    slot = next_slot_s(q, "e")
    late_id = occurrence_id("e", int(slot * 1000))
    assert q.get(late_id).expires_at is None  # the pending occurrence: no expiry stored yet
    clock.now = slot + 15 * MINUTE  # workers were down past slot + expires
    assert claim_and_ack(q) == []
    assert q.get(late_id).state == "expired"
    assert expired_count(q) == 1
    definition = q.cron.get("e")
    assert definition.expires == timedelta(minutes=10)
    assert definition.next_at == at(slot + 3600)  # the schedule goes on
    assert definition.last_fired_at is None  # an expired occurrence did not fire
    assert definition.last_outcome is None  # and records no outcome
    clock.now = slot + 3600 + MINUTE
    assert claim_and_ack(q) == [occurrence_id("e", int((slot + 3600) * 1000))]


def test_missed_all_catch_up_occurrences_each_get_their_own_expiry(make_queue, clock):
    q = make_queue("x")
    q.configure(keep_results=3600)
    q.cron.add("m", every=60, missed="all", max_missed=100, expires=timedelta(seconds=150))
    slot = next_slot_s(q, "m")
    clock.now = slot + 10 * MINUTE + 1  # ten slots missed
    assert q.claim(limit=100) == []  # the head is past its expiry; the fresh missed slots wait
    missed = [occurrence_id("m", int((slot + n * MINUTE) * 1000)) for n in (8, 9, 10)]
    for n, task_id in zip((8, 9, 10), missed, strict=True):
        assert q.get(task_id).expires_at == at(slot + n * MINUTE + 150)
    for n in range(1, 8):  # already past their expiry at the catch-up: never added
        assert q.get(occurrence_id("m", int((slot + n * MINUTE) * 1000))) is None
    clock.now = slot + 11 * MINUTE + 41  # slots 8 and 9 expired since; 10 and 11 still fresh
    ran = sorted(claim_and_ack(q))
    assert [parse_occurrence_id(i)[1] for i in ran] == [
        int((slot + n * MINUTE) * 1000) for n in (10, 11)
    ]
    assert q.get(missed[0]).state == "expired" and q.get(missed[1]).state == "expired"
    assert expired_count(q) == 3  # the head, slots 8 and 9


def test_backfilled_slots_expire_counting_from_when_they_are_due(make_queue, clock):
    q = make_queue("x")
    q.configure(keep_results=3600)
    q.cron.add("b", "0 * * * *", expires=timedelta(minutes=10))
    now = clock.now
    assert q.cron.backfill("b", start=at(now - 3 * 3600), end=at(now - 3600)) == 2
    assert len(claim_and_ack(q)) == 2  # hours old, yet due now: each has its ten minutes
    assert q.cron.backfill("b", start=at(now - 5 * 3600), end=at(now - 3 * 3600)) == 2
    clock.now = now + 11 * MINUTE
    assert claim_and_ack(q) == []
    assert expired_count(q) == 2


def test_run_now_counts_the_expiry_from_now(make_queue, clock):
    q = make_queue("x")
    q.cron.add("n", "0 3 * * *", expires=timedelta(minutes=10))
    task_id = q.cron.run_now("n")
    assert q.get(task_id).expires_at == at(clock.now + 10 * MINUTE)
    # (its id names the second it was asked: the expiry counts from there)


def test_expires_is_checked_and_shown_and_absent_costs_nothing(make_queue, clock, r):
    q = make_queue("x")
    with pytest.raises(dueq.CronError, match="jitter must be shorter than expires"):
        q.cron.add("j", every=60, jitter=60, expires=60)
    with pytest.raises(dueq.CronError):
        q.cron.add("z", every=60, expires=0)
    q.cron.add("plain", every=60)
    assert q.cron.get("plain").expires is None
    assert b"expires" not in r.hget(q.keys.cron, "plain")
    pending = occurrence_id("plain", int(next_slot_s(q, "plain") * 1000))
    assert r.hget(q.keys.tasks, pending).startswith(b"1:")  # stored exactly as before
