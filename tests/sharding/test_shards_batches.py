"""Batches across shards (issue 43): every shard counts its own part of a batch; a part that
completes schedules its note task, the claim that takes the note marks the part on the batch's
home shard (``shard_of(batch)``), and the last mark schedules the completion task exactly once
(``dueq.sharding.batches``). The contract tests of tests/queue/test_batches.py run on sharded
queues too; these show what only a sharded queue has: the parts, notes delivered again, a close
interrupted half-way, the refusals, and a real Redis Cluster."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from durable_support import target
from redis.cluster import RedisCluster

import dueq
from dueq import shard_of
from dueq._wire import protocol
from dueq._wire.keys import QueueKeys
from dueq.sharding import batches as sharded_batches
from dueq.sharding.layout import task_shard

N = 3


def drain(q: Any, limit: int = 100) -> list[Any]:
    seen = []
    while batch := q.claim(limit=limit):
        for d in batch:
            seen.append(d.payload)
            d.ack()
    return seen


def one_per_shard(prefix: str = "m") -> list[str]:
    """One id on each shard, shard 0 first."""
    found: dict[int, str] = {}
    for i in itertools.count():
        found.setdefault(task_shard(f"{prefix}{i}", N), f"{prefix}{i}")
        if len(found) == N:
            return [found[s] for s in range(N)]
    raise AssertionError


def parts(r: Any, q: Any, batch: str) -> list[bytes | None]:
    """Each shard's own record of ``batch`` (its part)."""
    return [r.hget(QueueKeys.for_queue(n).batches, batch) for n in target(q).shard_names]


def test_members_on_every_shard_complete_the_batch_once_on_its_home_shard(
    make_queue: Any, r: Any
) -> None:
    q = make_queue("q", shards=N)
    ids = [f"row-{n}" for n in range(30)]
    assert q.schedule_many([dueq.Task(n, id=i) for n, i in enumerate(ids)], batch="imp").added == 30
    assert all(p is not None for p in parts(r, q, "imp"))  # every shard holds a part
    info = q.close_batch("imp", on_complete=dueq.Task({"done": "imp"}))
    assert (info.total, info.pending, info.closed, info.complete) == (30, 30, True, False)

    payloads = drain(q, limit=7)
    assert sorted(p for p in payloads if isinstance(p, int)) == list(range(30))
    assert [p for p in payloads if not isinstance(p, int)] == [{"done": "imp"}]  # once
    info = q.batch("imp")
    assert (info.total, info.acked, info.pending, info.complete) == (30, 30, 0, True)
    home = shard_of("imp", N)
    done_id = sharded_batches.completion_id("imp", N)
    assert task_shard(done_id, N) == home and done_id == dueq.keyed_id("imp", "batch:imp", N)
    assert q.stats().scheduled == 0 and q.dead.count() == 0
    assert drain(q) == [] and q.close_batch("imp").complete  # a second close: nothing again


def test_a_note_whose_consumer_died_is_claimed_again_and_marks_its_part_once(
    make_queue: Any, clock: Any, r: Any
) -> None:
    q = make_queue("q", shards=N)
    members = one_per_shard()
    q.schedule_many([dueq.Task(i, id=i) for i in members], batch="b")
    q.close_batch("b", on_complete=dueq.Task("end"))
    for d in q.claim(limit=10):
        d.ack()  # every part completes: each schedules its note
    # a consumer that leased shard 0's note and died before it told the home shard
    shard0 = dueq.Queue(target(q).shard_names[0], r, clock=clock)  # its shard, as a plain queue
    [note] = shard0.claim(limit=10, lease=5)
    assert note.id == sharded_batches.note_id("b", 0, N)
    assert drain(q) == []  # the other notes: two parts marked, shard 0's still leased
    assert not q.batch("b").complete
    clock.advance(6)
    assert drain(q) == []  # its lease lapsed: due again after the queue's retry wait (10 s)
    clock.advance(10)
    assert drain(q) == ["end"]  # claimed again, marked, completed
    assert q.batch("b").complete

    # a note marked twice changes nothing (a consumer killed between marking and its ack)
    home = QueueKeys.for_queue(target(q).shard_names[shard_of("b", N)])
    again = protocol.gather_parts(home, "", "b", [0, 1, 2])
    reply = q.drive(_one(again))
    assert reply.status == 0 and reply.record.completed_ms is not None
    assert drain(q) == []


