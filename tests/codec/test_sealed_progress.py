"""Progress bodies under an encrypting codec, on both front ends: ``d.progress(body)`` seals the
body for its queue and task, so it is plaintext nowhere in Redis (the history field, the
"progress" events), nor on the progress channel; the key's holder reads it back from the history,
a live follow, a sharded queue and the events; a queue without the key sees the marker, and a
body copied onto another task's history is refused."""

from __future__ import annotations

import os
import uuid
from datetime import datetime, timezone

import pytest
from progress_support import Follower
from waiting_support import wait_for

import dueq
from dueq._consume.wake import sharded_pubsub
from dueq.exceptions import UndecryptableTask
from dueq.server import server_build

pytest.importorskip("cryptography")

K1 = os.urandom(32)
K2 = os.urandom(32)
STEPS = "dueq:{q}:steps"
SINCE = datetime(2000, 1, 1, tzinfo=timezone.utc)


def one_key(key_id: str = "k1", key: bytes = K1) -> dueq.Encrypted:
    return dueq.Encrypted(keys={key_id: key}, active=key_id)


def _leased(q, task_id: str = "t1"):
    q.schedule({"n": 1}, id=task_id)
    (d,) = q.claim()
    return d


def _channel_messages(r, channel: str):
    """A subscription to ``channel`` as the scripts publish on it (SSUBSCRIBE from Redis 7),
    and a reader of the data of its messages so far."""
    pubsub = r.pubsub()
    sharded = sharded_pubsub(server_build(r)[1])
    (pubsub.ssubscribe if sharded else pubsub.subscribe)(channel)
    read = pubsub.get_sharded_message if sharded else pubsub.get_message

    def messages(count: int) -> list[bytes]:
        found: list[bytes] = []

        def more() -> bool:
            message = read(timeout=0.1)
            if message is not None and message["type"] in ("message", "smessage"):
                found.append(message["data"])
            return len(found) >= count

        wait_for(more, f"{count} messages on {channel}")
        return found

    wait_for(lambda: read(timeout=0.1) is not None, "the subscription's confirmation")
    return pubsub, messages


def _progress_events(r, **options) -> list[dueq.Event]:
    """The "progress" events of queue "q" from the start, read by ``q.events()`` of a queue
    made with ``options``."""
    found: list = []
    q = dueq.Queue("q", r, **options)
    subscription = q.events(since=SINCE).subscribe(on_next=found.append)
    try:
        wait_for(lambda: len(found) >= 1, "the progress event")
    finally:
        subscription.dispose()
    return [e for e in found if e.kind == "progress"]


def test_no_progress_body_shows_in_a_dump_of_the_queue_or_on_its_channel(
    make_queue, r, admin, uncompressed_dumps
):
    def markers_seen(q) -> tuple[set[str], set[str]]:
        q.configure(events=3600)  # "progress" events in the outcome stream too
        pubsub, messages = _channel_messages(r, q.keys.progress)
        markers = [uuid.uuid4().hex for _ in range(20)]
        try:
            for i, marker in enumerate(markers):
                d = _leased(q, f"t{i}")
                d.progress({"secret": marker})
                d.progress(f"step of {marker}")
            published = b"".join(messages(2 * len(markers)))
        finally:
            pubsub.close()
        dumps = b"".join(r.dump(key) for key in r.scan_iter(match="dueq:{q}:*"))
        in_redis = {m for m in markers if m.encode() in dumps}
        on_channel = {m for m in markers if m.encode() in published}
        return in_redis, on_channel

    plain = make_queue(clock=None)
    assert [len(seen) for seen in markers_seen(plain)] == [20, 20]  # the scans see plaintext
    admin.flushall()
    sealed = make_queue(codec=one_key(), clock=None)
    assert markers_seen(sealed) == (set(), set())


def test_the_keys_holder_reads_the_bodies_back_from_the_history(make_queue):
    # bodies of every kind: a tab and a newline inside a string, text beyond ASCII, and one
    # long enough to be compressed before it is sealed
    q = make_queue(codec=one_key(), compression="auto")
    bodies = [{"done": 1, "of": 3}, "tab\there\nnewline", "naïve ✓", {"log": "line " * 300}]
    d = _leased(q)
    assert [d.progress(body) for body in bodies] == [1, 2, 3, 4]
    history = list(q.progress("t1", timeout=0))
    assert [(e.task_id, e.seq) for e in history] == [("t1", n) for n in (1, 2, 3, 4)]
    assert [e.body for e in history] == bodies


