"""The asyncio front end: ``AsyncQueue`` awaits what the shared flows (``dueq._flows.core``) yield.

Same settings, validation, encoding, scripts and Redis data as ``Queue``: a task scheduled by
one front end is consumed by the other. Only the I/O differs: every call goes through a
``redis.asyncio`` client on the caller's event loop, so a Redis stall never blocks the loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Literal, ParamSpec, TypeVar, overload

import redis
import redis.asyncio
from reactivex import Observable
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from dueq._consume.aio import deliveries, observe, wait_event
from dueq._consume.ended import async_listener as async_ended_listener
from dueq._consume.progress import afollow as follow_progress
from dueq._consume.wake import WakeSubscription
from dueq._flows.core import QueueCore
from dueq._flows.drive import Flow, drive_async
from dueq._util.checks import client_from_url
from dueq._util.clock import Clock, Duration, duration_ms
from dueq._wire import protocol as protocol
from dueq._wire.codec import Compression, Encrypted
from dueq._wire.envelope import DEFAULT_MAX_PAYLOAD_BYTES, validate_id
from dueq._wire.scripts import AsyncScripts, route_options_async
from dueq._wire.server_check import wrong_client
from dueq.cron.flows import AsyncCrons
from dueq.dead import AsyncDeadLetters
from dueq.delivery import AsyncDelivery, FailItem
from dueq.doctor import DoctorReport
from dueq.events.aio import async_events
from dueq.events.stream import AsyncEvent, EventGroup, event_groups_flow
from dueq.exceptions import WaitTimeout
from dueq.model import (
    BatchInfo,
    BatchSpec,
    ClaimBatch,
    DueHistogram,
    HistoryPoint,
    KeyLimit,
    KeyRotation,
    Outcome,
    Progress,
    QueueSettings,
    QueueStats,
    Rate,
    ReshardReport,
    ScheduleResult,
    Task,
    TaskInfo,
    TaskPage,
    TaskState,
)
from dueq.named import AsyncTaskFunction
from dueq.registry import WorkerInfo
from dueq.retry import RetryPolicy
from dueq.sharding.fanout import Each, send_each_async
from dueq.sharding.flows import sharded_layout
from dueq.sharding.reshard import IDLE_S as RESHARD_IDLE_S

logger = logging.getLogger("dueq.queue")

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")


class AsyncQueue(QueueCore):
    """A named queue of delayed tasks, on a ``redis.asyncio`` client; the API of ``Queue``,
    awaited. Settings are those of ``Queue`` (``retry``, ``lease``, ``clock``, ``shards``,
    ``codec``, ``compression``, ...).

    ``AsyncQueue.from_url(url, name, **options)`` makes the client too; that queue owns it
    (``owns_client``) and ``await aclose()`` (or the end of an ``async with``) closes it."""

    _delivery_type = AsyncDelivery

    def __init__(
        self,
        name: str,
        redis_client: redis.asyncio.Redis | AsyncRedisCluster,
        *,
        retry: RetryPolicy | None = None,
        lease: Duration = 30.0,
        clock: Clock | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        dead_max_count: int = 100_000,
        dead_max_age: Duration = timedelta(days=14),
        remember_done: Duration | None = None,
        wait_replicas: int = 0,
        wait_timeout: Duration = 1.0,
        holder: str | None = None,
        shards: int = 1,
        codec: Encrypted | None = None,
        compression: Compression | None = None,
    ) -> None:
        settings: dict[str, Any] = dict(
            retry=retry,
            lease=lease,
            clock=clock,
            max_payload_bytes=max_payload_bytes,
            dead_max_count=dead_max_count,
            dead_max_age=dead_max_age,
            remember_done=remember_done,
            wait_replicas=wait_replicas,
            wait_timeout=wait_timeout,
            holder=holder,
            codec=codec,
            compression=compression,
        )
        # shards: plain AsyncQueues of these settings on this client (see dueq.sharding.flows)
        sharded = sharded_layout(
            name, shards, lambda shard: AsyncQueue(shard, redis_client, **settings)
        )
        super().__init__(name, sharded=sharded, **settings)
        if not isinstance(redis_client, (redis.asyncio.Redis, AsyncRedisCluster)):
            blocking = isinstance(redis_client, (redis.Redis, redis.RedisCluster))
            raise wrong_client(
                redis_client,
                "a redis.asyncio.Redis or redis.asyncio.RedisCluster",
                "; for a blocking client use dueq.Queue" if blocking else "",
            )
        self.redis = redis_client
        #: True when the queue made its client (``from_url``): ``aclose()`` closes it then
        self.owns_client = False
        self._scripts = AsyncScripts(
            redis_client, wait_replicas=self.wait_replicas, wait_timeout_ms=self.wait_timeout_ms
        )
        self.dead = AsyncDeadLetters(self, self._dead_flows)
        self.cron = AsyncCrons(self, self._cron_flows)
        # a worker's wake listener and claim loop both check the server at start: once
        self._server_check_lock = asyncio.Lock()

    @classmethod
    def from_url(
        cls,
        url: str,
        name: str,
        *,
        client_options: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> AsyncQueue:
        """As ``Queue.from_url``, on a new ``redis.asyncio.Redis.from_url`` client (not
        awaited: nothing connects before the first call); ``aclose()`` closes it."""
        from_url = redis.asyncio.Redis.from_url
        client: redis.asyncio.Redis = client_from_url(from_url, url, client_options)
        queue = cls(name, client, **options)  # a refused option leaves no connection open
        queue.owns_client = True
        return queue

    async def aclose(self) -> None:
        """Close the Redis client if this queue made it (``from_url``); a client passed to
        the constructor is left open (it is the caller's)."""
        if self.owns_client:
            await self.redis.aclose()

    async def __aenter__(self) -> AsyncQueue:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- sending -----------------------------------------------------------------------------

    async def _send(self, step: protocol.Step | Each) -> Any:
        if isinstance(step, protocol.Call):
            return step.parse(await self._scripts.run(step.script, step.keys, step.args))
        if isinstance(step, protocol.Command):
            routed = await route_options_async(self.redis, step.route)
            return step.parse(await self.redis.execute_command(*step.args, **routed))
        if isinstance(step, protocol.Batch):
            pipe = self.redis.pipeline(transaction=False)
            for command in step.commands:
                pipe.execute_command(*command.args)
            replies = await pipe.execute()
            return [c.parse(r) for c, r in zip(step.commands, replies, strict=True)]
        # a sharded queue's steps for several shards: awaited at once
        return await send_each_async(self._send, step)

    async def drive(self, flow: Flow[T]) -> T:
        return await drive_async(flow, self._send)

    async def wake_subscription(self) -> WakeSubscription:
        """What the async consumer's wake listener subscribes to (checks the server first)."""
        await self._check_server_once()
        return await self.drive(self._core.wake_subscription_flow())

    def woken(self, channel: str | None) -> None:
        """Told by the wake listener of a message on ``channel`` (None: it (re)subscribed)."""
        self._core.note_wake(channel)

    async def _check_server_once(self) -> None:
        """As ``Queue._check_server_once``: coroutines asking at once share one check."""
        if self._server_checked:
            return
        async with self._server_check_lock:
            if not self._server_checked:
                await self.check_server()

    async def check_server(self) -> None:
        """As ``Queue.check_server``."""
        await self.drive(self._core.check_server_flow())

    # -- scheduling --------------------------------------------------------------------------

    @overload
    def task(self, fn: Callable[P, R], /) -> AsyncTaskFunction[P, R]: ...

    @overload
    def task(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        max_attempts: int | None = None,
        timeout: Duration | None = None,
        priority: int | None = None,
        key: str | None = None,
        context: bool = False,
        durable: bool = False,
        batch: BatchSpec | None = None,
    ) -> Callable[[Callable[P, R]], AsyncTaskFunction[P, R]]: ...

    def task(
        self,
        fn: Callable[P, R] | None = None,
        /,
        *,
        name: str | None = None,
        max_attempts: int | None = None,
        timeout: Duration | None = None,
        priority: int | None = None,
        key: str | None = None,
        context: bool = False,
        durable: bool = False,
        batch: BatchSpec | None = None,
    ) -> AsyncTaskFunction[P, R] | Callable[[Callable[P, R]], AsyncTaskFunction[P, R]]:
        """Register a function as a named task of this queue (``@q.task`` or
        ``@q.task(name=...)``): see ``dueq.TaskFunction``. ``name`` defaults to
        ``module.qualname``; ``max_attempts``, ``timeout``, ``priority`` and ``key`` are the
        defaults of its tasks. A ``Worker`` without a handler runs it by name. ``context=True``:
        the function's first parameter receives a ``dueq.TaskContext`` (id, attempt, ...);
        ``durable=True``: a ``dueq.StepContext`` (``AsyncStepContext`` for ``async def``), whose
        steps are committed as they finish (docs/durable.md). ``batch=dueq.BatchSpec(...)``: a
        bulk handler, called with a list of ``dueq.Item`` (docs/bulk-handlers.md)."""

        def register(function: Callable[P, R]) -> AsyncTaskFunction[P, R]:
            defined = AsyncTaskFunction(
                self,
                function,
                name=name,
                max_attempts=max_attempts,
                timeout=timeout,
                priority=priority,
                key=key,
                context=context,
                durable=durable,
                batch=batch,
            )
            self.register_task(defined)
            return defined

        return register if fn is None else register(fn)

    async def schedule(
        self,
        payload: Any,
        *,
        delay: Duration | None = None,
        at: datetime | None = None,
        id: str | None = None,  # the public API names it id
        replace: bool = False,
        priority: int = 0,
        key: str | None = None,
        timeout: Duration | None = None,
        max_attempts: int | None = None,
        task: str | None = None,
        expires: Duration | datetime | None = None,
        debounce: Duration | None = None,
        max_wait: Duration | None = None,
        batch: str | None = None,
        after: Sequence[str] | None = None,
        after_policy: Literal["fail", "run"] = "fail",
        fair_key: str | None = None,
    ) -> str:
        """Schedule one task; returns its id. An existing id is left alone unless ``replace``.
        ``priority``, ``key``, ``fair_key`` (its tenant on a fair queue when that is not its
        ``key``), ``timeout``, ``max_attempts`` and ``expires`` are kept with it,
        ``debounce``/``max_wait`` debounce repeated schedules of one id (see ``Task``).
        ``task`` names the registered function that runs it (``@q.task``): ``payload`` is
        then a dict of its arguments."""
        tasks = [
            Task(
                payload,
                id,
                at,
                delay,
                priority,
                key,
                timeout,
                max_attempts,
                task,
                expires,
                debounce,
                max_wait,
                batch,
                () if after is None else after,
                after_policy,
                fair_key,
            )
        ]
        result = await self.drive(self._core.schedule_many_flow(tasks, replace))
        return result.ids[0]

    async def schedule_many(
        self, tasks: Iterable[Task], *, replace: bool = False, batch: str | None = None
    ) -> ScheduleResult:
        """As ``Queue.schedule_many``: validated first, then one round trip per batch."""
        return await self.drive(self._core.schedule_many_flow(tasks, replace, batch))

    async def close_batch(self, batch: str, *, on_complete: Task | None = None) -> BatchInfo:
        """As ``Queue.close_batch``."""
        return await self.drive(self._core.close_batch_flow(batch, on_complete))

    async def batch(self, batch: str) -> BatchInfo | None:
        """As ``Queue.batch``."""
        return await self.drive(self._core.batch_flow(batch))

    async def batches(self, limit: int = 100) -> list[BatchInfo]:
        """As ``Queue.batches``."""
        return await self.drive(self._core.batches_flow(limit))

    async def cancel(self, task_id: str) -> bool:
        """Remove a task in any state; True if it existed. A live lease on it is revoked."""
        return await self.drive(self._core.cancel_flow(task_id))

    async def reschedule(
        self, task_id: str, *, at: datetime | None = None, delay: Duration | None = None
    ) -> bool:
        """Move a scheduled task to a new due time; False if it is not scheduled."""
        return await self.drive(self._core.reschedule_flow(task_id, at, delay))

    # -- consuming ---------------------------------------------------------------------------

    async def claim(
        self, limit: int = 100, *, lease: Duration | None = None
    ) -> list[AsyncDelivery]:
        """Lease up to ``limit`` due tasks (earliest first) to this caller, atomically."""
        return (await self.claim_batch(limit, lease=lease)).deliveries

    async def claim_batch(
        self, limit: int = 100, *, lease: Duration | None = None, holder: str | None = None
    ) -> ClaimBatch:
        """Like ``claim``, also telling when the next task is due and the next lease ends.
        ``holder`` names who takes the leases (a worker id, shown by ``list_tasks`` and
        ``get``); by default the queue's ``holder``, else "<host>:<pid>"."""
        await self._check_server_once()
        return await self.drive(self._core.claim_flow(limit, lease, holder))

    async def ack_many(self, deliveries: Sequence[AsyncDelivery]) -> int:
        """Ack a batch in one round trip; LeaseLost (with ``.ids``) if some leases were lost."""
        return await self.drive(self._core.ack_flow(deliveries))

    async def fail(
        self,
        delivery: AsyncDelivery,
        error: BaseException | str,
        *,
        retry_in: Duration | None = None,
    ) -> Outcome:
        """Record a failed delivery; retried after the backoff (or ``retry_in``), or dead."""
        return await self.drive(self._core.fail_flow(delivery, error, retry_in))

    async def fail_many(self, items: Sequence[FailItem[AsyncDelivery]]) -> list[Outcome]:
        """As ``Queue.fail_many``: items ``(delivery, error)`` or ``(delivery, error,
        retry_in)``, outcomes in the order given, one round trip per 1,000."""
        return await self.drive(self._core.fail_many_flow(items))

    async def extend_many(self, deliveries: Sequence[AsyncDelivery], seconds: Duration) -> datetime:
        """Extend many held leases to ``seconds`` from now in one round trip per 1,000;
        returns the new deadline. LeaseLost (with ``.ids``) names the leases that were not
        held; the others are still extended."""
        return await self.drive(self._core.extend_many_flow(deliveries, seconds))

    async def extend(self, delivery: AsyncDelivery, seconds: Duration) -> datetime:
        """Extend a held lease to ``seconds`` from now; LeaseLost if it is not held."""
        return await self.drive(self._core.extend_flow(delivery, seconds))

    async def release(self, delivery: AsyncDelivery, *, delay: Duration = 0) -> Outcome:
        """Give a leased task back, due after ``delay``; the delivery does not count."""
        return await self.drive(self._core.release_flow(delivery, delay))

    async def release_many(
        self, deliveries: Sequence[AsyncDelivery], *, delay: Duration = 0, hold: bool = False
    ) -> list[Outcome]:
        """As ``Queue.release_many``."""
        return await self.drive(self._core.release_many_flow(deliveries, delay, hold=hold))

    def deliveries(
        self,
        max_in_flight: int | Literal["auto"] = 64,
        *,
        wake: bool = True,
        heartbeat: Duration = 5.0,
    ) -> AsyncGenerator[AsyncDelivery, None]:
        """An ``async for`` iterator of this queue's deliveries, each yielded the moment it is
        due, on the running loop with no threads of its own.

        It holds at most ``max_in_flight`` unsettled deliveries (``"auto"``: adapted to how
        fast they are settled, between 16 and 1,024), then sleeps until the next
        due time or lease deadline (at most ``heartbeat``), or until the wake channel or a
        settled delivery says there is work. Redis outages are waited out; leaving the loop
        releases what was claimed but not yet yielded.
        """
        return deliveries(self, max_in_flight=max_in_flight, wake=wake, heartbeat=heartbeat)

    def observe(
        self,
        max_in_flight: int | Literal["auto"] = 64,
        *,
        wake: bool = True,
        heartbeat: Duration = 5.0,
    ) -> Observable[AsyncDelivery]:
        """An observable of this queue's deliveries with the timing of ``deliveries()``, run
        on the event loop it is subscribed from (subscribe from a coroutine), with no threads
        of its own. Pipe it into ``dueq.operators.process`` subscribed on the same loop to run
        ``async def`` handlers there; disposing stops claiming and releases what was claimed
        and not yet emitted."""
        return observe(self, max_in_flight=max_in_flight, wake=wake, heartbeat=heartbeat)

    def events(
        self,
        group: str | None = None,
        *,
        consumer: str | None = None,
        redeliver_after: Duration = 30.0,
        since: datetime | None = None,
    ) -> AsyncGenerator[AsyncEvent, None]:
        """An ``async for`` iterator of the queue's outcome events (``configure(events=...)``),
        as ``Queue.events``, on the running loop with no threads of its own; ``await
        ev.ack()`` settles an event in its group. A tail without ``since`` starts at its first
        read. See docs/events.md."""
        return async_events(
            self, group=group, consumer=consumer, redeliver_after=redeliver_after, since=since
        )

    async def event_groups(self) -> list[EventGroup]:
        """As ``Queue.event_groups``."""
        return await self.drive(event_groups_flow(self))

    # -- settings ----------------------------------------------------------------------------

    async def configure(
        self,
        *,
        paused: bool | None = None,
        remember_done: Duration | None = None,
        keep_results: Duration | None = None,
        rate: Rate | Literal[False] | None = None,
        key_rate: Rate | Literal[False] | None = None,
        key_concurrency: int | Literal[False] | None = None,
        concurrency: int | Literal[False] | None = None,
        key_limits: Mapping[str, KeyLimit | Literal[False] | None] | None = None,
        events: Duration | Literal[False] | None = None,
        fairness: Literal["key", False] | None = None,
    ) -> QueueSettings:
        """As ``Queue.configure``."""
        return await self.drive(
            self._core.configure_flow(
                paused=paused,
                remember_done=remember_done,
                keep_results=keep_results,
                rate=rate,
                key_rate=key_rate,
                key_concurrency=key_concurrency,
                concurrency=concurrency,
                key_limits=key_limits,
                events=events,
                fairness=fairness,
            )
        )

    async def pause(self) -> QueueSettings:
        """Stop every consumer of this queue from leasing tasks (expired leases are still
        reclaimed; scheduling goes on). Running handlers finish; deliveries a consumer
        holds and has not started are given back unstarted, not run (docs/settings.md)."""
        return await self.configure(paused=True)

    async def resume(self) -> QueueSettings:
        """Let consumers lease tasks again; sleeping consumers are woken at once."""
        return await self.configure(paused=False)

    async def settings(self) -> QueueSettings:
        """The queue's settings as stored in Redis."""
        return await self.drive(self._core.settings_flow())

    # -- inspection --------------------------------------------------------------------------

    async def get(self, task_id: str) -> TaskInfo | None:
        """A snapshot of one task, or None if there is no such task."""
        return await self.drive(self._core.get_flow(task_id))

    async def get_many(self, task_ids: Iterable[str]) -> list[TaskInfo]:
        """Snapshots of the tasks with these ids that exist, in the order given (a repeated id
        once, a missing one left out): one round trip per 1,000 ids, each page one consistent
        snapshot. ``InvalidTaskError`` for an id that is not valid, before anything is read."""
        return await self.drive(self._core.get_many_flow(task_ids))

    # -- task progress (docs/progress.md) ---------------------------------------------------

    async def report_progress(self, delivery: AsyncDelivery, obj: Any) -> int:
        """As ``Queue.report_progress`` (``await d.progress(obj)``)."""
        return await self.drive(self._core.progress_flow(delivery, obj))

    def progress(self, task_id: str, *, timeout: Duration | None = None) -> AsyncIterator[Progress]:
        """As ``Queue.progress``: ``async for entry in aq.progress(task_id)``; leave it with
        ``break`` or ``aclose()`` (``contextlib.aclosing``) to close its subscription."""
        flow = self._core.progress_follow_flow(task_id, timeout)  # (checks id and timeout)
        return follow_progress(flow, self._send, self.redis)

    async def wait(self, task_id: str, timeout: Duration = 10.0) -> TaskInfo:
        """As ``Queue.wait``: the task once it has ended; ``WaitTimeout`` if not in time."""
        task_id = validate_id(task_id)
        deadline = time.monotonic() + duration_ms(timeout, "timeout") / 1000
        shared = async_ended_listener(self.redis)  # one subscription per client and loop
        async with shared.looking():
            ended = await self.drive(self._core.wait_check_flow(task_id))  # (ended: no waiting)
        if ended is not None:
            return ended
        subscription = await self.drive(self._core.ended_subscription_flow(task_id))
        waiter = await shared.add(subscription, task_id)
        try:
            while True:  # woken by its task's end or a (re)confirmed subscription: look again
                await wait_event(waiter.woken, _left_s(deadline))
                waiter.woken.clear()
                shared.waiters.raise_error()
                async with shared.looking():
                    info = await self.drive(self._core.wait_check_flow(task_id))
                if info is not None:
                    return info
                if _left_s(deadline) <= 0:
                    raise WaitTimeout(f"task {task_id!r} did not end in time", task_id)
        finally:
            await shared.remove(waiter)

    async def stats(self) -> QueueStats:
        """Counts per state, the next due time and the lag of the oldest due task."""
        return await self.drive(self._core.stats_flow())

    async def doctor(self, fix: bool = False, *, batch: int = 1000) -> DoctorReport:
        """As ``Queue.doctor``."""
        return await self.drive(self._core.doctor_flow(fix, batch))

    async def rotate_key(
        self,
        to: str,
        *,
        batch: int = 500,
        cursor: str | None = None,
        progress: Callable[[KeyRotation], object] | None = None,
    ) -> KeyRotation:
        """As ``Queue.rotate_key`` (``progress`` is a plain callable, called on the loop)."""
        return await self.drive(self._core.rotate_key_flow(to, batch, cursor, progress))

    async def reshard(
        self,
        shards: int,
        *,
        batch: int = 500,
        progress: Callable[[ReshardReport], object] | None = None,
    ) -> ReshardReport:
        """As ``Queue.reshard`` (``progress`` is a plain callable, called on the loop)."""
        resharder = self._core.resharder()
        report: ReshardReport = await self.drive(resharder.start_flow(shards))
        while not report.done:
            report = await self.drive(resharder.step_flow(batch))
            if progress is not None:
                progress(report)
            if report.idle:  # a pass moved nothing: leases are out, or writers still follow
                await asyncio.sleep(RESHARD_IDLE_S)
        return report

    async def list_tasks(
        self,
        state: TaskState,
        *,
        limit: int = 100,
        cursor: str | None = None,
        id_prefix: str | None = None,
        grep: str | None = None,
        error_type: str | None = None,
        after: datetime | None = None,
        before: datetime | None = None,
    ) -> TaskPage:
        """As ``Queue.list_tasks``."""
        return await self.drive(
            self._core.list_flow(
                state,
                limit=limit,
                cursor=cursor,
                id_prefix=id_prefix,
                grep=grep,
                error_type=error_type,
                after=after,
                before=before,
            )
        )

    async def iter_tasks(
        self, state: TaskState, *, page: int = 100, **filters: Any
    ) -> AsyncIterator[TaskInfo]:
        """As ``Queue.iter_tasks``: ``async for info in q.iter_tasks("dead")``."""
        cursor: str | None = None
        while True:
            found = await self.list_tasks(state, limit=page, cursor=cursor, **filters)
            for info in found.tasks:
                yield info
            cursor = found.cursor
            if cursor is None:
                return

    async def signal(self, task_id: str, name: str, payload: Any = None) -> int:
        """As ``Queue.signal``."""
        return await self.drive(self._core.signal_flow(task_id, name, payload))

    async def run_now(self, task_id: str) -> bool:
        """As ``Queue.run_now``."""
        return await self.drive(self._core.run_now_flow(task_id))

    async def history(self, minutes: int = 60) -> list[HistoryPoint]:
        """As ``Queue.history``."""
        return await self.drive(self._core.history_flow(minutes))

    async def due_histogram(self, bucket: Duration = 60.0, buckets: int = 30) -> DueHistogram:
        """As ``Queue.due_histogram``."""
        return await self.drive(self._core.due_histogram_flow(bucket, buckets))

    async def workers(self) -> list[WorkerInfo]:
        """As ``Queue.workers``."""
        return await self.drive(self._core.workers_flow())

    async def send_heartbeat(self, entry_json: str, ttl_ms: int) -> int:
        return await self.drive(self._core.heartbeat_flow(entry_json, ttl_ms, leave=False))

    async def leave_registry(self) -> None:
        await self.drive(self._core.heartbeat_flow("{}", 0, leave=True))


def _left_s(deadline: float) -> float:
    """Seconds left until a ``time.monotonic()`` deadline (0 once passed)."""
    return max(deadline - time.monotonic(), 0.0)
