"""The outcome of each cron definition's last firing (``CronDefinition.last_outcome`` ...),
written by the scripts that settle deliveries, on both front ends against a real Redis."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

import dueq

MINUTE = 60.0


def at(clock: Any) -> datetime:
    return datetime.fromtimestamp(clock.now, UTC)


def every_minute(make_queue: Callable[..., Any], clock: Any, **kwargs: Any) -> Any:
    """A queue with cron "tick" every minute; the clock at the start of a minute."""
    clock.now -= clock.now % 60
    kwargs.setdefault("retry", dueq.RetryPolicy(max_attempts=2, wait=lambda state: 1.0))
    q = make_queue("c", lease=30, **kwargs)
    q.cron.add("tick", "* * * * *", payload={"n": 1})
    return q


def fire(q: Any, clock: Any) -> Any:
    """Move to the next slot and claim its occurrence."""
    clock.advance(MINUTE)
    [d] = q.claim(10)
    return d


def test_an_acked_occurrence_is_the_definitions_last_outcome(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = every_minute(make_queue, clock)
    [fresh] = q.cron.list()
    assert (fresh.last_outcome, fresh.last_outcome_at, fresh.last_success_at) == (None,) * 3
    d = fire(q, clock)
    clock.advance(2)
    d.ack()
    [c] = q.cron.list()
    assert c.last_outcome == "acked"
    assert c.last_occurrence == d.id
    assert c.last_outcome_at == c.last_success_at == at(clock)
    assert c.last_error_type is None
    assert q.cron.get("tick") == c


def test_a_retried_then_dead_occurrence_shows_each_outcome_and_its_error_type(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = every_minute(make_queue, clock)
    d = fire(q, clock)
    d.fail(TimeoutError("smtp"))
    c = q.cron.get("tick")
    assert (c.last_outcome, c.last_occurrence, c.last_error_type) == (
        "retrying",
        d.id,
        "TimeoutError",
    )
    assert c.last_outcome_at == at(clock) and c.last_success_at is None
    clock.advance(1)
    again = [x for x in q.claim(10) if x.id == d.id]
    again[0].fail(KeyError("gone"))
    c = q.cron.get("tick")
    assert (c.last_outcome, c.last_error_type, c.last_outcome_at) == ("dead", "KeyError", at(clock))


def test_an_occurrence_whose_lease_expires_shows_lease_expired(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = every_minute(make_queue, clock, retry=dueq.RetryPolicy(max_attempts=1))
    d = fire(q, clock)
    clock.advance(31)  # the lease (30 s) ran out: the next claim reclaims it; 1 attempt: dead
    q.claim(0)
    c = q.cron.get("tick")
    assert (c.last_outcome, c.last_occurrence, c.last_error_type) == ("dead", d.id, "LeaseExpired")


def test_a_late_failure_of_an_older_firing_keeps_the_newer_firings_outcome(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = every_minute(make_queue, clock, retry=dueq.RetryPolicy(max_attempts=3, wait=lambda s: 5))
    older = fire(q, clock)
    older.fail(ValueError("first try"))  # its retry is due in 5 s
    clock.advance(MINUTE)  # the next slot falls due as well
    retry, newer = sorted(q.claim(10), key=lambda d: d.id)
    assert retry.id == older.id < newer.id
    newer.ack()
    acked_at = at(clock)
    clock.advance(3)
    retry.fail(ValueError("second try"))  # the older firing ends later
    c = q.cron.get("tick")
    assert c.last_occurrence == newer.id and newer.id > older.id
    assert (c.last_outcome, c.last_outcome_at, c.last_error_type) == ("acked", acked_at, None)


def test_a_run_now_occurrence_counts_as_the_latest_firing(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = every_minute(make_queue, clock)
    fire(q, clock).ack()
    clock.advance(5)
    extra = q.cron.run_now("tick")
    [d] = q.claim(10)
    assert d.id == extra
    d.fail(dueq.Unrecoverable("no"))
    c = q.cron.get("tick")
    assert (c.last_outcome, c.last_occurrence) == ("dead", extra)
    assert c.last_success_at == datetime.fromtimestamp(clock.now - 5, UTC)


def test_a_removed_definition_loses_its_record_and_a_late_ack_writes_none(
    make_queue: Callable[..., Any], clock: Any, r: Any
) -> None:
    q = every_minute(make_queue, clock)
    fire(q, clock).ack()
    assert r.hlen(q.keys.cron_last) == 1
    running = fire(q, clock)
    assert q.cron.remove("tick")
    assert r.hlen(q.keys.cron_last) == 0
    running.ack()  # the occurrence runs out after its definition went: nothing is kept
    assert r.exists(q.keys.cron_last) == 0


def test_tasks_with_cron_like_ids_and_no_definition_write_nothing(
    make_queue: Callable[..., Any], clock: Any, r: Any
) -> None:
    q = make_queue("c")
    q.schedule("x", id="cron:ghost:20260101T000000Z")
    q.schedule("y", id="cron:plain")
    for d in q.claim(10):
        d.ack()
    assert r.exists(q.keys.cron_last) == 0


@pytest.mark.parametrize(
    "stored",
    [
        b"not json",
        b"\xff\xfe",
        b"[1, 2]",
        b'{"id": 5, "outcome": "acked", "at": 1}',
        b'{"id": "cron:tick:x", "outcome": "won", "at": 1}',
        b'{"id": "cron:tick:x", "outcome": "dead", "at": -4}',
        b'{"id": "cron:tick:x", "outcome": "dead", "at": 1e300, "ok_at": "soon"}',
        b'{"id": "cron:tick:x", "outcome": "dead", "at": 1, "error_type": ["E"]}',
    ],
)
def test_an_unreadable_record_shows_no_outcome_and_the_next_outcome_replaces_it(
    make_queue: Callable[..., Any], clock: Any, r: Any, stored: bytes
) -> None:
    q = every_minute(make_queue, clock)
    r.hset(q.keys.cron_last, "tick", stored)
    [c] = q.cron.list()
    assert c.problem is None
    assert (c.last_outcome, c.last_outcome_at, c.last_occurrence, c.last_success_at) == (None,) * 4
    d = fire(q, clock)
    d.ack()
    c = q.cron.get("tick")
    assert (c.last_outcome, c.last_occurrence, c.last_success_at) == ("acked", d.id, at(clock))


def test_ordinary_tasks_pay_only_a_byte_test_in_the_settling_scripts() -> None:
    """The ack, fail and claim scripts call cron_note only behind a test of the id's first
    byte (99, "c"), so an ordinary task never parses its id or asks Redis about crons."""
    from importlib.resources import files

    for name in ("ack", "fail", "claim"):
        text = files("dueq._wire").joinpath(f"lua/{name}.lua").read_text()
        lines = [line for line in text.splitlines() if "cron_note(" in line]
        assert lines, name
        source = text.splitlines()
        for line in lines:
            i = source.index(line)
            guard = " ".join(source[max(0, i - 2) : i + 1])
            assert "string.byte(id, 1) == 99" in guard, (name, line)
