"""Redis outages: which errors a consumer waits out, and the backoff between its tries.

A consumer (``Queue.observe``, ``dueq.operators.process``, ``dueq.Worker``) never ends its
stream because Redis cannot serve for a while: it logs, waits with tenacity's jittered
exponential backoff and tries again. "For a while" covers more than a lost connection. Redis
answers with an error reply when it is up but refuses to serve right now, and each of these
ends on its own or by an operator's fix, never by changing the request:

- ``NOREPLICAS``: ``min-replicas-to-write`` (docs/deployment.md recommends it) and too few
  replicas;
- ``MASTERDOWN``: a replica with ``replica-serve-stale-data no`` lost its primary;
- ``LOADING``: Redis is loading its AOF or RDB after a restart;
- ``READONLY``: the client reached a replica, e.g. a demoted primary after a failover;
- ``TRYAGAIN`` / ``CLUSTERDOWN``: a Cluster resharding or without a majority;
- ``OOM``: ``maxmemory`` reached under ``noeviction`` (deletions, hence acks, still pass);
- ``BUSY``: another client's script runs past ``busy-reply-threshold``;
- ``MISCONF``: writes are stopped because a snapshot could not be saved.

redis-py maps some reply codes to classes (``OutOfMemoryError``, ``MasterDownError``, ...)
and leaves others (``NOREPLICAS``, ``BUSY``, ``MISCONF``) as a plain ``ResponseError`` whose
message starts with the code; Redis 7 keeps the code of an error raised inside a script
(``NOREPLICAS Not enough good replicas to write. script: ...``), Redis 6.2 wraps it in
``ERR Error running script (call to f_...): @user_script:1: NOREPLICAS ...``. OUTAGE_REPLIES is
the one table of codes; ``outage_reason`` reads the code from the class or the message, the way
redis-py's own parser reads it. Authentication and permission errors, unknown commands and
script bugs are not outages: they end the stream with ``on_error``.
"""

from __future__ import annotations

import logging
import re
from typing import TypeVar

import redis
import tenacity
from redis import exceptions as redis_errors

from dueq.retry import WaitStrategy, retry_state

logger = logging.getLogger("dueq.outage")

T = TypeVar("T")

#: Error reply codes of a server that cannot serve for now -> what that means.
OUTAGE_REPLIES: dict[str, str] = {
    "NOREPLICAS": "too few replicas for min-replicas-to-write",
    "MASTERDOWN": "this replica lost its primary",
    "LOADING": "Redis is loading its data",
    "READONLY": "this server is a read-only replica",
    "TRYAGAIN": "the cluster is moving a slot",
    "CLUSTERDOWN": "the cluster is down",
    "OOM": "Redis is out of memory (maxmemory)",
    "BUSY": "Redis is busy running a script",
    "MISCONF": "Redis stopped writes after a failed snapshot",
}

#: redis-py's classes for those codes (it strips the code from their message), most specific
#: first; BusyLoadingError is a ConnectionError, MasterDownError a ClusterDownError.
_CLASS_CODES: tuple[tuple[type[Exception], str], ...] = (
    (redis_errors.BusyLoadingError, "LOADING"),
    (redis_errors.ReadOnlyError, "READONLY"),
    (redis_errors.TryAgainError, "TRYAGAIN"),
    *(
        ((redis_errors.MasterDownError, "MASTERDOWN"),)  # redis-py >= 5.0.1
        if hasattr(redis_errors, "MasterDownError")
        else ()
    ),
    (redis_errors.ClusterDownError, "CLUSTERDOWN"),
    (redis_errors.SlotNotCoveredError, "CLUSTERDOWN"),  # the cluster client's own verdict
    (redis_errors.OutOfMemoryError, "OOM"),
)
#: Errors of the connection itself: Redis unreachable, restarting, too slow to answer.
_CONNECTION_ERRORS = (redis.ConnectionError, redis.TimeoutError)
#: ConnectionErrors that are the caller's fault, not an outage.
_NOT_OUTAGES = (redis_errors.AuthenticationError, redis_errors.AuthorizationError)
#: Redis 6.2's wrapping of an error raised inside a script (redis-py strips the ERR).
_SCRIPT_ERROR = re.compile(
    r"Error running script \(call to [^)]*\): (?:@?user_script: ?\d+: )*-?(\w+) "
)


def outage_reason(exc: BaseException) -> str | None:
    """``"CODE: meaning"`` when ``exc`` means Redis cannot serve for now, else None."""
    if isinstance(exc, _NOT_OUTAGES):
        return None
    for cls, code in _CLASS_CODES:
        if isinstance(exc, cls):
            return f"{code}: {OUTAGE_REPLIES[code]}"
    if isinstance(exc, _CONNECTION_ERRORS):
        return f"{type(exc).__name__}: {exc}"
    if type(exc) is not redis.ResponseError:  # NOPERM, NOSCRIPT, ... have classes of their own
        return None
    message = str(exc)
    code = message.split(" ", 1)[0]
    wrapped = _SCRIPT_ERROR.match(message)
    if wrapped is not None:
        code = wrapped.group(1)
    return f"{code}: {OUTAGE_REPLIES[code]}" if code in OUTAGE_REPLIES else None


def is_outage(exc: BaseException) -> bool:
    """True for errors worth waiting out (see OUTAGE_REPLIES)."""
    return outage_reason(exc) is not None


def describe(exc: BaseException) -> str:
    """``Type: message`` for logs (redis-py 8's exception repr hides the message); an outage
    is named by its reply code too."""
    try:
        named = f"{type(exc).__name__}: {exc}"
    except Exception as unprintable:  # an exception whose __str__ raises: say so, never fail
        named = f"{type(exc).__name__}: <unprintable: {type(unprintable).__name__}>"
    reason = outage_reason(exc)
    return named if reason is None or reason.startswith(named) else f"{reason} ({named})"


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
