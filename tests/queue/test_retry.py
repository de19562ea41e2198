"""Bounded retries with backoff (guarantee 5): the tenacity adapter and the queue's use of it."""

from __future__ import annotations

import math
import time
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
import tenacity
from freezegun import freeze_time

import dueq
import dueq.retry
from dueq.retry import retry_state


def test_retry_state_carries_attempt_and_age_for_tenacity():
    state = retry_state(3, age_s=42.0, error=KeyError("k"))
    assert state.attempt_number == 3
    assert state.seconds_since_start == pytest.approx(42.0)
    assert isinstance(state.outcome.exception(), KeyError)


def test_policy_uses_tenacity_waits_and_their_combinations():
    policy = dueq.RetryPolicy(
        max_attempts=10,
        wait=tenacity.wait_exponential(multiplier=1, max=100) + tenacity.wait_fixed(0.5),
    )
    assert [policy.delay_s(n) for n in (1, 2, 3, 4)] == [1.5, 2.5, 4.5, 8.5]


def test_policy_stops_at_max_attempts_or_on_tenacity_stop():
    policy = dueq.RetryPolicy(max_attempts=5, stop=tenacity.stop_after_delay(60))
    assert not policy.gives_up(1, age_s=10)
    assert policy.gives_up(2, age_s=61)
    assert policy.gives_up(5, age_s=0)
    either = dueq.RetryPolicy(
        max_attempts=50, stop=tenacity.stop_after_attempt(3) | tenacity.stop_after_delay(600)
    )
    assert (either.gives_up(2), either.gives_up(3)) == (False, True)


def test_default_wait_is_jittered_exponential_and_bounded():
    policy = dueq.RetryPolicy()
    samples = [policy.delay_s(3) for _ in range(50)]
    assert all(4 <= s <= 5 for s in samples)  # initial * 2**(n-1) plus up to 1 s of jitter
    assert len(set(samples)) > 1
    assert policy.delay_s(40) <= 600 + 1


def test_plain_callables_are_accepted_and_bad_values_clamped():
    policy = dueq.RetryPolicy(max_attempts=3, wait=lambda state: -5)
    assert policy.delay_s(1) == 0.0
    assert policy.backoff_table_ms() == [0, 0]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3"])
def test_invalid_max_attempts_is_a_configuration_error(bad):
    with pytest.raises(dueq.ConfigurationError):
        dueq.RetryPolicy(max_attempts=bad)


def test_backoff_grows_through_the_injected_clock_under_freezegun(make_queue):
    wait = tenacity.wait_exponential(multiplier=2, max=60)
    with freeze_time("2026-03-01 12:00:00", tz_offset=0) as frozen:
        q = make_queue(
            "fz", clock=lambda: time.time(), retry=dueq.RetryPolicy(max_attempts=4, wait=wait)
        )
        tid = q.schedule({"n": 1})
        delays = []
        for attempt in (1, 2, 3):
            [d] = q.claim()
            assert d.attempt == attempt
            outcome = d.fail(RuntimeError(f"try {attempt}"))
            delay = (outcome.at - datetime.now(timezone.utc)).total_seconds()
            delays.append(delay)
            frozen.tick(timedelta(seconds=delay - 0.001))
            assert q.claim() == []  # never early
            frozen.tick(timedelta(milliseconds=1))
        [last] = q.claim()
        outcome = last.fail(RuntimeError("try 4"))
    assert delays == [2.0, 4.0, 8.0]
    assert outcome.kind == "dead" and last.attempt == 4
    info = q.get(tid)
    assert info.state == "dead"
    assert [e.message for e in info.errors] == ["try 1", "try 2", "try 3", "try 4"]
    assert [e.attempt for e in info.errors] == [1, 2, 3, 4]
    assert info.errors[0].at == datetime(2026, 3, 1, 12, tzinfo=timezone.utc)


def test_failing_every_attempt_dies_after_exactly_max_attempts(make_queue, clock):
    q = make_queue(retry=dueq.RetryPolicy(max_attempts=3, wait=lambda s: 1))
    tid = q.schedule("x")
    deliveries = 0
    while True:
        clock.advance(1)
        batch = q.claim()
        if not batch:
            break
        deliveries += 1
        outcome = batch[0].fail(ValueError("nope"))
    assert deliveries == 3 and outcome.kind == "dead"
    info = q.get(tid)
    assert info.state == "dead" and info.attempt == 3
    assert [e.type for e in info.errors] == ["ValueError"] * 3
    assert info.errors[0].traceback is None  # never raised, so no traceback


