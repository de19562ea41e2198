"""Resharding a live queue (issue 43, ``dueq.sharding.reshard``): ``q.reshard(M)`` moves every
task to its shard in the new layout with its whole state, while queue objects of the old
layout follow the record; a mover stopped anywhere resumes; what a reshard cannot move yet is
refused with the reason."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from durable_support import target

import dueq
from dueq._wire import protocol
from dueq._wire.keys import QueueKeys, layout_key, reshard_key
from dueq.sharding.layout import LAYOUT_RECHECK_S, shard_names, shard_of, task_shard


def held_by(r: Any, name: str, task_id: str) -> list[str]:
    """The shards (of the layouts of 2 to 6 shards) whose tasks hash holds ``task_id``."""
    names = {n for c in range(2, 7) for n in shard_names(name, c)}
    return sorted(n for n in names if r.hexists(QueueKeys.for_queue(n).tasks, task_id))


def drain(q: Any, limit: int = 100) -> list[Any]:
    seen = []
    while batch := q.claim(limit=limit):
        for d in batch:
            seen.append(d.id)
            d.ack()
    return seen


def started(q: dueq.Queue, ids: list[str], to: int) -> tuple[Any, list[str]]:
    """Start ``q``'s reshard to ``to`` (its first call only, as a mover that died then); an
    old shard that some of ``ids`` leave, and those ids."""
    assert not q.drive(q._core.resharder().start_flow(to)).done
    layout = q._core.layout
    shard = next(s for s in map(layout.former_shard, ids) if s is not None)
    return shard, [i for i in ids if layout.former_shard(i) is shard]


def reshard_until_kept(q: dueq.Queue, to: int) -> tuple[threading.Thread, list[Any]]:
    """``q.reshard(to)`` in a thread, once its progress reports tasks it cannot move yet (it
    is still running then); the thread and its reports (the last: the result, once joined)."""
    reports: list[Any] = []
    mover = threading.Thread(target=lambda: reports.append(q.reshard(to, progress=reports.append)))
    mover.start()
    deadline = time.monotonic() + 30
    while not any(rep.kept for rep in reports):
        assert time.monotonic() < deadline and mover.is_alive()
        time.sleep(0.02)
    assert mover.is_alive()
    return mover, reports


def test_reshard_3_to_5_to_2_moves_every_task_with_its_whole_state(
    make_queue: Any, r: Any, clock: Any
) -> None:
    q = make_queue("rs", shards=3, retry=dueq.RetryPolicy(max_attempts=5, wait=lambda s: 60.0))
    q.configure(keep_results=3600, remember_done=3600)
    later = [dueq.Task({"n": n}, id=f"later-{n}", delay=300, priority=n % 3) for n in range(60)]
    q.schedule_many(later)
    q.schedule_many([dueq.Task({"f": n}, id=f"failed-{n}") for n in range(20)])
    for d in q.claim(limit=20):
        d.fail(RuntimeError(f"boom {d.id}"))  # attempt 1 failed: due again in 60 s
    q.schedule_many([dueq.Task({"d": n}, id=f"dead-{n}", max_attempts=1) for n in range(10)])
    for d in q.claim(limit=10):
        d.fail(RuntimeError("fatal"))
    q.schedule_many([dueq.Task({"a": n}, id=f"acked-{n}") for n in range(10)])
    for d in q.claim(limit=10):
        d.ack({"result": d.id})
    before = {
        i.id: i for i in q.get_many([t.id for t in later] + [f"failed-{n}" for n in range(20)])
    }
    assert len(before) == 80

    report = q.reshard(5)
    assert (report.from_shards, report.to_shards, report.done) == (3, 5, True)
    assert report.moved > 0
    assert r.get(layout_key("rs")) == b"5"
    assert target(q).shard_count == 5
    for task_id, info in before.items():
        assert held_by(r, "rs", task_id) == [shard_names("rs", 5)[task_shard(task_id, 5)]]
        after = q.get(task_id)
        assert after is not None
        assert (after.state, after.attempt, after.due_at, after.priority) == (
            info.state,
            info.attempt,
            info.due_at,
            info.priority,
        )
        assert [e.message for e in after.errors] == [e.message for e in info.errors]
    assert q.dead.count() == 10
    assert {i.id for i in q.dead.list(limit=100)} == {f"dead-{n}" for n in range(10)}
    assert q.get("acked-3").result == {"result": "acked-3"}  # kept results moved too
    again = q.schedule_many([dueq.Task("again", id="acked-4")])
    assert (again.added, again.existing) == (0, 1)  # its done mark moved: not scheduled again

    assert q.reshard(2).done
    assert r.get(layout_key("rs")) == b"2"
    dropped = set(shard_names("rs", 3) + shard_names("rs", 5)) - set(shard_names("rs", 2))
    for n in dropped:
        k = QueueKeys.for_queue(n)
        assert r.hlen(k.tasks) == r.zcard(k.due) == r.hlen(k.moving) == 0
    clock.advance(3600)
    ran = drain(q)
    assert sorted(ran) == sorted(before)  # every scheduled task runs once, none lost
    assert q.dead.count() == 10


def test_a_queue_object_of_the_old_layout_follows_the_reshard(make_queue: Any) -> None:
    old = make_queue("follow", shards=3)
    old.schedule_many([dueq.Task(n, id=f"t{n}") for n in range(40)])
    mover = make_queue("follow", shards=3)
    assert mover.reshard(4).done
    time.sleep(LAYOUT_RECHECK_S + 0.1)  # every queue object reads the record once a second
    assert old.schedule_many([dueq.Task("new", id="t-new")]).added == 1
    assert target(old).shard_count == 4
    assert sorted(drain(old)) == sorted([f"t{n}" for n in range(40)] + ["t-new"])
    fresh = make_queue("follow", shards=3)  # a process started with the old count: follows
    assert fresh.stats().scheduled == 0 and target(fresh).shard_count == 4
    with pytest.raises(dueq.ConfigurationError, match="has 4 shards"):
        make_queue("follow", shards=5).stats()  # a count the queue never had


def test_a_mover_stopped_after_taking_tasks_is_resumed_by_the_next(r: Any) -> None:
    """A mover killed between "take" and "put" left whole tasks in its shard's ``moving``
    records; the next ``reshard`` call puts them on their new shards first."""
    q = dueq.Queue("resume", r, shards=3)
    ids = [f"t{n}" for n in range(200)]
    q.schedule_many([dueq.Task(n, id=i, delay=60) for n, i in enumerate(ids)])
    shard, leaving = started(q, ids, 5)
    assert r.get(layout_key("resume")) == b"3>5"

    def take() -> Any:
        return (yield protocol.reshard_take(shard.keys, "", leaving))

    taken = q.drive(take())  # the step's first call, then the mover dies
    assert len(taken.records) == len(leaving) > 0
    assert r.hlen(shard.keys.moving) == len(leaving)
    assert q.reshard(5).done  # any process resumes it
    assert r.hlen(shard.keys.moving) == 0
    assert sorted(i.id for i in q.get_many(ids)) == sorted(ids)
    assert all(held_by(r, "resume", i) == [q.shard(i).name] for i in ids)


def test_reshard_while_producers_and_consumers_run_loses_nothing(r: Any) -> None:
    """A producer and two consumers (threads, each its own queue object of the old layout)
    run through 3 -> 5 -> 2: every task runs exactly once."""

    def make_queue(name: str, **options: Any) -> dueq.Queue:
        return dueq.Queue(name, r, **options)

    q = make_queue("live", shards=3)
    made: list[str] = []
    ran: dict[str, int] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def produce() -> None:
        p = make_queue("live", shards=3)
        for n in range(1500):
            task_id = f"p{n}"
            p.schedule_many([dueq.Task(n, id=task_id, delay=0.05 * (n % 7))])
            with lock:
                made.append(task_id)
        done_producing.set()

    def consume() -> None:
        c = make_queue("live", shards=3)
        while not stop.is_set():
            batch = c.claim(limit=20)
            for d in batch:
                with lock:
                    ran[d.id] = ran.get(d.id, 0) + 1
                d.ack()
            if not batch:
                time.sleep(0.02)

    done_producing = threading.Event()
    threads = [threading.Thread(target=produce)] + [
        threading.Thread(target=consume) for _ in range(2)
    ]
    for t in threads:
        t.start()
    try:
        assert q.reshard(5, batch=50).done
        assert q.reshard(2, batch=50).done
        assert done_producing.wait(60)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with lock:
                if len(ran) == len(made):
                    break
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert sorted(ran) == sorted(made)  # none lost
    assert set(ran.values()) == {1}  # none run twice (no consumer died)
    assert q.stats().scheduled == 0


def test_an_asyncio_reshard_while_async_producers_and_consumers_run_loses_nothing(r: Any) -> None:
    """The asyncio front end's reshard, on the loop that also runs an ``AsyncQueue`` producer
    and two consumers (each its own queue object of the old layout): 3 -> 5 -> 2, every task
    runs exactly once."""
    import asyncio

    from conftest import async_mirror

    async def run() -> tuple[list[str], dict[str, int], int]:
        client = async_mirror(r)
        made: list[str] = []
        ran: dict[str, int] = {}
        produced = asyncio.Event()

        async def produce() -> None:
            p = dueq.AsyncQueue("alive", client, shards=3)
            for n in range(0, 1200, 20):
                tasks = [dueq.Task(i, id=f"a{i}", delay=0.05 * (i % 5)) for i in range(n, n + 20)]
                await p.schedule_many(tasks)
                made.extend(t.id for t in tasks if t.id is not None)
                await asyncio.sleep(0.01)
            produced.set()

        async def consume() -> None:
            c = dueq.AsyncQueue("alive", client, shards=3)
            while True:
                batch = await c.claim(limit=20)
                for d in batch:
                    ran[d.id] = ran.get(d.id, 0) + 1
                    await d.ack()
                if not batch:
                    if produced.is_set() and len(ran) >= len(made):
                        return
                    await asyncio.sleep(0.02)

        try:
            mover = dueq.AsyncQueue("alive", client, shards=3)
            jobs = [asyncio.ensure_future(produce())]
            jobs += [asyncio.ensure_future(consume()) for _ in range(2)]
            assert (await mover.reshard(5, batch=50)).done
            assert (await mover.reshard(2, batch=50)).done
            await asyncio.wait_for(asyncio.gather(*jobs), 60)
            return made, ran, (await mover.stats()).scheduled
        finally:
            await client.aclose()

    made, ran, left = asyncio.run(run())
    assert sorted(ran) == sorted(made) and len(made) == 1200  # none lost
    assert set(ran.values()) == {1}  # none run twice
    assert left == 0


def test_what_a_reshard_cannot_move_yet_is_refused_with_the_reason(make_queue: Any) -> None:
    q = make_queue("refuse", shards=3)
    q.configure(key_concurrency=2)
    with pytest.raises(dueq.ConfigurationError, match="per-key limits"):
        q.reshard(4)
    q.configure(key_concurrency=False, events=3600)
    with pytest.raises(dueq.ConfigurationError, match="outcome events are on"):
        q.reshard(4)
    q.configure(events=False, rate=dueq.Rate(5, per=1.0))
    with pytest.raises(dueq.ConfigurationError, match="needs n >= 6"):
        q.reshard(4)  # (shards of both layouts while it runs: 3 and 4, none shared here)
    q.configure(rate=False)
    q.schedule_many([dueq.Task(n, id=f"b{n}") for n in range(6)], batch="imp")
    with pytest.raises(dueq.ConfigurationError, match="records of open batches"):
        q.reshard(4)
    q.close_batch("imp")
    assert len(drain(q)) == 6 and q.batch("imp").complete
    assert q.reshard(4).done  # a completed batch's records do not hold it back
    with pytest.raises(dueq.ConfigurationError, match="plain queue"):
        make_queue("plain").reshard(2)
    with pytest.raises(dueq.ConfigurationError, match="cannot become a plain"):
        q.reshard(1)


def test_the_reshard_record_keeps_every_count_the_queue_had(make_queue: Any, r: Any) -> None:
    q = make_queue("past", shards=2)
    q.schedule("x")
    q.reshard(3)
    q.reshard(2)
    assert r.hget(reshard_key("past"), "past") == b"2,3"
    assert q.reshard(2).done  # already 2: nothing to do


def test_the_queue_wide_rate_and_cap_hold_over_the_new_shards(make_queue: Any) -> None:
    q = make_queue("limits", shards=3)
    q.configure(rate=dueq.Rate(30, per=1.0), concurrency=12, paused=True)
    q.schedule("x")
    assert q.reshard(5).done
    settings = q.settings()
    assert (settings.rate, settings.concurrency, settings.paused) == (dueq.Rate(30, 1.0), 12, True)
    assert q.claim() == []  # the new shards are paused too
    assert q.reshard(2).done
    assert (q.settings().rate, q.settings().concurrency) == (dueq.Rate(30, 1.0), 12)


def test_doctor_reports_what_a_stopped_mover_left_and_the_running_reshard(r: Any) -> None:
    q = dueq.Queue("doc-rs", r, shards=2)
    ids = [f"t{n}" for n in range(60)]
    q.schedule_many([dueq.Task(n, id=i) for n, i in enumerate(ids)])
    shard, leaving = started(q, ids, 3)

    def take() -> Any:
        return (yield protocol.reshard_take(shard.keys, "", leaving))

    q.drive(take())
    report = q.doctor()
    [finding] = [f for f in report.findings if f.what == "moving_records"]
    assert (finding.subject, finding.found) == (shard.name, len(leaving))
    assert any("a reshard runs (2>3 shards)" in note for note in report.notes)
    stats = q.stats()
    assert stats.resharding == "2>3" and len(stats.shards) == len(q._core.layout.queues)
    assert q.reshard(3).done
    assert not [f for f in q.doctor().findings if f.what == "moving_records"]


MOVER = """
import sys, redis, dueq
q = dueq.Queue("killed", redis.Redis(port=int(sys.argv[1])), shards=3)
q.reshard(5, batch=25)
"""


@pytest.mark.timeout(240)
def test_a_resharding_process_sigkilled_three_times_is_resumed_and_loses_nothing(
    redis_server: Any, r: Any
) -> None:
    import subprocess
    import sys

    q = dueq.Queue("killed", r, shards=3)
    ids = [f"t{n}" for n in range(4000)]
    q.schedule_many([dueq.Task(n, id=i, delay=600) for n, i in enumerate(ids)])
    moved_at_kill = []
    for _ in range(3):
        start = int(r.hget(reshard_key("killed"), "moved") or 0)
        mover = subprocess.Popen([sys.executable, "-c", MOVER, str(redis_server.port)])
        deadline = time.monotonic() + 60
        while int(r.hget(reshard_key("killed"), "moved") or 0) < start + 300:
            assert mover.poll() is None, "the mover ended before it was killed"
            assert time.monotonic() < deadline
            time.sleep(0.005)
        mover.kill()  # SIGKILL, mid-step most of the time
        mover.wait(10)
        moved_at_kill.append(int(r.hget(reshard_key("killed"), "moved") or 0))
        assert r.get(layout_key("killed")) == b"3>5"
    assert moved_at_kill == sorted(moved_at_kill)  # each run went on from the last
    assert q.reshard(5).done
    held = {i: held_by(r, "killed", i) for i in ids}
    assert all(held[i] == [q.shard(i).name] for i in ids)  # each task once, on its new shard
    assert q.stats().scheduled == len(ids)
    names = set(shard_names("killed", 3) + shard_names("killed", 5))
    assert all(r.hlen(QueueKeys.for_queue(n).moving) == 0 for n in names)


def test_a_running_worker_listens_on_the_new_shards_after_a_reshard(r: Any) -> None:
    """A worker started on 3 shards follows the reshard to 5 and subscribes to the new
    shards' wake channels: a task another process schedules on a new shard wakes it (its
    heartbeat, which caps an idle sleep, is 30 s here)."""
    q = dueq.Queue("wakes", r, shards=3)
    q.stats()
    ran = threading.Event()
    worker = dueq.Worker(q, lambda d: ran.set(), heartbeat=30)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        assert dueq.Queue("wakes", r, shards=3).reshard(5).done
        deadline = time.monotonic() + 10
        while target(q).shard_count != 5:  # the worker's claims follow the record
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(1.0)  # (its listener subscribes to the new channels after its next read)
        new = set(shard_names("wakes", 5)) - set(shard_names("wakes", 3))
        producer = dueq.Queue("wakes", r, shards=5)
        task_id = next(f"w{n}" for n in range(1000) if producer.shard(f"w{n}").name in new)
        producer.schedule_many([dueq.Task("hello", id=task_id)])
        assert ran.wait(5), "the worker did not hear the new shard's wake"
    finally:
        worker.stop()
        thread.join(10)


def test_keyed_tasks_move_to_their_keys_shard_of_the_new_layout(r: Any) -> None:
    """A keyed task's id carries its key's route (``dueq.keyed_id``), so it lies with its key
    for every shard count and the reshard moves it there, whole, without waiting for it."""
    q = dueq.Queue("keyed-rs", r, shards=3)
    keyed = q.schedule_many([dueq.Task(n, key=f"k{n % 4}") for n in range(12)]).ids
    named = [dueq.keyed_id(f"k{n % 4}", f"order-{n}") for n in range(8)]
    q.schedule_many([dueq.Task(n, id=i, key=f"k{n % 4}") for n, i in enumerate(named)])
    plain = q.schedule_many([dueq.Task(n, id=f"p{n}") for n in range(30)]).ids
    reports: list[Any] = []
    assert q.reshard(5, progress=reports.append).done
    assert not any(rep.kept for rep in reports)  # none waited where it was
    keys = {i: f"k{n % 4}" for n, i in enumerate(keyed)} | {
        i: f"k{n % 4}" for n, i in enumerate(named)
    }
    for task_id, key in keys.items():
        assert held_by(r, "keyed-rs", task_id) == [shard_names("keyed-rs", 5)[shard_of(key, 5)]]
    c = dueq.Queue("keyed-rs", r, shards=5)
    assert c.get(named[3]) is not None and c.get(named[3]).key == "k3"
    seen = {d.id: d.key for d in c.claim(limit=100)}
    assert seen == keys | dict.fromkeys(plain)


def test_key_limits_cannot_change_while_a_reshard_runs(r: Any) -> None:
    """A reshard moves keyed tasks on the promise that no key limit is set (the start refuses
    one): configuring one meanwhile is refused, with the way out."""
    q = dueq.Queue("keyed-cfg", r, shards=3)
    q.schedule_many([dueq.Task(n, id=f"p{n}") for n in range(20)])
    q.drive(q._core.resharder().start_flow(5))
    for change in ({"key_concurrency": 2}, {"key_rate": dueq.Rate(5)}, {"fairness": "key"}):
        with pytest.raises(dueq.ConfigurationError, match="reshard"):
            q.configure(**change)
    assert q.reshard(5).done
    assert q.configure(key_concurrency=2).key_concurrency == 2


def test_reshard_on_a_real_cluster_moves_tasks_between_primaries_on_both_front_ends(
    cluster: Any, cluster_nodes: Any
) -> None:
    """3 -> 5 -> 2 on a 3-primary Redis Cluster: every script stays on one slot (the mover's
    calls go to the node of each shard), the async front end resumes what the sync one
    started, and every task runs once afterwards."""
    import asyncio

    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

    q = dueq.Queue("cl-rs", cluster, shards=3)
    ids = q.schedule_many([dueq.Task(n, id=f"c{n}", delay=30) for n in range(300)]).ids
    assert q.reshard(5).done
    assert {cluster.keyslot(QueueKeys.for_queue(n).due) for n in shard_names("cl-rs", 5)}

    async def async_part() -> Any:
        client = AsyncRedisCluster(host="127.0.0.1", port=cluster_nodes[0].port)
        try:
            aq = dueq.AsyncQueue("cl-rs", client, shards=5)
            report = await aq.reshard(2)
            found = await aq.get_many(ids)
            return report, found
        finally:
            await client.aclose()

    report, found = asyncio.run(async_part())
    assert report.done and (report.from_shards, report.to_shards) == (5, 2)
    assert sorted(i.id for i in found) == sorted(ids)
    c = dueq.Queue("cl-rs", cluster, shards=2, clock=lambda: time.time() + 60)
    assert sorted(drain(c)) == sorted(ids)


def test_a_mover_killed_after_putting_never_brings_a_finished_task_back(r: Any) -> None:
    """Killed between "put" and "drop": the tasks it put ran and were acked on their new shard
    meanwhile; the next mover puts the left records again, and the new shard, which noted
    their tokens, writes nothing: each task ran once."""
    q = dueq.Queue("put-twice", r, shards=3)
    ids = [f"t{n}" for n in range(120)]
    q.schedule_many([dueq.Task(n, id=i) for n, i in enumerate(ids)])
    shard, leaving = started(q, ids, 4)

    def take_and_put() -> Any:
        taken = yield protocol.reshard_take(shard.keys, "", leaving)
        for task_id, record in taken.records:
            home = q._core.layout.shard(task_id)
            yield protocol.reshard_put(home.keys, "", [(task_id, record)])
        return taken

    q.drive(take_and_put())  # the mover dies before "drop"
    ran = drain(q)
    assert sorted(ran) == sorted(ids)
    assert q.reshard(4).done
    assert q.stats().scheduled == 0 and drain(q) == []  # nothing came back
    assert all(r.hlen(s.keys.arrived) == 0 for s in q._core.layout.queues)


#: The last commit before resharding: a release whose processes read the layout key once.
BEFORE_RESHARDING = "05f976a"

OLD_RELEASE_PROCESS = """
import sys, redis, dueq
q = dueq.Queue("deploy", redis.Redis(port=int(sys.argv[1])), shards=int(sys.argv[2]))
try:
    q.schedule("from the old release")
