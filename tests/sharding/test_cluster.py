"""A queue on a real 3-node Redis Cluster: every script touches one slot (hash-tagged keys)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import redis
from redis.cluster import RedisCluster

import dueq
from dueq.server import local_cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    with local_cluster(3) as nodes:
        client = RedisCluster(host="127.0.0.1", port=nodes[0].port)
        yield client
        client.close()


def test_queues_in_different_slots_run_every_script(cluster):
    slots = set()
    for name in ("emails", "sms", "push", "reports"):
        q = dueq.Queue(name, cluster, retry=dueq.RetryPolicy(max_attempts=1))
        slots.add(cluster.keyslot(q.keys.due))
        assert q.schedule_many(dueq.Task(i) for i in range(50)).added == 50
        batch = q.claim(limit=30)
        assert q.ack_many(batch[:20]) == 20
        for d in batch[20:]:
            assert d.fail(RuntimeError("x")).kind == "dead"
        assert [t.state for t in q.dead.list()] == ["dead"] * 10
        assert q.dead.replay() == 10
        stats = q.stats()
        assert (stats.scheduled, stats.leased, stats.dead) == (30, 0, 0)
    owners = {cluster.nodes_manager.get_node_from_slot(s).port for s in slots}
    assert len(owners) > 1  # the queues really live on different nodes


def test_cross_slot_access_is_refused_by_the_cluster(cluster):
    with pytest.raises(redis.exceptions.RedisClusterException):
        cluster.register_script("return 1")(keys=["dueq:{a}:due", "dueq:{b}:due"])


def test_observe_and_process_on_a_cluster_queue_with_wake_ups(cluster):
    q = dueq.Queue("cluster-observe", cluster)
    q.schedule({"far": True}, delay=3600)
    acked: list[str] = []
    done = threading.Event()

    def on_outcome(outcome: dueq.Outcome) -> None:
        acked.append(outcome.id)
        done.set()

    stream = q.observe(heartbeat=3600).pipe(dueq.operators.process(lambda d: None, 2))
    sub = stream.subscribe(on_next=on_outcome)
    try:
        time.sleep(0.3)  # asleep until the far task; only a wake message can bring the next one
        tid = q.schedule({"near": True})
        assert done.wait(30), "the cluster consumer was not woken"
    finally:
        sub.dispose()
    assert acked == [tid]


def test_cron_definitions_and_occurrences_on_a_cluster_queue(cluster):
    now = [1_800_000_000.0]
    q = dueq.Queue("cron-cluster", cluster, clock=lambda: now[0])
    assert q.cron.add("tick", "* * * * *", payload={"n": 1}) == "added"
    now[0] += 60
    (d,) = q.claim()  # the first occurrence; claiming it scheduled the next minute
    assert d.payload == {"n": 1}
    d.ack()
    (definition,) = q.cron.list()
    assert definition.next_at is not None and definition.last_fired_at is not None
    assert definition.next_at.timestamp() > now[0]
    assert q.cron.pause("tick") and q.stats().scheduled == 0
    extra = q.cron.run_now("tick")
    assert q.cron.resume("tick") and q.stats().scheduled == 2
    (d,) = q.claim()  # the extra occurrence, due now; the resumed slot is in the next minute
    assert d.id == extra
    d.ack()
    assert q.cron.remove("tick") and q.stats().scheduled == 0


def test_wait_hears_the_ended_channel_on_a_cluster(cluster):
    """q.wait subscribes by SSUBSCRIBE on the queue's node and wakes on another client's ack."""
    q = dueq.Queue("results", cluster)
    q.configure(keep_results=600)
    tid = q.schedule({"n": 1})

    def ack_later() -> None:
        deadline = time.monotonic() + 30
        while not cluster.pubsub_shardnumsub(q.keys.ended)[0][1]:
            assert time.monotonic() < deadline, "the waiter never subscribed"
            time.sleep(0.02)
        (d,) = q.claim()
        d.ack(result={"ok": True})

    acker = threading.Thread(target=ack_later)
    acker.start()
    info = q.wait(tid, timeout=30)
    acker.join()
    assert (info.state, info.result) == ("done", {"ok": True})
