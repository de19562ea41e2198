"""Retry policies over tenacity's wait and stop strategies.

tenacity's strategies are callables of a ``RetryCallState``. A task's retry state lives in
Redis, not in a running ``Retrying`` loop, so ``retry_state`` below builds that object by hand
from the task's attempt number and age (the same way tenacity's own tests do).

Strategies are user code, asked long after the policy was built (at every claim, for the
lease-expiry table, and at every failure), so a policy is checked for the whole table when
it is built: a strategy that raises, or answers something that is not a number of seconds
(NaN, a str, None), at any attempt of the table is a ConfigurationError naming that attempt.
Answers with a sane reading are taken as such: a negative wait is no wait, and waits beyond
``MAX_DELAY_S`` (inf, 10**400) are capped. A strategy that breaks later (it is stateful,
random or calls out) never stops a consumer: its failure is logged and the default
jittered backoff (for ``wait``) or ``max_attempts`` alone (for ``stop``) decides instead.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import tenacity

from dueq._util.checks import whole_number
from dueq.exceptions import ConfigurationError

logger = logging.getLogger(__name__)

WaitStrategy = Callable[[tenacity.RetryCallState], float]
StopStrategy = Callable[[tenacity.RetryCallState], bool]

#: Most entries of the per-attempt backoff table sent with each claim (for lease expiries).
MAX_BACKOFF_TABLE = 64
#: Longest wait a policy gives (longer answers are capped): ten years.
MAX_DELAY_S = 10 * 365 * 86400

_RETRYING = tenacity.Retrying()


def default_wait() -> WaitStrategy:
    """Jittered exponential backoff from 1 s up to 10 minutes.

    Jitter matters: many workers retrying in lock-step is the contention tenacity warns about.
    """
    return tenacity.wait_exponential_jitter(initial=1, max=600)


def retry_state(
    attempt: int, age_s: float = 0.0, error: BaseException | None = None
) -> tenacity.RetryCallState:
    """A tenacity RetryCallState for a task that has just failed its ``attempt``-th delivery."""
    state = tenacity.RetryCallState(_RETRYING, None, (), {})
    state.attempt_number = attempt
    now = time.monotonic()
    state.start_time = now - (age_s if math.isfinite(age_s) and age_s > 0 else 0.0)
    state.outcome = tenacity.Future.construct(attempt, error or Exception("failed"), True)
    state.outcome_timestamp = now
    return state


@dataclass(frozen=True)
class RetryPolicy:
    """How often a task is delivered and how long to wait between attempts.

    ``max_attempts`` caps deliveries (lease expiries count). ``wait`` is a tenacity wait
    strategy (or any callable of a RetryCallState returning seconds). ``stop`` is an optional
    extra tenacity stop strategy, e.g. ``tenacity.stop_after_delay(3600)`` to give up on tasks
    older than an hour; it is judged on explicit failures.
    """

    max_attempts: int = 5
    wait: WaitStrategy = field(default_factory=default_wait)
    stop: StopStrategy | None = None

    def __post_init__(self) -> None:
        whole_number(self.max_attempts, "max_attempts", low=1)
        if not callable(self.wait):
            raise ConfigurationError(f"wait must be a tenacity wait strategy, got {self.wait!r}")
        if self.stop is not None and not callable(self.stop):
            raise ConfigurationError(f"stop must be a tenacity stop strategy, got {self.stop!r}")
        # Ask both strategies for every attempt of the table now, not at a claim months later.
        for attempt in range(1, self._table_size() + 1):
            state = retry_state(attempt)
            try:
                _seconds(self.wait(state))
            except Exception as exc:  # any failure of user code here is a configuration error
                raise ConfigurationError(
                    f"retry wait failed for attempt {attempt}: {exc!r}"
                ) from exc
            if self.stop is not None:
                try:
                    bool(self.stop(state))
                except Exception as exc:  # as above
                    raise ConfigurationError(
                        f"retry stop failed for attempt {attempt}: {exc!r}"
                    ) from exc

    def _table_size(self) -> int:
        return min(max(self.max_attempts - 1, 1), MAX_BACKOFF_TABLE)

    def delay_s(
        self, attempt: int, age_s: float = 0.0, error: BaseException | None = None
    ) -> float:
        """Seconds to wait after failed delivery ``attempt``: from 0 to ``MAX_DELAY_S``.

        If the wait strategy fails now, the failure is logged and the default backoff answers.
        """
        state = retry_state(attempt, age_s, error)
        try:
            return _seconds(self.wait(state))
        except Exception as exc:  # user code must not stop a consumer: fall back and say so
            fallback = _seconds(_FALLBACK_WAIT(retry_state(min(attempt, MAX_BACKOFF_TABLE))))
            logger.warning(
                "retry wait failed for attempt %d (%r); waiting %.3f s, the default backoff",
                attempt,
                exc,
                fallback,
            )
            return fallback

    def gives_up(
        self,
        attempt: int,
        age_s: float = 0.0,
        error: BaseException | None = None,
        max_attempts: int | None = None,
    ) -> bool:
        """True when failed delivery ``attempt`` was the last one allowed.

        ``max_attempts`` is the task's own (``schedule(..., max_attempts=)``), which wins over
        the policy's. If the stop strategy fails now, the failure is logged and
        ``max_attempts`` decides.
        """
        if attempt >= (self.max_attempts if max_attempts is None else max_attempts):
            return True
        if self.stop is None:
            return False
        try:
            return bool(self.stop(retry_state(attempt, age_s, error)))
        except Exception as exc:  # user code must not stop a consumer: fall back and say so
            logger.warning(
                "retry stop failed for attempt %d (%r); retrying up to max_attempts=%d",
                attempt,
                exc,
                self.max_attempts,
            )
            return False

    def backoff_table_ms(self) -> list[int]:
        """Delays (ms) after attempts 1, 2, ...: used by the claim script for lease expiries."""
        return [round(self.delay_s(n) * 1000) for n in range(1, self._table_size() + 1)]


_FALLBACK_WAIT = default_wait()


def _is_number(value: object) -> bool:
    """A real number: int, float, or (without importing ``numbers`` and ``decimal`` for every
    worker) a ``numbers.Real`` or ``Decimal``, which can exist only once their module is
    imported."""
    if isinstance(value, (int, float)):
        return True
    numbers, decimal = sys.modules.get("numbers"), sys.modules.get("decimal")
    return (numbers is not None and isinstance(value, numbers.Real)) or (
        decimal is not None and isinstance(value, decimal.Decimal)
    )


def _seconds(value: object) -> float:
    """A wait strategy's answer as seconds from 0 to MAX_DELAY_S; ValueError if it is not a
    number (NaN, str, None, bool, complex)."""
    if isinstance(value, bool) or not _is_number(value):
        raise ValueError(f"the wait is {value!r:.60}, not a number of seconds")
    number: Any = value
    try:
        seconds = float(number)
    except OverflowError:  # an int or Fraction beyond float range
        seconds = math.inf if number > 0 else -math.inf
    if math.isnan(seconds):
        raise ValueError("the wait is NaN, not a number of seconds")
    return min(max(seconds, 0.0), float(MAX_DELAY_S))
