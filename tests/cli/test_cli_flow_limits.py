"""dueq configure --concurrency / --key-limit, and what dueq configure and dueq stats show."""

from __future__ import annotations

import json

import pytest

import dueq


@pytest.fixture(autouse=True)
def jobs(r):
    """Queue "jobs" exists (a task is scheduled)."""
    dueq.Queue("jobs", r).schedule({}, id="first", delay=3600)


def test_configure_sets_shows_and_removes_the_concurrency_cap(invoke, r):
    q = dueq.Queue("jobs", r)
    result = invoke("configure", "jobs", "--concurrency", "2")
    assert result.exit_code == 0, result.output
    assert "concurrency 2" in result.output
    assert q.settings().concurrency == 2
    q.schedule_many(dueq.Task({}) for _ in range(5))
    assert len(q.claim(10)) == 2
    assert "2/2" in invoke("stats", "jobs").output  # leased against the cap
    document = json.loads(invoke("stats", "jobs", "--json").output)
    assert document["queues"][0]["settings"]["concurrency"] == 2
    result = invoke("configure", "jobs", "--concurrency", "off")
    assert result.exit_code == 0 and "concurrency off" in result.output
    assert q.settings().concurrency is None


def test_configure_sets_shows_and_removes_key_limits(invoke, r):
    q = dueq.Queue("jobs", r)
    result = invoke(
        "configure",
        "jobs",
        "--key-limit",
        "tenant:big=concurrency:5,rate:50/1",
        "--key-limit",
        "tenant:small=concurrency:1",
    )
    assert result.exit_code == 0, result.output
    assert "key 'tenant:big': concurrency 5, rate 50/1s" in result.output
    assert q.settings().key_limits == {
        "tenant:big": dueq.KeyLimit(concurrency=5, rate=dueq.Rate(50, per=1)),
        "tenant:small": dueq.KeyLimit(concurrency=1),
    }
    assert "tenant:small" in invoke("configure", "jobs").output
    result = invoke("configure", "jobs", "--key-limit", "tenant:small=off")
    assert result.exit_code == 0, result.output
    assert list(q.settings().key_limits) == ["tenant:big"]


@pytest.mark.parametrize(
    "bad",
    ["nokey", "=concurrency:1", "k=concurrency:0", "k=speed:3", "k=rate:x", "k=", "k=rate:1/0"],
)
def test_configure_refuses_a_bad_key_limit_before_writing(invoke, r, bad):
    result = invoke("configure", "jobs", "--key-limit", bad)
    assert result.exit_code == 2, result.output
    assert "--key-limit" in result.output
    assert dueq.Queue("jobs", r).settings().key_limits == {}


def test_configure_refuses_a_bad_concurrency_before_writing(invoke, r):
    result = invoke("configure", "jobs", "--concurrency", "0")
    assert result.exit_code == 2 and "--concurrency" in result.output
    assert dueq.Queue("jobs", r).settings().concurrency is None
