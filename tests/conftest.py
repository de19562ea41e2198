"""Fixtures: one real redis-server per test session, on a free loopback port.

``DUEQ_TEST_TLS=1`` makes that server TLS-only with a throwaway CA, and every client from
``redis_server.client()`` or ``redis_server.url`` verifies its certificate (tests/test_tls.py
runs the core, consumer and cron tests this way).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from async_support import Blocking
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


@pytest.fixture(params=["sync", "async"])
def front_end(request: pytest.FixtureRequest) -> str:
    """Which front end a contract test runs on: ``Queue`` or ``AsyncQueue``."""
    return str(request.param)


@pytest.fixture
def make_queue(
    r: redis.Redis, clock: ManualClock, front_end: str, redis_server: RedisServer
) -> Iterator[Callable[..., Any]]:
    """Build a queue on the test's Redis; the manual clock unless clock=None is passed.

    The contract tests that use it run on both front ends: an ``AsyncQueue`` comes wrapped in
    ``Blocking`` (each awaitable driven on the test's own event loop), so one test body checks
    both. ``client=`` passes a blocking client; it is used as is (sync) or mirrored (async).
    """
    loop = asyncio.new_event_loop() if front_end == "async" else None
    clients: list[Any] = []

    def make(name: str = "q", **kwargs: Any) -> Any:
        kwargs.setdefault("clock", clock)
        kwargs.setdefault("retry", dueq.RetryPolicy(max_attempts=3, wait=lambda state: 10.0))
        client = kwargs.pop("client", r)
        if loop is None:
            return dueq.Queue(name, client, **kwargs)
        kw = client.connection_pool.connection_kwargs
        tls = {k: kw[k] for k in ("ssl_ca_certs", "ssl_cert_reqs", "ssl_check_hostname") if k in kw}
        aclient = redis.asyncio.Redis(
            host=kw.get("host", "127.0.0.1"),
            port=kw.get("port", redis_server.port),
            username=kw.get("username"),
            password=kw.get("password"),
            decode_responses=kw.get("decode_responses", False),
            **({"ssl": True, **tls} if kw.get("ssl_ca_certs") else {}),
        )
        clients.append(aclient)
        return Blocking(dueq.AsyncQueue(name, aclient, **kwargs), loop)

    yield make
    if loop is not None:
        for aclient in clients:
            loop.run_until_complete(aclient.aclose())
        loop.close()


@pytest.fixture
def invoke(r: redis.Redis, redis_server: RedisServer) -> Callable[..., Result]:
    """Run ``dueq ARGS`` in-process (click's CliRunner); DUEQ_REDIS_URL is the test server."""

    def run(*args: str, input: str | None = None, url: str | None = None) -> Result:
        env = {"DUEQ_REDIS_URL": url or redis_server.url, "COLUMNS": "200"}
        return CliRunner().invoke(cli, list(args), input=input, env=env)

    return run
