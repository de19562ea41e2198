"""dueq's exception hierarchy.

::

    DueqError
    ├── ConfigurationError   (also ValueError)   bad queue name, lease, retry policy, limits
    ├── InvalidTaskError     (also ValueError)   bad id, naive datetime, negative/NaN delay
    │   ├── BatchCompleted                       scheduled into a batch that has completed
    │   ├── BatchCompletionTaken                 close_batch: the completion id is a task's
    │   ├── DependencyCycle                      after= would make a task wait for itself
    │   └── InvalidArguments  (also Unrecoverable) a named task's arguments do not bind
    ├── PayloadError         (also ValueError)   payload not JSON, too large, or undecodable
    │   └── UndecryptableTask                    an encrypted payload no known key opens
    ├── CronError          (also ValueError)   bad cron expression, zone, name or missed policy
    │   ├── CronConflict                         a cron name already defined differently
    │   └── CronNotFound     (also LookupError)  no cron definition of that name (pause, ...)
    ├── TaskNotFound         (also LookupError)  an id that is not in the state asked for
    ├── LeaseLost                                a holder whose lease expired or was taken over
    │   └── TaskCancelled                        ... because its task was cancelled while leased
    ├── ReplicationTimeout                       written, but fewer replicas confirmed it than asked
    ├── CorruptQueue   (also redis ResponseError) a queue key holds the wrong type of value
    ├── TaskTimeout                              an attempt ran past process(timeout=...): retried
    ├── WaitTimeout      (also TimeoutError)     q.wait: the task did not end in time
    ├── SignalRefused                            q.signal: the task holds the most signals it may
    ├── Unrecoverable                            raised by a handler: skip retries, go to dead
    │   ├── UnknownTask  (also LookupError)      a named task no function is registered for
    │   └── NonDeterministic                     a durable task's re-run asked for other steps
    └── KeyCooldown                              raised by a handler: back later, its key held

Redis's own errors (``redis.exceptions.ConnectionError``, ``TimeoutError``, ...) pass through
unwrapped: they say nothing about the task, only about the connection, and callers usually
retry them with their own policy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import timedelta

from redis.exceptions import ResponseError

__all__ = [
    "BatchCompleted",
    "BatchCompletionTaken",
    "ConfigurationError",
    "CorruptQueue",
    "CronConflict",
    "CronError",
    "CronNotFound",
    "DependencyCycle",
    "DueqError",
    "InvalidArguments",
    "InvalidTaskError",
    "KeyCooldown",
    "LeaseLost",
    "NonDeterministic",
    "PayloadError",
    "ReplicationTimeout",
    "SignalRefused",
    "TaskCancelled",
    "TaskNotFound",
    "TaskTimeout",
    "UndecryptableTask",
    "UnknownTask",
    "Unrecoverable",
    "WaitTimeout",
]


class DueqError(Exception):
    """Root of every error dueq raises itself."""


class ConfigurationError(DueqError, ValueError):
    """A queue, policy or limit was configured with a value dueq cannot use."""


class InvalidTaskError(DueqError, ValueError):
    """A task's id or timing is invalid; nothing was written."""