def test_a_live_follower_with_the_key_gets_the_opened_bodies(make_queue, r, front_end):
    q = make_queue(codec=one_key(), clock=None)
    d = _leased(q)
    d.progress({"kept": 1})
    follower = Follower(front_end, r, "t1", codec=one_key(), timeout=10)
    wait_for(lambda: follower.seqs == [1], "the history")
    d.progress({"live": 2})
    wait_for(lambda: follower.seqs == [1, 2], "the live entry")
    d.ack()
    assert follower.join() == [1, 2]
    assert [e.body for e in follower.entries] == [{"kept": 1}, {"live": 2}]


def test_a_queue_without_the_key_sees_the_marker_not_the_body(make_queue):
    writer = make_queue(codec=one_key())
    d = _leased(writer)
    d.progress({"secret": "SECRET-BODY"})
    for reader in (make_queue(), make_queue(codec=one_key("k2", K2))):
        (entry,) = reader.progress("t1", timeout=0)
        assert entry.seq == 1
        assert isinstance(entry.body, str) and entry.body.startswith("<encrypted k1, ")
        assert "SECRET" not in entry.body
        assert isinstance(entry.body.error, UndecryptableTask)


def test_a_body_copied_onto_another_tasks_history_is_refused(make_queue, r):
    q = make_queue(codec=one_key())
    _leased(q, "theirs").progress({"amount": 1_000_000})
    _leased(q, "mine").progress({"amount": 1})
    r.hset(STEPS, "mine\0p", r.hget(STEPS, "theirs\0p"))
    (entry,) = q.progress("mine", timeout=0)
    assert entry.body.startswith("<encrypted k1, ")
    assert isinstance(entry.body.error, UndecryptableTask)
    assert "authentication" in str(entry.body.error)
    (theirs,) = q.progress("theirs", timeout=0)
    assert theirs.body == {"amount": 1_000_000}


def test_a_sharded_queue_seals_on_the_tasks_shard_and_opens_for_the_holder(
    make_queue, r, front_end
):
    q = make_queue(codec=one_key(), shards=3, clock=None)
    ids = [f"t{i}" for i in range(9)]
    for task_id in ids:
        q.schedule({"id": task_id}, id=task_id)
    deliveries = {d.id: d for d in q.claim(20)}
    for d in deliveries.values():
        d.progress({"of": f"SECRET-{d.id}"})
        assert b"SECRET" not in r.hget(q.shard(d.id).keys.steps, d.id + "\0p")
    for task_id in ids:
        (entry,) = q.progress(task_id, timeout=0)
        assert (entry.seq, entry.body) == (1, {"of": f"SECRET-{task_id}"})
    follower = Follower(front_end, r, "t5", shards=3, codec=one_key(), timeout=10)
    wait_for(lambda: follower.seqs == [1], "the history")
    deliveries["t5"].progress("live")
    wait_for(lambda: follower.seqs == [1, 2], "the live entry")
    deliveries["t5"].ack()
    assert follower.join() == [1, 2]
    assert [e.body for e in follower.entries] == [{"of": "SECRET-t5"}, "live"]


def test_progress_events_show_the_opened_body_to_the_holder_and_the_marker_to_others(make_queue, r):
    q = make_queue(codec=one_key(), clock=None)
    q.configure(events=3600)
    _leased(q).progress({"secret": "SECRET-BODY"})
    held = _progress_events(r, codec=one_key())
    assert [(e.kind, e.seq, e.body) for e in held] == [("progress", 1, {"secret": "SECRET-BODY"})]
    (other,) = _progress_events(r)
    assert other.body.startswith("<encrypted k1, ") and "SECRET" not in other.body


def test_rotate_key_reseals_progress_bodies_so_the_new_key_alone_reads_them(make_queue):
    old = make_queue(codec=one_key())
    d = _leased(old)
    d.progress({"secret": "PROGRESS-1"})
    d.progress("PROGRESS-2")
    both = make_queue(codec=dueq.Encrypted(keys={"k1": K1, "k2": K2}, active="k2"))
    report = both.rotate_key("k2")
    assert report.undecryptable == 0 and report.resealed >= 2
    new_only = make_queue(codec=one_key("k2", K2))
    history = list(new_only.progress("t1", timeout=0))
    assert [e.body for e in history] == [{"secret": "PROGRESS-1"}, "PROGRESS-2"]
    d.progress("after")  # the script appends to the rotated history as before
    assert [e.seq for e in new_only.progress("t1", timeout=0)] == [1, 2, 3]
