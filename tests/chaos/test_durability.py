"""No acknowledged schedule is lost when Redis restarts with AOF on (guarantee 7)."""

from __future__ import annotations

import pytest
import redis

import dueq
from dueq.server import RedisServer, free_port


@pytest.mark.parametrize("kill", [False, True], ids=["shutdown", "sigkill"])
def test_acknowledged_schedules_survive_a_redis_restart_with_aof(kill):
    with RedisServer(appendonly=True) as server:
        client = server.client()
        q = dueq.Queue("durable", client)
        ids = q.schedule_many(dueq.Task({"n": i}, delay=3600) for i in range(1000)).ids
        q.schedule("now", id="leased-one")
        [d] = q.claim()
        client.close()
        server.restart(kill=kill)
        client = server.client()
        q = dueq.Queue("durable", client)
        assert q.stats().scheduled == 1000
        assert q.get(ids[123]).payload == {"n": 123}
        assert q.get("leased-one").state == "leased"
        q.ack_many([d])  # the lease survived too: its holder can still ack after the restart
        client.close()


def test_connection_errors_pass_through_unwrapped():
    client = redis.Redis(port=free_port(), socket_connect_timeout=0.5)
    q = dueq.Queue("down", client)
    with pytest.raises(redis.exceptions.ConnectionError) as caught:
        q.schedule("x")
    assert not isinstance(caught.value, dueq.DueqError)
    with pytest.raises(redis.exceptions.ConnectionError):
        q.claim()


def test_eviction_policy_warning(make_queue, r, caplog):
    r.config_set("maxmemory-policy", "allkeys-lru")
    try:
        make_queue().claim()
    finally:
        r.config_set("maxmemory-policy", "noeviction")
    assert any("noeviction" in rec.getMessage() for rec in caplog.records)
