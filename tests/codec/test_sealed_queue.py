"""Payload codecs on a real Redis, on both front ends: encrypted and compressed payloads round
trip, never show in Redis, refuse to be moved, rotate, and end dead (data kept) when no key
opens them."""

from __future__ import annotations

import json
import os
import uuid

import pytest

import dueq

pytest.importorskip("cryptography")
pytest.importorskip("zstandard")

K1 = os.urandom(32)
K2 = os.urandom(32)
TASKS = "dueq:{q}:tasks"


def one_key(key_id: str = "k1", key: bytes = K1) -> dueq.Encrypted:
    return dueq.Encrypted(keys={key_id: key}, active=key_id)


def stored(r, task_id: str) -> bytes:
    """The envelope of a task as Redis holds it."""
    return r.hget(TASKS, task_id)


def test_an_encrypted_compressed_payload_round_trips_through_claim_get_and_dead(make_queue):
    q = make_queue(codec=one_key(), compression="auto", retry=dueq.RetryPolicy(max_attempts=1))
    payload = {"to": "a@example.com", "body": "hello " * 100, "n": [1, 2.5, None, True]}
    q.schedule(payload, id="t1")
    assert q.get("t1").payload == payload
    [d] = q.claim()
    assert d.payload == payload
    d.fail(RuntimeError("boom"))
    [dead] = q.dead.list()
    assert dead.id == "t1" and dead.payload == payload


def test_schedule_many_seals_each_task_for_its_own_id(make_queue, r):
    q = make_queue(codec=one_key())
    q.schedule_many([dueq.Task({"n": i}, id=f"t{i}") for i in range(5)] + [dueq.Task({"n": 5})])
    got = {d.id: d.payload for d in q.claim(limit=10)}
    assert sorted(v["n"] for v in got.values()) == [0, 1, 2, 3, 4, 5]
    assert got["t3"] == {"n": 3}


def test_a_named_task_keeps_its_name_plaintext_and_its_arguments_sealed(make_queue, r):
    q = make_queue(codec=one_key())
    q.schedule({"user": "SECRET-USER"}, task="send_welcome", id="n1")
    raw = stored(r, "n1")
    assert raw.startswith(b"1:~@send_welcome\n%|k1\n") and b"SECRET-USER" not in raw
    [d] = q.claim()
    assert d.payload == {"user": "SECRET-USER"} and d.task_name == "send_welcome"


def test_task_options_stay_plaintext_for_the_scripts(make_queue, r):
    q = make_queue(codec=one_key())
    q.schedule({"x": 1}, id="lo", priority=1)
    q.schedule({"x": 2}, id="hi", priority=7, key="tenant:1", max_attempts=2)
    assert stored(r, "hi").startswith(b"2:7||2|tenant:1\n%|k1\n")
    assert [d.id for d in q.claim(limit=10)] == ["hi", "lo"]  # priority read by claim.lua


def test_a_dump_of_every_key_of_the_queue_shows_no_marker_payload(
    make_queue, r, admin, uncompressed_dumps
):
    def markers_in_dump(q) -> set[str]:
        markers = [uuid.uuid4().hex for _ in range(300)]
        q.schedule_many(
            [
                dueq.Task({"secret": m, "pad": "x" * (i % 400)}, id=f"t{i}")
                for i, m in enumerate(markers)
            ]
        )
        claimed = q.claim(limit=100)
        for d in claimed[:50]:
            d.fail(dueq.Unrecoverable("to dead"))  # dead tasks keep their envelope
        for d in claimed[50:]:
            d.fail(RuntimeError("retry"))  # back to due with an error record
        q.claim(limit=20)  # some leased
        dumps = b"".join(r.dump(key) for key in r.scan_iter(match="dueq:{q}:*"))
        return {m for m in markers if m.encode() in dumps}

    plain = make_queue()
    assert len(markers_in_dump(plain)) == 300  # the scan sees plaintext where there is some
    admin.flushall()
    sealed = make_queue(codec=one_key(), compression="auto")
    assert markers_in_dump(sealed) == set()


