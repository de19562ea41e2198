"""Fixtures: one real redis-server per test session, on a free loopback port.

``DUEQ_TEST_TLS=1`` makes that server TLS-only with a throwaway CA, and every client from
``redis_server.client()`` or ``redis_server.url`` verifies its certificate (tests/test_tls.py
runs the core, consumer and cron tests this way).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

import dueq
from dueq.cli import cli
from dueq.server import RedisServer


class ManualClock:
    """A clock the test moves by hand (epoch seconds)."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


TLS = os.environ.get("DUEQ_TEST_TLS") == "1"


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer(tls=TLS).start()
    yield server
    server.stop()


@pytest.fixture
def r(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client()
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def make_queue(r: redis.Redis, clock: ManualClock) -> Callable[..., dueq.Queue]:
    """Build a queue on the test's Redis; the manual clock unless clock=None is passed."""

    def make(name: str = "q", **kwargs: Any) -> dueq.Queue:
        kwargs.setdefault("clock", clock)
        kwargs.setdefault("retry", dueq.RetryPolicy(max_attempts=3, wait=lambda state: 10.0))
        return dueq.Queue(name, kwargs.pop("client", r), **kwargs)

    return make


@pytest.fixture
def invoke(r: redis.Redis, redis_server: RedisServer) -> Callable[..., Result]:
    """Run ``dueq ARGS`` in-process (click's CliRunner); DUEQ_REDIS_URL is the test server."""

    def run(*args: str, input: str | None = None, url: str | None = None) -> Result:
        env = {"DUEQ_REDIS_URL": url or redis_server.url, "COLUMNS": "200"}
        return CliRunner().invoke(cli, list(args), input=input, env=env)

    return run
