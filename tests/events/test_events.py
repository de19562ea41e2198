"""Outcome events (issue 30): the settling scripts append one event per outcome to the queue's
events stream; consumer groups deliver each event to one member, redeliver what a member that
went away never acked, and let a restarted member resume; without events nothing is written.

Followers run on both front ends (``Queue.events``, an Observable on a reader thread;
``AsyncQueue.events``, an async iterator on a loop of the follower's own thread). Outcomes are
made with the queue's manual clock; waits are condition waits.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import redis
from conftest import ManualClock
from events_support import Followers, outcomes, seen
from waiting_support import wait_for

import dueq


@pytest.fixture
def follow(r, clock, front_end):
    followers = Followers(front_end, r, clock)
    yield followers
    followers.stop()


@pytest.fixture
def q(r, clock):
    """The producing and consuming queue (sync; followers use the front end under test)."""
    queue = dueq.Queue(
        "q", r, clock=clock, retry=dueq.RetryPolicy(max_attempts=2, wait=lambda s: 5)
    )
    queue.configure(events=timedelta(hours=24), keep_results=timedelta(hours=1))
    return queue


def since(clock: ManualClock) -> datetime:
    return datetime.fromtimestamp(clock.now - 1, tz=timezone.utc)


def test_each_group_sees_each_outcome_exactly_once(q, clock, follow):
    start = since(clock)
    billing_1 = follow(group="billing", consumer="b1", since=start, redeliver_after=60)
    billing_2 = follow(group="billing", consumer="b2", since=start, redeliver_after=60)
    audit = follow(group="audit", consumer="a1", since=start, redeliver_after=60)
    expected = outcomes(q, 40)
    wait_for(lambda: len(seen(billing_1, billing_2)) >= 40, "billing saw 40 events")
    wait_for(lambda: len(seen(audit)) >= 40, "audit saw 40 events")
    for group in ((billing_1, billing_2), (audit,)):
        got = seen(*group)
        assert sorted(got) == sorted(expected)  # each outcome once, dead ones included
    assert {kind for _, kind in expected} == {"acked", "retried", "dead", "cancelled"}


def test_an_event_carries_the_task_its_result_and_its_error(q, clock, follow):
    tail = follow(since=since(clock))
    outcomes(q, 4)
    wait_for(lambda: len(tail.events) >= 4, "4 events")
    by_kind = {ev.kind: ev for ev in tail.events}
    acked = by_kind["acked"]
    assert acked.task_id == "t0" and acked.result == {"ok": "t0"} and acked.attempt == 1
    assert acked.task.payload == {"n": "t0"} and acked.task.id == "t0"
    assert acked.at == datetime.fromtimestamp(clock.now, tz=timezone.utc)
    assert by_kind["retried"].error.type == "RuntimeError"
    assert by_kind["dead"].error.type == "Unrecoverable" and by_kind["dead"].result is None
    assert by_kind["cancelled"].task_id == "t3" and by_kind["cancelled"].error is None
    assert acked.group is None
    tail.settle(acked)  # a tail's events need no ack; it does nothing


def test_an_expired_lease_is_a_retried_then_dead_event(q, clock, follow):
    tail = follow(since=since(clock))
    q.schedule({}, id="hung")
    q.claim()
    clock.advance(31)
    q.claim(limit=0)  # reclaims the expired lease: retried
    clock.advance(5)
    q.claim()
    clock.advance(31)
    q.claim(limit=0)  # the second attempt was the last: dead
    wait_for(lambda: len(tail.events) >= 2, "2 events")
    assert [(ev.kind, ev.attempt, ev.error.type) for ev in tail.events] == [
        ("retried", 1, "LeaseExpired"),
        ("dead", 2, "LeaseExpired"),
    ]


def test_an_expired_task_is_one_expired_event_for_a_group(make_queue, clock, follow):
    """Expiry (issue 29) ends a task at fail (its retry would start after its expiry) or at
    claim (due after its expiry): each is exactly one "expired" event, never a retried one.
    Produced and followed on the front end under test."""
    q = make_queue()  # retries wait 10 s
    q.configure(events=timedelta(hours=24))
    group = follow(group="audit", consumer="a1", since=since(clock), redeliver_after=60)
    q.schedule({"n": 1}, id="short", expires=timedelta(seconds=3))
    (d,) = q.claim(1)
    assert d.fail(RuntimeError("boom")).kind == "expired"  # its retry would come in 10 s
    q.schedule({"n": 2}, id="late", delay=20, expires=timedelta(seconds=10))
    clock.advance(21)
    assert q.claim(5) == []  # "late" is past its expiry: ended, never leased
    q.schedule({}, id="marker")
    (m,) = q.claim(1)
    m.ack()  # written after every event above: once it is seen, nothing else is coming
    wait_for(lambda: ("marker", "acked") in seen(group), "the marker's event")
    assert sorted(seen(group)) == [("late", "expired"), ("marker", "acked"), ("short", "expired")]
    by_id = {ev.task_id: ev for ev in group.events}
    short, late = by_id["short"], by_id["late"]
    assert (short.attempt, short.error.type, short.task.payload) == (1, "RuntimeError", {"n": 1})
    assert (late.attempt, late.error, late.task.payload) == (0, None, {"n": 2})
    assert late.at == datetime.fromtimestamp(clock.now, tz=timezone.utc)


def test_an_unacked_event_of_a_member_that_went_away_reaches_another_member(q, clock, follow):
    start = since(clock)
    gone = follow(ack=False, group="billing", consumer="gone", since=start, redeliver_after=0.3)
    expected = outcomes(q, 8)
    wait_for(lambda: len(gone.events) >= 8, "the first member got 8 events")
    gone.stop()
    other = follow(group="billing", consumer="other", redeliver_after=0.3)
    wait_for(lambda: len(other.events) >= 8, "the other member got them")
    assert sorted(seen(other)) == sorted(expected)


def test_a_restarted_member_resumes_its_unacked_events_first(q, clock, follow, r):
    start = since(clock)
    first = follow(ack=False, group="billing", consumer="m1", since=start, redeliver_after=600)
    outcomes(q, 4, prefix="a")
    wait_for(lambda: len(first.events) >= 4, "4 events")
    first.settle(first.events[0])
    first.settle(first.events[1])
    unacked = [(ev.task_id, ev.kind) for ev in first.events[2:]]
    first.stop()
    later = outcomes(q, 4, prefix="b")
    again = follow(group="billing", consumer="m1", redeliver_after=600)
    wait_for(lambda: len(again.events) >= 6, "6 events after the restart")
    got = seen(again)
    assert got[:2] == unacked  # pending first
    assert sorted(got[2:]) == sorted(later)
    assert len(got) == 6


def test_a_member_follows_on_when_the_stream_is_deleted_under_it(q, clock, follow, r):
    member = follow(group="billing", consumer="m1", since=since(clock), redeliver_after=600)
    outcomes(q, 4, prefix="a")
    wait_for(lambda: len(member.events) >= 4, "4 events")
    r.delete(q.keys.events)  # an operator drops the stream while the member blocks on it
    later = outcomes(q, 4, prefix="b")
    wait_for(lambda: len(member.events) >= 8, "the 4 events after the stream came back")
    assert sorted(seen(member)[4:]) == sorted(later)


def test_a_tail_without_since_starts_now(q, clock, follow, admin):
    outcomes(q, 4, prefix="before")
    earlier = {c["id"] for c in admin.client_list()}
    tail = follow()

    def reading() -> bool:  # an async tail starts at its first read: its reader in XREAD
        return any(c["cmd"] == "xread" and c["id"] not in earlier for c in admin.client_list())

    wait_for(reading, "the tail reads")
    later = outcomes(q, 4, prefix="after")
    wait_for(lambda: len(tail.events) >= 4, "4 events")
    assert sorted(seen(tail)) == sorted(later)


def test_events_off_writes_nothing_and_costs_no_memory_per_task(r, clock):
    def run(name: str, on_then_off: bool) -> dict[str, int]:
        queue = dueq.Queue(name, r, clock=clock)
        if on_then_off:
            queue.configure(events=60)
            queue.configure(events=False)
        assert queue.settings().events is None
        for i in range(40):
            queue.schedule({"i": i}, id=f"t{i}")
        for i, d in enumerate(queue.claim(limit=40)):
            if i % 2:
                d.ack()
            else:
                d.fail(dueq.Unrecoverable("no"))
        usage = {}
        for key in r.scan_iter(f"dueq:{{{name}}}:*"):
            part = key.decode().split("}:", 1)[1]
            usage[part] = r.memory_usage(key)
        return usage

    never = run("never", on_then_off=False)
    off = run("off", on_then_off=True)
    assert "events" not in never and "events" not in off
    assert never.keys() == off.keys()
    per_task = {k: v for k, v in off.items() if k != "config"}
    assert per_task == {k: v for k, v in never.items() if k != "config"}


def test_events_are_trimmed_by_age_on_the_queue_clock(q, clock, r):
    q.configure(events=timedelta(seconds=60))
    for i in range(300):
        q.schedule({}, id=f"old{i}")
    for d in q.claim(limit=300):
        d.ack()
    stream = q.keys.events
    assert r.xlen(stream) == 300
    clock.advance(30)  # within the retention: nothing goes
    q.schedule({}, id="mid")
    q.claim()[0].ack()
    assert r.xlen(stream) == 301
    clock.advance(90)  # the first 300 are older than 60 s now
    q.schedule({}, id="new")
    q.claim()[0].ack()
    entries = r.xrange(stream)
    ids = [fields[b"id"].decode() for _, fields in entries]
    assert ids[-2:] == ["mid", "new"]
    assert len(ids) < 150  # whole stream nodes of old events trimmed (MINID ~)
    first_ms = int(entries[0][0].split(b"-")[0])
    assert first_ms == int((clock.now - 120) * 1000)  # ids follow the queue clock


def test_events_setting_is_validated_and_read_back(q):
    assert q.settings().events == timedelta(hours=24)
    assert q.configure(events=90).events == timedelta(seconds=90)
    assert q.configure(events=False).events is None
    with pytest.raises(dueq.ConfigurationError):
        q.configure(events=367 * 86400)
    with pytest.raises(dueq.ConfigurationError):
        q.events(since=datetime(2020, 1, 1))  # naive


def test_dueq_events_prints_the_latest_events_and_configure_turns_them_on(invoke, r, clock):
    assert invoke("configure", "q", "--create", "--events", "3600").exit_code == 0
    q = dueq.Queue("q", r, clock=clock)
    assert q.settings().events == timedelta(hours=1)
    outcomes(q, 4)
    shown = invoke("events", "q", "--json")
    assert shown.exit_code == 0, shown.output
    docs = [json.loads(line) for line in shown.output.splitlines()]
    assert [(d["task_id"], d["kind"]) for d in docs] == [
        ("t0", "acked"),
        ("t1", "retried"),
        ("t2", "dead"),
        ("t3", "cancelled"),
    ]
    assert docs[2]["error"]["type"] == "Unrecoverable" and docs[0]["payload"] == {"n": "t0"}
    text = invoke("events", "q", "--count", "1")
    assert "cancelled" in text.output and "t3" in text.output and "t0" not in text.output
    assert invoke("events", "q", "--group", "g").exit_code != 0  # a group needs --follow


# -- a group that falls behind the retention (issue 37) ------------------------------------------


def acked_outcomes(q: dueq.Queue, n: int, prefix: str) -> None:
    for i in range(n):
        q.schedule({}, id=f"{prefix}{i}")
    for d in q.claim(limit=n):
        d.ack()


def counts_stream_entries(r: redis.Redis) -> bool:
    """Whether the server counts a stream's entries ever added (Redis 7.0, Valkey)."""
    return int(str(r.info("server")["redis_version"]).split(".")[0]) >= 7


