"""What differs between the servers dueq supports (docs/servers.md), against the real server
this run uses (``DUEQ_TEST_SERVER``; ``scripts/test-servers`` runs this file on each):

- each role's ``dueq acl`` rule is accepted by ACL SETUSER, and holds what the role needs;
- each outage the server can be put in is read as an outage from the server's own error text,
  for a plain command and for a dueq script (whose error texts differ by server and version);
- a user who may not run scripts gets one ConfigurationError naming what is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from redis.backoff import NoBackoff
from redis.retry import Retry

import dueq
from dueq._consume.wake import sharded_pubsub
from dueq._util.outage import outage_reason
from dueq.acl import ROLES
from dueq.cli import cli
from dueq.server import RedisServer, find_redis_server, free_port, server_build

PASSWORD = "servers-test-pw"


def refusal(call: Callable[[], object]) -> Exception:
    """The error ``call`` raises (it must raise)."""
    try:
        call()
    except Exception as exc:
        return exc
    raise AssertionError("expected the server to refuse the call")


def assert_outage(exc: Exception, code: str) -> None:
    """``exc`` is read as the outage ``code``; its text is printed (``pytest -rP`` shows the
    server's real texts, which docs/servers.md quotes)."""
    print(f"{code}: {type(exc).__name__}: {exc}")
    reason = outage_reason(exc)
    assert reason is not None and reason.startswith(f"{code}:"), (type(exc), str(exc), reason)


@pytest.fixture
def server() -> Iterator[RedisServer]:
    """A server of this test's own (the tests below break it on purpose)."""
    s = RedisServer().start()
    yield s
    s.stop()


@pytest.fixture
def r(server: RedisServer) -> Iterator[redis.Redis]:
    client = server.client()
    yield client
    client.close()


def queue_with_a_task(r: redis.Redis) -> dueq.Queue:
    """A queue whose scripts are loaded (so EVALSHA runs them, not SCRIPT LOAD)."""
    q = dueq.Queue("outage", r)
    q.schedule({"n": 0}, id="first")
    return q


# -- dueq acl ----------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ROLES)
def test_each_roles_printed_rule_is_accepted_and_publishes_only_what_its_job_needs(
    r: redis.Redis, server: RedisServer, role: str
) -> None:
    result = CliRunner().invoke(cli, ["acl", role, "--queue", "emails"])
    rule = result.stdout.splitlines()[-1].split()
    r.execute_command("ACL", "SETUSER", role, "reset", "on", f">{PASSWORD}", *rule)
    user = server.client(username=role, password=PASSWORD)
    wake = "dueq:{emails}:wake"
    # every role's scripts publish wakes; the consumer listens, and the producer may (its
    # channels include the ended channel it waits on, and ACL channel rules cannot tell
    # publishing from subscribing)
    assert user.publish(wake, "1") == 0
    _, version = server_build(r)
    if sharded_pubsub(version):
        assert user.execute_command("SPUBLISH", wake, "1") == 0
    pubsub = user.pubsub()
    if role in ("consumer", "producer"):
        pubsub.subscribe(wake)
        assert pubsub.get_message(timeout=5)["type"] == "subscribe"
    else:
        with pytest.raises(redis.exceptions.NoPermissionError):
            pubsub.subscribe(wake)
            pubsub.get_message(timeout=5)
    pubsub.close()
    for command in (("PSUBSCRIBE", "dueq:*"), ("PUBSUB", "CHANNELS"), ("PUBLISH", "other", "1")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            user.execute_command(*command)
    dueq.Queue("emails", user).get("nothing")  # a script of every role's
    user.close()


# -- outages, by the server's own texts --------------------------------------------------------


def test_out_of_memory_is_an_outage_for_commands_and_scripts(r: redis.Redis) -> None:
    q = queue_with_a_task(r)
    r.config_set("maxmemory", 1)  # with the noeviction policy RedisServer sets
    assert_outage(refusal(lambda: r.set("x", "y")), "OOM")
    assert_outage(refusal(lambda: q.schedule({"n": 1}, id="later")), "OOM")
    q.cancel("first")  # deletions still go through
    r.config_set("maxmemory", 0)


def test_missing_replicas_are_an_outage_for_commands_and_scripts(r: redis.Redis) -> None:
    q = queue_with_a_task(r)
    r.config_set("min-replicas-to-write", 1)
    assert_outage(refusal(lambda: r.set("x", "y")), "NOREPLICAS")
    assert_outage(refusal(lambda: q.schedule({"n": 1}, id="later")), "NOREPLICAS")
    r.config_set("min-replicas-to-write", 0)


def test_a_replica_is_an_outage_for_writes_by_command_and_by_script(server: RedisServer) -> None:
    with RedisServer(replica_of=("127.0.0.1", server.port)) as replica:
        replica.wait_in_sync()
        queue_with_a_task(server.client())
        client = replica.client()
        assert_outage(refusal(lambda: client.set("x", "y")), "READONLY")
        q = dueq.Queue("outage", client)
        assert_outage(refusal(lambda: q.schedule({"n": 1}, id="later")), "READONLY")
        client.close()


def test_a_busy_script_of_another_client_is_an_outage_for_commands_and_scripts(
    r: redis.Redis, server: RedisServer
) -> None:
    q = queue_with_a_task(r)
    # 6.2 calls it lua-time-limit; 7.0 and Valkey keep that name as an alias
    r.config_set("lua-time-limit", 50)
    busy = server.client()
    spin = threading.Thread(
        target=lambda: refusal(lambda: busy.eval("while true do end", 0)), daemon=True
    )
    spin.start()
    try:
        deadline = time.monotonic() + 10
        while True:  # until the script runs past the threshold
            try:
                r.set("x", "y")
            except redis.ResponseError as exc:
                refused = exc
                break
            assert time.monotonic() < deadline, "the script never made the server busy"
            time.sleep(0.01)
        assert_outage(refused, "BUSY")
        assert_outage(refusal(lambda: q.schedule({"n": 1}, id="later")), "BUSY")
    finally:
        r.script_kill()
        spin.join(10)
        busy.close()


def test_a_failed_snapshot_is_an_outage_for_commands_and_scripts(
    r: redis.Redis, server: RedisServer
) -> None:
    q = queue_with_a_task(r)
    r.config_set("save", "3600 1")  # stop-writes-on-bgsave-error applies with save points
    # the snapshot's temporary file cannot be created in a folder that is gone, even by root
    # (CONFIG SET dir is a protected config from Redis 7.0; this server is thrown away after)
    shutil.rmtree(server.dir)
    r.bgsave()
    deadline = time.monotonic() + 10
    while r.info("persistence")["rdb_last_bgsave_status"] != "err":
        assert time.monotonic() < deadline, "BGSAVE did not fail"
        time.sleep(0.02)
    assert_outage(refusal(lambda: r.set("x", "y")), "MISCONF")
    assert_outage(refusal(lambda: q.schedule({"n": 1}, id="later")), "MISCONF")
    r.config_set("save", "")  # else SIGTERM's final save fails and the server will not stop


def test_a_server_loading_its_data_is_an_outage_for_commands_and_scripts(r: redis.Redis) -> None:
    q = queue_with_a_task(r)
    # 16 MB: Redis 6.2 answers clients while loading only every 2 MB read (7.0+ can be told
    # loading-process-events-interval-bytes, 6.2 has no such config)
    r.mset({f"k{n}": os.urandom(4096) for n in range(4000)})  # random: RDB compresses no byte
    r.save()
    folder = Path(tempfile.mkdtemp(prefix="dueq-loading-"))
    shutil.copy(Path(r.config_get("dir")["dir"]) / "dump.rdb", folder / "dump.rdb")
    port = free_port()
    # key-load-delay (microseconds per key, a testing config): 4000 keys load in ~8 s
    args = ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder), "--save", ""]
    args += ["--key-load-delay", "2000", "--logfile", str(folder / "log")]
    if server_build(r) >= ("redis", (7, 0)):  # Valkey too
        args += ["--loading-process-events-interval-bytes", "1024"]
    loading = subprocess.Popen([find_redis_server(), *args], stdin=subprocess.DEVNULL)
    # no retries: redis-py 8 retries connection errors, BusyLoadingError (LOADING) among them
    client = redis.Redis(port=port, socket_timeout=15, retry=Retry(NoBackoff(), 0))
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                client.get("k1")
            except redis.ConnectionError as exc:
                if isinstance(exc, redis.exceptions.BusyLoadingError):
                    assert_outage(exc, "LOADING")
                    break
                assert time.monotonic() < deadline, exc
                time.sleep(0.01)
                continue
            pytest.fail("the server answered before it was seen loading")
        if server_build(r) < ("redis", (7, 0)):
            # 6.2 answers only every 2 MB read, so loading can end before the next call; the
            # refusal comes before any command runs, the same for EVALSHA as for GET above
            return
        assert_outage(refusal(lambda: client.set("x", "y")), "LOADING")
        loading_q = dueq.Queue("outage", client)
        assert_outage(refusal(lambda: loading_q.get("first")), "LOADING")
        assert q.get("first") is not None  # the first server is fine
    finally:
        client.close()
        loading.kill()
        loading.wait()
        shutil.rmtree(folder, ignore_errors=True)


