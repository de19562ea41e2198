"""Task progress (issue 39): ``d.progress(body)`` writes a numbered entry under the lease,
the task keeps its last 20, and ``q.progress(task_id)`` yields them, then live entries, each
once and in order, until the task ends. Each test runs on both front ends (``make_queue``);
followers that run while entries are written run on a thread of their own
(``progress_support.Follower``)."""

from __future__ import annotations

import math
import threading
import time
from datetime import datetime, timezone

import pytest
from progress_support import Follower
from waiting_support import wait_for

import dueq


def _leased(q, task_id="t1"):
    q.schedule({"n": 1}, id=task_id)
    (d,) = q.claim()
    return d


def test_entries_are_numbered_per_task_and_read_back_in_order(make_queue, clock):
    q = make_queue()
    d = _leased(q)
    assert [d.progress({"done": 1}), d.progress("two"), d.progress([3])] == [1, 2, 3]
    entries = list(q.progress("t1", timeout=0.2))
    assert [(e.task_id, e.seq, e.body) for e in entries] == [
        ("t1", 1, {"done": 1}),
        ("t1", 2, "two"),
        ("t1", 3, [3]),
    ]
    at = datetime.fromtimestamp(round(clock.now * 1000) / 1000, tz=timezone.utc)
    assert all(e.at == at for e in entries)  # the queue clock's, aware
    assert isinstance(entries[0], dueq.Progress)
    assert [e.seq for e in q.progress("t1", timeout=0)] == [1, 2, 3]  # the kept ones only
    assert entries[0].to_json()["at"].endswith("Z")


def test_the_history_keeps_the_last_20_entries(make_queue):
    q = make_queue()
    d = _leased(q)
    for i in range(1, 26):
        assert d.progress({"i": i}) == i
    entries = list(q.progress("t1", timeout=0.2))
    assert [e.seq for e in entries] == list(range(6, 26))
    assert [e.body["i"] for e in entries] == list(range(6, 26))


def test_seqs_go_on_across_attempts(make_queue, clock):
    q = make_queue(lease=5)
    d = _leased(q)
    d.progress("first attempt")
    d.fail("boom", retry_in=0)
    (again,) = q.claim()
    assert again.attempt == 2 and again.progress("second attempt") == 2


def test_a_stale_holder_gets_lease_lost_and_writes_nothing(make_queue, clock):
    q = make_queue(lease=1)
    d = _leased(q)
    assert d.progress("mine") == 1
    clock.advance(2)  # the lease runs out
    with pytest.raises(dueq.LeaseLost):
        d.progress("late")
    assert q.claim() == []  # its expired lease is reclaimed: retried after the backoff
    clock.advance(11)
    (taker,) = q.claim()  # taken over by another delivery
    with pytest.raises(dueq.LeaseLost):
        d.progress("stale")
    assert taker.progress("new holder") == 2
    assert [e.body for e in q.progress("t1", timeout=0.2)] == ["mine", "new holder"]


def test_a_cancelled_task_raises_task_cancelled(make_queue):
    q = make_queue()
    d = _leased(q)
    q.cancel("t1")
    with pytest.raises(dueq.TaskCancelled):
        d.progress("after cancel")
    assert d.cancelled


@pytest.mark.parametrize(
    "body",
    [object(), {"x": math.nan}, {1j: 2}, "\ud800", "x" * (64 * 1024)],
    ids=["object", "nan", "complex key", "lone surrogate", "over 64 KiB"],
)
def test_a_body_that_is_not_json_or_too_big_raises_payload_error_and_writes_nothing(
    make_queue, r, body
):
    q = make_queue()
    d = _leased(q)
    with pytest.raises(dueq.PayloadError):
        d.progress(body)
    assert r.hgetall(q.keys.steps) == {}
    assert d.progress("x" * (64 * 1024 - 2)) == 1  # 64 KiB of JSON exactly: fits


def test_a_follower_sees_the_history_then_live_entries_without_gaps_or_doubles(
    make_queue, r, front_end
):
    q = make_queue(clock=None)
    d = _leased(q)
    total = 300
    written = threading.Event()

    def write() -> None:
        for i in range(1, total + 1):
            d.progress({"i": i})
        written.set()

    writer = threading.Thread(target=write)
    if front_end == "async":  # the wrapped AsyncQueue runs on the test's loop: write here
        for i in range(1, 11):
            d.progress({"i": i})
        follower = Follower(front_end, r, "t1", timeout=10)
        wait_for(lambda: follower.seqs, "the follower's first entries")
        for i in range(11, total + 1):
            d.progress({"i": i})
    else:
        writer.start()  # the follower starts while entries are being written
        follower = Follower(front_end, r, "t1", timeout=10)
        writer.join()
    wait_for(lambda: follower.seqs[-1:] == [total], "the last entry")
    d.ack()
    seqs = follower.join()
    first = seqs[0]
    assert seqs == list(range(first, total + 1))  # no gap, no double
    # it started from the kept history: the last 20 of what was written by then (all of it,
    # when it started after the tenth entry)
    assert len(seqs) >= 20 and (first == 1 if front_end == "async" else True)
    assert [e.body["i"] for e in follower.entries] == seqs


@pytest.mark.parametrize("end", ["ack", "ack with results kept", "dead", "cancel"])
def test_the_follower_ends_when_the_task_ends(make_queue, r, front_end, end):
    q = make_queue(clock=None, retry=dueq.RetryPolicy(max_attempts=1))
    if end == "ack with results kept":
        q.configure(keep_results=60)
    d = _leased(q)
    d.progress("started")
    follower = Follower(front_end, r, "t1", timeout=30)
    wait_for(lambda: follower.seqs == [1], "the history")
    d.progress("half")
    wait_for(lambda: follower.seqs == [1, 2], "the live entry")
    started = time.monotonic()
    if end.startswith("ack"):
        d.ack()
    elif end == "dead":
        assert d.fail("boom").kind == "dead"
    else:
        q.cancel("t1")
    assert follower.join(10) == [1, 2]
    took = time.monotonic() - started
    # the ended channel ends it at once; an ack that keeps nothing publishes nothing, and the
    # follower's look at the task after a quiet second finds it gone
    assert took < (5.0 if end == "ack" else 2.0), took


def test_a_follower_of_a_task_that_ended_or_never_was_ends_at_once(make_queue):
    q = make_queue()
    d = _leased(q)
    d.progress("only")
    d.fail(dueq.Unrecoverable("no"))  # dead: it keeps its history
    started = time.monotonic()
    assert [e.body for e in q.progress("t1", timeout=30)] == ["only"]
    assert list(q.progress("never", timeout=30)) == []
    assert time.monotonic() - started < 5


def test_a_follower_without_entries_ends_after_its_timeout(make_queue):
    q = make_queue()
    _leased(q)
    started = time.monotonic()
    assert list(q.progress("t1", timeout=0.3)) == []
    assert 0.25 <= time.monotonic() - started < 5


def test_progress_checks_the_id_and_timeout_first(make_queue):
    q = make_queue()
    with pytest.raises(dueq.InvalidTaskError):
        q.progress("")
    with pytest.raises(dueq.InvalidTaskError, match="timeout"):  # as q.wait's
        q.progress("t1", timeout=-1)
