"""Retry policies over tenacity's wait and stop strategies.

tenacity's strategies are callables of a ``RetryCallState``. A task's retry state lives in
Redis, not in a running ``Retrying`` loop, so ``retry_state`` below builds that object by hand
from the task's attempt number and age (the same way tenacity's own tests do).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import tenacity

from .checks import whole_number
from .exceptions import ConfigurationError

WaitStrategy = Callable[[tenacity.RetryCallState], float]
StopStrategy = Callable[[tenacity.RetryCallState], bool]

#: Most entries of the per-attempt backoff table sent with each claim (for lease expiries).
MAX_BACKOFF_TABLE = 64

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
    state.start_time = now - max(age_s, 0.0)
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
        try:  # a strategy that cannot answer for attempt 1 would fail at the first failure
            self.delay_s(1)
            self.gives_up(1)
        except Exception as exc:
            raise ConfigurationError(f"retry strategy raised for attempt 1: {exc!r}") from exc

    def delay_s(
        self, attempt: int, age_s: float = 0.0, error: BaseException | None = None
    ) -> float:
        """Seconds to wait after failed delivery ``attempt`` (never negative, never NaN)."""
        value: Any = self.wait(retry_state(attempt, age_s, error))
        delay = float(value)
        if math.isnan(delay) or delay < 0:
            return 0.0
        return min(delay, 10 * 365 * 86400.0)

    def gives_up(
        self, attempt: int, age_s: float = 0.0, error: BaseException | None = None
    ) -> bool:
        """True when failed delivery ``attempt`` was the last one allowed."""
        if attempt >= self.max_attempts:
            return True
        return bool(self.stop(retry_state(attempt, age_s, error))) if self.stop else False

    def backoff_table_ms(self) -> list[int]:
        """Delays (ms) after attempts 1, 2, ...: used by the claim script for lease expiries."""
        count = min(max(self.max_attempts - 1, 1), MAX_BACKOFF_TABLE)
        return [round(self.delay_s(n) * 1000) for n in range(1, count + 1)]