class BatchCompleted(InvalidTaskError):
    """Tasks were scheduled into a batch whose completion task has already been scheduled: they
    were not written (the other tasks of the call were). ``ids`` names them."""

    def __init__(self, message: str, ids: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.ids = list(ids)


class BatchCompletionTaken(InvalidTaskError):
    """``close_batch`` was given a completion task whose id a task of the queue already has
    (scheduled, leased, waiting for parents, or dead): it could never be scheduled, so the
    batch was not closed and nothing was written. ``id`` names it; give the completion task
    another id (or none: ``batch:<batch id>``)."""

    def __init__(self, message: str, task_id: str) -> None:
        super().__init__(message)
        self.id = task_id


class DependencyCycle(InvalidTaskError):
    """Tasks were scheduled (replaced) with parents that wait, through waiting tasks, for them:
    a dependency cycle, whose tasks would wait for ever. They were not written (the other tasks
    of the call were). ``ids`` names them; ``unchecked`` those refused because more dependency
    edges than the walk's bound lay on the way to tell (docs/dependencies.md)."""

    def __init__(self, message: str, ids: Iterable[str] = (), unchecked: Iterable[str] = ()):
        super().__init__(message)
        self.ids = list(ids)
        self.unchecked = list(unchecked)


class PayloadError(DueqError, ValueError):
    """A payload cannot be encoded as JSON, is over the size limit, or cannot be decoded."""


class UndecryptableTask(PayloadError):
    """A task's encrypted payload cannot be opened: its key id is unknown to the queue's codec
    (or the queue has none), or its ciphertext fails authentication (tampered, or copied from
    another task). No retry makes it readable: a claim moves the task to dead at once, its
    stored data untouched, so it can be replayed once the key is there.
    ``task_id`` and ``key_id`` name what was refused."""

    def __init__(self, message: str, task_id: str = "", key_id: str | None = None) -> None:
        super().__init__(message)
        self.task_id = task_id
        self.key_id = key_id

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self), self.task_id, self.key_id))


class CronError(DueqError, ValueError):
    """A cron definition is invalid (expression, time zone, name or missed policy)."""


class CronConflict(CronError):
    """A cron definition with this name exists with other settings; pass replace=True."""


class CronNotFound(CronError, LookupError):
    """No cron definition of this name in the queue (``cron.pause``, ``resume``, ``run_now``)."""


class TaskNotFound(DueqError, LookupError):
    """One or more task ids are not in the state the operation needs."""

    def __init__(self, message: str, ids: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.ids: list[str] = list(ids)


class LeaseLost(DueqError):
    """The caller's lease on a task expired or was taken over; its ack/fail/extend is refused."""

    def __init__(
        self, message: str, ids: Iterable[str] = (), cancelled: Iterable[str] = ()
    ) -> None:
        super().__init__(message)
        self.ids: list[str] = list(ids)
        #: those of ``ids`` whose task was cancelled (``q.cancel``) while leased
        self.cancelled: list[str] = list(cancelled)


class TaskCancelled(LeaseLost):
    """The task was cancelled (``q.cancel``) while this holder had it leased: its ack, fail,
    extend or release is refused, and ``process`` reports the outcome ``cancelled``."""

    def __init__(self, message: str, ids: Iterable[str] = ()) -> None:
        ids = list(ids)
        super().__init__(message, ids, ids)


class EventsTrimmed(DueqError):
    """Outcome events a reader had not read yet were trimmed from the queue's events stream
    (older than the queue's events retention): Spark's events source fails the micro-batch
    with this unless its option ``failOnDataLoss`` is false (docs/spark-events.md)."""


class ReplicationTimeout(DueqError):
    """A change was applied on the primary, but fewer replicas than ``Queue(wait_replicas=N)``
    confirmed it within ``wait_timeout``: a failover now could undo it. Scheduling again with
    the same explicit ids is safe (idempotent). ``.confirmed`` is how many replicas did."""

    def __init__(self, message: str, confirmed: int, wanted: int) -> None:
        super().__init__(message)
        self.confirmed = confirmed
        self.wanted = wanted


class CorruptQueue(DueqError, ResponseError):
    """A key the queue cannot work without (due, leased, tasks, meta, config, ...) holds another
    type of value than dueq keeps there: something other than dueq wrote it. The message names
    the key, the type it holds and the type expected; nothing of the failed call was done past
    the point where it met the key. An operator must restore or delete the key; consumers stop
    with this error rather than retry. It is also a ``redis.ResponseError`` whose message has
    "WRONGTYPE" in it, as Redis's own error had before dueq named the key."""

    def __init__(self, message: str, key: str, actual_type: str, expected_type: str) -> None:
        super().__init__(message)
        self.key = key
        self.actual_type = actual_type
        self.expected_type = expected_type


class TaskTimeout(DueqError):
    """An attempt ran past its timeout (``process(handler, timeout=...)``): recorded as the
    attempt's failure, so the task follows its retry policy. An ``async def`` handler was
    cancelled; a plain function's thread was abandoned and its late result is refused."""


class WaitTimeout(DueqError, TimeoutError):
    """``q.wait(id, timeout=...)``: the task did not end (done, dead or cancelled) in time.
    ``task_id`` names it; the task itself is untouched (it may still end later)."""

    def __init__(self, message: str, task_id: str) -> None:
        super().__init__(message)
        self.task_id = task_id


class Unrecoverable(DueqError):
    """Raise (or pass to ``Delivery.fail``) to send a task straight to the dead-letter queue."""


class UnknownTask(Unrecoverable, LookupError):
    """A worker got a task whose name (``@q.task(name=...)``) has no function registered on
    its queue, or a plain payload task and no handler for them: no retry can fix that, so the
    task goes dead at once (an ``Unrecoverable``) with this reason; replay it
    (``q.dead.replay``) once a worker that knows it runs. ``.name`` is the task's name (None
    for a plain payload task)."""

    def __init__(self, message: str, name: str | None = None) -> None:
        super().__init__(message)
        self.name = name


class NonDeterministic(Unrecoverable):
    """A durable task's function, run again, asked for a step other than the one its log holds
    at that position (another name or kind: the code changed between deployments, or a step
    depends on something other than its inputs and earlier steps' results), or returned before
    reaching every committed step. Retrying runs the same code again, so the task goes dead at
    once: deploy code whose steps match, then replay it (or replay it from the start).
    ``position``, ``expected`` (the stored step, "kind name") and ``found`` (what the run
    asked for) say where."""

    def __init__(self, message: str, position: int, expected: str, found: str) -> None:
        super().__init__(message)
        self.position = position
        self.expected = expected
        self.found = found

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self), self.position, self.expected, self.found))


