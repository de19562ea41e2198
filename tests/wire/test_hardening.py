"""Defects found by attacking dueq (issue 11), one test each: hostile input through the public
API, and corrupted data written straight into Redis. Each failed before its fix."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta, timezone

import pytest
import redis

import dueq
from dueq._wire.envelope import MAX_PAYLOAD_DEPTH

K = "dueq:{q}:"


def _nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


# -- item 1: a deep payload ----------------------------------------------------------------


def test_a_payload_nested_a_thousand_deep_is_refused_at_schedule(make_queue, r):
    q = make_queue()
    with pytest.raises(dueq.PayloadError, match="nests deeper"):
        q.schedule(_nested(1000))
    assert r.dbsize() == 0


def test_a_payload_at_the_depth_limit_is_scheduled_and_delivered(make_queue):
    q = make_queue()
    q.schedule(_nested(MAX_PAYLOAD_DEPTH - 1), id="deep")
    [d] = q.claim()
    assert d.id == "deep"


def test_brackets_inside_strings_do_not_count_as_nesting(make_queue):
    q = make_queue()
    q.schedule({"text": "[" * 5000 + "{" * 5000}, id="brackets")
    [d] = q.claim()
    assert d.payload["text"].startswith("[[[")


def test_a_stored_deep_payload_goes_dead_and_the_rest_of_its_batch_is_delivered(make_queue, r):
    q = make_queue()
    for i in range(5):
        q.schedule({"n": i}, id=f"good{i}")
    q.schedule("placeholder", id="deep")
    r.hset(K + "tasks", "deep", b"1:" + b"[" * 100_000 + b"]" * 100_000)
    delivered = {d.id for d in q.claim(limit=10)}
    assert delivered == {f"good{i}" for i in range(5)}
    info = q.get("deep")
    assert info is not None and info.state == "dead"
    assert "nests deeper" in info.errors[-1].message


# -- item 3: before 1970, and absurd times -------------------------------------------------


@pytest.mark.parametrize(
    "at",
    [
        datetime(1969, 12, 31, 23, 59, tzinfo=timezone.utc),
        datetime(1, 1, 1, tzinfo=timezone.utc),
        datetime.max.replace(tzinfo=timezone(timedelta(hours=-1))),
    ],
    ids=["1969", "year-1", "past-9999"],
)
def test_a_due_time_outside_1970_to_9999_is_refused(make_queue, r, at):
    q = make_queue()
    with pytest.raises(dueq.InvalidTaskError, match="outside 1970"):
        q.schedule("x", at=at)
    with pytest.raises(dueq.InvalidTaskError):
        q.schedule_many([dueq.Task("ok", id="a"), dueq.Task("x", at=at)])
    assert r.dbsize() == 0


def test_the_epoch_itself_is_a_valid_due_time_and_the_task_is_due_at_once(make_queue):
    q = make_queue()
    q.schedule("x", at=datetime(1970, 1, 1, tzinfo=timezone.utc), id="epoch")
    [d] = q.claim()
    d.ack()
    assert q.get("epoch") is None


@pytest.mark.parametrize("delay", [10**400, 10**20, 1e15, timedelta(days=999_999)])
def test_a_delay_beyond_a_hundred_years_is_an_invalid_task_not_an_overflow(make_queue, r, delay):
    q = make_queue()
    with pytest.raises(dueq.InvalidTaskError, match="too large"):
        q.schedule("x", delay=delay)
    assert r.dbsize() == 0


@pytest.mark.parametrize("value", [10**400, 1e300])
def test_huge_durations_for_retry_in_extend_and_release_are_refused_and_lease_kept(
    make_queue, value
):
    q = make_queue()
    q.schedule("x", id="t")
    [d] = q.claim()
    with pytest.raises(dueq.InvalidTaskError):
        d.fail(RuntimeError("boom"), retry_in=value)
    with pytest.raises(dueq.ConfigurationError):
        d.extend(value)
    with pytest.raises(dueq.InvalidTaskError):
        d.release(delay=value)
    d.ack()  # still held: nothing above touched it


@pytest.mark.parametrize("value", [10**400, 1e300])
def test_huge_queue_settings_are_configuration_errors(r, value):
    for setting in ("lease", "dead_max_age", "remember_done", "wait_timeout"):
        with pytest.raises(dueq.ConfigurationError):
            dueq.Queue("q", r, **{setting: value})


# -- item 12: lone surrogates --------------------------------------------------------------


def test_a_lone_surrogate_id_is_an_invalid_task_in_every_method(make_queue, r):
    q = make_queue()
    bad = "\ud800"
    with pytest.raises(dueq.InvalidTaskError, match="not valid Unicode"):
        q.schedule("x", id=bad)
    with pytest.raises(dueq.InvalidTaskError):
        q.cancel(bad)
    with pytest.raises(dueq.InvalidTaskError):
        q.get(bad)
    with pytest.raises(dueq.InvalidTaskError):
        q.reschedule(bad, delay=1)
    with pytest.raises(dueq.InvalidTaskError):
        q.dead.replay([bad])
    with pytest.raises(dueq.InvalidTaskError):
        q.dead.purge([bad])
    assert r.dbsize() == 0


def test_a_payload_with_a_lone_surrogate_is_a_payload_error(make_queue, r):
    q = make_queue()
    with pytest.raises(dueq.PayloadError):
        q.schedule({"text": "a\udfffb"})
    assert r.dbsize() == 0


# -- item 6: a script that fails half way must not keep its earlier writes --------------------


@pytest.mark.parametrize("counter", ["claimed", "lease_seq", "expired", "dead"])
def test_a_corrupted_counter_never_fails_a_claim(make_queue, r, clock, counter):
    q = make_queue()
    for i in range(6):
        q.schedule({"n": i}, id=f"t{i}")
    r.hset(K + "stats", counter, "not-a-number")
    deliveries = q.claim(limit=10)
    assert len(deliveries) == 6
    for d in deliveries:
        d.ack()
    assert q.stats().scheduled == 0 and q.stats().leased == 0


@pytest.mark.parametrize("counter", ["acked", "retried", "released", "cancelled", "scheduled"])
def test_a_corrupted_counter_never_fails_a_settle_and_is_restarted(make_queue, r, counter):
    q = make_queue()
    r.hset(K + "stats", counter, "1.5")
    for i in range(4):
        q.schedule({"n": i}, id=f"t{i}")
    a, b, c, d = q.claim(limit=4)
    a.ack()
    b.fail(RuntimeError("x"))
    c.release()
    q.cancel(d.id)
    stats = q.stats()
    assert stats.counters[counter] >= 1
    assert q.get("t0") is None and q.get("t3") is None


def test_a_counter_near_the_integer_limit_does_not_fail_the_ack(make_queue, r):
    q = make_queue()
    r.hset(K + "stats", "acked", str(2**63 - 1))
    q.schedule("x", id="t")
    [d] = q.claim()
    d.ack()
    assert q.get("t") is None


def test_stats_reads_corrupted_counters_as_zero(make_queue, r):
    q = make_queue()
    q.schedule("x")
    r.hset(K + "stats", mapping={"acked": "abc", "retried": "9" * 40})
    stats = q.stats()
    assert stats.counters["acked"] == 0
    assert stats.scheduled == 1


# -- item 7: corrupted scores and error histories ------------------------------------------


@pytest.mark.parametrize("score", [1.5, float("-inf"), -1e20])
def test_a_corrupted_due_score_is_delivered_and_read_without_crashing(make_queue, r, score):
    q = make_queue()
    q.schedule("x", id="bad", delay=5)
    q.schedule("y", id="good")
    r.zadd(K + "due", {"bad": score})
    info = q.get("bad")
    assert info is not None and info.state == "scheduled"
    deliveries = {d.id: d for d in q.claim(limit=10)}
    assert set(deliveries) == {"bad", "good"}
    assert deliveries["bad"].due_at == datetime(1970, 1, 1, tzinfo=timezone.utc) or score == 1.5
    for d in deliveries.values():
        d.ack()


def test_a_due_score_far_past_year_9999_is_shown_without_a_due_time(make_queue, r):
    q = make_queue()
    q.schedule("x", id="far", delay=5)
    r.zadd(K + "due", {"far": 1e300})
    info = q.get("far")
    assert info is not None and info.state == "scheduled" and info.due_at is None
    assert q.stats().next_due_at is not None


@pytest.mark.parametrize("score", [1.5, 1e300, float("-inf")])
def test_corrupted_dead_scores_never_crash_the_dead_letter_readers(make_queue, r, score):
    q = make_queue(retry=dueq.RetryPolicy(max_attempts=1))
    for task_id in ("a", "b"):
        q.schedule("x", id=task_id)
    for d in q.claim():
        d.fail(RuntimeError("boom"))
    r.zadd(K + "dead", {"a": score})
    listed = {info.id: info for info in q.dead.list()}
    assert set(listed) == {"a", "b"}
    assert listed["b"].died_at is not None
    assert q.get("a") is not None
    assert q.dead.replay(["a"]) == 1


@pytest.mark.parametrize(
    "history",
    [
        "5",
        "[]",
        '[{"attempt":"x"}]',
        '[{"at":1e20,"attempt":1,"type":"E","message":"m"}]',
        '[{"attempt":null,"type":5,"message":["m"],"traceback":7}]',
        '{"not":"a list"}',
        "[" * 5000,
        "\xff\xfe garbage",
    ],
)
def test_corrupted_error_histories_are_read_and_appended_to_without_crashing(
    make_queue, r, history
):
    q = make_queue()
    q.schedule("x", id="t")
    r.hset(K + "errors", "t", history)
    info = q.get("t")
    assert info is not None
    [d] = q.claim()
    d.fail(RuntimeError("after corruption"))
    errors = q.get("t").errors
    assert errors[-1].type == "RuntimeError" and errors[-1].message == "after corruption"
    stored = r.hget(K + "errors", "t")
    assert isinstance(json.loads(stored), list)  # the stored history is valid JSON again


# -- item 13: attempts -------------------------------------------------------------------


def test_lowering_max_attempts_buries_a_task_that_already_had_them(make_queue, r, clock):
    q5 = make_queue(retry=dueq.RetryPolicy(max_attempts=5, wait=lambda s: 1.0))
    q5.schedule("x", id="t")
    for _ in range(3):
        [d] = q5.claim()
        d.fail(RuntimeError("again"))
        clock.advance(2)
    q2 = make_queue(retry=dueq.RetryPolicy(max_attempts=2, wait=lambda s: 1.0))
    assert q2.claim() == []
    info = q2.get("t")
    assert info is not None and info.state == "dead"
    assert info.errors[-1].type == "AttemptsExhausted"
    assert info.attempt == 3


@pytest.mark.parametrize("meta", ["99999999999999999999|||", "12|tok|abc|", "garbage", "|||"])
def test_an_unreadable_attempt_record_sends_only_that_task_to_dead(make_queue, r, meta):
    q = make_queue()
    q.schedule("x", id="bad")
    q.schedule("y", id="good")
    r.hset(K + "meta", "bad", meta)
    assert [d.id for d in q.claim(limit=10)] == ["good"]
    info = q.get("bad")
    assert info is not None and info.state == "dead"
    assert info.errors[-1].type == "CorruptTask"


def test_an_unreadable_attempt_record_of_an_expired_lease_goes_dead(make_queue, r, clock):
    q = make_queue()
    q.schedule("x", id="t")
    q.claim()
    r.hset(K + "meta", "t", "not|a|meta")
    clock.advance(60)
    assert q.claim() == []
    info = q.get("t")
    assert info is not None and info.state == "dead" and info.errors[-1].type == "CorruptTask"


# -- item 9: tasks whose data was evicted ---------------------------------------------------


def test_evicted_task_data_is_reported_by_stats_and_logged_when_claimed(
    make_queue, admin, caplog: pytest.LogCaptureFixture
):
    q = make_queue()
    q.schedule_many(dueq.Task({"n": i}) for i in range(50))
    admin.delete(K + "tasks")  # what allkeys-lru did to the whole hash
    assert q.stats().missing == 50
    with caplog.at_level(logging.ERROR, logger="dueq.queue"):
        assert q.claim(limit=100) == []
    assert "50 due task(s) had no stored data" in caplog.text
    stats = q.stats()
    assert stats.scheduled == 0 and stats.missing == 0
    assert stats.counters["dropped"] == 50


def test_a_healthy_queue_reports_nothing_missing(make_queue):
    q = make_queue()
    q.schedule_many(dueq.Task({"n": i}) for i in range(5))
    q.claim(limit=2)
    assert q.stats().missing == 0


def test_a_claim_reply_never_holds_a_non_integer_time(redis_server, r: redis.Redis, clock):
    client = redis_server.client(decode_responses=True)
    q = dueq.Queue("q", client, clock=clock)
    q.schedule("x", id="t", delay=1)
    r.zadd(K + "due", {"t": 0.25})
    batch = q.claim_batch()
    client.close()
    assert [d.id for d in batch.deliveries] == ["t"]
    assert batch.next_due_ms is None