def group_named(q: Any, name: str) -> Any:
    (found,) = [g for g in q.event_groups() if g.name == name]
    return found


def test_a_group_behind_the_retention_reports_its_lost_events_lag_and_metric(
    q, clock, follow, r, make_queue, caplog, invoke
):
    if not counts_stream_entries(r):
        pytest.skip("Redis 6.2 keeps no entries-added: lost events cannot be counted")
    q.configure(events=timedelta(seconds=60))
    # the group as a member makes it (at the end of a new stream), then nobody reads a while
    r.xgroup_create(q.keys.events, "slow", id="$", mkstream=True)
    acked_outcomes(q, 300, "old")
    clock.advance(120)  # the 300 are older than the retention now
    acked_outcomes(q, 1, "new")  # its event's write trims old ones
    kept = r.xlen(q.keys.events)
    lost = 301 - kept
    assert lost >= 200  # whole stream nodes went (MINID ~)
    info = group_named(make_queue("q"), "slow")  # the front end under test
    assert (info.lag, info.lost, info.pending) == (kept, lost, 0)
    shown = invoke("events", "q", "--groups", "--json")
    assert shown.exit_code == 0, shown.output
    [listed] = json.loads(shown.output)["groups"]
    assert (listed["name"], listed["lag"], listed["lost"]) == ("slow", kept, lost)
    table = invoke("events", "q", "--groups")
    assert "slow" in table.output and str(lost) in table.output
    caplog.set_level("WARNING", logger="dueq.events")
    second = follow(group="slow", consumer="m1")
    wait_for(lambda: len(second.events) == kept, f"the {kept} events kept")
    assert ("new0", "acked") in seen(second)
    warnings = [rec.getMessage() for rec in caplog.records if "retention" in rec.getMessage()]
    assert len(warnings) == 1 and "'slow'" in warnings[0] and f" {lost} event" in warnings[0]
    assert q.stats().counters["events_lost"] == lost
    after = group_named(q, "slow")
    assert (after.lag, after.lost) == (0, 0)  # its lag no longer counts the lost ones
    acked_outcomes(q, 1, "later")
    wait_for(lambda: ("later0", "acked") in seen(second), "a later event")
    assert q.stats().counters["events_lost"] == lost  # counted once


