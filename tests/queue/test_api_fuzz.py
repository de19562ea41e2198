"""Property test: every public method, given arbitrary arguments, either works or raises a
dueq error (a DueqError, which also covers ValueError/LookupError for the typed ones), and a
refused call writes nothing.

Arguments are drawn from a pool of hostile values: huge and negative ints, floats including
NaN and infinities, lone surrogates, bytes, naive and extreme datetimes, timedeltas, deep
lists, and objects JSON cannot encode.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dueq


def _nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


hostile = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([10**400, -(10**400), 2**63, -1, 0, 1000, 1001]),
    st.floats(),
    st.sampled_from([math.nan, math.inf, -math.inf, 1e300, -0.0, 5e-324]),
    st.text(max_size=20),
    st.sampled_from(["\ud800", "a\udfffb", "", " ", "x" * 600, "\x1b[31m", "*", "{q}"]),
    st.binary(max_size=20),
    st.datetimes(),
    st.datetimes(timezones=st.just(timezone.utc)),
    st.sampled_from(
        [
            datetime.min.replace(tzinfo=timezone.utc),
            datetime.max.replace(tzinfo=timezone.utc),
            datetime(1969, 7, 20, tzinfo=timezone.utc),
        ]
    ),
    st.timedeltas(),
    st.sampled_from([timedelta.max, timedelta.min, timedelta(0)]),
    st.lists(st.text(max_size=5), max_size=3),
    st.sampled_from([_nested(300), {"k": object()}, {1, 2}, object()]),
)

FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _call(fn: Any, *args: Any, **kwargs: Any) -> bool:
    """True if the call worked; False if it raised a dueq error; anything else fails the test."""
    try:
        fn(*args, **kwargs)
    except dueq.DueqError:
        return False
    return True


@pytest.fixture
def q(r: redis.Redis, clock) -> dueq.Queue:
    return dueq.Queue("f", r, clock=clock)


@FUZZ
@given(payload=hostile, delay=hostile, at=hostile, task_id=hostile, replace=hostile)
def test_schedule_raises_only_dueq_errors_and_a_refusal_writes_nothing(
    q, r, admin, payload, delay, at, task_id, replace
):
    admin.flushall()
    kwargs = {"delay": delay, "at": at, "id": task_id, "replace": replace}
    if not _call(q.schedule, payload, **kwargs):
        assert r.dbsize() == 0
    admin.flushall()
    if not _call(q.schedule_many, [dueq.Task(payload, id=task_id, at=at, delay=delay)]):
        assert r.dbsize() == 0


@FUZZ
@given(task_id=hostile, at=hostile, delay=hostile, limit=hostile, offset=hostile, lease=hostile)
def test_readers_and_movers_raise_only_dueq_errors(
    q, admin, task_id, at, delay, limit, offset, lease
):
    admin.flushall()
    q.schedule({"n": 1}, id="known")
    _call(q.get, task_id)
    _call(q.cancel, task_id)
    _call(q.reschedule, task_id, at=at, delay=delay)
    _call(q.reschedule, "known", at=at, delay=delay)
    _call(q.claim, limit)
    _call(q.claim_batch, 1, lease=lease)
    _call(q.dead.list, limit, offset)
    _call(q.dead.replay, task_id)
    _call(q.dead.purge, task_id)
    _call(q.dead.replay, [task_id])
    _call(q.dead.purge, [task_id])
    q.stats()


@FUZZ
@given(retry_in=hostile, seconds=hostile, delay=hostile, error=hostile)
def test_settling_a_delivery_raises_only_dueq_errors_and_a_refusal_keeps_the_lease(
    q, r, admin, retry_in, seconds, delay, error
):
    admin.flushall()
    q.schedule({"n": 1}, id="t")
    [d] = q.claim()
    _call(d.extend, seconds)
    _call(d.release, delay=delay) or _call(d.fail, RuntimeError("x"), retry_in=retry_in)
    if not d.settled:
        _call(d.fail, error if isinstance(error, (BaseException, str)) else str(error))


@FUZZ
@given(
    name=hostile,
    lease=hostile,
    max_payload=hostile,
    dead_count=hostile,
    dead_age=hostile,
    done=hostile,
    wait=hostile,
)
def test_queue_settings_raise_only_configuration_errors(
    r, name, lease, max_payload, dead_count, dead_age, done, wait
):
    kwargs = {
        "lease": lease,
        "max_payload_bytes": max_payload,
        "dead_max_count": dead_count,
        "dead_max_age": dead_age,
        "remember_done": done,
        "wait_replicas": wait,
    }
    for key, value in kwargs.items():
        with contextlib.suppress(dueq.ConfigurationError), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # remember_done= (deprecated)
            dueq.Queue("f", r, **{key: value})
    with contextlib.suppress(dueq.ConfigurationError):
        dueq.Queue(name, r)


@FUZZ
@given(paused=hostile, done=hostile, rate=hostile)
def test_configure_raises_only_configuration_errors_and_writes_nothing_bad(r, paused, done, rate):
    q = dueq.Queue("f", r)
    for kwargs in ({"paused": paused}, {"remember_done": done}, {"rate": rate}):
        with contextlib.suppress(dueq.ConfigurationError):
            q.configure(**kwargs)
    settings = q.settings()  # whatever was written reads back as valid settings
    assert isinstance(settings.paused, bool)
    q.configure(paused=False, remember_done=0, rate=False)


@FUZZ
@given(max_attempts=hostile, value=hostile)
def test_retry_policies_raise_only_configuration_errors(max_attempts, value):
    for kwargs in (
        {"max_attempts": max_attempts},
        {"wait": lambda state: value},
        {"stop": lambda state: value},
    ):
        with contextlib.suppress(dueq.ConfigurationError):
            dueq.RetryPolicy(**kwargs)
