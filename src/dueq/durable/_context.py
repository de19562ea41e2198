"""What a named task's function sees of its own delivery: ``TaskContext``
(``@q.task(context=True)``), and for a durable task (``@q.task(durable=True)``) its steps:
``StepContext`` (blocking) and ``AsyncStepContext`` (awaited).

Each step operation is written once, as flows (``_begin``, ``_commit``, ``_failed``,
``_sleep``, ``_wait``) over ``dueq.durable._run.StepRun`` and the queue's step flows
(``dueq._flows.steps``); the two contexts differ only in how they drive those flows and call the
step's body, as the queue's two front ends do. A context is made per delivery by the
dispatcher (``dueq.named``), with the driver that fits the delivery and the function: a blocking
queue's ``drive``, an asyncio queue's awaited ``drive``, or either from the other side
(``step_context``).

The task's step log is read once per run, on its first step; each write is one script call
under the lease, so a holder whose lease was lost or taken over is refused (``LeaseLost``) and
its result discarded.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Protocol, TypeVar

from dueq._util.clock import Clock, Duration, duration_ms
from dueq._wire.protocol import DurableOp, Flow, StepReply
from dueq._wire.signals import validate_signal_name
from dueq.durable._run import (
    StepRun,
    Suspended,
    duration_arg,
    error_json,
    result_json,
)
from dueq.exceptions import ConfigurationError, InvalidTaskError, LeaseLost, Unrecoverable
from dueq.model import Outcome, StepInfo, StepKind
from dueq.retry import RetryPolicy

T = TypeVar("T")


class StepQueue(Protocol):
    """What a durable delivery's queue runs its steps on (``QueueCore`` has it: the queue, or
    a sharded queue's shard, that claimed the delivery)."""

    @property
    def clock(self) -> Clock | None:
        """The injected clock (seconds), or None for the server's."""
        ...

    def step_log_flow(self, delivery: Any) -> Flow[list[StepInfo]]: ...

    def progress_flow(self, delivery: Any, obj: Any) -> Flow[int]: ...

    def step_flow(
        self,
        delivery: Any,
        op: DurableOp,
        position: int,
        head: str,
        value: str,
        extra: str = "",
    ) -> Flow[StepReply]: ...


class TaskContext:
    """What a named task registered with ``@q.task(context=True)`` sees of its own delivery;
    the function receives it as its first argument (Celery's ``bind=True``, arq's ``ctx``).

    ``id``, ``attempt`` (1 on the first delivery), ``max_attempts`` (the task's own or the
    queue's retry policy's), ``queue`` (the queue's name; a shard's on a sharded queue),
    ``task_name``, ``due_at`` and ``lease_deadline`` (aware datetimes), ``cancelled`` (True
    once dueq found the task cancelled while it runs: a long function may stop early) and
    ``extend(seconds)``, which extends the lease like ``Delivery.extend`` (on an
    ``AsyncQueue``: ``await ctx.extend(s)`` from an ``async def`` function; a plain function
    an ``AsyncWorker`` runs on a thread cannot await it, so make one that extends
    ``async def``). ``delivery`` is the ``Delivery`` (or ``AsyncDelivery``) itself.
    """

    __slots__ = ("delivery",)

    def __init__(self, delivery: Any) -> None:
        self.delivery = delivery

    @property
    def id(self) -> str:
        return str(self.delivery.id)

    @property
    def attempt(self) -> int:
        return int(self.delivery.attempt)

    @property
    def max_attempts(self) -> int:
        own: int | None = self.delivery.max_attempts
        return int(self.delivery.queue.retry.max_attempts) if own is None else own

    @property
    def queue(self) -> str:
        return str(self.delivery.queue_name)

    @property
    def task_name(self) -> str | None:
        name: str | None = self.delivery.task_name
        return name

    @property
    def due_at(self) -> datetime:
        due: datetime = self.delivery.due_at
        return due

    @property
    def lease_deadline(self) -> datetime:
        deadline: datetime = self.delivery.lease_deadline
        return deadline

    @property
    def cancelled(self) -> bool:
        return bool(self.delivery.cancelled)

    def extend(self, seconds: Duration) -> Any:
        """Extend the lease to ``seconds`` from now: the new deadline (``Queue``), or an
        awaitable of it (``AsyncQueue``)."""
        return self.delivery.extend(seconds)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(id={self.id!r}, attempt={self.attempt}, "
            f"max_attempts={self.max_attempts}, queue={self.queue!r})"
        )