def test_abandoned_at_every_attempt_dies_after_exactly_max_attempts(make_queue, clock):
    q = make_queue(lease=5, retry=dueq.RetryPolicy(max_attempts=4, wait=lambda s: 2))
    tid = q.schedule("poison")
    attempts = []
    for _ in range(10):
        attempts += [d.attempt for d in q.claim()]  # claimed, then the "worker" dies
        clock.advance(7)
    assert attempts == [1, 2, 3, 4]
    info = q.get(tid)
    assert info.state == "dead" and info.attempt == 4
    assert [e.type for e in info.errors] == ["LeaseExpired"] * 4


def test_retry_in_overrides_the_backoff_but_not_the_limit(make_queue, clock):
    q = make_queue(retry=dueq.RetryPolicy(max_attempts=2, wait=lambda s: 1000))
    q.schedule("x", id="a")
    [d] = q.claim()
    outcome = d.fail(RuntimeError("rate limited"), retry_in=timedelta(seconds=3))
    assert outcome.kind == "retried"
    assert outcome.at == datetime.fromtimestamp(clock.now + 3, tz=timezone.utc)
    clock.advance(3)
    [d2] = q.claim()
    assert d2.fail(RuntimeError("again"), retry_in=1).kind == "dead"


def test_unrecoverable_goes_straight_to_dead(make_queue):
    q = make_queue(retry=dueq.RetryPolicy(max_attempts=10))
    q.schedule("x", id="a")
    [d] = q.claim()
    try:
        raise dueq.Unrecoverable("bad address")
    except dueq.Unrecoverable as exc:
        outcome = d.fail(exc)
    assert outcome.kind == "dead" and outcome.attempt == 1
    [error] = q.get("a").errors
    assert error.type == "Unrecoverable" and "bad address" in error.message
    assert error.traceback is not None and "test_unrecoverable" in error.traceback


def test_huge_error_messages_are_shortened(make_queue):
    q = make_queue()
    q.schedule("x", id="a")
    [d] = q.claim()
    d.fail(RuntimeError("x" * 1_000_000))
    [error] = q.get("a").errors
    assert len(error.message) < 2200 and "characters cut" in error.message


def test_stop_after_delay_judges_the_task_age(make_queue, clock):
    policy = dueq.RetryPolicy(
        max_attempts=100, wait=lambda s: 10, stop=tenacity.stop_after_delay(25)
    )
    q = make_queue(retry=policy)
    q.schedule("x", id="a")
    kinds = []
    for _ in range(5):
        batch = q.claim()
        if batch:
            kinds.append(batch[0].fail(RuntimeError("e")).kind)
        clock.advance(10)
    assert kinds == ["retried", "retried", "retried", "dead"]


def test_a_strategy_that_raises_is_refused_up_front():
    with pytest.raises(dueq.ConfigurationError, match="attempt 1"):
        dueq.RetryPolicy(wait=lambda state: 1 / 0)
    with pytest.raises(dueq.ConfigurationError):
        dueq.RetryPolicy(wait=lambda state: "soon")  # not a number
    with pytest.raises(dueq.ConfigurationError):
        dueq.RetryPolicy(stop=lambda state: state.missing_attribute)


# -- strategies that misbehave -------------------------------------------------------------------


def fails_at(attempt: int, answer: object = None) -> dueq.retry.WaitStrategy:
    """A wait that answers 1 s, except at ``attempt``: raises IndexError, or returns ``answer``."""
    table = [1.0] * (attempt - 1)

    def wait(state: tenacity.RetryCallState) -> float:
        if state.attempt_number == attempt and answer is not None:
            return answer  # type: ignore[return-value]
        return table[state.attempt_number - 1]  # IndexError at `attempt`

    return wait


def test_a_wait_that_raises_at_a_later_attempt_is_refused_naming_it():
    with pytest.raises(dueq.ConfigurationError, match="attempt 3"):
        dueq.RetryPolicy(max_attempts=5, wait=fails_at(3))
    # Attempts after the last retry (and past the 64-entry table) are never waited for.
    assert dueq.RetryPolicy(max_attempts=3, wait=fails_at(3)).delay_s(2) == 1.0
    dueq.RetryPolicy(max_attempts=1000, wait=fails_at(65))


@pytest.mark.parametrize(
    "answer", [float("nan"), "5", b"5", [1], 1j, True, object(), Decimal("NaN"), Decimal("sNaN")]
)
def test_a_wait_that_returns_no_number_at_some_attempt_is_refused(answer):
    with pytest.raises(dueq.ConfigurationError, match="attempt 2"):
        dueq.RetryPolicy(max_attempts=5, wait=fails_at(2, answer))