def _one(call: Any) -> Any:
    """A flow of one call (driven by the queue's own driver)."""
    reply = yield call
    return reply


def test_a_close_interrupted_after_its_home_was_opened_is_finished_by_closing_again(
    make_queue: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = make_queue("q", shards=N)
    members = one_per_shard()
    q.schedule_many([dueq.Task(i, id=i) for i in members], batch="b")

    def dies(*args: Any) -> str:
        raise ConnectionError("the closing process died")

    monkeypatch.setattr(sharded_batches, "note_id", dies)
    with pytest.raises(ConnectionError):
        q.close_batch("b", on_complete=dueq.Task("first"))
    monkeypatch.undo()
    assert q.batch("b").closed and not q.batch("b").complete  # opened; no part closed yet
    assert sorted(drain(q)) == sorted(members)  # the members run and end meanwhile
    info = q.close_batch("b", on_complete=dueq.Task("second"))  # the first one is kept
    assert info.complete
    assert drain(q) == ["first"]


def test_a_member_scheduled_after_close_counts_only_while_its_shards_part_is_pending(
    make_queue: Any,
) -> None:
    q = make_queue("q", shards=N)
    first, second, _ = one_per_shard("late")
    q.schedule(0, id=first, batch="b")  # shard 0's part has a member; 1 and 2 are empty
    q.close_batch("b")
    q.schedule(1, id=one_per_shard("more")[0], batch="b")  # shard 0: still pending, counts
    assert q.batch("b").total == 2
    with pytest.raises(dueq.BatchCompleted) as refused:
        q.schedule(2, id=second, batch="b")  # shard 1's part completed at the close
    assert refused.value.ids == [second] and q.get(second) is None
    assert sorted(drain(q)) == [0, 1]
    assert q.batch("b").complete


def test_a_completion_id_off_the_home_shard_is_refused_naming_the_one_that_fits(
    make_queue: Any,
) -> None:
    q = make_queue("q", shards=N)
    home = shard_of("b", N)
    stranger = next(f"x{i}" for i in itertools.count() if task_shard(f"x{i}", N) != home)
    with pytest.raises(dueq.InvalidTaskError, match="keyed_id") as refused:
        q.close_batch("b", on_complete=dueq.Task("end", id=stranger))
    assert dueq.keyed_id("b", stranger, N) in str(refused.value)
    assert q.batch("b") is None  # nothing written
    q.close_batch("b", on_complete=dueq.Task("end", id=dueq.keyed_id("b", stranger, N)))
    assert drain(q) == ["end"]


def test_a_task_cannot_take_a_notes_id(make_queue: Any) -> None:
    q = make_queue("q", shards=N)
    with pytest.raises(dueq.InvalidTaskError, match="reserved"):
        q.schedule({"dueq_batch": "b", "part": 0}, id="dueq-batch:b:0")
    assert q.stats().scheduled == 0


def test_batch_ids_leave_room_for_their_notes(make_queue: Any) -> None:
    q = make_queue("q", shards=N)
    with pytest.raises(dueq.InvalidTaskError, match="batch id is longer"):
        q.schedule("x", batch="b" * 500)
    assert q.close_batch("b" * sharded_batches.MAX_BATCH_ID_BYTES).complete


def test_batches_lists_every_shards_batches_merged(make_queue: Any, clock: Any) -> None:
    q = make_queue("q", shards=N)
    q.schedule_many([dueq.Task(i, id=f"o{i}") for i in range(9)], batch="old")
    clock.advance(1)
    q.schedule_many([dueq.Task(i, id=f"n{i}") for i in range(9)], batch="new")
    q.close_batch("old")
    drain(q)
    listed = q.batches()
    assert [(b.id, b.total, b.acked, b.complete) for b in listed] == [
        ("new", 9, 9, False),
        ("old", 9, 9, True),
    ]


def test_a_batch_across_a_real_redis_cluster_completes_once(cluster: RedisCluster) -> None:
    q = dueq.Queue("cluster-batches", cluster, shards=N)
    q.schedule_many([dueq.Task(i, id=f"c{i}") for i in range(60)], batch="imp")
    q.close_batch("imp", on_complete=dueq.Task("done"))
    nodes = {
        cluster.nodes_manager.get_node_from_slot(cluster.keyslot(QueueKeys.for_queue(n).due)).port
        for n in q.shard_names
    }
    assert len(nodes) > 1  # the parts really live on different primaries
    payloads = drain(q, limit=16)
    assert sorted(p for p in payloads if p != "done") == list(range(60))
    assert payloads.count("done") == 1
    info = q.batch("imp")
    assert (info.acked, info.complete) == (60, True)


def test_consumers_killed_around_their_notes_still_complete_every_batch_exactly_once(
    r: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four consumers drain 4 batches of 50 members over 3 shards; a consumer "dies" before
    it marks a note (the claim raises, the note stays leased), after it marked it (no ack), or
    drops a member's delivery: every lapsed lease is claimed again, and each batch's completion
    task runs exactly once."""
    import random
    import threading
    import time

    rng = random.Random(43)
    lock = threading.Lock()
    real_mark, real_ack = sharded_batches._mark_flow, sharded_batches._ack_notes_flow

    killed = {"before marking": 0, "after marking": 0}

    class Killed(Exception):
        pass

    calls = {"mark": 0, "ack": 0}

    def dies_now(step: str) -> bool:
        """The first call of each step dies (so both deaths happen on every run, whatever the
        threads' interleaving), later ones with a 30% chance."""
        with lock:
            calls[step] += 1
            return calls[step] == 1 or rng.random() < 0.3

    def mark(*args: Any) -> Any:
        dies = dies_now("mark")
        if dies:
            killed["before marking"] += 1
            raise Killed("killed before marking")
        return real_mark(*args)

    def ack(shard: Any, notes: list[Any]) -> Any:
        dies = dies_now("ack")
        if dies:  # killed after marking: its notes are claimed again once their leases lapse
            killed["after marking"] += 1
            return iter(())
        return real_ack(shard, notes)

    monkeypatch.setattr(sharded_batches, "_mark_flow", mark)
    monkeypatch.setattr(sharded_batches, "_ack_notes_flow", ack)
    retry = dueq.RetryPolicy(max_attempts=50, wait=lambda state: 0.0)
    q = dueq.Queue("chaos-batches", r, shards=N, retry=retry)
    names = [f"b{i}" for i in range(4)]
    for b in names:
        q.schedule_many([dueq.Task({"m": n}, id=f"{b}-{n}") for n in range(50)], batch=b)
        q.close_batch(b, on_complete=dueq.Task({"done": b}))
    ran: list[Any] = []

    def consume() -> None:
        c = dueq.Queue("chaos-batches", r, shards=N, retry=retry)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                deliveries = c.claim(limit=10, lease=0.3)
            except Killed:
                continue
            for d in deliveries:
                with lock:
                    drop = rng.random() < 0.1
                if drop:
                    continue  # killed while running it: its lease lapses
                try:
                    d.ack()
                except dueq.LeaseLost:  # it outlived its lease: another consumer runs it
                    continue
                with lock:
                    ran.append(d.payload)
            with lock:
                finished = sum(1 for p in ran if "done" in p) == len(names)
            if finished and q.stats().scheduled + q.stats().leased == 0:
                return
            if not deliveries:
                time.sleep(0.05)

    threads = [threading.Thread(target=consume) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(n > 0 for n in killed.values()), killed  # both deaths happened
    done = sorted(p["done"] for p in ran if "done" in p)
    assert done == names  # every batch completed, each exactly once
    assert sorted(p["m"] for p in ran if "m" in p) == sorted(list(range(50)) * 4)  # acked once
    for b in names:
        info = q.batch(b)
        assert info is not None and (info.complete, info.total, info.acked) == (True, 50, 50)


def test_an_encrypted_sharded_queues_notes_and_completion_are_sealed_and_read(
    make_queue: Any, r: Any
) -> None:
    import os

    q = make_queue("q", shards=N, codec=dueq.Encrypted(keys={"k1": os.urandom(32)}, active="k1"))
    q.schedule_many([dueq.Task({"m": i}, id=i) for i in one_per_shard()], batch="secret-b")
    q.close_batch("secret-b", on_complete=dueq.Task({"done": "secret-marker"}))
    stored = [  # the members, each part's note (batch:on), the completion task (gather:on)
        v
        for k in (QueueKeys.for_queue(n) for n in target(q).shard_names)
        for v in r.hvals(k.tasks) + r.hvals(k.batch_on) + r.hvals(k.gather_on)
    ]
    assert len(stored) == N + N + 1
    assert not any(b"secret-marker" in v or b"dueq_batch" in v for v in stored)
    payloads = drain(q)
    assert payloads.count({"done": "secret-marker"}) == 1 and len(payloads) == N + 1
    assert q.batch("secret-b").complete
