"""Cron under a payload codec, on both front ends and a real Redis: a definition's payload is
sealed once, when it is added (bound to the queue and the definition's name), and its
occurrences carry that sealed body, so no key of the queue holds the payload's plaintext; the
key's holder reads it in occurrences and listings, others see the marker; re-adding the same
definition stays "unchanged" (also under another active key); a ciphertext moved between a
definition's occurrences and other tasks is refused."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
from freezegun import freeze_time
from freezegun.api import FrozenDateTimeFactory

import dueq

pytest.importorskip("cryptography")

K1 = os.urandom(32)
K2 = os.urandom(32)
TASKS = "dueq:{cron}:tasks"


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=timezone.utc)  # type: ignore[misc]


@pytest.fixture
def frozen() -> Iterator[FrozenDateTimeFactory]:
    with freeze_time(utc(2026, 1, 1)) as factory:
        yield factory


def sealed_queue(make_queue, keys=None, active="k1", **kwargs):
    codec = dueq.Encrypted(keys=keys or {"k1": K1}, active=active)
    return make_queue("cron", clock=time.time, codec=codec, **kwargs)


def test_no_key_of_the_queue_holds_a_cron_payload_and_every_occurrence_opens_it(
    make_queue, r, frozen, uncompressed_dumps
):
    secret = uuid.uuid4().hex
    payload = {"secret": secret, "to": "ops@example.com"}
    q = sealed_queue(make_queue, compression="auto")
    q.cron.add("report", "0 * * * *", payload=payload, missed="all")
    q.cron.add("zipped", "0 * * * *", payload={"secret": secret, "pad": "x" * 600})
    q.cron.backfill("report", start=utc(2025, 12, 31, 20), end=utc(2025, 12, 31, 23))
    extra = q.cron.run_now("report")
    frozen.move_to(utc(2026, 1, 1, 3, 30))  # three slots of "report" missed: "all" runs each
    opened = {}
    for _ in range(3):
        for d in q.claim(limit=100):
            opened[d.id] = d.payload
            d.ack()
    ids = sorted(opened)
    assert extra in ids and "cron:report:20251231T200000Z" in ids  # run-now and backfill
    assert "cron:report:20260101T020000Z" in ids and "cron:zipped:20260101T030000Z" in ids
    assert all(p["secret"] == secret for p in opened.values())
    assert opened[extra] == payload
    assert q.get("cron:report:20260101T040000Z").payload == payload  # the pending one
    dumps = b"".join(r.dump(key) for key in r.scan_iter(match="dueq:{cron}:*"))
    assert secret.encode() not in dumps and b"ops@example.com" not in dumps
    assert b'"0 * * * *"' in dumps  # the scan sees the plaintext there is


def test_the_same_definition_added_again_is_unchanged_under_either_active_key(
    make_queue, r, frozen
):
    payload = {"a": 1, "b": [2, 3]}
    q1 = sealed_queue(make_queue)
    assert q1.cron.add("n", "0 3 * * *", payload=payload) == "added"
    stored = r.hget("dueq:{cron}:cron", "n")
    assert q1.cron.add("n", " 0  3 * * * ", payload={"b": [2, 3], "a": 1}) == "unchanged"
    both = sealed_queue(make_queue, keys={"k1": K1, "k2": K2}, active="k2")
    assert both.cron.add("n", "0 3 * * *", payload=payload) == "unchanged"
    assert r.hget("dueq:{cron}:cron", "n") == stored  # nothing rewritten
    with pytest.raises(dueq.CronConflict):
        both.cron.add("n", "0 3 * * *", payload={"a": 2, "b": [2, 3]})
    assert both.cron.add("n", "0 3 * * *", payload={"a": 2}, replace=True) == "replaced"
    assert both.cron.get("n").payload == {"a": 2}
    assert q1.cron.get("n").payload.startswith("<encrypted k2, ")  # sealed with the active k2


def test_listings_open_a_cron_payload_for_the_keys_holder_and_show_a_marker_to_others(
    make_queue, frozen
):
    q = sealed_queue(make_queue)
    q.cron.add("n", "0 3 * * *", payload={"to": "a@example.com"})
    [definition] = q.cron.list()
    assert definition.payload == {"to": "a@example.com"} and definition.problem is None
    stranger = make_queue("cron", clock=time.time)  # no codec: reads the definition's fields
    [seen] = stranger.cron.list()
    assert (seen.expr, seen.problem) == ("0 3 * * *", None)
    assert str(seen.payload).startswith("<encrypted k1, ") and "a@example.com" not in str(seen)
    assert str(stranger.cron.get("n").payload).startswith("<encrypted k1, ")


def test_a_cron_ciphertext_moved_to_another_task_or_another_to_a_cron_id_is_refused(
    make_queue, r, frozen
):
    q = sealed_queue(make_queue, retry=dueq.RetryPolicy(max_attempts=1))
    q.cron.add("n", "0 3 * * *", payload={"amount": 1_000_000})
    occurrence = "cron:n:20260101T030000Z"
    q.schedule({"amount": 1}, id="mine")
    q.schedule({"amount": 2}, id="cron:other:20260101T000000Z")  # an ordinary task, cron-like id
    q.schedule({"amount": 3}, id="cron:n:20260101T000000Z")  # so is this one, under n's name
    cron_body, plain_body = r.hget(TASKS, occurrence), r.hget(TASKS, "mine")
    r.hset(TASKS, "mine", cron_body)
    r.hset(TASKS, "cron:other:20260101T000000Z", cron_body)
    r.hset(TASKS, "cron:n:20260101T000000Z", plain_body)
    assert q.claim(limit=10) == []
    for victim in ("mine", "cron:other:20260101T000000Z", "cron:n:20260101T000000Z"):
        info = q.get(victim)
        assert info.state == "dead", victim
        assert info.errors[-1].type == "UndecryptableTask", victim
    frozen.move_to(utc(2026, 1, 1, 3))
    [d] = q.claim()
    assert (d.id, d.payload) == (occurrence, {"amount": 1_000_000})


def test_an_ordinary_task_with_an_occurrence_shaped_id_opens_as_its_own(make_queue, frozen):
    q = sealed_queue(make_queue)
    q.schedule({"n": 1}, id="cron:n:20260101T000000Z")
    q.cron.add("n", "0 3 * * *", payload={"n": 2})
    [d] = q.claim()
    assert d.payload == {"n": 1}
    frozen.tick(timedelta(hours=3))
    [d] = q.claim()
    assert d.payload == {"n": 2}


def test_a_sharded_queue_seals_cron_payloads_and_rotation_reseals_them(
    make_queue, r, frozen, uncompressed_dumps
):
    q = sealed_queue(make_queue, shards=2)
    q.cron.add("n", "0 * * * *", payload={"s": "SECRET-X"})
    assert q.cron.add("n", "0 * * * *", payload={"s": "SECRET-X"}) == "unchanged"
    frozen.tick(timedelta(hours=1))
    [d] = q.claim()
    assert d.payload == {"s": "SECRET-X"} and q.cron.get("n").payload == {"s": "SECRET-X"}
    d.ack()
    dumps = b"".join(r.dump(key) for key in r.scan_iter(match="dueq:{cron*"))
    assert b"SECRET-X" not in dumps and b"0 * * * *" in dumps  # the definition is there
    both = sealed_queue(make_queue, keys={"k1": K1, "k2": K2}, active="k2", shards=2)
    report = both.rotate_key("k2")
    assert report.resealed == 2 and report.undecryptable == 0  # the definition, the pending one
    k2_alone = sealed_queue(make_queue, keys={"k2": K2}, active="k2", shards=2)
    assert k2_alone.cron.get("n").payload == {"s": "SECRET-X"}
    frozen.tick(timedelta(hours=1))
    [d] = k2_alone.claim()
    assert d.payload == {"s": "SECRET-X"}
