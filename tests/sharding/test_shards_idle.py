"""Claims skip idle shards (issue 43): a shard whose last claim said it has nothing due is not
asked again until its next due time or lease deadline, a wake on its channel, or this queue
object's own write onto it, and never for longer than the recheck bound (a lost wake costs at
most that much latency)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

from internals_support import sharded_flows
from redis.cluster import RedisCluster

import dueq
from dueq import shard_of
from dueq._wire.keys import QueueKeys
from dueq.server import RedisServer

_names = itertools.count()
SCRIPT_COMMANDS = ("evalsha", "eval", "fcall")


def fresh() -> str:
    return f"idle{next(_names)}"


def on_shard(shard: int, prefix: str = "t", shards: int = 3) -> str:
    """A task id that hashes to ``shard``."""
    return next(
        f"{prefix}{i}" for i in itertools.count() if shard_of(f"{prefix}{i}", shards) == shard
    )


def script_calls(node: Any) -> int:
    """How many scripts ``node`` ran since its stats were reset (INFO commandstats)."""
    stats = node.info("commandstats")
    return sum(
        int(stats[f"cmdstat_{c}"]["calls"]) for c in SCRIPT_COMMANDS if f"cmdstat_{c}" in stats
    )


def test_idle_shards_cost_no_commands_after_a_first_claim(
    cluster: RedisCluster, cluster_nodes: list[RedisServer]
) -> None:
    q = dueq.Queue(fresh(), cluster, shards=3)
    q.schedule_many(dueq.Task(i, id=on_shard(0, f"b{i}-")) for i in range(40))
    busy_port = cluster.nodes_manager.get_node_from_slot(
        cluster.keyslot(QueueKeys.for_queue(q.shard_names[0]).due)
    ).port
    nodes = {n.port: n.client() for n in cluster_nodes}
    try:
        for _ in range(3):  # each claim starts at the next shard: every shard asked once
            assert len(q.claim(limit=1)) == 1
        for node in nodes.values():
            node.config_resetstat()
        for _ in range(10):
            assert len(q.claim(limit=1)) == 1
        counts = {port: script_calls(node) for port, node in nodes.items()}
        assert counts.pop(busy_port) == 10, counts
        assert counts == dict.fromkeys(counts, 0), counts  # the idle shards were not asked

        q.claim(limit=0)  # a claim of 0 still visits every shard (their lapsed leases)
        assert {port: script_calls(node) for port, node in nodes.items()} == {
            **dict.fromkeys(counts, 1),
            busy_port: 11,
        }
    finally:
        for node in nodes.values():
            node.close()


def test_without_a_wake_an_idle_shard_is_asked_again_within_the_bound(
    make_queue: Callable[..., Any],
) -> None:
    q = make_queue("lost", shards=3)
    producer = make_queue("lost", shards=3)  # another process's queue object: q hears nothing
    assert q.claim(limit=10) == []  # every shard found idle
    task_id = on_shard(1)
    producer.schedule("x", id=task_id)
    started = time.monotonic()
    got: list[Any] = []
    while not got and time.monotonic() - started < 10 * sharded_flows.IDLE_RECHECK_S:
        got = q.claim(limit=10)
        time.sleep(0.02)
    assert [d.id for d in got] == [task_id]
    assert time.monotonic() - started <= sharded_flows.IDLE_RECHECK_S + 0.5


def test_a_task_on_an_idle_shard_is_claimed_at_its_due_time(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue("due", shards=3)
    task_id = on_shard(2)
    q.schedule("later", id=task_id, delay=60)
    batch = q.claim_batch(10)  # every shard asked; shard 2 is idle until the task is due
    assert batch.deliveries == [] and batch.next_due_ms == batch.now_ms + 60_000
    skipped = q.claim_batch(10)  # no shard asked, and still told when the next task is due
    assert skipped.deliveries == [] and skipped.next_due_ms == batch.now_ms + 60_000
    clock.advance(59.9)
    assert q.claim(limit=10) == []
    clock.advance(0.1)
    assert [d.id for d in q.claim(limit=10)] == [task_id]


def test_this_queue_objects_own_schedule_onto_an_idle_shard_is_claimed_at_once(
    make_queue: Callable[..., Any],
) -> None:
    q = make_queue("own", shards=3)
    assert q.claim(limit=10) == []  # every shard found idle
    ids = [on_shard(s, "o") for s in range(3)]
    q.schedule_many(dueq.Task(i, id=i) for i in ids)
    claimed = q.claim(limit=10)
    assert sorted(d.id for d in claimed) == sorted(ids)
    assert q.claim(limit=10) == []  # every shard found idle again
    q.release_many(claimed)  # back to due on their shards, through the logical queue
    again = q.claim(limit=10)
    assert sorted(d.id for d in again) == sorted(ids)
    assert q.claim(limit=10) == []
    assert q.fail(again[0], RuntimeError("now"), retry_in=0).kind == "retried"
    assert [d.id for d in q.claim(limit=10)] == [again[0].id]


def test_a_shard_with_leases_out_is_not_skipped_so_what_their_settling_makes_due_is_claimed(
    make_queue: Callable[..., Any],
) -> None:
    # an ack (d.ack goes to the shard's own queue, unseen by the sharded core) releases a
    # child on the same shard: the very next claim must find it, wake or no wake
    q = make_queue(fresh(), shards=3)
    parent = on_shard(1, "p")
    child = next(f"c{i}" for i in itertools.count() if shard_of(f"c{i}", 3) == 1)
    q.schedule({"n": 1}, id=parent)
    q.schedule({"n": 2}, id=child, after=[parent])
    [d] = q.claim(limit=10)
    d.ack()
    assert [d.id for d in q.claim(limit=10)] == [child]


def test_a_replayed_dead_task_and_a_cron_run_now_are_claimed_at_once(
    make_queue: Callable[..., Any],
) -> None:
    q = make_queue(fresh(), shards=3, retry=dueq.RetryPolicy(max_attempts=1))
    q.schedule({"n": 1}, id=on_shard(2, "d"))
    [d] = q.claim(limit=10)
    d.fail(RuntimeError("to dead"))
    assert q.claim(limit=10) == []  # every shard now known idle
    assert q.dead.replay(ids=[d.id]) == 1
    [again] = q.claim(limit=10)
    assert again.id == d.id
    again.ack()
    q.cron.add("hourly", "0 * * * *")
    assert q.claim(limit=10) == []
    extra = q.cron.run_now("hourly")
    assert [x.id for x in q.claim(limit=10)] == [extra]
