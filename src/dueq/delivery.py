"""Deliveries: a task leased to this consumer, and how it is finished (ack, fail, extend,
release, cooldown).

``DeliveryBase`` is what a delivery is for both front ends; ``Delivery`` (from ``Queue``)
settles with blocking calls and ``AsyncDelivery`` (from ``AsyncQueue``) with awaitable ones.
Unlike ``dueq.model``'s values, a delivery holds its queue and calls it.

It names no front end: what it calls on its queue is spelled as a ``typing.Protocol``
(``SettlingQueue``, ``AsyncSettlingQueue``), as redis-py's ``Lock`` takes any client. Naming
``Queue`` here, even under ``TYPE_CHECKING``, closed a circle of some 25 modules (the front ends
import the consumers, flows and parts that import this module);
tests/structure/test_import_cycles.py keeps it open. So ``Delivery.queue`` is typed as the protocol
(the object is still the ``Queue``, or the shard's, that claimed it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar

from dueq._util.clock import Duration, duration_ms, ms_datetime
from dueq._wire.envelope import NO_OPTIONS, TaskOptions, TraceContext
from dueq.exceptions import ConfigurationError, KeyCooldown
from dueq.model import Outcome

#: A delivery type (``Delivery``, ``AsyncDelivery`` or ``DeliveryBase``).
D = TypeVar("D", bound="DeliveryBase")
#: One item of ``fail_many``: a delivery and its error (an exception or a message), and
#: optionally its ``retry_in`` (the delay before the retry, instead of the retry policy's).
FailItem = tuple[D, BaseException | str] | tuple[D, BaseException | str, Duration | None]


class NamedQueue(Protocol):
    """What every delivery reads of its queue: the name (``QueueCore`` has it)."""

    @property
    def name(self) -> str: ...


class SettlingQueue(NamedQueue, Protocol):
    """The queue of a ``Delivery`` (a ``Queue``, or a sharded queue's shard): what the delivery
    calls to finish itself, and the lease length its processor keeps it by."""

    @property
    def lease_ms(self) -> int: ...

    def ack_many(self, deliveries: Sequence[Delivery]) -> int: ...

    def fail(
        self, delivery: Delivery, error: BaseException | str, *, retry_in: Duration | None = None
    ) -> Outcome: ...

    def fail_many(self, items: Sequence[FailItem[Delivery]]) -> list[Outcome]: ...

    def extend(self, delivery: Delivery, seconds: Duration) -> datetime: ...

    def release(self, delivery: Delivery, *, delay: Duration = 0) -> Outcome: ...

    def report_progress(self, delivery: Delivery, obj: Any) -> int: ...


class AsyncSettlingQueue(NamedQueue, Protocol):
    """The queue of an ``AsyncDelivery`` (an ``AsyncQueue``, or a shard's): as
    ``SettlingQueue``, each call awaited."""

    @property
    def lease_ms(self) -> int: ...

    async def ack_many(self, deliveries: Sequence[AsyncDelivery]) -> int: ...

    async def fail(
        self,
        delivery: AsyncDelivery,
        error: BaseException | str,
        *,
        retry_in: Duration | None = None,
    ) -> Outcome: ...

    async def fail_many(self, items: Sequence[FailItem[AsyncDelivery]]) -> list[Outcome]: ...

    async def extend(self, delivery: AsyncDelivery, seconds: Duration) -> datetime: ...

    async def release(self, delivery: AsyncDelivery, *, delay: Duration = 0) -> Outcome: ...

    async def report_progress(self, delivery: AsyncDelivery, obj: Any) -> int: ...


class SettleHook:
    """A delivery's ``on_settled`` that also takes a batch: ``one(d)`` for a delivery settled
    alone, ``many(ds)`` for deliveries acked together (``mark_all_acked``: one call and one
    lock round per batch instead of several per delivery)."""

    __slots__ = ("many", "one")

    def __init__(self, one: Callable[[Any], None], many: Callable[[list[Any]], None]) -> None:
        self.one = one
        self.many = many

    def __call__(self, delivery: Any) -> None:
        self.one(delivery)


def mark_all_acked(deliveries: Iterable[DeliveryBase]) -> None:
    """``d.mark_settled()`` for each of ``deliveries`` (all acked), their ``on_settled``
    hooks run after, each ``SettleHook`` once with its deliveries (in order)."""
    groups: list[tuple[Callable[[Any], None], list[Any]]] = []
    last: Callable[[Any], None] | None = None
    group: list[Any] = []
    for d in deliveries:
        hook = d.acked_hook()
        if hook is None:
            continue
        if hook is not last:
            last, group = hook, []
            groups.append((hook, group))
        group.append(d)
    for hook, settled in groups:
        if isinstance(hook, SettleHook):
            hook.many(settled)
        else:
            for d in settled:
                hook(d)


class DeliveryBase:
    """What a delivery is, for both front ends: the task, its attempt, due time and lease.

    ``Delivery`` (from ``Queue``) finishes it with blocking calls, ``AsyncDelivery`` (from
    ``AsyncQueue``) with awaitable ones.
    """

    __slots__ = (
        "_cancelled",
        "_outcome",
        "_queue",
        "_queue_paused",
        "_settled_flag",
        "attempt",
        "claimed_ms",
        "due_ms",
        "first_claimed_ms",
        "id",
        "lease_deadline_ms",
        "on_settled",
        "options",
        "payload",
        "result",
        "task_name",
        "token",
        "trace_context",
    )

    def __init__(
        self,
        queue: NamedQueue,
        task_id: str,
        payload: Any,
        attempt: int,
        due_ms: int,
        lease_deadline_ms: int,
        token: str,
        first_claimed_ms: int,
        claimed_ms: int,
        options: TaskOptions = NO_OPTIONS,
        trace_context: TraceContext | None = None,
        task_name: str | None = None,
    ) -> None:
        self._queue = queue
        self.options = options
        #: the name of the function that runs this task (``@q.task``), None for a plain
        #: payload task (``payload`` is then the function's arguments as a dict)
        self.task_name = task_name
        #: the W3C trace context the task was scheduled in (``schedule`` inside a span, with
        #: opentelemetry installed), or None: ``trace_context.headers()`` is a carrier for a
        #: propagator, for consumers that claim by hand (``process`` links its spans to it)
        self.trace_context = trace_context
        self.id = task_id
        self.payload = payload
        self.attempt = attempt
        self.due_ms = due_ms
        self.lease_deadline_ms = lease_deadline_ms
        self.token = token
        self.first_claimed_ms = first_claimed_ms
        self.claimed_ms = claimed_ms
        #: called once with this delivery when it is settled (set by dueq's consumers)
        self.on_settled: Callable[[Any], None] | None = None
        self._outcome: Outcome | None = None
        self._settled_flag = False
        self._cancelled = False
        self._queue_paused = False
        #: the value to keep as the task's result when it is acked (the handler's return
        #: value, set by dueq's consumers; ``ack(result=...)``): stored only while the queue
        #: keeps results (``keep_results``)
        self.result: Any = None

    @property
    def due_at(self) -> datetime:
        return ms_datetime(self.due_ms)

    @property
    def lease_deadline(self) -> datetime:
        return ms_datetime(self.lease_deadline_ms)

    @property
    def priority(self) -> int:
        """The task's priority (0-9, see ``Task``)."""
        return self.options.priority

    @property
    def key(self) -> str | None:
        """The task's limit key, if it was scheduled with one."""
        return self.options.key

    @property
    def fair_key(self) -> str | None:
        """The task's tenant on a fair queue when that is not its key (``fair_key=``)."""
        return self.options.fair_key

    @property
    def timeout_s(self) -> float | None:
        """The task's own timeout in seconds (overriding the consumer's), if it has one."""
        t = self.options.timeout_ms
        return None if t is None else t / 1000

    @property
    def max_attempts(self) -> int | None:
        """The task's own max_attempts (overriding the retry policy's), if it has one."""
        return self.options.max_attempts

    @property
    def settled(self) -> bool:
        """True once acked, failed or released through this object, or found lost doing so."""
        return self._settled_flag

    @property
    def cancelled(self) -> bool:
        """True once dueq found that this task was cancelled (``q.cancel``) while leased here:
        a long handler may check it and stop early. ``process`` finds out when it extends the
        lease (every third of the lease) or settles the delivery."""
        return self._cancelled

    @property
    def queue_name(self) -> str:
        """The name of the queue this delivery came from (a shard's, on a sharded queue)."""
        return self._queue.name

    @property
    def outcome(self) -> Outcome | None:
        """What became of this delivery once settled here other than by an ack (retried, dead,
        released, cancelled, lost); None before that and after an ack."""
        return self._outcome

    @property
    def queue_paused(self) -> bool:
        """True while the consumer that holds this delivery last found its queue paused
        (``q.pause()``): ``process`` does not start it then, but gives it back unstarted (no
        attempt counted), to be claimed once the queue is resumed."""
        return self._queue_paused

    def mark_queue_paused(self, paused: bool) -> None:
        """Set ``queue_paused``: called by the consumer's claim loop when a claim finds the
        queue paused, or resumed, for every delivery it holds."""
        self._queue_paused = paused

    def mark_cancelled(self) -> None:
        """Record that dueq found this task cancelled while leased here (``cancelled``): called
        by the flows that learn it from a script's verdict."""
        self._cancelled = True

    def acked_hook(self) -> Callable[[Any], None] | None:
        """``mark_settled()`` (an ack) without running ``on_settled``: returns it, for
        ``mark_all_acked`` to run once per hook for a whole batch."""
        self._settled_flag = True
        self._outcome = None
        hook, self.on_settled = self.on_settled, None
        return hook

    def mark_settled(self, outcome: Outcome | None = None) -> None:
        """Called by the flows once this delivery is no longer held: acked, failed, released
        or lost. ``outcome`` is what became of it (None for an ack); ``on_settled`` runs."""
        self._settled_flag = True
        if outcome is not None and outcome.kind == "cancelled":
            self._cancelled = True
        self._outcome = outcome
        hook, self.on_settled = self.on_settled, None
        if hook is not None:
            hook(self)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(id={self.id!r}, attempt={self.attempt}, "
            f"due_at={self.due_at.isoformat()}, "
            f"queue={self._queue.name!r})"
        )


class Delivery(DeliveryBase):
    """A task leased to this consumer. Finish it with ``ack``, ``fail`` or ``release``.

    Every call carries the lease token; a holder whose lease expired or was taken over gets
    ``LeaseLost``.
    """

    __slots__ = ()
    _queue: SettlingQueue

    @property
    def queue(self) -> SettlingQueue:
        """The queue that claimed it: a ``Queue`` (a sharded queue's shard), typed by what a
        delivery calls on it."""
        return self._queue

    def ack(self, result: Any = None) -> None:
        """Finish the task: it is removed (kept as ``done`` with ``result``, a JSON value,
        while the queue keeps results). Raises LeaseLost if the lease is no longer held."""
        if result is not None:
            self.result = result
        self._queue.ack_many([self])

    def fail(self, error: BaseException | str, *, retry_in: Duration | None = None) -> Outcome:
        """Record a failure: retry after the policy's backoff (or ``retry_in``), or go dead."""
        return self._queue.fail(self, error, retry_in=retry_in)

    def extend(self, seconds: Duration) -> datetime:
        """Extend the lease to ``seconds`` from now; returns the new deadline."""
        return self._queue.extend(self, seconds)

    def release(self, delay: Duration = 0) -> Outcome:
        """Give the task back, due after ``delay``, without counting this delivery."""
        return self._queue.release(self, delay=delay)

    def cooldown(self, seconds: float | timedelta) -> Outcome:
        """Give the task back, due after ``seconds``, without counting this delivery, and hold
        its limit key as long (see ``dueq.KeyCooldown``): the outcome is ``released``."""
        return self._queue.fail(self, KeyCooldown(seconds))

    def progress(self, obj: Any) -> int:
        """Report progress: ``obj`` (a JSON value, at most 64 KiB of JSON) becomes the task's
        next progress entry, written under this lease, kept with the task's last 20 and
        published to its followers (``q.progress(task_id)``); a "progress" event while the
        queue's events are on. Returns the entry's seq (1, 2, ... per task). LeaseLost
        (TaskCancelled when the task was cancelled) if the lease is no longer held;
        PayloadError for a body that is not JSON or too big. Nothing is written then."""
        return self._queue.report_progress(self, obj)


class AsyncDelivery(DeliveryBase):
    """A task leased to this consumer by an ``AsyncQueue``: ``await`` its ``ack``, ``fail``,
    ``extend`` or ``release``. A holder whose lease was lost gets ``LeaseLost``."""

    __slots__ = ()
    _queue: AsyncSettlingQueue

    @property
    def queue(self) -> AsyncSettlingQueue:
        """The queue that claimed it: an ``AsyncQueue`` (a sharded queue's shard), typed by what
        a delivery calls on it."""
        return self._queue

    async def ack(self, result: Any = None) -> None:
        """Finish the task: it is removed (kept as ``done`` with ``result``, a JSON value,
        while the queue keeps results). Raises LeaseLost if the lease is no longer held."""
        if result is not None:
            self.result = result
        await self._queue.ack_many([self])

    async def fail(
        self, error: BaseException | str, *, retry_in: Duration | None = None
    ) -> Outcome:
        """Record a failure: retry after the policy's backoff (or ``retry_in``), or go dead."""
        return await self._queue.fail(self, error, retry_in=retry_in)

    async def extend(self, seconds: Duration) -> datetime:
        """Extend the lease to ``seconds`` from now; returns the new deadline."""
        return await self._queue.extend(self, seconds)

    async def release(self, delay: Duration = 0) -> Outcome:
        """Give the task back, due after ``delay``, without counting this delivery."""
        return await self._queue.release(self, delay=delay)

    async def cooldown(self, seconds: float | timedelta) -> Outcome:
        """As ``Delivery.cooldown``."""
        return await self._queue.fail(self, KeyCooldown(seconds))

    async def progress(self, obj: Any) -> int:
        """As ``Delivery.progress``."""
        return await self._queue.report_progress(self, obj)


class Item:
    """One task of a bulk handler's call (``BatchSpec``): its delivery's task, and what the
    handler says became of it. ``fail``, ``release`` and ``result`` record a verdict only;
    dueq settles every item of the call together once the handler returns (or raises): items
    failed are retried alone with backoff (or go dead alone once out of attempts), items
    released go back without counting the attempt, and the rest are acked (with their
    ``result``, kept while the queue keeps results). A raise fails every item that has no
    verdict yet. The same class serves both front ends: nothing here calls Redis."""

    __slots__ = ("delivery", "error", "release_delay", "retry_in")

    def __init__(self, delivery: DeliveryBase) -> None:
        #: the delivery this item is (its lease is kept while the call runs)
        self.delivery = delivery
        #: the failure recorded by ``fail`` (None: not failed)
        self.error: BaseException | str | None = None
        #: ``fail``'s ``retry_in`` (None: the retry policy's backoff)
        self.retry_in: Duration | None = None
        #: ``release``'s delay (None: not released)
        self.release_delay: Duration | None = None

    @property
    def id(self) -> str:
        return self.delivery.id

    @property
    def payload(self) -> Any:
        """The task's payload (a named task's: the dict of its arguments)."""
        return self.delivery.payload

    @property
    def attempt(self) -> int:
        return self.delivery.attempt

    @property
    def due_at(self) -> datetime:
        return self.delivery.due_at

    @property
    def key(self) -> str | None:
        return self.delivery.key

    @property
    def priority(self) -> int:
        return self.delivery.priority

    @property
    def task_name(self) -> str | None:
        return self.delivery.task_name

    @property
    def queue_name(self) -> str:
        return self.delivery.queue_name

    @property
    def cancelled(self) -> bool:
        """True once dueq found the task cancelled while the call held it."""
        return self.delivery.cancelled

    @property
    def verdict(self) -> str | None:
        """ "failed" or "released" once the handler said so; None (acked when the call
        returns)."""
        if self.error is not None:
            return "failed"
        return None if self.release_delay is None else "released"

    def _refuse_second(self, what: str) -> None:
        if self.verdict is not None:
            raise ConfigurationError(
                f"item {self.id!r} is {self.verdict} already: an item takes one verdict "
                f"({what} after it)"
            )

    def fail(self, error: BaseException | str, *, retry_in: Duration | None = None) -> None:
        """Record a failure of this item alone: retried after the policy's backoff (or
        ``retry_in``), or dead once out of attempts (at once for ``dueq.Unrecoverable``)."""
        self._refuse_second("fail")
        if not isinstance(error, (BaseException, str)) or error == "":
            raise ConfigurationError(f"item.fail takes an exception or a message, got {error!r}")
        if retry_in is not None:
            duration_ms(retry_in, "retry_in", error=ConfigurationError)
        self.error = error
        self.retry_in = retry_in

    def release(self, delay: Duration = 0) -> None:
        """Give this item back, due after ``delay``, without counting the attempt."""
        self._refuse_second("release")
        duration_ms(delay, "release delay", error=ConfigurationError)
        self.release_delay = delay

    def result(self, value: Any) -> None:
        """Keep ``value`` (a JSON value) as this item's result when it is acked, while the
        queue keeps results (``keep_results``)."""
        self.delivery.result = value

    def __repr__(self) -> str:
        return f"Item(id={self.id!r}, attempt={self.attempt}, verdict={self.verdict!r})"
