"""Outcome events of a sharded queue (issue 43): each shard writes its own events stream, and one
reader of the logical queue reads them all, as one logical stream: a consumer group has the
same name on every shard's stream, each event goes to one member once, ``ev.ack()`` settles
it on the stream it came from, an event not acked in time goes to another member (per shard,
as on a plain queue), and a tail (no group) reads every shard's events too. There is no order
across shards (each shard's own order is kept).

Followers run on both front ends (``events_support``); outcomes are made by a sync sharded
queue with the manual clock; waits are condition waits.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from conftest import ManualClock
from events_support import Followers, seen
from events_support import outcomes as made_outcomes
from waiting_support import wait_for

import dueq
from dueq._wire.keys import QueueKeys

SHARDS = 3


@pytest.fixture
def follow(r, clock, front_end):
    followers = Followers(front_end, r, clock, shards=SHARDS)
    yield followers
    followers.stop()


@pytest.fixture
def q(r, clock):
    """The producing and consuming sharded queue (sync; followers use the front end under test)."""
    queue = dueq.Queue(
        "q",
        r,
        clock=clock,
        shards=SHARDS,
        retry=dueq.RetryPolicy(max_attempts=2, wait=lambda s: 5),
    )
    queue.configure(events=timedelta(hours=24))
    return queue


def since(clock: ManualClock) -> datetime:
    return datetime.fromtimestamp(clock.now - 1, tz=timezone.utc)


def stream_of(q: dueq.Queue, task_id: str) -> str:
    """The events stream of the shard that holds ``task_id``."""
    return QueueKeys.for_queue(q.shard(task_id).name).events


def outcomes(q: dueq.Queue, n: int, prefix: str = "t") -> set[tuple[str, str]]:
    """``events_support.outcomes`` of tasks on every shard."""
    assert len({q.shard(f"{prefix}{i}").name for i in range(n)}) == SHARDS
    return made_outcomes(q, n, prefix)


def pending_per_shard(q: dueq.Queue, r: Any, group: str) -> list[int]:
    return [
        int(r.xpending(QueueKeys.for_queue(name).events, group)["pending"])
        for name in q.shard_names
    ]


def test_one_group_reads_the_outcomes_of_every_shard_once_and_acks_each_on_its_shard(
    q, clock, follow, r
):
    reader = follow(group="billing", consumer="m1", since=since(clock))
    expected = outcomes(q, 24)
    wait_for(lambda: len(reader.events) >= 24, "the 24 events of 3 shards")
    got = seen(reader)
    assert sorted(got) == sorted(expected)
    assert max(Counter(got).values()) == 1  # each once
    assert {ev.group for ev in reader.events} == {"billing"}
    # each event says the shard stream it came from, which is its task's shard's
    assert all(ev.stream == stream_of(q, ev.task_id) for ev in reader.events)
    wait_for(lambda: pending_per_shard(q, r, "billing") == [0, 0, 0], "every event acked")
    (group,) = q.event_groups()
    assert (group.name, group.pending, group.lag) == ("billing", 0, 0)


def test_each_shards_order_is_kept(q, clock, follow):
    reader = follow(group="billing", consumer="m1", since=since(clock))
    outcomes(q, 24)
    wait_for(lambda: len(reader.events) >= 24, "24 events")
    for name in q.shard_names:
        stream = QueueKeys.for_queue(name).events
        ids = [ev.id for ev in reader.events if ev.stream == stream]
        assert ids and ids == sorted(ids, key=lambda i: tuple(map(int, i.split("-"))))


def test_two_members_of_a_group_split_the_events_of_every_shard(q, clock, follow):
    start = since(clock)
    first = follow(group="billing", consumer="m1", since=start, redeliver_after=600)
    second = follow(group="billing", consumer="m2", since=start, redeliver_after=600)
    expected = outcomes(q, 40)
    wait_for(lambda: len(seen(first, second)) >= 40, "the 40 events between both members")
    got = seen(first, second)
    assert sorted(got) == sorted(expected)
    assert len(got) == 40  # each event to one member


def test_an_event_not_acked_is_redelivered_to_another_member(q, clock, follow, r):
    start = since(clock)
    gone = follow(ack=False, group="billing", consumer="gone", since=start, redeliver_after=0.3)
    expected = outcomes(q, 12)
    wait_for(lambda: len(gone.events) >= 12, "the first member got 12 events")
    gone.stop()
    (group,) = q.event_groups()
    assert group.pending == 12  # summed over the shards' groups
    assert sum(pending_per_shard(q, r, "billing")) == 12
    other = follow(group="billing", consumer="other", redeliver_after=0.3)
    wait_for(lambda: len(other.events) >= 12, "the other member got them")
    assert sorted(seen(other)) == sorted(expected)
    wait_for(lambda: pending_per_shard(q, r, "billing") == [0, 0, 0], "all acked by the other")


def test_a_tail_reads_the_events_of_every_shard(q, clock, follow):
    tail = follow(since=since(clock))
    expected = outcomes(q, 12)
    wait_for(lambda: len(tail.events) >= 12, "12 events")
    assert sorted(seen(tail)) == sorted(expected)
    assert {ev.group for ev in tail.events} == {None}


def test_a_sharded_queue_without_events_has_no_groups_and_writes_no_stream(make_queue, r):
    quiet = make_queue("quiet", shards=SHARDS)
    assert quiet.event_groups() == []
    quiet.schedule({"n": 1}, id="a")
    assert not any(r.exists(QueueKeys.for_queue(n).events) for n in quiet.shard_names)


def test_groups_of_a_sharded_queue_are_summed_over_the_shards(q, clock, follow, r):
    reader = follow(ack=False, group="audit", consumer="m1", since=since(clock))
    outcomes(q, 12)
    wait_for(lambda: len(reader.events) >= 12, "12 events")
    (group,) = q.event_groups()
    assert (group.name, group.consumers, group.pending, group.lag) == ("audit", 1, 12, 0)


def test_the_latest_events_of_a_sharded_queue_merge_every_shards_newest_first(q, r, clock):
    from dueq.events.stream import latest_events

    for i in range(12):  # one outcome a second, on every shard
        q.schedule({"n": i}, id=f"t{i}")
        [d] = q.claim()
        d.ack()
        clock.advance(1)
    assert len({q.shard(f"t{i}").name for i in range(12)}) == SHARDS
    latest = latest_events(r, q, 5)
    assert [ev.task_id for ev in latest] == ["t11", "t10", "t9", "t8", "t7"]
    assert all(ev.kind == "acked" for ev in latest)
