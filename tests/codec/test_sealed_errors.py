"""Error messages and tracebacks sealed with ``Encrypted(errors=True)`` on both front ends:
after a retry and after dead no key of the queue holds a marker message's text, a holder of
the key reads it back (``q.get``, ``q.dead``), and without ``errors=True`` it stays plain."""

from __future__ import annotations

import os
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from codec_support import read_events, values_of_queue

import dueq

pytest.importorskip("cryptography")

K1 = os.urandom(32)


def test_an_error_message_is_sealed_after_a_retry_and_after_dead_and_read_back(make_queue, r):
    q = make_queue(codec=dueq.Encrypted(keys={"k1": K1}, active="k1", errors=True))
    marker = f"secret-{uuid.uuid4().hex}"
    q.schedule({"n": 1}, id="t1", max_attempts=2)
    [d] = q.claim()
    d.fail(ValueError(marker), retry_in=0)
    assert not any(marker.encode() in v for v in values_of_queue(r, q.name))
    [d] = q.claim()
    try:
        raise ValueError(marker)
    except ValueError as exc:  # raised, so that it has a traceback naming the marker
        d.fail(exc)
    assert not any(marker.encode() in v for v in values_of_queue(r, q.name))
    info = q.get("t1")
    assert info.state == "dead"
    assert [e.message for e in info.errors] == [marker, marker]
    assert info.errors[0].type == "ValueError"
    assert marker in (info.errors[1].traceback or "")
    [dead] = q.dead.list()
    assert dead.errors[-1].message == marker
    reader = make_queue(name=q.name)
    assert reader.get("t1").errors[0].message.startswith("<encrypted k1, ")


def test_without_errors_true_an_error_message_stays_plain(make_queue, r):
    q = make_queue(codec=dueq.Encrypted(keys={"k1": K1}, active="k1"))
    marker = f"plain-{uuid.uuid4().hex}"
    q.schedule({"n": 1}, id="t1", max_attempts=1)
    [d] = q.claim()
    d.fail(ValueError(marker))
    assert any(marker.encode() in v for v in values_of_queue(r, q.name))
    assert q.get("t1").errors[0].message == marker


def test_a_failed_event_shows_a_sealed_error_opened_for_the_key_holder_and_a_marker_otherwise(
    make_queue, clock
):
    codec = dueq.Encrypted(keys={"k1": K1}, active="k1", errors=True)
    q = make_queue(codec=codec)
    q.configure(events=timedelta(hours=1))
    marker = f"secret-{uuid.uuid4().hex}"
    q.schedule({"n": 1}, id="t1", max_attempts=1)
    [d] = q.claim()
    d.fail(ValueError(marker))
    start = datetime.fromtimestamp(clock.now - 60, tz=timezone.utc)
    [ev] = read_events(q, 1, start)
    assert ev.kind == "dead" and ev.error.message == marker and ev.error.type == "ValueError"
    other = dueq.Encrypted(keys={"k2": os.urandom(32)}, active="k2")
    [shown] = read_events(make_queue(name=q.name, codec=other), 1, start)
    assert shown.error.message.startswith("<encrypted k1, ")


def test_scripts_still_read_the_type_of_an_error_whose_message_is_sealed(make_queue, clock):
    # the scripts decode error records (a kept result's history, the error-type filter, a
    # cron definition's last outcome): a sealed message's JSON escape must not make them skip it
    q = make_queue(codec=dueq.Encrypted(keys={"k1": K1}, active="k1", errors=True))
    q.configure(keep_results=timedelta(hours=1))
    q.cron.add("minutely", "* * * * *", payload={})
    q.schedule({"n": 1}, id="flaky")
    q.schedule({"n": 2}, id="doomed", max_attempts=1)
    clock.advance(60)
    for d in q.claim(limit=10):
        d.fail(KeyError("secret"), retry_in=0)
    assert q.cron.get("minutely").last_error_type == "KeyError"
    assert [t.id for t in q.list_tasks("dead", error_type="KeyError").tasks] == ["doomed"]
    for d in q.claim(limit=10):
        d.ack()
    [error] = q.get("flaky").errors  # kept with the result record
    assert (error.type, error.message) == ("KeyError", "'secret'")
