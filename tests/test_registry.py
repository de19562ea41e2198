"""The worker registry (``dueq.registry``): heartbeat entries, their expiry and cleanup, and the
worker named in error records. Both front ends (the ``make_queue`` contract fixture)."""

from __future__ import annotations

import json

from dueq.registry import entry_json


def _beat(q, ttl_ms: int = 3000, counts=(2, 10, 3), queues=("q",)) -> int:
    return q._heartbeat(entry_json(queues, 1_700_000_000_000, *counts), ttl_ms)


# -- error records name the worker -------------------------------------------------------------


def test_a_failed_attempt_records_the_worker_that_ran_it(make_queue):
    q = make_queue(holder="web-1")
    q.schedule("x", id="t")
    [d] = q.claim()
    d.fail(RuntimeError("boom"))
    [record] = q.get("t").errors
    assert record.worker == "web-1" and record.type == "RuntimeError"


def test_a_failure_by_a_default_holder_names_this_process(make_queue):
    from dueq._core import default_holder

    q = make_queue()
    q.schedule("x", id="t")
    [d] = q.claim()
    d.fail("no")
    assert q.get("t").errors[0].worker == default_holder()


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