def _timeout_ms(timeout: Duration | None) -> int | None:
    return None if timeout is None else duration_ms(timeout, "wait_for timeout")


def _check_retry(retry: RetryPolicy | None) -> None:
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise ConfigurationError(f"a step's retry must be a dueq.RetryPolicy, got {retry!r}")


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name or len(name) > 200:
        raise InvalidTaskError(f"a step's name is a str of 1 to 200 characters, got {name!r}")
    return name


class StepContextBase(TaskContext):
    """A durable task's context: ``TaskContext`` and the flows of its steps (see the module
    docstring); ``StepContext`` and ``AsyncStepContext`` drive them."""

    __slots__ = ("_queue", "_run")

    def __init__(self, delivery: Any) -> None:
        super().__init__(delivery)
        self._queue: StepQueue = delivery.queue
        self._run = StepRun(str(delivery.id))

    @property
    def step_id(self) -> str:
        """An idempotency key for the step whose body runs now (``"<task id>/<position>/
        <name>"``), the same on every run of that step: give it to the service a step calls
        (a payment provider's idempotency key), since a step's body runs at least once."""
        running = self._run.running
        if running is None:
            raise InvalidTaskError("ctx.step_id is read inside a step's body (ctx.step)")
        return running

    def now_ms(self) -> int:
        """The queue's clock in epoch ms (this process's clock when the queue uses Redis's):
        what a step's start and run time are stamped with."""
        clock = self._queue.clock
        return round((clock() if clock is not None else time.time()) * 1000)

    def check_lease(self) -> None:
        """LeaseLost (the delivery settled as lost) when this delivery's lease has run out by
        the queue's clock (this process's clock when the queue uses the server's): checked
        before each step's body, so that a run that stalled past its lease (a pause, an
        outage, a stopped process) runs no body that another holder may have committed
        since. Its lease keeper extends a running delivery's lease as ever."""
        d = self.delivery
        if self.now_ms() >= d.lease_deadline_ms:
            d.mark_settled(Outcome(d.id, "lost", d.attempt))
            raise LeaseLost(
                f"lease on task {d.id!r} ran out before step {self._run.position} "
                "(another holder may run the task now); this run stops here",
                [d.id],
            )

    def finish(self) -> None:
        """At the function's return (the dispatcher calls it): NonDeterministic when the run
        stopped short of the steps the log holds committed."""
        self._run.finish()

    # -- the flows each step operation is made of ------------------------------------------

    def _begin(self, kind: StepKind, name: str) -> Flow[StepInfo | None]:
        if self._run.records is None:
            self._run.loaded(list((yield from self._queue.step_log_flow(self.delivery))))
        return self._run.next(kind, name)

    def _commit(self, name: str, value: Any, started_ms: int) -> Flow[Any]:
        """Commit the result of step ``name`` (its body began at ``started_ms``): the value as
        the log keeps it (JSON decoded, so that this run sees what every later run will)."""
        text = result_json(name, value)
        run = self._run
        run.room_for(name, len(text))
        now_ms = self.now_ms()
        head = run.head("step", name, now_ms, started_ms)
        yield from self._queue.step_flow(self.delivery, "commit", run.position, head, text)
        kept = json.loads(text)
        run.committed_now("step", name, kept)
        return kept

    def _failed(
        self, name: str, exc: BaseException, retry: RetryPolicy | None, started_ms: int
    ) -> Flow[None]:
        """Record a failed run of step ``name``. With the step's own ``retry``, the task is
        handed back for the policy's delay (Suspended), or, once the policy gives up, the
        attempt ends with Unrecoverable (dead); without, the caller re-raises ``exc`` and the
        task's retry policy decides."""
        run = self._run
        now_ms = self.now_ms()
        head = run.head("step", name, now_ms, started_ms)
        runs, extra, gave_up = run.runs(), "", False
        if retry is not None and not isinstance(exc, Unrecoverable):
            age_s = run.age_s(now_ms)
            if retry.gives_up(runs, age_s, exc):
                gave_up = True
            else:
                extra = duration_arg(round(retry.delay_s(runs, age_s, exc) * 1000))
        yield from self._queue.step_flow(
            self.delivery, "fail", run.position, head, error_json(exc), extra
        )
        if extra:
            run.suspended = True
            raise Suspended
        if gave_up:
            raise Unrecoverable(
                f"step {name!r} failed {runs} time(s) and its retry policy gave up: "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    def _sleep(self, delay_ms: int) -> Flow[None]:
        run = self._run
        found = yield from self._begin("sleep", "sleep")
        if found is not None:  # committed before: hand back again if it has not ended
            wake_ms = found.result if isinstance(found.result, int) else 0
            reply = yield from self._queue.step_flow(
                self.delivery, "again", run.position, "", duration_arg(wake_ms)
            )
        else:
            head = run.head("sleep", "sleep", self.now_ms())
            reply = yield from self._queue.step_flow(
                self.delivery, "sleep", run.position, head, duration_arg(delay_ms)
            )
            run.committed_now("sleep", "sleep", int(reply.value) if reply.value != "-1" else None)
        if reply.value != "-1":
            run.suspended = True
            raise Suspended

    def _wait(self, name: str, timeout_ms: int | None) -> Flow[Any]:
        run = self._run
        found = yield from self._begin("wait", name)
        if found is not None:
            return found.result
        head = run.head("wait", name, self.now_ms())
        timeout = "" if timeout_ms is None else duration_arg(timeout_ms)
        reply = yield from self._queue.step_flow(
            self.delivery, "wait", run.position, head, timeout, name
        )
        if reply.value.startswith("P"):
            run.suspended = True
            raise Suspended
        payload = None if reply.value == "~" else json.loads(reply.value[1:])
        run.committed_now("wait", name, payload)
        return payload


def _wait_args(name: object, timeout: Duration | None) -> tuple[str, int | None]:
    return validate_signal_name(name), _timeout_ms(timeout)


class StepContext(StepContextBase):
    """The context of a durable task run with blocking calls (a plain ``def`` function):
    ``TaskContext``, and

    - ``ctx.step(name, fn, *args, retry=None, **kwargs)``: ``fn(*args, **kwargs)``'s result,
      committed under the lease the first time; on every later run of the task, the stored
      result without calling ``fn``. Its body runs at least once and its result is committed
      at most once (``ctx.step_id`` is an idempotency key for what it does). A failed run
      raises as ever (the task's retry policy runs the task again) or, with ``retry=`` (a
      ``dueq.RetryPolicy``), hands the task back for the step policy's delay until it gives up
      (the task then goes dead).
    - ``ctx.sleep(duration)``: ends this attempt (not counted as a failure, no worker held) and
      goes on after ``duration``.
    - ``ctx.wait_for(name, timeout=None)``: the payload of the first signal ``name`` sent to
      the task (``q.signal``) not yet taken; when none is there, the task is handed back until
      one comes or ``timeout`` passes (then None).
    - ``ctx.progress(obj)``: a progress entry for the task's followers (``q.progress(id)``).

    Steps are told apart by their order and name: a run that asks for another step at a
    position than the log holds fails with ``NonDeterministic``. docs/durable.md has it all.
    """

    __slots__ = ("_drive",)

    def __init__(self, delivery: Any, drive: Callable[[Flow[Any]], Any]) -> None:
        super().__init__(delivery)
        self._drive = drive

    def step(
        self,
        name: str,
        fn: Callable[..., T],
        /,
        *args: Any,
        retry: RetryPolicy | None = None,
        **kwargs: Any,
    ) -> T:
        _check_name(name)
        _check_retry(retry)
        found = self._drive(self._begin("step", name))
        if found is not None:
            return found.result  # type: ignore[no-any-return]
        self.check_lease()
        run = self._run
        run.running, started_ms = run.step_id(name), self.now_ms()
        try:
            value = fn(*args, **kwargs)
        except Exception as exc:  # a failed run: recorded, then retried by a policy
            run.running = None
            self._drive(self._failed(name, exc, retry, started_ms))
            raise
        run.running = None
        return self._drive(self._commit(name, value, started_ms))  # type: ignore[no-any-return]

    def sleep(self, duration: Duration) -> None:
        delay_ms = duration_ms(duration, "sleep")
        self._drive(self._sleep(delay_ms))

    def progress(self, obj: Any) -> int:
        """Report ``obj`` (a JSON value) as this task's next progress entry, as
        ``Delivery.progress`` does (docs/progress.md): followers of ``q.progress(id)`` and
        ``q.events()`` get it; its number. Not a step: it is written on every run that reaches
        it (make it a step's result to keep it to one)."""
        seq: int = self._drive(self._queue.progress_flow(self.delivery, obj))
        return seq

    def wait_for(self, name: str, timeout: Duration | None = None) -> Any:
        signal, timeout_ms = _wait_args(name, timeout)
        return self._drive(self._wait(signal, timeout_ms))


class AsyncStepContext(StepContextBase):
    """The context of a durable ``async def`` task: ``StepContext``'s operations, awaited
    (``await ctx.step(name, fn, ...)``, where ``fn`` may be ``async def`` or plain: a plain
    one runs on the loop, so keep it short or give it to a thread yourself;
    ``await ctx.sleep(d)``; ``await ctx.wait_for(name, timeout=)``)."""

    __slots__ = ("_drive",)

    def __init__(self, delivery: Any, drive: Callable[[Flow[Any]], Awaitable[Any]]) -> None:
        super().__init__(delivery)
        self._drive = drive

    async def step(
        self,
        name: str,
        fn: Callable[..., Any],
        /,
        *args: Any,
        retry: RetryPolicy | None = None,
        **kwargs: Any,
    ) -> Any:
        _check_name(name)
        _check_retry(retry)
        found = await self._drive(self._begin("step", name))
        if found is not None:
            return found.result
        self.check_lease()
        run = self._run
        run.running, started_ms = run.step_id(name), self.now_ms()
        try:
            value = fn(*args, **kwargs)
            if inspect.isawaitable(value):
                value = await value
        except Exception as exc:  # a failed run: recorded, then retried by a policy
            run.running = None
            await self._drive(self._failed(name, exc, retry, started_ms))
            raise
        run.running = None
        return await self._drive(self._commit(name, value, started_ms))

    async def sleep(self, duration: Duration) -> None:
        delay_ms = duration_ms(duration, "sleep")
        await self._drive(self._sleep(delay_ms))

    async def progress(self, obj: Any) -> int:
        """As ``StepContext.progress``, awaited."""
        seq: int = await self._drive(self._queue.progress_flow(self.delivery, obj))
        return seq

    async def wait_for(self, name: str, timeout: Duration | None = None) -> Any:
        signal, timeout_ms = _wait_args(name, timeout)
        return await self._drive(self._wait(signal, timeout_ms))


def step_context(
    delivery: Any, *, awaited: bool, loop: asyncio.AbstractEventLoop | None = None
) -> StepContextBase:
    """The context of durable ``delivery`` for a function that awaits (``awaited``: an
    ``async def`` one) or not, driving its queue as that queue is driven: an ``AsyncQueue``'s
    flows awaited (from a thread: on ``loop``, the consumer's), a ``Queue``'s blocking (from a
    coroutine: on a worker thread)."""
    queue: Any = delivery.queue
    on_loop = inspect.iscoroutinefunction(getattr(queue, "drive", None))
    if awaited:
        if on_loop:
            return AsyncStepContext(delivery, queue.drive)

        async def in_thread(flow: Flow[Any]) -> Any:
            return await asyncio.to_thread(queue.drive, flow)

        return AsyncStepContext(delivery, in_thread)
    if not on_loop:
        return StepContext(delivery, queue.drive)
    if loop is None:
        raise ConfigurationError(
            "a plain durable function consumed from an AsyncQueue runs on a thread with the "
            "consumer's loop (AsyncWorker does that): make it async def, or run it there"
        )
    running_loop = loop

    def on_the_loop(flow: Flow[Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(queue.drive(flow), running_loop).result()

    return StepContext(delivery, on_the_loop)