# -- a server or user without scripts ----------------------------------------------------------


def test_a_user_who_may_not_run_scripts_gets_one_configuration_error_naming_evalsha(
    r: redis.Redis, server: RedisServer, make_queue: Callable[..., Any]
) -> None:
    r.execute_command(
        "ACL", "SETUSER", "noscripts", "reset", "on", f">{PASSWORD}", "~*", "&*", "+@all",
        "-@scripting",
    )  # fmt: skip
    user = server.client(username="noscripts", password=PASSWORD)
    q = make_queue("emails", client=user)
    with pytest.raises(dueq.ConfigurationError, match="may not run EVALSHA") as refused:
        q.schedule({"n": 1})
    assert refused.value.__cause__ is None and "NOPERM" not in type(refused.value).__name__
    user.close()


def test_a_server_without_evalsha_gets_one_configuration_error_naming_it(
    make_queue: Callable[..., Any],
) -> None:
    renamed = ["--rename-command", "EVALSHA", "", "--rename-command", "EVAL", ""]
    with RedisServer(extra_args=renamed) as bare:
        q = make_queue("emails", client=bare.client())
        with pytest.raises(dueq.ConfigurationError, match="has no EVALSHA command"):
            q.schedule({"n": 1})
        with pytest.raises(dueq.ConfigurationError, match="has no EVALSHA command"):
            q.claim(10)
