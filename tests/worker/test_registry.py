"""The worker registry (``dueq.registry``): heartbeat entries, their expiry and cleanup, and the
worker named in error records. Both front ends (the ``make_queue`` contract fixture)."""

from __future__ import annotations

import json
import os
import socket

import pytest

import dueq
from dueq.registry import entry_json


def _beat(q, ttl_ms: int = 3000, counts=(2, 10, 3), queues=("q",)) -> int:
    return q.send_heartbeat(entry_json(queues, 1_700_000_000_000, *counts), ttl_ms)


# -- error records name the worker -------------------------------------------------------------


def test_a_failed_attempt_records_the_worker_that_ran_it(make_queue):
    q = make_queue(holder="web-1")
    q.schedule("x", id="t")
    [d] = q.claim()
    d.fail(RuntimeError("boom"))
    [record] = q.get("t").errors
    assert record.worker == "web-1" and record.type == "RuntimeError"


def test_a_failure_by_a_default_holder_names_this_process(make_queue):
    q = make_queue()
    q.schedule("x", id="t")
    [d] = q.claim()
    d.fail("no")
    worker = q.get("t").errors[0].worker  # the worker id, cut from the left to 32 characters
    assert worker and len(worker) <= 32 and dueq.worker_id().endswith(worker)
    assert worker.split(":")[-2] == str(os.getpid())


def test_an_expired_lease_records_the_worker_that_held_it(make_queue, clock):
    q = make_queue(holder="gone-7", lease=5)
    q.schedule("x", id="t")
    q.claim()
    clock.advance(6)
    make_queue(holder="other", lease=5).claim()  # reclaims the expired lease
    errors = q.get("t").errors
    assert errors[0].type == "LeaseExpired" and errors[0].worker == "gone-7"


def test_an_error_record_written_before_workers_were_named_reads_as_none(make_queue, r):
    q = make_queue()
    q.schedule("x", id="t")
    old = [{"at": 1, "attempt": 1, "type": "E", "message": "m", "traceback": None}]
    r.hset(q.keys.errors, "t", json.dumps(old))
    [record] = q.get("t").errors
    assert record.worker is None and record.type == "E"


# -- the registry through the library (both front ends) ----------------------------------------


def test_a_beat_shows_the_worker_with_its_fields(make_queue, clock):
    q = make_queue()
    assert q.workers() == []
    assert _beat(q, queues=("q", "other")) == 1
    [w] = q.workers()
    assert w.worker_id == dueq.worker_id()
    assert w.pid == os.getpid() and w.host == socket.gethostname()
    assert w.queues == ("q", "other")
    assert (w.in_flight, w.processed, w.failed) == (2, 10, 3)
    assert w.last_seen_at.timestamp() == clock()
    assert w.started_at.timestamp() == 1_700_000_000


def test_a_beat_lists_the_named_tasks_the_worker_runs_per_queue_with_their_parameters(
    make_queue,
):
    q = make_queue()
    _beat(q)
    assert q.workers()[0].tasks == {}  # a beat without tasks
    tasks = {"q": {"add": ["x", "y=", "**"]}, "other": {}}
    q.send_heartbeat(entry_json(("q", "other"), 1, 0, 0, 0, tasks=tasks), 3000)
    [w] = q.workers()
    assert w.tasks == {"q": {"add": ("x", "y=", "**")}, "other": {}}


def test_a_real_workers_beat_names_its_tasks_and_a_context_parameter_is_left_out(r, clock):
    from dueq.registry import task_parameters

    q = dueq.Queue("q", r, clock=clock)

    @q.task(name="add", context=True)
    def add(ctx, x: int, y: int = 0, *rest: int, z: int, w: int = 1, **more: int) -> None: ...

    @q.task(name="plain")
    def plain() -> None: ...

    assert task_parameters([q]) == {"q": {"add": ("x", "y=", "z", "w=", "**"), "plain": ()}}