def test_a_stop_that_raises_at_a_later_attempt_is_refused_naming_it():
    def stop(state: tenacity.RetryCallState) -> bool:
        return [False, False][state.attempt_number - 1]

    with pytest.raises(dueq.ConfigurationError, match=r"stop .*attempt 3"):
        dueq.RetryPolicy(max_attempts=10, stop=stop)


@pytest.mark.parametrize(
    "answer",
    [10**400, float("inf"), Fraction(10**400, 3), Decimal("1e400"), 1e300],
    ids=["int", "inf", "fraction", "decimal", "float"],
)
def test_huge_waits_are_capped_at_ten_years_without_overflow(make_queue, clock, answer):
    policy = dueq.RetryPolicy(max_attempts=3, wait=lambda s: answer)
    assert policy.delay_s(1) == dueq.retry.MAX_DELAY_S == 10 * 365 * 86400
    assert policy.backoff_table_ms() == [dueq.retry.MAX_DELAY_S * 1000] * 2
    q = make_queue(retry=policy)
    q.schedule("x", id="a")
    [d] = q.claim()
    outcome = d.fail(RuntimeError("later"))
    assert outcome.kind == "retried"
    assert outcome.at == datetime.fromtimestamp(clock.now + dueq.retry.MAX_DELAY_S, timezone.utc)
    info = q.get("a")
    assert info is not None and info.due_at == outcome.at


@pytest.mark.parametrize("answer", [-5, -math.inf, Decimal("-1")])
def test_negative_waits_mean_no_wait(answer):
    policy = dueq.RetryPolicy(max_attempts=3, wait=lambda s: answer)
    assert policy.delay_s(1) == 0.0 and policy.backoff_table_ms() == [0, 0]


class Flaky:
    """A strategy that works at construction and breaks later (e.g. a remote lookup)."""

    def __init__(self, answer: object = 7.0) -> None:
        self.broken = False
        self.answer = answer

    def __call__(self, state: tenacity.RetryCallState) -> Any:
        if self.broken:
            raise RuntimeError("strategy down")
        return self.answer


def test_a_wait_that_fails_at_failure_time_falls_back_to_the_default_backoff(
    make_queue, clock, caplog
):
    wait = Flaky()
    q = make_queue(retry=dueq.RetryPolicy(max_attempts=3, wait=wait))
    q.schedule("x", id="a")
    wait.broken = True
    [d] = q.claim()  # the lease-expiry table falls back too: the claim does not raise
    outcome = d.fail(RuntimeError("boom"))
    assert outcome.kind == "retried" and outcome.at is not None
    delay_s = outcome.at.timestamp() - clock.now
    assert 1 <= delay_s <= 2  # the default jittered backoff for attempt 1
    assert "retry wait failed for attempt 1" in caplog.text and "strategy down" in caplog.text


def test_a_stop_that_fails_at_failure_time_keeps_retrying_up_to_max_attempts(
    make_queue, clock, caplog
):
    stop = Flaky(answer=False)
    q = make_queue(retry=dueq.RetryPolicy(max_attempts=2, wait=lambda s: 1, stop=stop))
    q.schedule("x", id="a")
    stop.broken = True
    [d] = q.claim()
    assert d.fail(RuntimeError("boom")).kind == "retried"
    clock.advance(1)
    [d] = q.claim()
    assert d.fail(RuntimeError("boom")).kind == "dead"
    assert "retry stop failed for attempt 1" in caplog.text


def test_a_task_age_that_is_not_finite_reads_as_zero():
    for age_s in (math.nan, math.inf, -math.inf, -5.0):
        assert retry_state(2, age_s=age_s).seconds_since_start == pytest.approx(0.0, abs=1)


def test_claims_reuse_the_backoff_table_and_a_new_policy_is_asked_at_the_next_claim(r):
    asked: list[int] = []

    def wait(state: Any) -> float:
        asked.append(state.attempt_number)
        return 1.0

    q = dueq.Queue("backoff", r, retry=dueq.RetryPolicy(max_attempts=4, wait=wait))
    q.BACKOFF_TABLE_S = 3600.0  # no second passes between these claims, however slow
    asked.clear()  # the policy asked once at construction, to validate it
    for _ in range(5):
        q.claim()
    assert asked == [1, 2, 3]  # one table (attempts 1-3) for five claims
    q.retry = dueq.RetryPolicy(max_attempts=3, wait=wait)
    asked.clear()
    q.claim()
    assert asked == [1, 2]
