"""dueq over TLS: a TLS-only redis-server with a throwaway CA and certificate checks on.

The direct tests talk to their own ``RedisServer(tls=True)``. The last test runs the core,
consumer and cron test files again in a pytest subprocess with ``DUEQ_TEST_TLS=1``, in which
the session server (tests/conftest.py) is TLS-only and every client verifies its certificate.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from paths_support import module_path

import dueq
from dueq.server import RedisServer

TLS = os.environ.get("DUEQ_TEST_TLS") == "1"  # the mode tests/conftest.py runs in
#: The core, consumer and cron tests that run again over TLS.
TLS_SUITE = [
    "test_claim.py",
    "test_schedule.py",
    "test_observe.py",
    "test_process.py",
    "test_worker.py",
    "test_cron.py",
    "test_dead.py",
    "test_retry.py",
]


@pytest.fixture(scope="module")
def tls_server():
    with RedisServer(tls=True) as server:
        yield server


def test_a_tls_server_serves_tls_only_and_names_its_ca(tls_server):
    client = tls_server.client()
    assert client.config_get("port") == {"port": "0"}  # no plain-text listener
    assert client.config_get("tls-port") == {"tls-port": str(tls_server.port)}
    assert tls_server.url.startswith("rediss://127.0.0.1:")
    assert f"ssl_ca_certs={tls_server.ca_file}" in tls_server.url
    client.close()


def test_a_client_without_the_ca_fails_certificate_verification(tls_server):
    unverified = redis.Redis(host="127.0.0.1", port=tls_server.port, ssl=True)
    with pytest.raises(redis.ConnectionError, match=r"(?i)certificate verify failed"):
        dueq.Queue("tls", unverified).schedule({"n": 1})
    unverified.close()


def test_a_plain_text_client_cannot_talk_to_the_tls_port(tls_server):
    plain = redis.Redis(host="127.0.0.1", port=tls_server.port, socket_timeout=2)
    with pytest.raises(redis.ConnectionError):
        plain.ping()
    plain.close()


def test_schedule_claim_and_ack_work_over_verified_tls(tls_server):
    client = redis.Redis.from_url(tls_server.url)  # rediss:// with the CA: checks are on
    q = dueq.Queue("tls", client)
    tid = q.schedule({"to": "a@example.com"})
    [d] = q.claim()
    assert (d.id, d.payload) == (tid, {"to": "a@example.com"})
    d.ack()
    assert q.get(tid) is None
    assert q.stats().counters["acked"] == 1
    client.close()


def test_the_session_server_follows_the_tls_mode(redis_server, r):
    """Run in the TLS subprocess below too, so it proves that run really used TLS."""
    assert redis_server.tls is TLS
    assert redis_server.url.startswith("rediss://" if TLS else "redis://")
    assert r.connection_pool.connection_kwargs.get("ssl_ca_certs") == (
        str(redis_server.ca_file) if TLS else None
    )
    assert r.ping()


@pytest.mark.timeout(900)
@pytest.mark.skipif(TLS, reason="this test starts the TLS run itself")
def test_core_consumer_and_cron_tests_pass_against_a_tls_only_server():
    files = [str(module_path(name)) for name in TLS_SUITE]  # each must exist: none is dropped
    files.append(f"{Path(__file__)}::test_the_session_server_follows_the_tls_mode")
    env = {**os.environ, "DUEQ_TEST_TLS": "1"}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=880)
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert "passed" in summary and "failed" not in summary and "error" not in summary
