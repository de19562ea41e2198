"""Sharded queues (``Queue(..., shards=N)``) on a real local Redis Cluster of 3 primaries,
through both front ends, and on a single Redis (where every shard shares one server)."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis.asyncio.cluster
import redis.crc
from async_support import Blocking
from internals_support import shards
from redis.cluster import RedisCluster
from waiting_support import wait_for

import dueq
from dueq import shard_of
from dueq._wire.keys import QueueKeys, layout_key
from dueq.server import CLUSTER_SLOTS as SLOTS
from dueq.server import RedisServer

MAX_SHARDS, shard_names = shards.MAX_SHARDS, shards.shard_names
_names = itertools.count()
#: an expired lease makes its task due again at once
AT_ONCE = dueq.RetryPolicy(max_attempts=5, wait=lambda state: 0.0)


def fresh(prefix: str = "sq") -> str:
    """A queue name no other test of the module used (the cluster is shared)."""
    return f"{prefix}{next(_names)}"


@pytest.fixture
def sharded(cluster_nodes: list[RedisServer], front_end: str) -> Iterator[Callable[..., Any]]:
    """Build a sharded queue on the cluster with either front end (an ``AsyncQueue`` wrapped
    in ``Blocking``, so one test body checks both)."""
    loop = asyncio.new_event_loop() if front_end == "async" else None
    clients: list[Any] = []

    def make(name: str, **kwargs: Any) -> Any:
        kwargs.setdefault("shards", 3)
        if loop is None:
            client = RedisCluster(host="127.0.0.1", port=cluster_nodes[0].port)
            clients.append(client)
            return dueq.Queue(name, client, **kwargs)
        aclient = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=cluster_nodes[0].port)
        clients.append(aclient)
        return Blocking(dueq.AsyncQueue(name, aclient, **kwargs), loop)

    yield make
    for client in clients:
        if loop is None:
            client.close()
        else:
            loop.run_until_complete(client.aclose())
    if loop is not None:
        loop.close()


def calls(node: Any, command: str) -> int:
    """How many times ``node`` ran ``command`` since its stats were reset (INFO commandstats)."""
    stats = node.info("commandstats").get(f"cmdstat_{command}")
    return int(stats["calls"]) if stats else 0


def node_of(cluster: RedisCluster, key: str) -> int:
    port: int = cluster.nodes_manager.get_node_from_slot(cluster.keyslot(key)).port
    return port


# -- placement and ids (no Redis) ------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 6, 16, MAX_SHARDS])
@pytest.mark.parametrize("name", ["emails", "x", "tenant-42/reports"])
def test_shard_tags_land_in_their_slot_ranges(name: str, n: int) -> None:
    names = shard_names(name, n)
    assert len(set(names)) == n
    for i, shard in enumerate(names):
        assert shard.split("#") == [name, shard.split("#")[1]]
        assert shard.split("#")[1].split(".")[0] == str(i)
        slot = redis.crc.key_slot(f"{{{shard}}}".encode())
        assert i * SLOTS // n <= slot < (i + 1) * SLOTS // n


def test_shard_of_is_a_stable_hash_of_the_id() -> None:
    # pinned: every process, version and machine must agree, or tasks would be lost to get()
    assert [shard_of(i, 3) for i in ("welcome:42", "a", "b", "c")] == [2, 2, 2, 0]
    assert [shard_of(i, 6) for i in ("welcome:42", "a")] == [2, 5]


def test_sequential_ids_spread_evenly_over_shards() -> None:
    counts = Counter(shard_of(f"order:{i}", 6) for i in range(60_000))
    assert set(counts) == set(range(6))
    assert all(9_400 < c < 10_600 for c in counts.values()), counts


def test_shards_is_checked_and_one_shard_is_the_plain_queue(r: Any) -> None:
    assert type(dueq.Queue("plain", r, shards=1)) is dueq.Queue
    assert dueq.Queue("plain", r, shards=1).keys == dueq.Queue("plain", r).keys
    for bad in (0, MAX_SHARDS + 1, "3", True, 2.0):
        with pytest.raises(dueq.ConfigurationError, match="shards"):
            dueq.Queue("q", r, shards=bad)
    with pytest.raises(dueq.ConfigurationError, match="cannot contain '#'"):
        dueq.Queue("a#b", r, shards=3)
    q = dueq.Queue("q", r, shards=3)
    assert isinstance(q, dueq.Queue) and q.shard_names == shard_names("q", 3)


def test_a_sharded_queue_is_a_plain_front_end_object_that_holds_its_shards(r: Any) -> None:
    aclient = redis.asyncio.Redis(port=r.connection_pool.connection_kwargs["port"])
    for front_end, client in ((dueq.Queue, r), (dueq.AsyncQueue, aclient)):
        q = front_end("q", client, shards=3)
        assert type(q) is front_end
        assert (q.shard_count, q.shard_names) == (3, shard_names("q", 3))
        shard = q.shard("welcome:42")
        assert type(shard) is front_end and shard.name == q.shard_names[shard_of("welcome:42", 3)]
        # q.dead and q.cron are the front end's own classes, over the shards
        assert type(q.dead) is type(shard.dead) and type(q.cron) is type(shard.cron)
        plain = front_end("q", client)
        assert (plain.shard_count, plain.shard_names, plain.shard("a")) == (1, ("q",), plain)


def test_a_subclass_of_a_front_end_shards_too(r: Any) -> None:
    class Mine(dueq.Queue):
        pass

    assert type(Mine("q", r)) is Mine
    q = Mine("q", r, shards=3)
    assert type(q) is Mine and q.shard_count == 3
    assert all(type(q.shard(f"t{i}")) is dueq.Queue for i in range(10))


def test_the_shard_layer_does_not_import_the_front_ends() -> None:
    import ast
    import pathlib

    imported = {
        node.module
        for module in (pathlib.Path(dueq.__file__).parent / "sharding").glob("*.py")
        for node in ast.walk(ast.parse(module.read_text()))
        if isinstance(node, ast.ImportFrom) and node.module
    }
    assert imported, "no module of dueq.sharding was read"
    assert not imported & {"dueq.queue", "dueq.async_queue"}, imported


def test_shard_of_is_public() -> None:
    assert dueq.shard_of is shard_of
    assert dueq.shard_of("welcome:42", 3) == 2


# -- the cluster -------------------------------------------------------------------------------


def test_shards_of_a_3_shard_queue_sit_on_three_primaries(cluster: RedisCluster) -> None:
    q = dueq.Queue(fresh(), cluster, shards=3)
    assert len({node_of(cluster, QueueKeys.for_queue(s).due) for s in q.shard_names}) == 3
    six = dueq.Queue(fresh(), cluster, shards=6)
    per_node = Counter(node_of(cluster, QueueKeys.for_queue(s).due) for s in six.shard_names)
    assert sorted(per_node.values()) == [2, 2, 2]


def test_3000_tasks_spread_over_all_primaries_and_are_idempotent_by_id(
    sharded: Callable[..., Any], cluster: RedisCluster
) -> None:
    q = sharded(fresh())
    tasks = [dueq.Task({"n": i}, id=f"t{i}", delay=60) for i in range(3000)]
    assert q.schedule_many(tasks).added == 3000
    per_node: Counter[int] = Counter()
    for shard in q.shard_names:
        due = QueueKeys.for_queue(shard).due
        per_node[node_of(cluster, due)] += cluster.zcard(due)
    assert len(per_node) == 3 and sum(per_node.values()) == 3000
    assert all(800 < c < 1200 for c in per_node.values()), per_node
    again = q.schedule_many(tasks)
    assert (again.added, again.existing) == (0, 3000)
    assert q.stats().scheduled == 3000
    assert q.get("t1234").payload == {"n": 1234}
    assert q.shard("t1234").get("t1234").payload == {"n": 1234}  # on the shard its id names
    others = [s for s in q.shard_names if s != q.shard("t1234").name]
    assert all(not cluster.hexists(QueueKeys.for_queue(s).tasks, "t1234") for s in others)


def test_generated_ids_spread_evenly_and_are_found_by_id(sharded: Callable[..., Any]) -> None:
    q = sharded(fresh())
    ids = q.schedule_many(dueq.Task(i, delay=60) for i in range(1500)).ids
    assert len(set(ids)) == 1500
    counts = Counter(shard_of(i, 3) for i in ids)
    assert all(400 < c < 600 for c in counts.values()), counts
    assert [q.get(i).payload for i in ids[:20]] == list(range(20))


def test_get_many_reads_ids_of_every_shard_in_the_order_given(sharded: Callable[..., Any]) -> None:
    q = sharded(fresh())
    ids = q.schedule_many(dueq.Task(i, delay=60) for i in range(300)).ids
    assert len({shard_of(i, 3) for i in ids}) == 3
    wanted = [*reversed(ids), "missing", ids[0]]
    assert [info.payload for info in q.get_many(wanted)] == list(reversed(range(300)))


def test_cancel_reschedule_and_run_now_work_by_id(sharded: Callable[..., Any]) -> None:
    q = sharded(fresh())
    a = q.schedule("a", id="a", delay=3600)
    b = q.schedule("b", id="b", delay=3600)
    c = q.schedule("c", id="c", delay=3600)
    assert q.cancel(a) and not q.cancel(a)
    assert q.reschedule(b, delay=7200) and q.get(b).state == "scheduled"
    assert q.run_now(c)
    (d,) = q.claim(limit=10)
    assert d.id == c
    d.ack()
    assert q.get(c) is None and q.stats().scheduled == 1


def test_one_consumer_drains_every_shard_within_bounded_attempts(
    sharded: Callable[..., Any], clock: Any
) -> None:
    retry = dueq.RetryPolicy(max_attempts=3, wait=lambda state: 10.0)
    q = sharded(fresh(), clock=clock, retry=retry)
    # task i fails its first i % 4 attempts: 3 and up never succeed within 3 attempts
    q.schedule_many(dueq.Task({"fails": i % 4}, id=f"d{i}") for i in range(300))
    delivered: Counter[str] = Counter()
    acked: Counter[str] = Counter()
    for _ in range(200):
        batch = q.claim(limit=64)
        if not batch:
            if q.stats().scheduled == 0:
                break
            clock.advance(10)
            continue
        succeeded = []
        for d in batch:
            delivered[d.id] += 1
            assert d.attempt == delivered[d.id]
            if d.payload["fails"] >= d.attempt:
                d.fail(RuntimeError("not yet"))
            else:
                succeeded.append(d)
                acked[d.id] += 1
        assert q.ack_many(succeeded) == len(succeeded)
    assert max(delivered.values()) == 3
    assert set(acked.values()) == {1}
    assert len(acked) == 225  # fails 0, 1, 2
    stats = q.stats()
    assert (stats.scheduled, stats.leased, stats.dead) == (0, 0, 75)


def test_a_sync_step_for_several_shards_goes_to_their_nodes_at_once(
    cluster: RedisCluster, cluster_nodes: list[RedisServer]
) -> None:
    q = dueq.Queue(fresh(), cluster, shards=3)
    names = shard_names(q.name, 3)
    ids = [next(f"p{i}" for i in itertools.count() if shard_of(f"p{i}", 3) == n) for n in range(3)]
    q.schedule_many(dueq.Task("warm", id=f"warm-{i}") for i in ids)  # scripts loaded everywhere
    [paused] = [
        n.client()
        for n in cluster_nodes
        if n.port == node_of(cluster, QueueKeys.for_queue(names[0]).tasks)
    ]
    paused.client_pause(30_000, all=False)  # shard 0's node takes no writes (scripts) for now
    sending = threading.Thread(target=q.schedule_many, args=([dueq.Task(i, id=i) for i in ids],))
    try:
        sending.start()
        # shards 1 and 2 are written while shard 0 (the first step) still waits on its node
        wait_for(
            lambda: all(
                cluster.hexists(QueueKeys.for_queue(n).tasks, i)
                for n, i in zip(names[1:], ids[1:], strict=True)
            ),
            "the other shards' writes during the pause",
        )
        assert sending.is_alive()  # shard 0's write is still held by the pause
    finally:
        paused.client_unpause()
        sending.join(30)
        paused.close()
    assert all(q.get(i) is not None for i in ids)


def test_claims_start_at_different_shards(cluster: RedisCluster) -> None:
    q = dueq.Queue(fresh(), cluster, shards=3)
    q.schedule_many(dueq.Task(i, id=f"s{i}") for i in range(300))
    firsts = {q.shard(q.claim(limit=1)[0].id).name for _ in range(6)}
    assert len(firsts) == 3  # one claim of one task from each shard in turn


def test_fencing_holds_per_task_and_batched_acks_group_by_shard(
    sharded: Callable[..., Any], clock: Any
) -> None:
    q = sharded(fresh(), clock=clock, lease=5, retry=AT_ONCE)
    q.schedule_many(dueq.Task(i, id=f"f{i}") for i in range(30))
    first = q.claim(limit=30)
    assert len({shard_of(d.id, 3) for d in first}) == 3
    clock.advance(6)  # every lease ran out
    second = q.claim(limit=30)
    assert sorted(d.id for d in second) == sorted(d.id for d in first)
    with pytest.raises(dueq.LeaseLost) as lost:
        q.ack_many(first[:10])
    assert sorted(lost.value.ids) == sorted(d.id for d in first[:10])
    with pytest.raises(dueq.LeaseLost):
        first[10].fail(RuntimeError("late"))
    with pytest.raises(dueq.LeaseLost):
        first[11].extend(5)
    assert q.ack_many(second) == 30
    assert q.stats().leased == 0 and q.stats().scheduled == 0


def test_ack_many_acks_the_held_and_names_the_lost_across_shards(
    sharded: Callable[..., Any], clock: Any
) -> None:
    q = sharded(fresh(), clock=clock, lease=5, retry=AT_ONCE)
    q.schedule_many(dueq.Task(i, id=f"m{i}") for i in range(12))
    early = q.claim(limit=6)
    clock.advance(3)
    held = q.claim(limit=6)  # its leases end 3 s after the early ones
    assert len({shard_of(d.id, 3) for d in early + held}) == 3
    clock.advance(3)  # the early leases ran out; the held ones did not
    again = q.claim(limit=12)
    assert {d.id for d in again} == {d.id for d in early}
    with pytest.raises(dueq.LeaseLost) as lost:
        q.ack_many(early + held)
    assert lost.value.ids == [d.id for d in early]  # in the caller's order
    assert q.stats().leased == 6  # the held ones were acked all the same
    assert q.extend_many(again, 30) is not None
    assert q.ack_many(again) == 6
    assert q.stats().leased == 0


def test_dead_letters_of_every_shard_merge_newest_first_and_move_by_id(
    sharded: Callable[..., Any], clock: Any
) -> None:
    one = dueq.RetryPolicy(max_attempts=1)
    q = sharded(fresh(), clock=clock, retry=one)
    ids = [f"dl{i}" for i in range(12)]
    assert {shard_of(i, 3) for i in ids} == {0, 1, 2}
    q.schedule_many(dueq.Task(i, id=i) for i in ids)
    for d in sorted(q.claim(limit=12), key=lambda d: ids.index(d.id)):
        clock.advance(1)  # each dies a second after the one before
        assert d.fail(RuntimeError(d.id)).kind == "dead"
    assert q.dead.count() == 12 and q.stats().dead == 12
    assert [t.id for t in q.dead.list(limit=5)] == ids[::-1][:5]
    assert [t.id for t in q.dead.list(limit=4, offset=5)] == ids[::-1][5:9]
    assert [t.state for t in q.dead.list(limit=100)] == ["dead"] * 12
    with pytest.raises(dueq.TaskNotFound):
        q.dead.replay(ids=["dl0", "no-such-task"])
    assert q.dead.count() == 12  # all or nothing: dl0 stayed dead
    assert q.dead.replay(ids=["dl0", "dl1", "dl2"]) == 3
    assert q.dead.purge(ids=["dl3"]) == 1
    assert q.dead.purge(error_type="RuntimeError") == 8
    assert q.dead.count() == 0 and q.stats().scheduled == 3
    assert q.dead.replay() == 0


def test_pause_and_resume_hold_on_every_shard(sharded: Callable[..., Any]) -> None:
    q = sharded(fresh())
    q.schedule_many(dueq.Task(i, id=f"p{i}") for i in range(30))
    assert q.pause().paused and q.settings().paused and q.stats().paused
    assert q.claim(limit=30) == []
    one_per_shard = [
        next(f"p{i}" for i in range(30) if shard_of(f"p{i}", 3) == k) for k in (0, 1, 2)
    ]
    assert all(q.shard(i).settings().paused for i in one_per_shard)
    with pytest.raises(dueq.ConfigurationError, match="remember_done"):
        q.configure(paused=False, remember_done=-1)  # refused before any shard is written
    assert q.settings().paused
    assert not q.resume().paused
    assert len(q.claim(limit=30)) == 30
    assert q.configure(remember_done=3600).remember_done == timedelta(hours=1)


def test_history_and_due_histogram_sum_the_shards(sharded: Callable[..., Any], clock: Any) -> None:
    q = sharded(fresh(), clock=clock)
    q.schedule_many(dueq.Task(i, id=f"h{i}", delay=30 + 60 * (i % 3)) for i in range(30))
    q.schedule_many(dueq.Task(i, id=f"n{i}") for i in range(12))
    q.ack_many(q.claim(limit=12))
    histogram = q.due_histogram(bucket=60, buckets=2)
    assert (histogram.overdue, histogram.counts, histogram.later) == (0, [10, 10], 10)
    (now,) = q.history(minutes=1)
    assert (now.scheduled, now.claimed, now.acked) == (42, 12, 12)
    assert len(q.history(minutes=5)) == 5


def test_cron_definitions_live_on_the_shard_of_their_name(
    sharded: Callable[..., Any], clock: Any
) -> None:
    q = sharded(fresh(), clock=clock)
    names = ["nightly", "hourly", "tick", "report", "sync", "audit"]
    assert {shard_of(n, 3) for n in names} == {0, 1, 2}
    for name in names:
        assert q.cron.add(name, "* * * * *", payload={"name": name}) == "added"
    assert [d.name for d in q.cron.list()] == sorted(names)
    for name in names:  # the pending occurrence is on the definition's shard, found by id
        (pending,) = [d for d in q.cron.list() if d.name == name]
        assert pending.next_at is not None
        assert q.shard(name).cron.get(name).name == name
    assert q.stats().scheduled == 6
    clock.advance(60)
    got = q.claim(limit=10)  # claiming each occurrence schedules the next on its shard
    assert sorted(d.payload["name"] for d in got) == sorted(names)
    for d in got:  # each came from its definition's shard, where its id is routed
        assert d.queue.name == q.shard(d.id).name == q.shard(d.payload["name"]).name
        assert q.get(d.id).state == "leased"
    assert q.ack_many(got) == 6
    assert q.stats().scheduled == 6
    assert all(q.get(d.id) is None for d in got)
    extra = q.cron.run_now("tick")
    assert q.get(extra).state == "scheduled" and q.cancel(extra)
    assert q.cron.pause("audit") and q.stats().scheduled == 5
    assert q.cron.resume("audit") and q.cron.remove("audit")
    assert q.cron.get("audit") is None and q.stats().scheduled == 5
    with pytest.raises(dueq.CronError):
        q.cron.add("", "* * * * *")


def test_listings_go_shard_by_shard_and_list_every_task_once(
    sharded: Callable[..., Any],
) -> None:
    q = sharded(fresh())
    q.schedule_many(dueq.Task(i, id=f"l{i}", delay=60 + i) for i in range(40))
    q.schedule_many(dueq.Task(i, id=f"other{i}", delay=60) for i in range(5))
    listed = [t.id for t in q.iter_tasks("scheduled", page=7, id_prefix="l")]
    assert sorted(listed) == sorted(f"l{i}" for i in range(40))
    first = q.list_tasks("scheduled", limit=100)
    assert first.cursor is not None and len({shard_of(t.id, 3) for t in first.tasks}) == 1
    due = [t.due_at for t in first.tasks]
    assert due == sorted(due)  # in order within a shard
    assert [t.id for t in q.iter_tasks("leased")] == []
    for bad in ("nonsense", "MQ==", 3):
        with pytest.raises(dueq.InvalidTaskError, match="cursor"):
            q.list_tasks("scheduled", cursor=bad)


def test_a_different_shard_count_on_a_live_queue_is_refused(
    sharded: Callable[..., Any], cluster: RedisCluster
) -> None:
    name = fresh()
    sharded(name, shards=3).schedule("x", id="x")
    with pytest.raises(dueq.ConfigurationError, match=r"has 3 shards.*shards=6"):
        sharded(name, shards=6).stats()
    with pytest.raises(dueq.ConfigurationError, match="has 3 shards"):
        sharded(name, shards=2).schedule("y")
    assert cluster.get(layout_key(name)) == b"3"
    assert sharded(name, shards=3).get("x").payload == "x"


def test_a_sharded_queue_over_a_plain_queue_with_tasks_is_refused(
    sharded: Callable[..., Any], cluster: RedisCluster
) -> None:
    name = fresh()
    dueq.Queue(name, cluster).schedule("plain")
    with pytest.raises(dueq.ConfigurationError, match="plain"):
        sharded(name, shards=3).schedule("sharded")


def test_what_slice_one_lacks_raises_a_clear_configuration_error(
    sharded: Callable[..., Any],
) -> None:
    q = sharded(fresh())
    with pytest.raises(dueq.ConfigurationError, match="not available on a sharded queue"):
        q.keys  # noqa: B018 (the attribute raises)


def test_a_rate_is_split_over_the_shards_and_read_back_whole(
    sharded: Callable[..., Any], cluster: RedisCluster
) -> None:
    q = sharded(fresh())
    assert q.configure(rate=dueq.Rate(10, per=3600.0)).rate == dueq.Rate(10, per=3600.0)
    assert q.settings().rate == dueq.Rate(10, per=3600.0)
    assert q.stats().settings.rate == dueq.Rate(10, per=3600.0)
    shares = [dueq.Queue(n, cluster).settings().rate for n in shard_names(q.name, 3)]
    assert shares == [dueq.Rate(4, per=3600.0), dueq.Rate(3, per=3600.0), dueq.Rate(3, per=3600.0)]
    # so the shards together lease at most 10 in a window, wherever the due tasks lie
    q.schedule_many(dueq.Task(i, id=f"r{i}") for i in range(60))
    assert len(q.claim(100)) + len(q.claim(100)) == 10
    assert q.configure(rate=False).rate is None
    assert all(dueq.Queue(n, cluster).settings().rate is None for n in shard_names(q.name, 3))


def test_a_rate_below_one_per_shard_is_refused_and_changes_nothing(
    sharded: Callable[..., Any],
) -> None:
    q = sharded(fresh())
    q.configure(rate=dueq.Rate(30, per=1.0))
    with pytest.raises(dueq.ConfigurationError, match="n must be at least 3"):
        q.configure(rate=dueq.Rate(2, per=1.0), paused=True)
    assert q.settings().rate == dueq.Rate(30, per=1.0) and not q.settings().paused


def test_sharded_observe_is_never_early_and_wakes_on_any_shard(cluster: RedisCluster) -> None:
    q = dueq.Queue(fresh(), cluster, shards=3)
    q.schedule("far", id="far", delay=3600)
    seen: list[tuple[str, float, float]] = []  # id, due (epoch s), delivered (epoch s)
    done = threading.Event()
    ids = [f"w{i}" for i in range(9)]
    assert {shard_of(i, 3) for i in ids} == {0, 1, 2}

    def handle(d: dueq.Delivery) -> None:
        seen.append((d.id, d.due_at.timestamp(), time.time()))
        if len(seen) == len(ids):
            done.set()

    stream = q.observe(heartbeat=3600).pipe(dueq.operators.process(handle, 4))
    sub = stream.subscribe()
    try:
        time.sleep(0.3)  # asleep until the far task: only wake messages bring the next ones
        q.schedule_many(dueq.Task(i, id=i, delay=0.2 + 0.05 * n) for n, i in enumerate(ids))
        assert done.wait(30), f"only {len(seen)} of {len(ids)} delivered"
    finally:
        sub.dispose()
    assert sorted(i for i, _, _ in seen) == sorted(ids)
    for task_id, due_s, delivered_s in seen:
        assert delivered_s >= due_s, f"{task_id} delivered {due_s - delivered_s:.3f} s early"


@pytest.mark.parametrize("producer", ["same", "another"])
def test_a_sleeping_consumer_wakes_for_a_task_on_each_shard(
    cluster: RedisCluster, producer: str
) -> None:
    q = dueq.Queue(fresh(), cluster, shards=3)
    # another queue object (another process's producer): only its wake tells q's claims to
    # ask the shard again, which they had just found idle (issue 43)
    p = q if producer == "same" else dueq.Queue(q.name, cluster, shards=3)
    q.schedule("far", id="far", delay=3600)
    arrived: list[str] = []
    came = threading.Event()

    def handle(d: dueq.Delivery) -> None:
        arrived.append(d.id)
        came.set()

    sub = q.observe(heartbeat=3600).pipe(dueq.operators.process(handle, 2)).subscribe()
    try:
        for shard in (2, 0, 1):  # asleep until the far task each time: only a wake brings it
            time.sleep(0.2)
            came.clear()
            task_id = next(f"x{i}" for i in itertools.count() if shard_of(f"x{i}", 3) == shard)
            p.schedule(shard, id=task_id)
            assert came.wait(30), f"the consumer was not woken for shard {shard}"
            assert arrived[-1] == task_id
    finally:
        sub.dispose()


def test_wakes_stay_on_their_shards_primary_by_sharded_pubsub(
    cluster: RedisCluster, cluster_nodes: list[RedisServer]
) -> None:
    q = dueq.Queue(fresh(), cluster, shards=3)
    q.schedule("far", id="far", delay=3600)
    channels = [QueueKeys.for_queue(name).wake for name in shard_names(q.name, 3)]
    nodes = [n.client() for n in cluster_nodes]
    sub = q.observe(heartbeat=3600).subscribe()
    try:
        for node in nodes:
            node.config_resetstat()

        def subscribed() -> dict[int, set[bytes]]:
            return {
                n.connection_pool.connection_kwargs["port"]: set(n.pubsub_shardchannels())
                for n in nodes
            }

        # each shard's channel is subscribed on the primary that holds the shard, and only there
        want = {node_of(cluster, c): {c.encode()} for c in channels}
        wait_for(lambda: subscribed() == want, "a sharded subscription per primary")
        assert all(n.pubsub_channels() == [] for n in nodes)  # no classic subscription
        for shard in range(3):
            q.schedule(
                shard, id=next(f"z{i}" for i in itertools.count() if shard_of(f"z{i}", 3) == shard)
            )
        spublished = [calls(n, "spublish") for n in nodes]
        assert sum(spublished) >= 3 and all(spublished), spublished
        assert [calls(n, "publish") for n in nodes] == [0, 0, 0]  # nothing broadcast
    finally:
        sub.dispose()
        for node in nodes:
            node.close()


def test_an_async_consumer_wakes_for_a_task_on_each_shard(
    cluster_nodes: list[RedisServer],
) -> None:
    async def main() -> None:
        client = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=cluster_nodes[0].port)
        q = dueq.AsyncQueue(fresh(), client, shards=3)
        await q.schedule("far", id="far", delay=3600)
        it = q.deliveries(heartbeat=3600)
        for shard in (1, 2, 0):
            task_id = next(f"y{i}" for i in itertools.count() if shard_of(f"y{i}", 3) == shard)
            later = asyncio.get_running_loop().call_later(
                0.2, lambda t=task_id: asyncio.ensure_future(q.schedule(t, id=t))
            )
            d = await asyncio.wait_for(it.__anext__(), 30)  # only a wake message brings it
            assert d.id == task_id
            await d.ack()
            later.cancel()
        await it.aclose()
        await client.aclose()

    asyncio.run(main())


def test_a_worker_drains_a_sharded_queue(cluster: RedisCluster) -> None:
    q = dueq.Queue(fresh(), cluster, shards=3)
    q.schedule_many(dueq.Task(i, id=f"k{i}") for i in range(200))
    handled: list[str] = []
    worker = dueq.Worker(q, lambda d: handled.append(d.id), concurrency=4, heartbeat=0.5)
    runner = threading.Thread(target=worker.run)
    runner.start()
    try:
        views = [dueq.Queue(name, cluster) for name in shard_names(q.name, 3)]
        for _ in range(600):  # bounded wait: the first beat reached every shard
            if all(view.workers() for view in views):
                break
            time.sleep(0.05)
        (entry,) = q.workers()  # one entry, though every shard holds one
        assert entry.queues == (q.name,)
        assert all([w.worker_id for w in view.workers()] == [entry.worker_id] for view in views)
        for _ in range(600):  # bounded wait
            stats = q.stats()
            if stats.scheduled == 0 and stats.leased == 0:
                break
            time.sleep(0.05)
    finally:
        worker.stop()
        runner.join(30)
    assert sorted(handled) == sorted(f"k{i}" for i in range(200))
    assert q.workers() == []  # it left every shard's registry on stop


def test_async_deliveries_drain_every_shard_of_an_async_sharded_queue(
    cluster_nodes: list[RedisServer],
) -> None:
    async def main() -> list[str]:
        client = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=cluster_nodes[0].port)
        q = dueq.AsyncQueue(fresh(), client, shards=3)
        await q.schedule_many(dueq.Task(i, id=f"a{i}", delay=0.1) for i in range(90))
        got: list[str] = []
        async for d in q.deliveries(max_in_flight=16, heartbeat=0.5):
            await d.ack()
            got.append(d.id)
            if len(got) == 90:
                break
        assert (await q.stats()).scheduled == 0
        await client.aclose()
        return got

    got = asyncio.run(asyncio.wait_for(main(), 60))
    assert sorted(got) == sorted(f"a{i}" for i in range(90))


# -- one Redis ---------------------------------------------------------------------------------


def test_a_sharded_queue_works_on_a_single_redis_too(make_queue: Callable[..., Any]) -> None:
    q = make_queue("single", shards=4)
    assert q.schedule_many(dueq.Task(i, id=f"s{i}") for i in range(40)).added == 40
    batch = q.claim(limit=40)
    assert len(batch) == 40 and q.ack_many(batch) == 40
    assert q.stats().scheduled == 0
