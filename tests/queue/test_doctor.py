"""A key is never blocked forever by derived state that went wrong, and ``q.doctor`` finds
(and with ``fix=True`` repairs) such state without touching any task.

Regressions: a leased keyed task whose stored data vanished kept its key's lease count when its
lease expired (or was failed or released), so the key's other tasks stayed parked forever; a
hand-edited key state (``999|0|0``) did the same and nothing could repair it. Contract tests on
both front ends, and the CLI command.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from paths_support import DOCS

import dueq
from dueq._wire.keys import QueueKeys


def schedule_keyed(q: Any, key: str, n: int, *, prefix: str = "") -> None:
    q.schedule_many(dueq.Task({"i": i}, id=f"{prefix or key}-{i:03d}", key=key) for i in range(n))


def dump_all(r: redis.Redis) -> dict[bytes, bytes | None]:
    """Every key of the database, serialized (DUMP), with its TTL state."""
    return {key: r.dump(key) for key in sorted(r.keys("*"))}


# -- 1. a leased keyed task whose data vanished no longer holds its key ------------------------


def test_an_expired_lease_whose_data_vanished_releases_its_key(
    make_queue: Callable[..., Any], r: redis.Redis, clock: Any, redis_server: Any
) -> None:
    q = make_queue(lease=5)
    q.configure(key_concurrency=1)
    schedule_keyed(q, "k", 3)
    [a] = q.claim(10)
    assert a.id == "k-000" and q.claim(10) == []  # the key is at its limit
    r.hdel(QueueKeys.for_queue("q").tasks, "k-000")  # evicted, or deleted by hand
    clock.advance(6)  # its lease expires: the claim that reclaims it frees the key
    [b] = q.claim(10)
    assert b.id == "k-001"
    log = (redis_server.dir / "redis.log").read_text(errors="replace")
    assert "k-000" in log and "released" in log


def test_failing_or_releasing_a_lease_whose_data_vanished_releases_its_key(
    make_queue: Callable[..., Any], r: redis.Redis
) -> None:
    q = make_queue()
    q.configure(key_concurrency=1)
    schedule_keyed(q, "k", 3)
    tasks = QueueKeys.for_queue("q").tasks
    [a] = q.claim(10)
    r.hdel(tasks, a.id)
    a.fail(ValueError("boom"))
    [b] = q.claim(10)
    assert b.id == "k-001"
    r.hdel(tasks, b.id)
    b.release()
    [c] = q.claim(10)
    assert c.id == "k-002"


# -- 2. doctor finds and repairs a hand-edited key state ---------------------------------------


def test_doctor_reports_a_hand_edited_key_state_and_fix_makes_its_parked_tasks_claimable(
    make_queue: Callable[..., Any], r: redis.Redis
) -> None:
    q = make_queue()
    q.configure(key_concurrency=1)
    keys = QueueKeys.for_queue("q")
    r.hset(keys.key_state, "k", "999|0|0")
    schedule_keyed(q, "k", 3)
    assert q.claim(10) == []  # every task of the key is parked behind 999 phantom leases

    report = q.doctor()
    assert isinstance(report, dueq.DoctorReport)
    assert not report.consistent and report.problems == report.findings
    found = {(f.what, f.subject): f for f in report.findings}
    leased = found[("key_leased", "k")]
    assert (leased.found, leased.expected, leased.fixed) == (999, 0, False)
    assert set(found) == {("key_leased", "k")}  # its parked count (3) is right
    assert q.claim(10) == []  # reporting changed nothing

    fixed = q.doctor(fix=True)
    assert fixed.findings and all(f.fixed for f in fixed.findings) and fixed.problems == []
    [d] = q.claim(10)
    assert d.id == "k-000"
    d.ack()
    [e] = q.claim(10)
    assert e.id == "k-001"
    assert q.doctor().consistent


def test_doctor_fix_repairs_counts_of_an_orphaned_lease_and_a_lost_parked_count(
    make_queue: Callable[..., Any], r: redis.Redis
) -> None:
    q = make_queue()
    q.configure(key_concurrency=1)
    keys = QueueKeys.for_queue("q")
    schedule_keyed(q, "k", 3)
    [a] = q.claim(10)
    assert q.claim(10) == []  # k-001, k-002 parked: key state "1||2"
    r.hset(keys.key_state, "k", "1||0")  # the parked count lost
    r.hset(keys.key_state, "ghost", "2||0")  # a key with no lease at all
    r.zadd(keys.key_wait, {"nobody": 0})  # a wait entry of a key with nothing parked

    report = q.doctor(fix=True)
    got = {(f.what, f.subject, f.found, f.expected) for f in report.findings}
    assert got == {
        ("key_parked", "k", 0, 2),
        ("key_leased", "ghost", 2, 0),
        ("key_wait_stale", "nobody", 0, None),
    }
    assert r.hget(keys.key_state, "k") == b"1||2"
    assert r.hget(keys.key_state, "ghost") is None
    assert r.zscore(keys.key_wait, "nobody") is None
    a.ack()  # the lease's end brings the parked tasks back, as if nothing had happened
    assert [d.id for d in q.claim(10)] == ["k-001"]


def test_doctor_reports_tasks_without_data_and_leaves_them(
    make_queue: Callable[..., Any], r: redis.Redis
) -> None:
    q = make_queue()
    keys = QueueKeys.for_queue("q")
    q.schedule("x", id="one")
    q.schedule("y", id="two")
    q.claim(1)  # one leased, the other due
    leased = [m.decode() for m in r.zrange(keys.leased, 0, -1)]
    due = [m.decode() for m in r.zrange(keys.due, 0, -1)]
    r.hdel(keys.tasks, *leased, *due)
    before = dump_all(r)
    report = q.doctor(fix=True)
    got = {(f.what, f.subject, f.fixed) for f in report.findings}
    assert got == {("leased_without_data", leased[0], False), ("due_without_data", due[0], False)}
    assert report.problems == report.findings
    assert dump_all(r) == before  # report only: the claim handles them


# -- 3. a healthy busy queue: nothing reported, nothing changed ---------------------------------


def busy_queue(q: Any, clock: Any) -> list[Any]:
    """A queue in every state: keyed tasks leased and parked (concurrency and rate), plain,
    priority, dead and retrying tasks, a queue-wide rate window. Returns live deliveries."""
    q.configure(key_concurrency=2, rate=dueq.Rate(1000, per=60.0))
    for key in ("a", "b", "c"):
        schedule_keyed(q, key, 5)
    q.schedule_many(dueq.Task({"p": i}, id=f"plain-{i}", priority=i % 3) for i in range(10))
    q.schedule("later", id="later", delay=3600)
    held = q.claim(20)
    held[0].fail(ValueError("retry me"))
    held[1].fail(dueq.Unrecoverable("bury me"))
    held[2].ack()
    held[3].release(delay=60)
    clock.advance(1)
    held = held[4:] + q.claim(3)
    q.configure(key_rate=dueq.Rate(1, per=30.0))
    schedule_keyed(q, "d", 3)
    held += q.claim(5)
    return held


def test_doctor_on_a_healthy_busy_queue_reports_nothing_and_changes_nothing(
    make_queue: Callable[..., Any], r: redis.Redis, clock: Any
) -> None:
    q = make_queue()
    held = busy_queue(q, clock)
    assert held and r.exists(QueueKeys.for_queue("q").parked)
    assert r.exists(QueueKeys.for_queue("q").dead)
    before = dump_all(r)
    report = q.doctor()
    assert report.findings == [] and report.consistent
    assert q.doctor(fix=True).findings == []
    assert dump_all(r) == before


def test_doctor_checks_in_batches_with_the_same_result(
    make_queue: Callable[..., Any], r: redis.Redis
) -> None:
    q = make_queue()
    q.configure(key_concurrency=1)
    keys = QueueKeys.for_queue("q")
    for i in range(30):
        schedule_keyed(q, f"key{i:02d}", 2)
    q.claim(100)
    for i in range(0, 30, 3):
        r.hset(keys.key_state, f"key{i:02d}", "5||1")
    whole = q.doctor(batch=1000)
    small = q.doctor(batch=2)
    assert set(whole.findings) == set(small.findings)
    assert {f.subject for f in whole.findings} == {f"key{i:02d}" for i in range(0, 30, 3)}
    q.doctor(fix=True, batch=2)
    assert q.doctor().consistent


def test_doctor_reports_a_rate_window_sum_that_disagrees_with_its_entries(
    make_queue: Callable[..., Any], r: redis.Redis
) -> None:
    q = make_queue()
    q.configure(rate=dueq.Rate(10, per=60.0))
    q.schedule_many(dueq.Task(i) for i in range(4))
    q.claim(2)
    q.claim(1)
    keys = QueueKeys.for_queue("q")
    assert r.hget(keys.stats, "rate_in_window") == b"3"
    r.hset(keys.stats, "rate_in_window", "9")  # claims would be held back for nothing
    [finding] = q.doctor().findings
    assert (finding.what, finding.subject, finding.found, finding.expected) == (
        "rate_in_window",
        "rate_in_window",
        9,
        3,
    )
    q.doctor(fix=True)
    assert r.hget(keys.stats, "rate_in_window") == b"3"


def test_doctor_refuses_a_batch_outside_its_bounds(make_queue: Callable[..., Any]) -> None:
    q = make_queue()
    with pytest.raises(dueq.ConfigurationError):
        q.doctor(batch=0)


# -- the CLI ------------------------------------------------------------------------------------


def test_cli_doctor_prints_findings_exits_1_and_fix_repairs_them(
    invoke: Callable[..., Any], r: redis.Redis
) -> None:
    q = dueq.Queue("cq", r)
    q.configure(key_concurrency=1)
    q.schedule("x", id="t1", key="k")
    assert invoke("doctor", "cq").exit_code == 0
    r.hset(QueueKeys.for_queue("cq").key_state, "k", "999|0|0")

    found = invoke("doctor", "cq")
    assert found.exit_code == 1, found.output
    assert "key_leased" in found.output and "'k'" in found.output and "999" in found.output

    as_json = invoke("doctor", "cq", "--json")
    assert as_json.exit_code == 1
    document = json.loads(as_json.output)
    assert document["queue"] == "cq" and document["healthy"] is False
    assert document["findings"][0]["what"] == "key_leased"

    fixed = invoke("doctor", "cq", "--fix")
    assert fixed.exit_code == 0, fixed.output
    assert "fixed" in fixed.output
    assert [d.id for d in q.claim()] == ["t1"]
    assert invoke("doctor", "cq").exit_code == 0


def test_cli_doctor_help_names_its_exit_codes(invoke: Callable[..., Any]) -> None:
    out = invoke("doctor", "--help").output
    assert "--fix" in out and "--json" in out and "exit" in out.lower()


def test_doctor_on_a_sharded_queue_checks_each_shard_and_names_it(
    make_queue: Callable[..., Any], r: redis.Redis
) -> None:
    q = make_queue("sq", shards=2)
    q.schedule_many(dueq.Task(i, id=f"t{i}") for i in range(4))
    shard = q.shard("t0")
    r.zadd(shard.keys.key_wait, {"nobody": 0})  # a key-wait entry of a key with nothing parked
    [finding] = q.doctor().findings
    assert (finding.what, finding.subject, finding.queue) == (
        "key_wait_stale",
        "nobody",
        shard.name,
    )
    q.doctor(fix=True)
    assert q.doctor().consistent


def test_the_docs_page_python_block_runs(make_queue: Callable[..., Any], r: redis.Redis) -> None:
    page = (DOCS / "doctor.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    assert blocks
    q = make_queue()
    q.configure(key_concurrency=1)
    schedule_keyed(q, "k", 2)
    r.hset(QueueKeys.for_queue("q").key_state, "k", "999|0|0")
    for block in blocks:
        exec(block, {"q": q})
    assert q.doctor().consistent and [d.id for d in q.claim(10)] == ["k-000"]


# -- issue 37: dependency cycles ---------------------------------------------------------------


def close_cycle_by_hand(r: redis.Redis, queue: str, first: str, last: str) -> None:
    """Make ``first`` (scheduled) wait for ``last``: the state an older dueq left when a replace
    closed a cycle (schedule.lua refuses that now)."""
    k = QueueKeys.for_queue(queue)
    r.zrem(k.due, first)
    r.zadd(k.waiting, {first: 0})
    r.hset(k.after, first, f"1|f|{last}")
    r.zadd(k.children, {f"{last}\0{first}": 0})


def three_in_a_cycle(q: Any, r: redis.Redis, queue: str, ids: tuple[str, str, str]) -> None:
    a, b, c = ids
    q.schedule(a, id=a)
    q.schedule(b, id=b, after=[a])
    q.schedule(c, id=c, after=[b])
    close_cycle_by_hand(r, queue, a, c)


def test_doctor_reports_a_dependency_cycle_and_fix_ends_its_tasks_dead(
    make_queue: Callable[..., Any], r: redis.Redis
) -> None:
    q = make_queue()
    three_in_a_cycle(q, r, "q", ("b", "c", "a"))  # b waits for a, which waits for c, for b
    q.schedule("d", id="d", after=["c"])  # waits for the cycle, is not in it
    q.schedule("e", id="e", after=["a"], after_policy="run")
    assert q.claim(10) == []  # nothing ever runs
    before = dump_all(r)
    report = q.doctor()
    [finding] = report.findings
    assert (finding.what, finding.subject) == ("dependency_cycle", "a")
    assert finding.found == "a -> c -> b -> a"
    assert not finding.fixed and report.problems == [finding] and not report.consistent
    assert dump_all(r) == before  # report only
    fixed = q.doctor(fix=True)
    assert [(f.what, f.fixed) for f in fixed.findings] == [("dependency_cycle", True)]
    assert fixed.problems == []
    for i in ("a", "b", "c"):
        task = q.get(i)
        assert task.state == "dead"
        assert (task.errors[-1].type, task.errors[-1].message) == (
            "DependencyCycle",
            "waits for itself: a -> c -> b -> a",
        )
    assert q.get("d").errors[-1].message == "parent c ended dead"  # as for any dead parent
    assert q.get("e").state == "scheduled"  # after_policy="run": released
    assert q.stats().dead == 4 and q.doctor().consistent
    assert q.dead.replay(["a"]) == 1
    assert sorted(run_claims(q)) == ["a", "e"]


def test_doctor_fix_of_a_cycle_writes_the_dead_outcome_events(
    make_queue: Callable[..., Any], r: redis.Redis
) -> None:
    from dueq.events.stream import latest_events

    q = make_queue()
    q.configure(events=3600)
    three_in_a_cycle(q, r, "q", ("a", "b", "c"))
    q.doctor(fix=True)
    events = latest_events(r, dueq.Queue("q", r), 10)
    dead = sorted(e.task_id for e in events if e.kind == "dead")
    assert dead == ["a", "b", "c"]
    assert {e.error.type for e in events if e.kind == "dead"} == {"DependencyCycle"}


def run_claims(q: Any) -> list[str]:
    """Claim and ack every due task; the ids run, in claim order."""
    ran = []
    while deliveries := q.claim(limit=10):
        for d in deliveries:
            ran.append(d.id)
            d.ack()
    return ran


def test_doctor_finds_a_cycle_in_small_batches_and_notes_a_walk_past_its_bound(
    make_queue: Callable[..., Any], r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = make_queue()
    q.schedule("t0", id="t0", delay=60)
    q.schedule_many(dueq.Task(i, id=f"t{i}", after=[f"t{i - 1}"]) for i in range(1, 30))
    assert q.doctor(batch=4).consistent  # a long chain is no cycle
    close_cycle_by_hand(r, "q", "t0", "t29")
    [finding] = q.doctor(batch=4).findings
    assert finding.subject == "t0"
    assert finding.found == " -> ".join(["t0", "t29", *(f"t{i}" for i in range(28, 20, -1)), "..."])
    monkeypatch.setattr("dueq._flows.view.DOCTOR_EDGE_CAP", 10)  # most edges a call follows
    report = q.doctor(batch=4)
    assert report.findings == []
    assert any("dependency cycles not looked for past 10 edges" in n for n in report.notes)


def test_doctor_on_a_sharded_queue_finds_a_cycle_on_its_shard(
    make_queue: Callable[..., Any], r: redis.Redis
) -> None:
    q = make_queue("sq", shards=2)
    ids = [f"s{i}" for i in range(30)]
    home = q.shard(ids[0]).name
    a, b, c = [i for i in ids if q.shard(i).name == home][:3]
    three_in_a_cycle(q, r, home, (a, b, c))
    report = q.doctor()
    [finding] = report.findings
    assert (finding.what, finding.queue) == ("dependency_cycle", home)
    assert report.health is not None and report.health.level == "ok"  # of the whole queue
    q.schedule("due", id="due-now")  # on some shard: the logical queue's verdict sees it
    health = q.doctor().health
    assert health is not None and health.reasons[0].startswith("1 due, no live worker")


def test_cli_doctor_exits_1_on_a_dependency_cycle_and_fix_ends_it(
    invoke: Callable[..., Any], r: redis.Redis
) -> None:
    q = dueq.Queue("cq", r)
    three_in_a_cycle(q, r, "cq", ("a", "b", "c"))
    result = invoke("doctor", "cq")
    assert result.exit_code == 1, result.output
    assert "dependency_cycle 'a': found 'a -> c -> b -> a'" in result.output
    fixed = invoke("doctor", "cq", "--fix")
    assert fixed.exit_code == 0, fixed.output
    assert "(fixed; waiting tasks that wait for each other" in fixed.output


# -- issue 37: doctor and the dashboard agree on health ----------------------------------------


def test_doctor_gives_the_dashboards_health_verdict_and_consistent_is_not_healthy(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    from dueq.health import HealthRules, judge_health

    q = make_queue(retry=dueq.RetryPolicy(max_attempts=1))
    q.schedule_many(dueq.Task(i, id=f"dead-{i}") for i in range(58))
    for d in q.claim(limit=100):
        d.fail(dueq.Unrecoverable("no"))
    q.schedule_many(dueq.Task(i, id=f"late-{i}") for i in range(402))
    clock.advance(11 * 60)  # 402 overdue for 11 min, no worker, 58 dead in the last hour
    report = q.doctor()
    assert report.consistent and report.findings == []
    assert report.health is not None and report.health.level == "bad"
    assert report.health.reasons == (
        "402 due, no live worker (oldest waiting 11 min)",
        "58 dead letters in the last 1 h",
    )
    rules = HealthRules()  # the one verdict, as the dashboard computes it
    history = q.history(rules.history_minutes)
    assert report.health == judge_health(q.stats(), live_workers=0, history=history, rules=rules)
    assert not report.healthy


def test_cli_doctor_says_the_health_verdict_and_exits_1_when_it_is_bad(
    invoke: Callable[..., Any], r: redis.Redis
) -> None:
    then_s = time.time() - 11 * 60  # a producer whose clock reads 11 minutes ago
    dueq.Queue("cq", r, clock=lambda: then_s).schedule_many(
        dueq.Task(i, id=f"late-{i}") for i in range(402)
    )
    result = invoke("doctor", "cq")
    assert result.exit_code == 1, result.output
    assert "healthy" not in result.output
    assert "derived state consistent; health bad: 402 due, no live worker" in result.output
    document = json.loads(invoke("doctor", "cq", "--json").output)
    assert (document["consistent"], document["healthy"]) == (True, False)
    assert document["health"]["level"] == "bad"
    assert document["health"]["reasons"][0].startswith("402 due, no live worker")
    dueq.Queue("wq", r).schedule({}, id="fresh")  # a queue that only warns exits 0
    warned = invoke("doctor", "wq")
    assert warned.exit_code == 0, warned.output
    assert "health warn: 1 due, no live worker" in warned.output


# -- fairness: the fair set against the lanes ---------------------------------------------------


def laned(r: redis.Redis, queue: str = "q") -> dict[str, list[str]]:
    """The tasks in each lane of a fair queue (tenant -> ids, in lane order)."""
    lanes: dict[str, list[str]] = {}
    for member in r.zrangebylex(QueueKeys.for_queue(queue).parked, "[\x01", "(\x02"):
        tenant, rest = member.decode().split("\x00", 1)
        lanes.setdefault(tenant[1:], []).append(rest[16:])
    return lanes


def test_doctor_finds_a_lane_missing_from_the_fair_set_and_fix_has_it_served_next(
    make_queue: Callable[..., Any], r: redis.Redis
) -> None:
    q = make_queue()
    q.configure(fairness="key")
    keys = QueueKeys.for_queue("q")
    schedule_keyed(q, "a", 5)
    schedule_keyed(q, "b", 2)
    assert sorted(d.id for d in q.claim(2)) == ["a-000", "b-000"]  # each lane at time 1 now
    r.zrem(keys.fair, "b")  # a hand edit, or a lost write: b's lane is never served again
    assert [d.id for d in q.claim(10)] == ["a-001", "a-002", "a-003", "a-004"]
    assert q.claim(10) == [] and laned(r) == {"b": ["b-001"]}  # stranded
    schedule_keyed(q, "a", 1, prefix="a2")  # a is back: it joins at the least time (0)
    before = dump_all(r)

    report = q.doctor()
    [finding] = report.findings
    assert (finding.what, finding.subject, finding.found, finding.expected, finding.fixed) == (
        "fair_lane_unlisted",
        "b",
        None,
        "0",
        False,
    )
    assert dump_all(r) == before  # report only

    fixed = q.doctor(fix=True)
    assert [(f.what, f.subject, f.fixed) for f in fixed.findings] == [
        ("fair_lane_unlisted", "b", True)
    ]
    assert fixed.problems == []
    assert r.zscore(keys.fair, "b") == 0.0  # at the least virtual time: served at once
    assert sorted(d.id for d in q.claim(2)) == ["a2-000", "b-001"]
    assert q.doctor().consistent


def test_doctor_gives_an_unlisted_lane_the_least_virtual_time_of_the_fair_set(
    make_queue: Callable[..., Any], r: redis.Redis
) -> None:
    q = make_queue()
    q.configure(fairness="key", key_limits={"w": dueq.KeyLimit(weight=2)})
    keys = QueueKeys.for_queue("q")
    for tenant in "wxyz":
        schedule_keyed(q, tenant, 10)
    q.claim(10)  # w: 4 tasks, x, y and z: 2 each; every lane at time 2
    assert set(r.zrange(keys.fair, 0, -1, withscores=True)) == {
        (t, 2.0) for t in (b"w", b"x", b"y", b"z")
    }
    r.zincrby(keys.fair, 0.5, "z")  # z at 2.5, w at 2: the least time
    r.zrem(keys.fair, "x", "y")
    report = q.doctor(fix=True)
    got = {(f.what, f.subject, f.found, f.expected, f.fixed) for f in report.findings}
    assert got == {
        ("fair_lane_unlisted", "x", None, "2", True),
        ("fair_lane_unlisted", "y", None, "2", True),
    }
    assert r.zrange(keys.fair, 0, -1, withscores=True) == [
        (b"w", 2.0),
        (b"x", 2.0),
        (b"y", 2.0),
        (b"z", 2.5),
    ]
    assert sorted(d.key for d in q.claim(4)) == ["w", "w", "x", "y"]  # z's turn comes after


def test_doctor_removes_a_fair_entry_whose_lane_is_empty(
    make_queue: Callable[..., Any], r: redis.Redis
) -> None:
    q = make_queue()
    q.configure(fairness="key")
    keys = QueueKeys.for_queue("q")
    schedule_keyed(q, "a", 2)
    r.zadd(keys.fair, {"ghost": 0.25, "gone": 7})  # entries with no task in their lanes
    before = dump_all(r)
    report = q.doctor()
    got = {(f.what, f.subject, f.found, f.expected, f.fixed) for f in report.findings}
    assert got == {
        ("fair_entry_empty", "ghost", "0.25", None, False),
        ("fair_entry_empty", "gone", "7", None, False),
    }
    assert dump_all(r) == before
    assert q.doctor(fix=True).problems == []
    assert r.zrange(keys.fair, 0, -1, withscores=True) == [(b"a", 0.0)]
    assert [d.id for d in q.claim(10)] == ["a-000", "a-001"]
    assert q.doctor().consistent


def test_doctor_reports_a_lane_member_whose_data_is_gone_and_leaves_it(
    make_queue: Callable[..., Any], r: redis.Redis
) -> None:
    q = make_queue()
    q.configure(fairness="key")
    keys = QueueKeys.for_queue("q")
    schedule_keyed(q, "a", 2)
    [member] = [m for m in r.zrange(keys.parked, 0, -1) if m.endswith(b"a-001")]
    r.hdel(keys.tasks, "a-001")
    before = dump_all(r)
    report = q.doctor(fix=True)
    got = {(f.what, f.subject, f.found, f.expected, f.fixed) for f in report.findings}
    assert got == {("fair_member_without_data", member.decode(), None, None, False)}
    assert dump_all(r) == before  # report only: the claim drops it
    assert [d.id for d in q.claim(10)] == ["a-000"]
    assert q.doctor().consistent


def test_doctor_checks_the_fair_state_in_batches_with_the_same_result(
    make_queue: Callable[..., Any], r: redis.Redis
) -> None:
    q = make_queue()
    q.configure(fairness="key")
    keys = QueueKeys.for_queue("q")
    for i in range(20):
        schedule_keyed(q, f"t{i:02d}", 2)
    r.zrem(keys.fair, *(f"t{i:02d}" for i in range(0, 20, 3)))
    # past 128 entries the set is no longer a listpack, and ZSCAN walks it COUNT at a time
    r.zadd(keys.fair, {f"stale{i:03d}": i for i in range(200)})
    whole = q.doctor(batch=1000)
    small = q.doctor(batch=2)
    assert set(whole.findings) == set(small.findings)
    assert {(f.what, f.subject) for f in whole.findings} == {
        *(("fair_lane_unlisted", f"t{i:02d}") for i in range(0, 20, 3)),
        *(("fair_entry_empty", f"stale{i:03d}") for i in range(200)),
    }
    q.doctor(fix=True, batch=2)
    assert q.doctor().consistent
    assert {d.key for d in q.claim(20)} == {f"t{i:02d}" for i in range(20)}


def test_doctor_on_a_healthy_busy_fair_queue_reports_nothing_and_changes_nothing(
    make_queue: Callable[..., Any], r: redis.Redis, clock: Any
) -> None:
    q = make_queue()
    q.configure(fairness="key")
    held = busy_queue(q, clock)
    schedule_keyed(q, "e", 3)  # a lane that waits
    keys = QueueKeys.for_queue("q")
    assert held and r.exists(keys.fair) and laned(r)
    before = dump_all(r)
    assert q.doctor().findings == []
    assert q.doctor(fix=True).findings == []
    assert dump_all(r) == before


def test_doctor_on_a_queue_that_never_used_fairness_reads_the_fair_set_once(
    make_queue: Callable[..., Any], admin: redis.Redis
) -> None:
    q = make_queue()
    q.configure(key_concurrency=1)
    schedule_keyed(q, "k", 3)
    q.claim(10)
    before = admin.info("commandstats")
    assert q.doctor().consistent
    after = admin.info("commandstats")

    def delta(command: str) -> int:
        return int(after.get(f"cmdstat_{command}", {}).get("calls", 0)) - int(
            before.get(f"cmdstat_{command}", {}).get("calls", 0)
        )

    assert delta("zscan") == 1  # the fair set's walk, on a missing key
    assert delta("zscore") == 0  # no lane to look up


def test_doctor_on_a_sharded_fair_queue_repairs_the_fair_set_of_the_shard_that_lost_an_entry(
    make_queue: Callable[..., Any], r: redis.Redis
) -> None:
    q = make_queue("sq", shards=2)
    q.configure(fairness="key")
    ids = [dueq.keyed_id(f"k{i % 3}", f"t{i}", 2) for i in range(12)]  # on their keys' shards
    q.schedule_many(dueq.Task(i, id=ids[i], key=f"k{i % 3}") for i in range(12))
    shard = q.shard(ids[0])
    r.zrem(shard.keys.fair, "k0")
    [finding] = q.doctor().findings
    assert (finding.what, finding.subject, finding.queue) == (
        "fair_lane_unlisted",
        "k0",
        shard.name,
    )
    assert q.doctor(fix=True).problems == []
    assert q.doctor().consistent
    assert sorted(d.id for d in q.claim(12)) == sorted(ids)