except dueq.ConfigurationError as exc:
    print("refused:", exc)
else:
    print("scheduled")
"""


def test_a_rolling_deploy_processes_of_a_release_before_resharding_are_refused_not_wrong(
    redis_server: Any, r: Any, tmp_path: Any
) -> None:
    """Roll this release out before resharding: while the layout reads "3>5" a process of the
    release before it is refused with a ConfigurationError (it reads no count there), so it
    never writes by the old layout; after the reshard it works again once opened with the new
    count, and one opened with the old count is refused, while this release's processes follow
    either way (``test_a_queue_object_of_the_old_layout_follows_the_reshard``)."""
    import subprocess
    import sys
    import tarfile

    from paths_support import ROOT

    archive = tmp_path / "old.tar"
    with archive.open("wb") as out:
        made = subprocess.run(
            ["git", "archive", BEFORE_RESHARDING, "src"], cwd=ROOT, stdout=out, check=False
        )
    if made.returncode != 0:
        pytest.skip(f"this checkout has no commit {BEFORE_RESHARDING} (a shallow clone)")
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path, filter="data")
    env = {"PYTHONPATH": str(tmp_path / "src"), "PATH": "/usr/bin:/bin"}

    def old_release(shards: int) -> str:
        cmd = [sys.executable, "-c", OLD_RELEASE_PROCESS, str(redis_server.port), str(shards)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    q = dueq.Queue("deploy", r, shards=3)
    ids = q.schedule_many([dueq.Task(n, id=f"t{n}", delay=60) for n in range(100)]).ids
    assert old_release(3).startswith("scheduled")  # before: the old release works
    q.drive(q._core.resharder().start_flow(5))  # the reshard begins (layout "3>5")
    assert "refused: queue 'deploy' has 3>5 shards" in old_release(3)
    assert "refused" in old_release(5)
    assert q.reshard(5).done
    assert "refused: queue 'deploy' has 5 shards" in old_release(3)
    assert old_release(5).startswith("scheduled")
    assert len(q.get_many(ids)) == 100 and q.stats().scheduled == 102


def test_cron_definitions_move_with_their_pending_occurrence_and_keep_firing(
    make_queue: Any, r: Any, clock: Any
) -> None:
    """Each definition moves to the shard of its name in the new layout together with its
    pending occurrence (one record), so the claim that takes the occurrence finds the
    definition there and schedules the next one: every definition keeps firing."""
    q = make_queue("crons", shards=3)
    names = [f"job{n}" for n in range(12)]
    for name in names:
        q.cron.add(name, every=60, payload={"job": name})
    before = {d.name: d.next_at for d in q.cron.list()}
    assert q.reshard(5).done
    after = {d.name: d.next_at for d in q.cron.list()}
    assert after == before  # every definition, each still pending at its slot
    for name in names:
        home = shard_names("crons", 5)[shard_of(name, 5)]
        assert r.hexists(QueueKeys.for_queue(home).cron, name)
    for _ in range(2):  # two slots: each fires, and its next occurrence follows on its shard
        clock.advance(60)
        fired = []
        while batch := q.claim(limit=50):
            for d in batch:
                fired.append(d.payload["job"])
                d.ack()
        assert sorted(fired) == sorted(names)
    assert q.reshard(2).done
    assert {d.name for d in q.cron.list()} == set(names)


def test_a_definition_whose_occurrence_runs_moves_once_it_has_ended(r: Any) -> None:
    """A definition whose latest occurrence is still leased stays (its outcome is noted where
    it runs): the reshard waits for it, then moves the definition."""
    clock = [1_800_000_000.0]
    q = dueq.Queue("cron-busy", r, shards=2, clock=lambda: clock[0])
    name = next(
        f"tick{n}" for n in range(100) if shard_of(f"tick{n}", 2) != shard_of(f"tick{n}", 3)
    )
    q.cron.add(name, every=60)
    clock[0] += 60
    [running] = q.claim(limit=1)  # its occurrence runs; the next one is pending
    mover, reports = reshard_until_kept(q, 3)  # it waits for the running occurrence
    running.ack()
    mover.join(30)
    assert reports[-1].done
    home = shard_names("cron-busy", 3)[shard_of(name, 3)]
    assert r.hexists(QueueKeys.for_queue(home).cron, name)
    assert q.cron.get(name).last_outcome == "acked"  # noted where it ran, then moved along