def test_a_ciphertext_copied_onto_another_task_ends_that_task_dead_with_its_data_kept(
    make_queue, r
):
    q = make_queue(codec=one_key())
    q.schedule({"amount": 1}, id="mine")
    q.schedule({"amount": 1_000_000}, id="theirs", delay=60)
    forged = stored(r, "theirs")
    r.hset(TASKS, "mine", forged)
    assert q.claim() == []  # the forged task is not delivered
    info = q.get("mine")
    assert info.state == "dead"
    assert info.errors[-1].type == "UndecryptableTask"
    assert "authentication" in info.errors[-1].message
    assert stored(r, "mine") == forged  # the ciphertext is kept as it was
    sealed_bytes = len(forged) - len(b"1:%|k1\n")
    assert info.payload == f"<encrypted k1, {sealed_bytes} B>"


def test_a_forged_ciphertext_is_refused_after_genuine_ones_opened_with_the_same_key(make_queue, r):
    # a claim opens the first task of a codec line the long way and later ones the short way:
    # the short way checks the tag as strictly, and leaves the refusal's reason to the long one
    q = make_queue(codec=one_key(), compression="auto")
    q.schedule({"amount": 1}, id="first")
    q.schedule({"note": "x" * 400}, id="long")  # a compressed one, then a forged one of each
    [first, long] = sorted(q.claim(limit=10), key=lambda d: d.id)
    assert (first.payload, long.payload) == ({"amount": 1}, {"note": "x" * 400})
    q.ack_many([first, long])
    for victim, source in (("mine", "theirs"), ("mine-long", "theirs-long")):
        body = {"amount": 1_000_000} if victim == "mine" else {"note": "y" * 400}
        q.schedule(body, id=source, delay=60)
        q.schedule({"amount": 2} if victim == "mine" else {"note": "z" * 400}, id=victim)
        r.hset(TASKS, victim, stored(r, source))
    assert q.claim(limit=10) == []
    for victim in ("mine", "mine-long"):
        info = q.get(victim)
        assert info.state == "dead", victim
        assert "authentication" in info.errors[-1].message


def test_an_unknown_key_id_ends_the_task_dead_and_replay_with_the_key_reads_it(make_queue, r):
    writer = make_queue(codec=one_key("k1", K1))
    writer.schedule({"secret": "s"}, id="t1")
    before = stored(r, "t1")
    reader = make_queue(codec=one_key("k2", K2))
    assert reader.claim() == []
    [dead] = reader.dead.list()
    assert dead.id == "t1" and dead.errors[-1].type == "UndecryptableTask"
    assert "no key 'k1'" in dead.errors[-1].message
    assert dead.payload.startswith("<encrypted k1, ")
    assert stored(r, "t1") == before
    assert writer.dead.replay(["t1"]) == 1
    [d] = writer.claim()
    assert d.payload == {"secret": "s"}


def test_a_queue_without_a_codec_sends_an_encrypted_task_dead_not_its_bytes(make_queue, r):
    make_queue(codec=one_key()).schedule({"secret": "s"}, id="t1")
    plain = make_queue()
    assert plain.get("t1").payload.startswith("<encrypted k1, ")
    assert plain.claim() == []
    assert plain.get("t1").errors[-1].type == "UndecryptableTask"


def test_rotation_readers_accept_every_listed_key_and_writers_use_the_active_one(make_queue, r):
    old = make_queue(codec=dueq.Encrypted(keys={"k1": K1}, active="k1"))
    old.schedule({"n": "old"}, id="a")
    both = make_queue(codec=dueq.Encrypted(keys={"k1": K1, "k2": K2}, active="k2"))
    both.schedule({"n": "new"}, id="b")
    assert stored(r, "a").startswith(b"1:%|k1\n")
    assert stored(r, "b").startswith(b"1:%|k2\n")
    assert {d.id: d.payload for d in both.claim(limit=10)} == {"a": {"n": "old"}, "b": {"n": "new"}}