def test_events_trimmed_while_delivered_and_unacked_are_lost_and_said_so(
    q, clock, follow, r, caplog
):
    q.configure(events=timedelta(seconds=60))
    holder = follow(group="g", consumer="m1", ack=False)
    wait_for(lambda: r.exists(q.keys.events) == 1, "the group made")
    acked_outcomes(q, 300, "old")
    wait_for(lambda: len(holder.events) == 300, "the 300 delivered, none acked")
    holder.stop()
    clock.advance(120)
    acked_outcomes(q, 1, "new")
    lost = 301 - r.xlen(q.keys.events)
    caplog.set_level("WARNING", logger="dueq.events")
    again = follow(group="g", consumer="m1")  # the same member: its pending entries first
    wait_for(lambda: ("new0", "acked") in seen(again), "the new event")
    wait_for(lambda: q.stats().counters.get("events_lost") == lost, "the lost ones counted")
    warnings = [
        rec.getMessage() for rec in caplog.records if "before they were acked" in rec.getMessage()
    ]
    assert warnings and all("'g'" in w and "'m1'" in w for w in warnings)
    assert group_named(q, "g").pending == 0  # the trimmed ones do not stay pending
    assert all(ev.task_id for ev in again.events)  # no empty event for a trimmed one


def test_event_groups_of_a_queue_without_events_is_empty(make_queue):
    assert make_queue("quiet").event_groups() == []
