"""The CLI on Redis Sentinel (``redis+sentinel://``) and with ``--wait-replicas``.

A primary, a replica and one Sentinel (quorum 1) run as real processes; a failover is
``SENTINEL FAILOVER``, which demotes the old primary to a replica as an operator's manual
promotion does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from cli_support import one_error_line
from paths_support import FIXTURES

import dueq
from dueq.server import RedisServer, find_redis_server, free_port

SERVICE = "mymaster"
WAIT_S = 30


def wait_for(condition, what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except redis.RedisError:  # a node is changing role: ask again
            pass
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class Sentinel:
    """One redis-server in Sentinel mode watching ``SERVICE`` on ``primary_port``."""

    def __init__(self, primary_port: int) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="dueq-sentinel-"))
        self.port = free_port()
        conf = self.dir / "sentinel.conf"
        conf.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {self.dir}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {primary_port} 1\n"
            f"sentinel down-after-milliseconds {SERVICE} 1000\n"
            f"sentinel failover-timeout {SERVICE} 5000\n",
            encoding="utf-8",
        )
        log = open(self.dir / "sentinel.log", "wb")  # noqa: SIM115 - closed in stop()
        self._log = log
        self.process = subprocess.Popen(
            [find_redis_server(), str(conf), "--sentinel"], stdout=log, stderr=log
        )
        self.client = redis.Redis(host="127.0.0.1", port=self.port, decode_responses=True)
        wait_for(lambda: self.client.ping(), "the Sentinel to start")

    def primary_port(self) -> int:
        _host, port = self.client.sentinel_get_master_addr_by_name(SERVICE)
        return int(port)

    def stop(self) -> None:
        self.client.close()
        self.process.kill()
        self.process.wait()
        self._log.close()


@pytest.fixture
def cluster() -> Iterator[tuple[RedisServer, RedisServer, Sentinel]]:
    primary = RedisServer(extra_args=["--repl-diskless-sync-delay", "0"]).start()
    replica = RedisServer(extra_args=["--replicaof", "127.0.0.1", str(primary.port)]).start()
    wait_for(
        lambda: replica.client().info("replication")["master_link_status"] == "up",
        "the replica to connect",
    )
    sentinel = Sentinel(primary.port)
    yield primary, replica, sentinel
    sentinel.stop()
    replica.stop()
    primary.stop()


def sentinel_url(sentinel: Sentinel) -> str:
    # an unreachable Sentinel first: the client must go on to the next one
    return f"redis+sentinel://127.0.0.1:{free_port()},127.0.0.1:{sentinel.port}/{SERVICE}"


def test_schedule_and_stats_through_sentinel_reach_the_primary(invoke, cluster):
    primary, _replica, sentinel = cluster
    url = sentinel_url(sentinel)
    result = invoke("schedule", "s", '{"a": 1}', "--id", "t1", url=url)
    assert result.exit_code == 0, result.output
    assert primary.client().hexists("dueq:{s}:tasks", "t1")
    stats = invoke("stats", url=url)
    assert stats.exit_code == 0, stats.output
    assert "│ s " in stats.stdout


def test_an_unknown_sentinel_service_is_one_line(invoke, cluster):
    _primary, _replica, sentinel = cluster
    result = invoke("stats", url=f"redis+sentinel://127.0.0.1:{sentinel.port}/nosuch")
    assert result.exit_code == 1
    assert "name no primary" in one_error_line(result)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+sentinel://127.0.0.1:26379", "/service_name"),
        ("redis+sentinel://127.0.0.1:26379/m/x", "/service_name"),
        ("redis+sentinel://127.0.0.1:99999/m", "bad port"),
        ("redis+sentinel://127.0.0.1:1/m?nope=1", "unknown parameter"),
    ],
)
def test_a_bad_sentinel_url_is_one_line(invoke, url, message):
    result = invoke("stats", url=url)
    assert result.exit_code == 1
    line = one_error_line(result)
    assert "bad Redis URL" in line and message in line


def test_wait_replicas_schedules_once_the_replica_has_the_task(invoke, cluster):
    _primary, replica, sentinel = cluster
    url = sentinel_url(sentinel)
    result = invoke("schedule", "s", "1", "--id", "w1", "--wait-replicas", "1", url=url)
    assert result.exit_code == 0, result.output
    assert replica.client().hexists("dueq:{s}:tasks", "w1")  # WAIT returned: no polling


def test_wait_replicas_without_replicas_is_an_error_naming_the_shortfall(invoke, r):
    result = invoke(
        "schedule", "s", "1", "--id", "w1", "--wait-replicas", "1", "--wait-timeout", "0.05"
    )
    assert result.exit_code == 1
    assert "only 0 of 1 replica(s) confirmed" in one_error_line(result)


@pytest.mark.timeout(120)
def test_the_worker_follows_a_sentinel_failover(cluster, tmp_path):
    primary, replica, sentinel = cluster
    url = sentinel_url(sentinel)
    env = {**os.environ, "DUEQ_REDIS_URL": url}
    child = subprocess.Popen(
        [sys.executable, "-m", "dueq", "worker", "f", "cli_handlers:noop", "--lease", "5"],
        cwd=FIXTURES,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(  # Sentinel learns of replicas from the primary's INFO, every 10 s
            lambda: len(sentinel.client.sentinel_slaves(SERVICE)) == 1,
            "the Sentinel to see the replica",
        )
        before = dueq.Queue("f", primary.client())
        before.schedule_many(dueq.Task({}, id=f"a{n}") for n in range(10))
        wait_for(lambda: before.stats().counters.get("acked", 0) == 10, "10 acks before")
        sentinel.client.execute_command("SENTINEL", "FAILOVER", SERVICE)
        wait_for(lambda: sentinel.primary_port() == replica.port, "the failover")
        wait_for(lambda: replica.client().info("replication")["role"] == "master", "the promotion")
        after = dueq.Queue("f", replica.client())
        after.schedule_many(dueq.Task({}, id=f"b{n}") for n in range(10))
        # the worker waits out the failover (backoff up to 5 s, heartbeat claims every 5 s)
        try:
            wait_for(lambda: after.stats().counters.get("acked", 0) == 20, "10 acks after", 90)
        except AssertionError:  # say what the worker saw
            child.kill()
            _, err = child.communicate()
            raise AssertionError(
                f"10 acks after the failover never came; worker: {err[-3000:]}"
            ) from None
        child.terminate()
        out, err = child.communicate(timeout=WAIT_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 0, err
    assert out == "" and err.count("worker stopped: {'acked': 20}") == 1, err


def test_a_worker_with_wait_replicas_acks_and_logs_a_replica_shortfall(r, redis_server):
    q = dueq.Queue("wr", r)
    q.schedule_many(dueq.Task({}, id=f"t{n}") for n in range(3))
    env = {**os.environ, "DUEQ_REDIS_URL": redis_server.url}
    options = ["--wait-replicas", "1", "--wait-timeout", "0.05"]
    child = subprocess.Popen(
        [sys.executable, "-m", "dueq", "worker", "wr", "cli_handlers:record", *options],
        cwd=FIXTURES,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: q.stats().counters.get("acked", 0) == 3, "3 acks")
        child.terminate()
        out, err = child.communicate(timeout=WAIT_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 0, err
    assert out == "" and err.count("worker stopped: {'acked': 3}") == 1, err
    assert "only 0 of 1 replica(s) confirmed" in err