def test_a_key_callable_is_asked_once_per_key_id(make_queue):
    asked: list[str] = []

    def kms(key_id: str) -> bytes | None:
        asked.append(key_id)
        return {"k1": K1}.get(key_id)

    q = make_queue(codec=dueq.Encrypted(keys=kms, active="k1"))
    for i in range(5):
        q.schedule({"n": i}, id=f"t{i}")
    assert len(q.claim(limit=10)) == 5
    assert asked == ["k1"]


def test_compressed_payloads_are_smaller_and_old_uncompressed_tasks_still_read(make_queue, r):
    payload = {"rows": [{"id": i, "email": f"user{i}@example.com", "ok": True} for i in range(30)]}
    assert len(json.dumps(payload)) > 1000
    old = make_queue()
    old.schedule(payload, id="old")
    new = make_queue(compression="zstd")
    new.schedule(payload, id="new")
    assert stored(r, "new").startswith(b"1:%z|\n")
    assert r.hstrlen(TASKS, "new") < 0.4 * r.hstrlen(TASKS, "old")
    assert {d.id: d.payload for d in new.claim(limit=10)} == {"old": payload, "new": payload}


def test_a_queue_without_compression_reads_compressed_tasks(make_queue):
    make_queue(compression="zstd").schedule({"s": "y" * 2000}, id="z")
    [d] = make_queue().claim()
    assert d.payload == {"s": "y" * 2000}


def test_auto_compresses_only_payloads_over_256_bytes(make_queue, r):
    q = make_queue(compression="auto")
    q.schedule({"s": "a" * 100}, id="small")
    q.schedule({"s": "a" * 400}, id="big")
    assert stored(r, "small") == b'1:{"s":"' + b"a" * 100 + b'"}'
    assert stored(r, "big").startswith(b"1:%z|\n")


def test_unencrypted_tasks_stay_readable_by_an_encrypting_queue(make_queue):
    make_queue().schedule({"plain": 1}, id="p")
    q = make_queue(codec=one_key())
    assert q.get("p").payload == {"plain": 1}
    [d] = q.claim()
    assert d.payload == {"plain": 1}


def test_reschedule_retry_and_release_keep_an_encrypted_task_readable(make_queue, clock):
    q = make_queue(codec=one_key())
    q.schedule({"n": 1}, id="t", delay=100)
    assert q.reschedule("t", delay=5)
    clock.advance(5)
    [d] = q.claim()
    d.fail(RuntimeError("again"))
    clock.advance(10)
    [d] = q.claim()
    assert d.payload == {"n": 1} and d.attempt == 2
    d.release(delay=1)
    clock.advance(1)
    [d] = q.claim()
    assert d.payload == {"n": 1}


def test_the_payload_limit_counts_json_bytes_before_compression(make_queue):
    q = make_queue(compression="zstd", max_payload_bytes=1000)
    with pytest.raises(dueq.PayloadError, match="over the limit"):
        q.schedule({"s": "a" * 2000})


def test_a_sharded_queue_seals_for_the_queue_and_every_shard_opens_it(make_queue, r):
    q = make_queue("sq", shards=3, codec=one_key(), compression="auto")
    q.schedule_many([dueq.Task({"n": i, "secret": "S" * 300}, id=f"t{i}") for i in range(30)])
    for name in ("sq#0", "sq#1", "sq#2"):
        for raw in r.hvals(f"dueq:{{{name}}}:tasks"):
            assert raw.startswith(b"1:%z|k1\n") and b"SSS" not in raw
    assert q.get("t7").payload == {"n": 7, "secret": "S" * 300}
    claimed = []
    while batch := q.claim(limit=100):
        claimed += batch
    assert sorted(d.payload["n"] for d in claimed) == list(range(30))