def test_an_entry_past_its_ttl_is_never_shown_and_the_next_beat_prunes_it(make_queue, r, clock):
    q = make_queue()
    _beat(q, ttl_ms=3000)
    r.hset(q.keys.workers_info, "dead:1:x", '{"x":1}')
    r.zadd(q.keys.workers, {"dead:1:x": int(clock() * 1000) + 1000})
    clock.advance(2)
    assert [w.worker_id for w in q.workers()] == [dueq.worker_id()]
    assert r.zcard(q.keys.workers) == 2  # expired, not yet pruned
    clock.advance(2)
    assert q.workers() == []  # ours expired too, and nobody has beaten since
    _beat(q, ttl_ms=3000)
    assert r.zrange(q.keys.workers, 0, -1) == [dueq.worker_id().encode()]
    assert r.hkeys(q.keys.workers_info) == [dueq.worker_id().encode()]


def test_leaving_removes_the_entry_at_once(make_queue, r):
    q = make_queue()
    _beat(q)
    q.leave_registry()
    assert q.workers() == []
    assert r.zcard(q.keys.workers) == 0 and r.hlen(q.keys.workers_info) == 0


def test_the_registry_keys_expire_with_the_longest_entry(make_queue, r):
    q = make_queue()
    _beat(q, ttl_ms=60_000)
    assert 0 < r.pttl(q.keys.workers) <= 60_000
    assert 0 < r.pttl(q.keys.workers_info) <= 60_000
    _beat(q, ttl_ms=1000)  # a shorter entry never shortens the key's life
    assert r.pttl(q.keys.workers) > 1000


@pytest.mark.parametrize(
    "garbage",
    [
        b"not json",
        b"[1, 2]",
        b'{"host": "h"}',
        b'{"host": 1, "pid": 1, "queues": [], "started_ms": 1, "last_seen_ms": 1,'
        b' "in_flight": 0, "processed": 0, "failed": 0}',
        b'{"host": "h", "pid": -1, "queues": ["q"], "started_ms": 1, "last_seen_ms": 1,'
        b' "in_flight": 0, "processed": 0, "failed": 0}',
        b"\xff\xfe",
        b'{"host": "h", "pid": 1, "queues": ["q"], "started_ms": 1, "last_seen_ms": 1,'
        b' "in_flight": 0, "processed": 0, "failed": 0, "tasks": {"q": {"add": [1]}}}',
        b'{"host": "h", "pid": 1, "queues": ["q"], "started_ms": 1, "last_seen_ms": 1,'
        b' "in_flight": 0, "processed": 0, "failed": 0, "tasks": ["add"]}',
    ],
)
def test_a_corrupt_entry_is_skipped_by_readers_and_the_heartbeat_goes_on(
    make_queue, r, clock, garbage
):
    q = make_queue()
    r.hset(q.keys.workers_info, "bad:1:x", garbage)
    r.zadd(q.keys.workers, {"bad:1:x": int(clock() * 1000) + 60_000})
    assert q.workers() == []
    assert _beat(q) == 2
    assert [w.worker_id for w in q.workers()] == [dueq.worker_id()]


def test_registry_keys_of_the_wrong_type_are_replaced_by_the_next_beat(make_queue, r):
    q = make_queue()
    r.set(q.keys.workers, "x")
    r.set(q.keys.workers_info, "y")
    assert q.workers() == []
    assert _beat(q) == 1
    assert [w.worker_id for w in q.workers()] == [dueq.worker_id()]


def test_an_entry_without_an_expiry_is_dropped_by_the_next_beat(make_queue, r):
    q = make_queue()
    r.hset(q.keys.workers_info, "orphan", "{}")
    _beat(q)
    assert r.hkeys(q.keys.workers_info) == [dueq.worker_id().encode()]


def test_a_queue_with_only_workers_is_found_by_discovery(make_queue, r):
    from dueq.discovery import discover_workers, queue_names

    q = make_queue("lonely")
    _beat(q, queues=("lonely",))
    assert "lonely" in queue_names(r)
    assert [w.worker_id for w in discover_workers(r)] == [dueq.worker_id()]
