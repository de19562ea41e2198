"""Bad input gets a typed dueq error and writes nothing (guarantee 8)."""

from __future__ import annotations

import math
from datetime import datetime

import pytest
import redis

import dueq


@pytest.fixture
def q(make_queue):
    return make_queue(max_payload_bytes=1000)


def _nothing_written(r: redis.Redis) -> bool:
    return r.dbsize() == 0


@pytest.mark.parametrize(
    "payload",
    [object(), {1, 2}, {"x": math.nan}, {"x": math.inf}, b"bytes", {"k": object()}],
    ids=["object", "set", "nan", "inf", "bytes", "nested"],
)
def test_payload_that_is_not_json_is_refused(q, r, payload):
    with pytest.raises(dueq.PayloadError):
        q.schedule(payload)
    assert _nothing_written(r)


def test_payload_over_the_size_limit_is_refused(q, r):
    with pytest.raises(dueq.PayloadError, match="over the limit"):
        q.schedule({"blob": "x" * 2000})
    assert _nothing_written(r)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"at": datetime(2030, 1, 1)}, "naive"),
        ({"delay": -1}, "negative"),
        ({"delay": math.nan}, "finite"),
        ({"delay": math.inf}, "finite"),
        ({"delay": "10"}, "seconds"),
        ({"id": ""}, "empty"),
        ({"id": "x" * 513}, "longer"),
        ({"id": 42}, "str"),
        ({"delay": 1, "at": datetime(2030, 1, 1).astimezone()}, "not both"),
    ],
)
def test_bad_timing_or_id_is_refused(q, r, kwargs, match):
    with pytest.raises(dueq.InvalidTaskError, match=match):
        q.schedule("payload", **kwargs)
    assert _nothing_written(r)


def test_one_bad_task_in_a_batch_writes_nothing(q, r):
    tasks = [dueq.Task(i) for i in range(2500)] + [dueq.Task({"bad": object()})]
    with pytest.raises(dueq.PayloadError, match="task 2500"):
        q.schedule_many(tasks)
    assert _nothing_written(r)
    with pytest.raises(dueq.InvalidTaskError):
        q.schedule_many([dueq.Task(1), {"not": "a Task"}])  # type: ignore[list-item]
    assert _nothing_written(r)


def test_errors_are_catchable_by_builtin_bases(q):
    with pytest.raises(ValueError):
        q.schedule(object())
    with pytest.raises(ValueError):
        q.schedule(1, delay=-5)
    assert issubclass(dueq.TaskNotFound, LookupError)
    assert all(
        issubclass(e, dueq.DueqError)
        for e in (
            dueq.ConfigurationError,
            dueq.InvalidTaskError,
            dueq.PayloadError,
            dueq.TaskNotFound,
            dueq.LeaseLost,
            dueq.Unrecoverable,
        )
    )


@pytest.mark.parametrize("name", ["", "a{b}", " padded", "tab\tname", "x" * 201, 7])
def test_bad_queue_names_are_configuration_errors(r, name):
    with pytest.raises(dueq.ConfigurationError):
        dueq.Queue(name, r)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"lease": 0},
        {"lease": -3},
        {"lease": math.nan},
        {"max_payload_bytes": 0},
        {"dead_max_count": 0},
        {"retry": "fast"},
        {"clock": 5},
    ],
)
def test_bad_queue_settings_are_configuration_errors(r, kwargs):
    with pytest.raises(dueq.ConfigurationError):
        dueq.Queue("q", r, **kwargs)


def test_not_a_redis_client_is_a_configuration_error():
    with pytest.raises(dueq.ConfigurationError):
        dueq.Queue("q", "redis://localhost")  # type: ignore[arg-type]


@pytest.mark.parametrize("limit", [-1, 1001, 2.5, True])
def test_claim_limit_out_of_range_is_refused(q, limit):
    with pytest.raises(dueq.ConfigurationError):
        q.claim(limit=limit)


def test_reschedule_without_a_time_is_refused(q):
    tid = q.schedule(1, delay=10)
    with pytest.raises(dueq.InvalidTaskError):
        q.reschedule(tid)
    with pytest.raises(dueq.InvalidTaskError):
        q.reschedule(tid, delay=-1)


def test_bad_extend_and_release_values_are_refused_and_lease_kept(q):
    q.schedule(1, id="a")
    [d] = q.claim()
    with pytest.raises(dueq.ConfigurationError):
        d.extend(0)
    with pytest.raises(dueq.InvalidTaskError):
        d.release(delay=-1)
    with pytest.raises(dueq.InvalidTaskError):
        d.fail(RuntimeError("x"), retry_in=math.nan)
    assert q.get("a").state == "leased"
    d.ack()
