"""Redis outages: which errors a consumer waits out, and the backoff between its tries.

A consumer (``Queue.observe``, ``dueq.operators.process``, ``dueq.Worker``) never ends its
stream because Redis is briefly unreachable, restarting, loading its AOF or failing over: it
logs, waits with tenacity's jittered exponential backoff and tries again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TypeVar

import redis
import tenacity
from redis import exceptions as redis_errors

from .retry import WaitStrategy, retry_state

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Errors that mean "Redis is not serving right now", not "this request is wrong".
#: BusyLoadingError (AOF loading) is a ConnectionError; authentication errors are not outages.
OUTAGE_ERRORS: tuple[type[Exception], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis_errors.ReadOnlyError,
    redis_errors.TryAgainError,
    redis_errors.ClusterDownError,
    redis_errors.OutOfMemoryError,
)
_NOT_OUTAGES = (redis_errors.AuthenticationError, redis_errors.AuthorizationError)


def is_outage(exc: BaseException) -> bool:
    """True for errors worth waiting out (see OUTAGE_ERRORS)."""
    return isinstance(exc, OUTAGE_ERRORS) and not isinstance(exc, _NOT_OUTAGES)


def outage_wait() -> WaitStrategy:
    """Waits between tries during an outage: 50 ms doubling up to 5 s, plus up to 250 ms of
    jitter so that many consumers do not reconnect in lock-step."""
    return tenacity.wait_exponential(multiplier=0.05, max=5.0) + tenacity.wait_random(0, 0.25)


class Backoff:
    """Counts consecutive failed tries and answers how long to wait before the next one."""

    def __init__(self, wait: WaitStrategy | None = None) -> None:
        self._wait = wait or outage_wait()
        self.failures = 0

    def failed(self) -> float:
        """Record a failed try; seconds to wait before the next."""
        self.failures += 1
        return max(float(self._wait(retry_state(self.failures))), 0.0)

    def succeeded(self) -> int:
        """Record a successful try; returns how many tries had failed before it."""
        failures, self.failures = self.failures, 0
        return failures


def through_outages(call: Callable[[], T], what: str, give_up: threading.Event) -> T:
    """Run ``call``, retrying it through Redis outages until it succeeds or ``give_up`` is set.

    Errors that are not outages, and the last outage error once ``give_up`` is set, propagate.
    """
    backoff = Backoff()
    while True:
        try:
            result = call()
        except Exception as exc:
            if not is_outage(exc) or give_up.is_set():
                raise
            delay = backoff.failed()
            logger.warning(
                "Redis unavailable while %s (try %d): %s; retrying in %.2f s",
                what,
                backoff.failures,
                exc,
                delay,
            )
            give_up.wait(delay)
            continue
        if backoff.succeeded():
            logger.info("Redis is back; %s succeeded", what)
        return result
