"""wait_replicas=N: changes that must survive a failover wait for N replicas (WAIT).

Each test runs on both front ends through ``make_queue`` (``Scripts`` and ``AsyncScripts``
send the script and WAIT in one pipeline each), on a primary of its own with a real replica.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

import dueq
from dueq.server import RedisServer


def _wait_for_link(replica: redis.Redis) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if replica.info("replication").get("master_link_status") == "up":
            return
        time.sleep(0.05)
    raise AssertionError("the replica did not connect to its primary")


def _wait_calls(client: redis.Redis) -> int:
    """How many WAIT commands the server has run so far."""
    return int(client.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))


@pytest.fixture
def primary() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture
def pclient(primary: RedisServer) -> Iterator[redis.Redis]:
    """A client of the primary, closed after the test."""
    client = primary.client()
    yield client
    client.close()


@pytest.fixture
def replica(primary: RedisServer) -> Iterator[RedisServer]:
    server = RedisServer(extra_args=["--replicaof", "127.0.0.1", str(primary.port)]).start()
    client = server.client()
    _wait_for_link(client)
    client.close()
    yield server
    server.stop()


def test_a_schedule_returns_once_a_replica_has_it(
    make_queue: Callable[..., Any], pclient: redis.Redis, replica: RedisServer
):
    q = make_queue("rq", client=pclient, clock=None, wait_replicas=1)
    before = _wait_calls(pclient)
    task_id = q.schedule({"n": 1}, id="t1")
    assert _wait_calls(pclient) == before + 1
    # WAIT returned 1, so the replica has the task already: no polling needed
    with replica.client() as reader:
        assert reader.hexists("dueq:{rq}:tasks", task_id)


def test_a_schedule_no_replica_confirms_raises_replication_timeout_but_is_written(
    make_queue: Callable[..., Any], pclient: redis.Redis, replica: RedisServer
):
    q = make_queue("rq", client=pclient, clock=None, wait_replicas=1, wait_timeout=0.1)
    replica.stop()
    with pytest.raises(dueq.ReplicationTimeout) as caught:
        q.schedule({"n": 1}, id="t1")
    assert (caught.value.confirmed, caught.value.wanted) == (0, 1)
    info = q.get("t1")
    assert info is not None and info.state == "scheduled"
    # scheduling again by id is the safe retry: it adds nothing
    with pytest.raises(dueq.ReplicationTimeout):
        q.schedule({"n": 1}, id="t1")
    assert q.stats().scheduled == 1


@pytest.mark.parametrize(
    ("settle", "after"),
    [("ack", None), ("fail", "scheduled"), ("release", "scheduled")],
)
def test_a_settle_without_replicas_is_made_and_logged_not_raised(
    make_queue: Callable[..., Any],
    pclient: redis.Redis,
    replica: RedisServer,
    caplog: pytest.LogCaptureFixture,
    settle: str,
    after: str | None,
):
    q = make_queue("rq", client=pclient, clock=None, wait_replicas=1, wait_timeout=0.1)
    q.schedule({"n": 1}, id="t1")
    [d] = q.claim()
    replica.stop()
    with caplog.at_level(logging.WARNING, logger="dueq.scripts"):
        if settle == "fail":
            d.fail(RuntimeError("boom"))
        else:
            getattr(d, settle)()
    info = q.get("t1")
    assert (info and info.state) == after
    assert f"{settle}: applied on the primary, but only 0 of 1 replica(s) confirmed" in caplog.text


def test_claims_do_not_wait_for_replicas(
    make_queue: Callable[..., Any], pclient: redis.Redis, replica: RedisServer
):
    q = make_queue("rq", client=pclient, clock=None, wait_replicas=1, wait_timeout=0.1)
    q.schedule({"n": 1}, id="t1")
    replica.stop()
    before = _wait_calls(pclient)
    assert [d.id for d in q.claim()] == ["t1"]
    assert _wait_calls(pclient) == before


@pytest.mark.parametrize("bad", [-1, 101, 1.5, True, "1"])
def test_wait_replicas_must_be_a_small_whole_number(make_queue: Callable[..., Any], bad: object):
    with pytest.raises(dueq.ConfigurationError):
        make_queue("rq", wait_replicas=bad)
