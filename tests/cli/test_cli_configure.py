"""dueq pause / resume / configure: a queue's settings in Redis, from the command line."""

from __future__ import annotations

from datetime import timedelta

import pytest

import dueq


@pytest.fixture(autouse=True)
def jobs(r):
    """Queue "jobs" exists (a task is scheduled): settings of a queue that does not are
    refused without --create (tests/cli/test_cli_surface.py)."""
    dueq.Queue("jobs", r).schedule({}, id="first", delay=3600)


def test_pause_and_resume_change_what_every_worker_may_claim(invoke, r):
    q = dueq.Queue("jobs", r)
    q.schedule({}, id="a")
    result = invoke("pause", "jobs")
    assert result.exit_code == 0, result.output
    assert "queue 'jobs': paused" in result.output
    assert q.claim(10) == [] and q.settings().paused
    assert "(paused)" in invoke("stats", "jobs").output
    result = invoke("resume", "jobs")
    assert result.exit_code == 0 and "queue 'jobs': running" in result.output
    assert [d.id for d in q.claim(10)] == ["a"]


def test_a_queue_may_be_paused_before_anything_was_scheduled(invoke, r):
    assert invoke("pause", "later", "--create").exit_code == 0
    q = dueq.Queue("later", r)
    q.schedule({}, id="a")
    assert q.claim(10) == []
    assert invoke("stats", "later").exit_code == 0  # its settings make it a known queue


def test_configure_shows_and_sets_remember_done_for_every_process(invoke, r):
    shown = "rate off; key_rate off; key_concurrency off; remember_done off"
    assert shown in invoke("configure", "jobs").output
    result = invoke("configure", "jobs", "--remember-done", "3600")
    assert result.exit_code == 0 and "remember_done 1.0 h" in result.output
    assert dueq.Queue("jobs", r).settings().remember_done == timedelta(hours=1)
    result = invoke("configure", "jobs", "--remember-done", "0", "--paused")
    assert "paused; rate off; key_rate off; key_concurrency off; remember_done off" in result.output


def test_configure_sets_and_removes_the_per_key_limits(invoke, r):
    result = invoke("configure", "jobs", "--key-rate", "5/2", "--key-concurrency", "3")
    assert result.exit_code == 0, result.output
    assert "key_rate 5/2s; key_concurrency 3" in result.output
    settings = dueq.Queue("jobs", r).settings()
    assert (settings.key_rate, settings.key_concurrency) == (dueq.Rate(5, per=2), 3)
    result = invoke("configure", "jobs", "--key-rate", "off", "--key-concurrency", "off")
    assert "key_rate off; key_concurrency off" in result.output


def test_configure_refuses_a_bad_key_concurrency_before_writing(invoke, r):
    for bad in ("0", "x", "-1"):
        result = invoke("configure", "jobs", "--key-concurrency", bad)
        assert result.exit_code == 2 and "--key-concurrency" in result.output
    result = invoke("configure", "jobs", "--key-rate", "5/0")
    assert result.exit_code == 2 and "--key-rate" in result.output
    assert not r.exists(dueq.Queue("jobs", r).keys.config)  # nothing written


def test_configure_refuses_a_negative_window_before_writing(invoke, r):
    result = invoke("configure", "jobs", "--remember-done", "-5")
    assert result.exit_code == 2 and "--remember-done" in result.output
    assert not r.exists(dueq.Queue("jobs", r).keys.config)  # nothing written


def test_configure_sets_and_removes_a_rate(invoke, r):
    result = invoke("configure", "jobs", "--rate", "20/0.5")
    assert result.exit_code == 0 and "rate 20/0.5s" in result.output
    assert dueq.Queue("jobs", r).settings().rate == dueq.Rate(20, per=0.5)
    assert "rate off" in invoke("configure", "jobs", "--rate", "off").output
    for bad in ("fast", "0/1", "5/0", "5/x"):
        result = invoke("configure", "jobs", "--rate", bad)
        assert result.exit_code == 2 and "--rate" in result.output, bad
