"""The throwaway local redis-server used by tests, examples and the demo."""

from __future__ import annotations

import os

import redis

from dueq.server import RedisServer


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