class SignalRefused(DueqError):
    """``q.signal`` refused: the task already holds the most signals not yet taken that a task
    may hold (``dueq.durable.MAX_PENDING_SIGNALS``); nothing was written."""


class InvalidArguments(InvalidTaskError, Unrecoverable):
    """A named task's arguments do not bind to its function's signature (a missing argument,
    an unexpected keyword: the message names the nearest parameter), or its payload is not a
    dict of them. Raised by ``schedule`` before anything is written (an ``InvalidTaskError``),
    and by the worker for a task scheduled by name without the check: no retry can fix it, so
    the task goes dead at once (an ``Unrecoverable``)."""


#: Longest cooldown, seconds (366 days, as the scripts bound rate windows).
MAX_COOLDOWN_S = 366 * 86_400


class KeyCooldown(DueqError):
    """Raise from a handler (or pass to ``Delivery.fail``; or call ``d.cooldown(seconds)``) when
    the task's limit key must rest, such as a tenant's API answering 429: the task goes back to
    due ``seconds`` from now with no attempt counted (like ``d.release(delay=seconds)``), and its
    key (``schedule(..., key=)``) is held as long, so the key's other tasks wait (parked) while
    other keys run. A task without a key only waits itself. On a sharded queue the key is held on
    its key's shard, which holds every task of the key (``dueq.keyed_id``)."""

    def __init__(self, seconds: float | timedelta, message: str = "") -> None:
        raw = seconds.total_seconds() if isinstance(seconds, timedelta) else seconds
        if isinstance(raw, bool) or not isinstance(raw, (int, float)):
            raise ConfigurationError(
                f"KeyCooldown seconds must be a number or a timedelta, got {seconds!r}"
            )
        if math.isnan(raw) or not 0 < raw <= MAX_COOLDOWN_S:
            raise ConfigurationError(
                f"KeyCooldown seconds must be above 0 and at most 366 days, got {seconds!r}"
            )
        super().__init__(message or f"cooling down for {raw:g} s")
        #: how long the task and its key wait, seconds
        self.seconds = float(raw)
