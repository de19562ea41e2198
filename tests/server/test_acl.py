"""Least privilege: the rules ``dueq acl`` prints, used as real Redis users.

Each role's user is created from the CLI's last line on a redis-server of this file's own,
does its job through the library and the CLI, and the server's ACL LOG shows what it was
refused: nothing it needs, and everything outside its queue or its job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis
from click.testing import CliRunner
from paths_support import ROOT, module_path
from waiting_support import wait_for

import dueq
from dueq._consume.wake import sharded_pubsub
from dueq.acl import ROLES, acl_rule, acl_rules, combined_rule, script_commands
from dueq.cli import cli
from dueq.events.stream import latest_events
from dueq.operators import process
from dueq.server import RedisServer, server_build

PASSWORD = "acl-test-pw"
QUEUE, OTHER = "emails", "billing"
#: Core, consumer and cron tests, run as the least-privilege user (conftest's DUEQ_TEST_ACL).
SUITE = [
    "test_claim.py",
    "test_schedule.py",
    "test_bad_input.py",
    "test_observe.py",
    "test_process.py",
    "test_worker.py",
    "test_cron.py",
    "test_dead.py",
    "test_retry.py",
    "test_remember_done.py",
    "test_scripts.py",
    "test_state_machine.py",
    "test_hardening.py",
    "test_corruption.py",
    "test_cron_corruption.py",
    "test_cron_control.py",
    "test_async_queue.py",
]


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    s = RedisServer().start()
    yield s
    s.stop()


def printed_rule(*args: str) -> str:
    """The last line ``dueq acl ARGS`` prints."""
    result = CliRunner().invoke(cli, ["acl", *args])
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()[-1]


@pytest.fixture
def admin(server: RedisServer) -> Iterator[redis.Redis]:
    client = server.client()
    client.flushall()
    client.execute_command("ACL", "LOG", "RESET")
    for role in ROLES:
        rule = printed_rule(role, "--queue", QUEUE)
        client.execute_command("ACL", "SETUSER", role, "reset", "on", f">{PASSWORD}", *rule.split())
    yield client
    client.close()


@pytest.fixture
def login(server: RedisServer, admin: redis.Redis) -> Iterator[Callable[[str], redis.Redis]]:
    clients: list[redis.Redis] = []

    def make(role: str) -> redis.Redis:
        clients.append(server.client(username=role, password=PASSWORD))
        return clients[-1]

    yield make
    for c in clients:
        c.close()


def url(server: RedisServer, role: str) -> str:
    return f"redis://{role}:{PASSWORD}@127.0.0.1:{server.port}/0"


def refused(admin: redis.Redis, role: str) -> set[str]:
    """What ACL LOG says the user was refused: command or key/channel names, less redis-py's
    CLIENT SETINFO on connecting (it ignores the refusal). Valkey (7.2-compatible) has the
    subcommand and logs ``client|setinfo``; Redis 6.2 checks ``client`` before it finds the
    subcommand unknown; 7.0 refuses the unknown subcommand first, and its ACL SETUSER refuses
    the name ``client|setinfo``, so the rule cannot grant it on every server."""
    entries = admin.acl_log(256)
    logged = {str(e["object"]) for e in entries if str(e["username"]) == role}
    if server_build(admin) < ("redis", (7, 0)):
        logged.discard("client")
    logged.discard("client|setinfo")
    return logged


def run_cli(server: RedisServer, role: str, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(
        cli, list(args), env={"DUEQ_REDIS_URL": url(server, role), "COLUMNS": "200"}
    )
    return result.exit_code, result.stdout, result.stderr


# -- the printed rules ---------------------------------------------------------------------


def test_dueq_acl_prints_comments_then_the_rule_to_append():
    result = CliRunner().invoke(cli, ["acl", "consumer", "--queue", "emails"])
    assert result.exit_code == 0, result.output
    *comments, line = result.stdout.splitlines()
    assert comments and all(c.startswith("# ") for c in comments)
    assert line == " ".join(acl_rules("consumer", "emails"))
    tokens = line.split()
    assert tokens[:5] == [
        "resetchannels",  # Redis 6.2 gives a new user allchannels, which refuses &patterns
        "~dueq:{emails}:*",
        "~dueq:{emails#*}:*",  # a sharded queue's shards and its layout key
        "&dueq:{emails}:wake",
        "&dueq:{emails#*}:wake",
    ]
    assert {"+evalsha", "+script|load", "+@pubsub"} <= set(tokens)
    assert not {"+@all", "~*", "+eval", "+keys", "+flushall", "+config|get"} & set(tokens)


def test_each_role_has_the_commands_of_its_lua_scripts_and_no_more_than_its_job():
    producer, consumer, operator = (set(acl_rule(role).commands) for role in ROLES)
    assert script_commands("schedule") <= producer
    assert script_commands("claim") | script_commands("ack") <= consumer
    assert script_commands("dead") | script_commands("stats") <= operator
    assert "scan" not in producer  # (it subscribes and reads INFO only to wait: q.wait)
    assert "scan" not in consumer and "subscribe" not in operator
    assert all(acl_rule(role).keys == ("~dueq:{*}:*",) for role in ROLES)


def test_several_roles_give_one_rule_with_the_union_of_their_commands():
    # (producer and consumer both publish and subscribe: their Pub/Sub tokens are the same)
    union = set(combined_rule(("producer", "consumer"), "emails"))
    assert union == set(acl_rules("producer", "emails")) | set(acl_rules("consumer", "emails"))
    assert printed_rule("producer", "operator", "--queue", "emails").split() == combined_rule(
        ("producer", "operator"), "emails"
    )


@pytest.mark.parametrize("pattern", ["a b", "a{b}", "", "x\x1b"])
def test_a_pattern_an_acl_rule_cannot_hold_is_a_usage_error(pattern):
    result = CliRunner().invoke(cli, ["acl", "producer", "--queue", pattern])
    assert result.exit_code == 2
    assert "--queue" in result.stderr
    with pytest.raises(dueq.ConfigurationError):
        acl_rule("producer", pattern)


def test_an_unknown_role_is_refused():
    assert CliRunner().invoke(cli, ["acl", "admin"]).exit_code == 2
    with pytest.raises(dueq.ConfigurationError):
        acl_rule("admin")


# -- each role does its job ----------------------------------------------------------------


def test_the_producer_schedules_cancels_reschedules_and_gets(server, admin, login):
    q = dueq.Queue(QUEUE, login("producer"))
    q.schedule({"n": 1}, id="a", delay=60)
    admin.script_flush()  # the next call reloads its script (SCRIPT LOAD after NOSCRIPT)
    assert q.schedule_many([dueq.Task({"n": n}) for n in range(5)]).added == 5
    assert q.reschedule("a", delay=0)
    assert q.get("a") is not None
    assert list(q.progress("a", timeout=0.1)) == []  # follows progress: the progress channel
    assert q.cancel("a")
    admin.hset(f"dueq:{{{QUEUE}}}:config", "keep_results_ms", "60000")
    q.schedule({"n": 2}, id="w")
    q.cancel("w")
    assert q.wait("w", timeout=5).state == "cancelled"  # q.wait: the ended channel
    code, out, err = run_cli(server, "producer", "schedule", QUEUE, '{"n": 9}', "--id", "cli")
    assert (code, out) == (0, "cli\n"), err
    assert refused(admin, "producer") == set()


def test_the_consumer_claims_settles_observes_and_runs_a_worker(admin, login):
    producer = dueq.Queue(QUEUE, login("producer"))
    consumer = dueq.Queue(
        QUEUE, login("consumer"), retry=dueq.RetryPolicy(max_attempts=2, wait=lambda s: 0)
    )
    producer.schedule_many([dueq.Task(n, id=f"c{n}") for n in range(4)])
    admin.script_flush()
    d0, d1, d2, d3 = sorted(consumer.claim(10), key=lambda d: d.id)
    d0.ack()
    d1.fail(ValueError("once"))
    d2.extend(30)
    assert d2.progress({"half": True}) == 1  # publishes on the progress channel
    d2.release()
    d3.fail(dueq.Unrecoverable("never"))
    # observe + process, woken by the wake channel for a task scheduled while it sleeps
    outcomes: list[dueq.Outcome] = []
    done = threading.Event()

    def keep(o: dueq.Outcome) -> None:
        outcomes.append(o)
        if {x.id for x in outcomes if x.kind == "acked"} >= {"c1", "c2", "later"}:
            done.set()

    sub = consumer.observe().pipe(process(lambda d: None)).subscribe(on_next=keep)
    try:
        # the consumer has claimed what was due and listens on the wake channel
        wait_for(lambda: {o.id for o in outcomes} >= {"c1", "c2"}, "the first claim")
        wait_for(lambda: _listeners(admin, QUEUE) == [1], "the wake subscription")
        producer.schedule("late", id="later")
        assert done.wait(30), outcomes
    finally:
        sub.dispose()
    # and the blocking Worker, stopped from another thread
    producer.schedule_many([dueq.Task(n, id=f"w{n}") for n in range(3)])
    worker = dueq.Worker(consumer, lambda d: None, concurrency=2, grace=5)
    stopper = threading.Thread(
        target=lambda: (
            wait_until(lambda: worker.outcomes["acked"] >= 3),
            worker.stop(),
        )
    )
    stopper.start()
    worker.run()
    stopper.join()
    assert worker.outcomes["acked"] == 3
    # the eviction check reads CONFIG GET, which the rule leaves out (it can read secrets)
    assert refused(admin, "consumer") <= {"config|get"}


def test_each_role_works_a_sharded_queue_of_its_name_and_no_other(admin, login):
    producer = dueq.Queue(QUEUE, login("producer"), shards=3)
    producer.schedule_many([dueq.Task(n, id=f"s{n}") for n in range(30)])  # writes the layout
    consumer = dueq.Queue(QUEUE, login("consumer"), shards=3)
    acked: list[str] = []
    done = threading.Event()

    def handle(d: dueq.Delivery) -> None:
        acked.append(d.id)
        if len(acked) == 31:
            done.set()

    sub = consumer.observe(heartbeat=3600).pipe(process(handle)).subscribe()
    try:
        # all 30 handled, then asleep on the three shards' wake channels (SSUBSCRIBE): only a
        # wake brings the next one
        wait_for(lambda: len(acked) == 30, "the first 30")
        wait_for(lambda: _listeners(admin, QUEUE, 3) == [1, 1, 1], "the wake subscriptions")
        producer.schedule("late", id="late")
        assert done.wait(30), f"{len(acked)} of 31 handled"
    finally:
        sub.dispose()
    operator = dueq.discovery.open_queue(login("operator"), QUEUE)
    assert operator.shard_count == 3
    wait_until(lambda: operator.stats().leased == 0)
    assert operator.stats().scheduled == 0
    other = dueq.Queue(OTHER, login("producer"), shards=3)
    with pytest.raises(redis.exceptions.NoPermissionError):
        other.schedule("x")
    assert refused(admin, "producer") and refused(admin, "consumer") <= {"config|get"}


def wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 30
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)


def test_the_operator_reads_stats_manages_dead_letters_and_cron(server, admin, login):
    producer = dueq.Queue(QUEUE, login("producer"))
    consumer = dueq.Queue(QUEUE, login("consumer"))
    producer.schedule_many([dueq.Task(n, id=f"d{n}") for n in range(3)])
    for d in consumer.claim(10):
        d.fail(dueq.Unrecoverable("boom"))
    dueq.Queue(OTHER, admin).schedule("not the operator's")
    admin.script_flush()
    op = dueq.Queue(QUEUE, login("operator"))
    assert op.stats().dead == 3
    # the latest outcome events (the dashboard's queue page, dueq events): XREVRANGE
    assert latest_events(op.redis, op, 5) == []
    assert {i.id for i in op.dead.list()} == {"d0", "d1", "d2"}
    assert op.dead.replay(["d0"]) == 1
    assert op.dead.purge(["d1"]) == 1
    op.cron.add("nightly", "0 3 * * *")
    assert [c.name for c in op.cron.list()] == ["nightly"]
    assert op.cron.pause("nightly") and op.cron.resume("nightly")
    assert op.cron.run_now("nightly").startswith("cron:nightly:now:")
    assert op.cron.remove("nightly")
    # the CLI: stats of every queue skips the one this user may not read
    code, out, err = run_cli(server, "operator", "stats")
    assert code == 0, err
    assert f"│ {QUEUE} " in out and f"skipped '{OTHER}': this Redis user may not read it" in out
    code, out, err = run_cli(server, "operator", "dead", "list", QUEUE)
    assert code == 0 and "d2" in out, err
    code, out, err = run_cli(server, "operator", "dead", "replay", QUEUE, "--all", "--yes")
    assert (code, out) == (0, f"replayed 1 dead task(s) of '{QUEUE}'\n"), err
    code, out, err = run_cli(server, "operator", "cron", "add", QUEUE, "n", "@daily")
    assert code == 0, err
    code, out, err = run_cli(server, "operator", "cron", "list", QUEUE)
    assert code == 0 and "@daily" in out, err
    for command in ("pause", "resume", "run-now"):
        code, out, err = run_cli(server, "operator", "cron", command, QUEUE, "n")
        assert code == 0, err
    # SCAN names foreign queues too (it is not a key command); reading them is refused
    denied = refused(admin, "operator")
    # (the other queue's keys, or the layout key ``dueq:{OTHER#}:shards`` read to open it)
    assert denied and all(f"{{{OTHER}" in item for item in denied), denied


def test_a_consumer_follows_a_group_and_the_operator_reads_the_groups_lag(server, admin, login):
    dueq.Queue(QUEUE, admin).configure(events=3600)
    admin.script_flush()  # events_read.lua is loaded by the consumer itself
    consumer = dueq.Queue(QUEUE, login("consumer"))
    got: list[dueq.Event] = []
    errors: list[BaseException] = []

    def on_next(ev: dueq.Event) -> None:
        got.append(ev)
        ev.ack()

    subscription = consumer.events(group="audit").subscribe(on_next, errors.append)
    try:
        dueq.Queue(QUEUE, login("producer")).schedule("x", id="e1")
        for d in consumer.claim(1):
            d.ack()
        wait_for(lambda: len(got) == 1 or bool(errors), "the event, or the reader's error")
    finally:
        subscription.dispose()
    assert errors == [] and [ev.task_id for ev in got] == ["e1"]
    [group] = dueq.Queue(QUEUE, login("operator")).event_groups()  # XINFO STREAM and GROUPS
    counted = int(str(admin.info("server")["redis_version"]).split(".")[0]) >= 7
    expected = (0, 0) if counted else (None, None)  # Redis 6.2 keeps no entries-added
    assert (group.name, group.pending, (group.lag, group.lost)) == ("audit", 0, expected)


def test_the_operator_reads_outcome_events_with_the_spark_events_source(server, admin, login):
    pytest.importorskip("pyspark.sql.streaming.datasource", reason="needs pyspark >= 4.2")
    from internals_support import spark_events

    dueq.Queue(QUEUE, admin).configure(events=3600)
    dueq.Queue(QUEUE, login("producer")).schedule_many([dueq.Task(n, id=f"e{n}") for n in range(3)])
    for d in dueq.Queue(QUEUE, login("consumer")).claim(10):
        d.ack()
    options = {"queue": QUEUE, "redis_url": url(server, "operator"), "events": "earliest"}
    reader = spark_events().events_stream_reader(options)  # XINFO STREAM, HGET, EXISTS, GET
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    rows = [row for part in reader.partitions(start, end) for row in reader.read(part)]  # XRANGE
    assert sorted(row[2] for row in rows) == ["e0", "e1", "e2"]
    assert refused(admin, "operator") == set()


def test_the_operator_lists_shows_steers_tasks_and_reads_history(server, admin, login):
    producer = dueq.Queue(QUEUE, login("producer"))
    consumer = dueq.Queue(QUEUE, login("consumer"), holder="acl-worker")
    producer.schedule_many([dueq.Task(n, id=f"v{n}") for n in range(4)])
    producer.schedule("later", id="later", delay=3600)
    held = consumer.claim(4)
    for d in held[:2]:
        d.fail(dueq.Unrecoverable("boom"))
    admin.script_flush()
    op = dueq.Queue(QUEUE, login("operator"))
    assert {t.id for t in op.iter_tasks("dead", error_type="Unrecoverable")} == {"v0", "v1"}
    assert {t.holder for t in op.list_tasks("leased").tasks} == {"acl-worker"}
    assert sum(p.claimed for p in op.history(5)) == 4
    assert op.due_histogram(bucket=3600, buckets=1).counts == [1]
    assert op.run_now("later") and op.dead.replay(error_type="Unrecoverable") == 2
    code, out, err = run_cli(server, "operator", "list", QUEUE, "--state", "leased", "--json")
    assert code == 0 and {t["holder"] for t in json.loads(out)["tasks"]} == {"acl-worker"}, err
    code, out, err = run_cli(server, "operator", "show", QUEUE, "v2", "--json")
    assert code == 0 and [t["state"] for t in json.loads(out)["tasks"]] == ["leased"], err
    for args in (
        ("reschedule", QUEUE, "later", "--delay", "60"),
        ("run-now", QUEUE, "later"),
        ("cancel", QUEUE, "later", "--yes"),
    ):
        code, _, err = run_cli(server, "operator", *args)
        assert code == 0, (args, err)


# -- and is refused the rest ---------------------------------------------------------------


@pytest.mark.parametrize("role", ROLES)
def test_every_role_is_refused_other_queues_and_server_commands(admin, login, role):
    dueq.Queue(OTHER, admin).schedule("theirs", id="t")
    client = login(role)
    other = dueq.Queue(OTHER, client)
    with pytest.raises(redis.exceptions.NoPermissionError):
        other.get("t")  # the script's own keys are checked on EVALSHA
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.hget(f"dueq:{{{OTHER}}}:tasks", "t")
    # a script of the user's own, reaching for another queue from inside Lua: refused too
    sha = client.script_load("return redis.call('HGET', 'dueq:{billing}:tasks', 't')")
    # Redis: "... can't access ...", Valkey 9: "No permissions to access a key"
    with pytest.raises(redis.ResponseError, match=r"can't access|No permissions to access a key"):
        client.evalsha(sha, 0)
    for command in (
        ("FLUSHALL",),
        ("CONFIG", "SET", "maxmemory-policy", "allkeys-lru"),
        ("KEYS", "*"),
        ("SCRIPT", "FLUSH"),
        ("CLIENT", "LIST"),
        ("ACL", "LIST"),
        ("EVAL", "return 1", "0"),
        ("SHUTDOWN",),
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.execute_command(*command)
    assert admin.hexists(f"dueq:{{{OTHER}}}:tasks", "t")


@pytest.mark.parametrize("method", ["ssubscribe", "subscribe"])
def test_the_wake_channel_of_another_queue_is_refused(server, login, method):
    if method == "ssubscribe" and not sharded_pubsub(server_build(server.client())[1]):
        pytest.skip("Redis 6.2 has no SSUBSCRIBE")
    pubsub = login("consumer").pubsub()
    with pytest.raises(redis.exceptions.NoPermissionError):
        getattr(pubsub, method)(f"dueq:{{{OTHER}}}:wake")
        pubsub.get_message(timeout=1)
    pubsub.close()


def test_roles_within_one_queue_are_not_separated_by_redis(admin, login):
    """The limit the README states: a producer may run Lua of its own on its queue's keys,
    and call the data commands its scripts need directly, so it can act as a consumer."""
    producer = login("producer")
    dueq.Queue(QUEUE, producer).schedule("x", id="x")
    sha = producer.script_load(
        "redis.call('ZREM', KEYS[1], 'x') return redis.call('ZADD', KEYS[2], 1, 'x')"
    )
    producer.evalsha(sha, 2, f"dueq:{{{QUEUE}}}:due", f"dueq:{{{QUEUE}}}:dead")
    assert dueq.Queue(QUEUE, admin).get("x").state == "dead"


# -- the suite as the least-privilege user -------------------------------------------------


@pytest.mark.timeout(900)
def test_the_core_consumer_and_cron_tests_pass_as_the_acl_user(server):
    if server_build(server.client()) < ("redis", (7, 0)):
        pytest.skip("the test user's extra selectors (conftest) need ACL selectors, Redis >= 7.0")
    files = [str(module_path(name)) for name in SUITE]  # each must exist: none is dropped
    env = {**os.environ, "DUEQ_TEST_ACL": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *files],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and " failed" not in done.stdout


def _listeners(admin: redis.Redis, name: str, shards: int = 1) -> list[int]:
    """How many clients listen on each wake channel of queue ``name`` (SSUBSCRIBE where the
    server has sharded Pub/Sub, SUBSCRIBE on Redis 6.2, as dueq._consume.wake does)."""
    channels = [
        dueq.Queue(n, admin).keys.wake for n in dueq.Queue(name, admin, shards=shards).shard_names
    ]
    if sharded_pubsub(server_build(admin)[1]):
        return [int(count) for _, count in admin.pubsub_shardnumsub(*channels)]
    return [int(count) for _, count in admin.pubsub_numsub(*channels)]
