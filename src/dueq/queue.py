"""The blocking front end: ``Queue`` sends what the shared flows (``dueq._flows.core``) yield.

Every state change is one Lua script call (see ``dueq/lua``), built by the protocol layer
(``dueq._wire.protocol``); validation, encoding and the handling of replies live in
``QueueCore`` and are shared with ``AsyncQueue``. This module only does the blocking I/O.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Literal, ParamSpec, TypeVar, overload

import redis
from reactivex import Observable, abc
from redis.cluster import RedisCluster

from dueq._consume.ended import listener as ended_listener
from dueq._consume.progress import follow as follow_progress
from dueq._consume.threads import observe_queue
from dueq._consume.wake import WakeSubscription
from dueq._flows.core import QueueCore
from dueq._flows.drive import Flow, drive
from dueq._flows.lease import MAX_CLAIM_BATCH
from dueq._flows.schedule import SCHEDULE_BATCH
from dueq._util.checks import client_from_url
from dueq._util.clock import Clock, Duration, duration_ms
from dueq._wire import protocol as protocol
from dueq._wire.codec import Compression, Encrypted
from dueq._wire.envelope import DEFAULT_MAX_PAYLOAD_BYTES, validate_id
from dueq._wire.scripts import Scripts, route_options
from dueq._wire.server_check import MIN_REDIS_VERSION, wrong_client
from dueq.cron.flows import Crons
from dueq.dead import DeadLetters
from dueq.delivery import Delivery, FailItem
from dueq.doctor import DoctorReport
from dueq.events.stream import Event, EventGroup, event_groups_flow, observe_events
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
from dueq.named import TaskFunction
from dueq.registry import WorkerInfo
from dueq.retry import RetryPolicy
from dueq.sharding.fanout import Each, send_each
from dueq.sharding.flows import sharded_layout
from dueq.sharding.reshard import IDLE_S as RESHARD_IDLE_S

logger = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")

__all__ = ["MAX_CLAIM_BATCH", "MIN_REDIS_VERSION", "SCHEDULE_BATCH", "ClaimBatch", "Queue"]


class Queue(QueueCore):
    """A named queue of delayed tasks in one Redis database (blocking client).

    ``retry`` decides how often a task is delivered and the backoff between attempts;
    ``lease`` is how long a consumer holds a claimed task before it is delivered again.
    ``clock`` (zero-argument callable returning epoch seconds) replaces the Redis server's
    ``TIME``, for tests and simulations. The dead-letter queue keeps at most
    ``dead_max_count`` tasks, none older than ``dead_max_age``.

    ``remember_done`` (off by default) keeps the ids of acked tasks for that long, and
    scheduling such an id again counts it as existing (unless ``replace=True``), so a re-run
    producer does not re-create tasks that already ran. Give it to producers and consumers.

    ``holder`` names this process in the leases its claims take (a worker id of at most 32
    characters, without "|"; default "<host>:<pid>"), so that ``list_tasks("leased")`` and
    ``get`` show who holds what.

    ``wait_replicas`` (0: off) makes every change that must survive a failover wait until that
    many replicas confirm it (Redis ``WAIT``, at most ``wait_timeout``): schedule, cancel,
    reschedule, dead-letter replay/purge and cron definitions raise ReplicationTimeout when
    fewer confirm (the change is made on the primary; scheduling again by id is safe); acks,
    failures and releases log a warning instead.

    ``shards`` (1 to 256; default 1) spreads the queue over that many hash tags, so a Redis
    Cluster spreads it over its primaries (``dueq.sharding.flows`` says how, and what a sharded
    queue does not offer yet); every process must give the same number. Every queue tells
    its layout: ``shard_count``, ``shard_names`` and ``shard(task_id)`` (the shard's queue).

    ``codec`` (a ``dueq.Encrypted``) seals each payload with AES-256-GCM, bound to its task id
    and queue; ``compression`` (``"zstd"``, or ``"auto"``: payloads over 256 bytes) stores
    payloads zstd-compressed. Either is recorded with each payload, so tasks written without
    them stay readable (docs/payload-codecs.md).

    ``Queue.from_url(url, name, **options)`` makes the client too; that queue owns it
    (``owns_client``) and ``close()`` (or the end of a ``with`` block) closes it.
    """

    _delivery_type = Delivery

    def __init__(
        self,
        name: str,
        redis_client: redis.Redis | RedisCluster,
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
        # shards: plain Queues of these settings on this client (see dueq.sharding.flows)
        sharded = sharded_layout(name, shards, lambda shard: Queue(shard, redis_client, **settings))
        super().__init__(name, sharded=sharded, **settings)
        if not isinstance(redis_client, (redis.Redis, RedisCluster)):
            asyncio_client = type(redis_client).__module__.startswith("redis.asyncio")
            raise wrong_client(
                redis_client,
                "a redis.Redis or redis.cluster.RedisCluster (blocking)",
                "; for a redis.asyncio client use dueq.AsyncQueue" if asyncio_client else "",
            )
        self.redis = redis_client
        #: True when the queue made its client (``from_url``): ``close()`` closes it then
        self.owns_client = False
        self._scripts = Scripts(
            redis_client, wait_replicas=self.wait_replicas, wait_timeout_ms=self.wait_timeout_ms
        )
        self.dead = DeadLetters(self, self._dead_flows)
        self.cron = Crons(self, self._cron_flows)
        # a threaded worker's wake and claim threads both check the server at start: once
        self._server_check_lock = threading.Lock()

    @classmethod
    def from_url(
        cls,
        url: str,
        name: str,
        *,
        client_options: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> Queue:
        """A queue named ``name`` on a new ``redis.Redis.from_url(url, **client_options)``
        client (``redis://``, ``rediss://`` with its certificate checks, ``unix://``).
        ``options`` are the constructor's keywords (``retry``, ``lease``, ``shards``, ...);
        ``client_options`` are redis-py's (``socket_timeout``, ``client_name``, ...). The
        queue owns the client: ``close()`` closes it. ConfigurationError for a URL redis-py
        cannot use; nothing connects before the first call."""
        client: redis.Redis = client_from_url(redis.Redis.from_url, url, client_options)
        queue = cls(name, client, **options)  # a refused option leaves no connection open
        queue.owns_client = True
        return queue

    def close(self) -> None:
        """Close the Redis client if this queue made it (``from_url``); a client passed to
        the constructor is left open (it is the caller's)."""
        if self.owns_client:
            self.redis.close()

    def __enter__(self) -> Queue:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- sending -----------------------------------------------------------------------------

    def _send(self, step: protocol.Step | Each) -> Any:
        if isinstance(step, protocol.Call):
            return step.parse(self._scripts.run(step.script, step.keys, step.args))
        if isinstance(step, protocol.Command):
            routed = route_options(self.redis, step.route)
            return step.parse(self.redis.execute_command(*step.args, **routed))  # type: ignore[no-untyped-call]
        if isinstance(step, protocol.Batch):
            pipe = self.redis.pipeline(transaction=False)
            for command in step.commands:
                pipe.execute_command(*command.args)
            replies = pipe.execute()
            return [c.parse(r) for c, r in zip(step.commands, replies, strict=True)]
        # a sharded queue's steps for several shards; a client of one connection (threads
        # must not share it) sends them in turn
        in_turn = getattr(self.redis, "connection", None) is not None
        return send_each(self._send, step, in_turn=in_turn)

    def drive(self, flow: Flow[T]) -> T:
        return drive(flow, self._send)

    def wake_subscription(self) -> WakeSubscription:
        """What ``dueq._consume.wake.WakeListener`` subscribes to (checks the server first)."""
        self._check_server_once()
        return self.drive(self._core.wake_subscription_flow())

    def woken(self, channel: str | None) -> None:
        """Told by the wake listener of a message on ``channel`` (None: it (re)subscribed)."""
        self._core.note_wake(channel)

    def _check_server_once(self) -> None:
        """``check_server`` unless done: threads asking at once (a worker's wake and claim
        threads at its start) wait for the first one's check instead of each sending theirs."""
        if self._server_checked:
            return
        with self._server_check_lock:
            if not self._server_checked:
                self.check_server()

    def check_server(self) -> None:
        """Check the Redis server once: refuse versions before 6.2, and log what its
        ``maxmemory-policy`` means for the queue (an ``allkeys-*`` policy may lose tasks).
        Works for a user without INFO or CONFIG (the checks Redis refuses are skipped)."""
        self.drive(self._core.check_server_flow())

    # -- scheduling --------------------------------------------------------------------------

    @overload
    def task(self, fn: Callable[P, R], /) -> TaskFunction[P, R]: ...

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
    ) -> Callable[[Callable[P, R]], TaskFunction[P, R]]: ...

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
    ) -> TaskFunction[P, R] | Callable[[Callable[P, R]], TaskFunction[P, R]]:
        """Register a function as a named task of this queue (``@q.task`` or
        ``@q.task(name=...)``): see ``dueq.TaskFunction``. ``name`` defaults to
        ``module.qualname``; ``max_attempts``, ``timeout``, ``priority`` and ``key`` are the
        defaults of its tasks. A ``Worker`` without a handler runs it by name. ``context=True``:
        the function's first parameter receives a ``dueq.TaskContext`` (id, attempt, ...);
        ``durable=True``: a ``dueq.StepContext`` (``AsyncStepContext`` for ``async def``), whose
        steps are committed as they finish (docs/durable.md). ``batch=dueq.BatchSpec(...)``: a
        bulk handler, called with a list of ``dueq.Item`` (docs/bulk-handlers.md)."""

        def register(function: Callable[P, R]) -> TaskFunction[P, R]:
            defined = TaskFunction(
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

    def schedule(
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
        then a dict of its arguments. ``batch``: the batch it joins (see ``close_batch``).
        ``after``: ids of tasks it waits for (state ``waiting``) until every one is acked; a
        parent that ends dead, cancelled or expired ends it dead (``ParentFailed``) unless
        ``after_policy="run"``. A parent that is not in the queue counts as done (an acked
        task leaves nothing behind; with ``keep_results`` its record tells how it ended)."""
        result = self.schedule_many(
            [
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
            ],
            replace=replace,
        )
        return result.ids[0]

    def schedule_many(
        self, tasks: Iterable[Task], *, replace: bool = False, batch: str | None = None
    ) -> ScheduleResult:
        """Schedule many tasks, one round trip per batch of up to 1,000.

        Every task is validated and encoded before anything is written, so a bad one raises
        (InvalidTaskError or PayloadError) and leaves the queue unchanged. Each batch is atomic;
        if Redis fails between batches the earlier ones stay, and re-running with the same
        explicit ids adds only what is missing.

        ``batch`` makes every task without its own ``Task.batch`` a member of that batch when
        it is added (an id that existed is not counted twice; see ``close_batch``). Tasks of a
        batch that has completed are not written: ``BatchCompleted`` names them.
        """
        return self.drive(self._core.schedule_many_flow(tasks, replace, batch))

    def close_batch(self, batch: str, *, on_complete: Task | None = None) -> BatchInfo:
        """Close ``batch``: once every member has ended (acked, dead, cancelled or expired),
        ``on_complete`` is scheduled, exactly once (right away when all have ended already;
        its id defaults to ``"batch:<batch>"``). Members scheduled after this still count
        until the batch completes. Closing a closed batch changes nothing (the first
        completion task stays). Returns the batch's counts."""
        return self.drive(self._core.close_batch_flow(batch, on_complete))

    def batch(self, batch: str) -> BatchInfo | None:
        """A batch's counts (``BatchInfo``), or None when there is none (never used, or its
        record trimmed a week after it completed)."""
        return self.drive(self._core.batch_flow(batch))

    def batches(self, limit: int = 100) -> list[BatchInfo]:
        """Up to ``limit`` batches: open ones first, then newest first."""
        return self.drive(self._core.batches_flow(limit))

    def schedule_records(
        self, ids: list[str], records: list[bytes], replace: bool, fresh_ids: Iterator[str]
    ) -> ScheduleResult:
        """Send records packed elsewhere (the Spark writer packs them on executors)."""
        return self.drive(self._core.schedule_records_flow(ids, records, replace, fresh_ids))

    def cancel(self, task_id: str) -> bool:
        """Remove a task in any state; True if it existed. A live lease on it is revoked."""
        return self.drive(self._core.cancel_flow(task_id))

    def reschedule(
        self, task_id: str, *, at: datetime | None = None, delay: Duration | None = None
    ) -> bool:
        """Move a scheduled task to a new due time; False if it is not scheduled."""
        return self.drive(self._core.reschedule_flow(task_id, at, delay))

    # -- consuming ---------------------------------------------------------------------------

    def claim(self, limit: int = 100, *, lease: Duration | None = None) -> list[Delivery]:
        """Lease up to ``limit`` due tasks (earliest first) to this caller, atomically.

        Expired leases are first returned to due (the attempt counts) or buried. Tasks whose
        stored envelope cannot be decoded go to the dead-letter queue and are not returned.
        """
        return self.claim_batch(limit, lease=lease).deliveries

    def claim_batch(
        self, limit: int = 100, *, lease: Duration | None = None, holder: str | None = None
    ) -> ClaimBatch:
        """Like ``claim``, also telling when the next task is due and the next lease ends.
        ``holder`` names who takes the leases (a worker id, shown by ``list_tasks`` and
        ``get``); by default the queue's ``holder``, else "<host>:<pid>"."""
        self._check_server_once()
        return self.drive(self._core.claim_flow(limit, lease, holder))

    def ack_many(self, deliveries: Sequence[Delivery]) -> int:
        """Ack a batch in one round trip; returns how many were acked.

        Raises LeaseLost (with ``.ids``) if some leases were lost; the others are still acked.
        """
        return self.drive(self._core.ack_flow(deliveries))

    def fail(
        self, delivery: Delivery, error: BaseException | str, *, retry_in: Duration | None = None
    ) -> Outcome:
        """Record a failed delivery; it is retried after the backoff (or ``retry_in``), or dead.

        ``Unrecoverable`` errors, and failures of the last allowed attempt, go to dead.
        """
        return self.drive(self._core.fail_flow(delivery, error, retry_in))

    def fail_many(self, items: Sequence[FailItem[Delivery]]) -> list[Outcome]:
        """Record many failed deliveries in one round trip per 1,000 (per shard of a sharded
        queue); returns their outcomes in the order given.

        Each item is ``(delivery, error)`` or ``(delivery, error, retry_in)``, and is decided
        as ``fail(delivery, error, retry_in=retry_in)`` decides it: ``retried`` after the
        backoff (or ``retry_in``), ``dead`` (``Unrecoverable``, or the last allowed attempt)
        or ``expired``; a ``KeyCooldown`` is ``released`` with its key held. Nothing is raised
        for a lease not held: that item's outcome is ``cancelled`` (its task was cancelled
        while leased) or ``lost``, and nothing is recorded for it. An empty list sends nothing.
        """
        return self.drive(self._core.fail_many_flow(items))

    def extend_many(self, deliveries: Sequence[Delivery], seconds: Duration) -> datetime:
        """Extend many held leases to ``seconds`` from now in one round trip per 1,000;
        returns the new deadline. Raises LeaseLost (with ``.ids``) naming the leases that were
        not held; the others are still extended."""
        return self.drive(self._core.extend_many_flow(deliveries, seconds))

    def extend(self, delivery: Delivery, seconds: Duration) -> datetime:
        """Extend a held lease to ``seconds`` from now; raises LeaseLost if it is not held."""
        return self.drive(self._core.extend_flow(delivery, seconds))

    def release(self, delivery: Delivery, *, delay: Duration = 0) -> Outcome:
        """Give a leased task back, due after ``delay``; the delivery does not count."""
        return self.drive(self._core.release_flow(delivery, delay))

    def release_many(
        self, deliveries: Sequence[Delivery], *, delay: Duration = 0, hold: bool = False
    ) -> list[Outcome]:
        """Give many leased tasks back in one round trip per 1,000, due after ``delay``;
        no delivery counts. With ``hold`` each one's limit key is held as long (as a
        KeyCooldown holds it). Each outcome says what became of its delivery: ``released``,
        ``cancelled`` (its task was cancelled while leased) or ``lost``; nothing is raised
        for a lease not held."""
        return self.drive(self._core.release_many_flow(deliveries, delay, hold=hold))

    def observe(
        self,
        max_in_flight: int | Literal["auto"] = 64,
        *,
        scheduler: abc.SchedulerBase | None = None,
        wake: bool = True,
        heartbeat: Duration = 5.0,
    ) -> Observable[Delivery]:
        """An observable of this queue's deliveries, each emitted the moment it is due.

        Each subscription claims at most as many tasks as it has free slots (``max_in_flight``
        minus deliveries emitted and not yet acked, failed or released; ``"auto"`` adapts it
        to how fast they are settled, between 16 and 1,024), then sleeps until the
        next due time or lease deadline the claim returned. With ``wake`` it also listens on
        the queue's wake channel (Redis Pub/Sub) so that an earlier task wakes it at once;
        ``heartbeat`` caps any sleep. Timing uses ``scheduler`` (default: a thread per
        subscription). Redis outages are logged and retried with backoff, never ``on_error``;
        disposing stops claiming. Pipe it into ``dueq.operators.process`` to run a handler.
        """
        return observe_queue(
            self,
            max_in_flight=max_in_flight,
            scheduler=scheduler,
            wake=wake,
            heartbeat=heartbeat,
        )

    def events(
        self,
        group: str | None = None,
        *,
        consumer: str | None = None,
        redeliver_after: Duration = 30.0,
        since: datetime | None = None,
    ) -> Observable[Event]:
        """An observable of the queue's outcome events (``configure(events=...)``): acked,
        retried, dead, cancelled, expired, one per outcome, and progress (``d.progress``, with
        ``seq`` and ``body``), each on a reader thread of its own (a blocking read on a
        connection of its own).

        With ``group``, a consumer group: each event goes to one of its members (``consumer``
        names this one; default: the queue's holder or this process's worker id), ``ev.ack()``
        settles it, and an event not acked within ``redeliver_after`` goes to another member.
        A new group starts at ``since`` (an aware datetime) or now; a member started again
        under the same name resumes its unacked events first. Without a group, every event
        from now (or ``since``) on. See docs/events.md."""
        return observe_events(
            self, group=group, consumer=consumer, redeliver_after=redeliver_after, since=since
        )

    def event_groups(self) -> list[EventGroup]:
        """The consumer groups of the queue's outcome events, by name, each with its ``lag``
        and the events it ``lost`` to the events retention (see ``events.stream.EventGroup``)."""
        return self.drive(event_groups_flow(self))

    # -- settings ----------------------------------------------------------------------------

    def configure(
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
        """Change the queue's settings, kept in Redis so that every producer and consumer
        obeys the same ones; returns them after the change. ``None`` leaves a setting alone.

        ``paused``: claims lease nothing while True (see ``pause``). ``remember_done``: how long
        acked ids are remembered, so that scheduling one again counts it as existing (0 turns
        it off). ``keep_results``: how long finished tasks stay readable as ``done``,
        ``dead`` or ``cancelled`` with their handler's return value (``get``, ``wait``; 0
        turns it off, see docs/results.md). ``rate``: a ``dueq.Rate``, at most that many
        claims per window across every consumer (False removes it). ``key_rate`` and
        ``key_concurrency`` apply to each limit key (``schedule(..., key=)``) separately:
        claims of one key spaced ``per / n`` apart, and at most that many of its tasks leased
        at once (False removes them); a key at its limit steps aside, so other keys' tasks go
        first. ``concurrency``: at most that many
        live leases of the whole queue across every consumer (a capped consumer sleeps until
        a lease ends; False or 0 removes it). ``key_limits``: limits of named keys over the
        key_rate / key_concurrency defaults, ``{key: dueq.KeyLimit(concurrency=, rate=)}``
        (None for a key removes its override; keys not named are left alone; at most 1,000).
        ``events``: how long outcome events are kept (``events()``, docs/events.md; False or 0
        stops writing them). ``fairness``: "key" shares the claims between tenants (a task's
        ``fair_key``, else its ``key``) in weighted fair order, ``KeyLimit(weight=)`` their
        shares; False turns it off (docs/fairness.md). Consumers are woken, so a change applies
        at once.
        """
        return self.drive(
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

    def pause(self) -> QueueSettings:
        """Stop every consumer of this queue from leasing tasks (expired leases are still
        reclaimed; scheduling goes on). Running handlers finish; deliveries a consumer
        holds and has not started are given back unstarted, not run (docs/settings.md)."""
        return self.configure(paused=True)

    def resume(self) -> QueueSettings:
        """Let consumers lease tasks again; sleeping consumers are woken at once."""
        return self.configure(paused=False)

    def settings(self) -> QueueSettings:
        """The queue's settings as stored in Redis."""
        return self.drive(self._core.settings_flow())

    # -- inspection --------------------------------------------------------------------------

    def get(self, task_id: str) -> TaskInfo | None:
        """A snapshot of one task, or None if there is no such task."""
        return self.drive(self._core.get_flow(task_id))

    def get_many(self, task_ids: Iterable[str]) -> list[TaskInfo]:
        """Snapshots of the tasks with these ids that exist, in the order given (a repeated id
        once, a missing one left out): one round trip per 1,000 ids, each page one consistent
        snapshot. ``InvalidTaskError`` for an id that is not valid, before anything is read."""
        return self.drive(self._core.get_many_flow(task_ids))

    def wait(self, task_id: str, timeout: Duration = 10.0) -> TaskInfo:
        """Block until the task has ended (``done``, ``dead`` or ``cancelled``) and return it;
        ``WaitTimeout`` if it has not within ``timeout`` seconds. Needs ``keep_results`` on
        the queue for a task that is still live (ConfigurationError otherwise); TaskNotFound
        when there is no such task (or it ended and nothing was kept). Woken by the queue's
        ended channel (Pub/Sub), with no polling: any process's ack, fail or cancel ends it.
        Every wait of the process on this client shares one subscription (``dueq._consume.ended``),
        so many threads waiting hold one connection of the client's pool, not one each.
        """
        task_id = validate_id(task_id)
        deadline = time.monotonic() + duration_ms(timeout, "timeout") / 1000
        shared = ended_listener(self.redis)  # one subscription for every wait on the client
        with shared.looking():
            ended = self.drive(self._core.wait_check_flow(task_id))  # (ended already: no waiting)
        if ended is not None:
            return ended
        waiter = shared.add(self.drive(self._core.ended_subscription_flow(task_id)), task_id)
        try:
            while True:  # woken by its task's end or a (re)confirmed subscription: look again
                waiter.woken.wait(_left_s(deadline))
                waiter.woken.clear()
                shared.waiters.raise_error()
                with shared.looking():
                    info = self.drive(self._core.wait_check_flow(task_id))
                if info is not None:
                    return info
                if _left_s(deadline) <= 0:
                    raise WaitTimeout(f"task {task_id!r} did not end in time", task_id)
        finally:
            shared.remove(waiter)

    # -- task progress (docs/progress.md) ---------------------------------------------------

    def report_progress(self, delivery: Delivery, obj: Any) -> int:
        """Append ``obj`` (a JSON value, at most 64 KiB of JSON) to the task's progress under
        the delivery's lease, as ``d.progress(obj)``; returns the entry's seq (1, 2, ... per
        task). LeaseLost (TaskCancelled when cancelled) for a lease not held, PayloadError
        for a body that is not JSON or too big; nothing is written then."""
        return self.drive(self._core.progress_flow(delivery, obj))

    def progress(self, task_id: str, *, timeout: Duration | None = None) -> Iterator[Progress]:
        """Follow a task's progress: its kept history (the last 20 entries) first, then each
        entry as it is written, each once and in order (``dueq.Progress``). Ends when the task
        ends (done, dead, cancelled, expired, or gone), or after ``timeout`` seconds with no
        entry. Holds one connection of the client's pool (a subscription) while it runs;
        ``break`` or ``close()`` ends it."""
        flow = self._core.progress_follow_flow(task_id, timeout)  # (checks id and timeout)
        return follow_progress(flow, self._send, self.redis)

    def stats(self) -> QueueStats:
        """Counts per state, the next due time and the lag of the oldest due task."""
        return self.drive(self._core.stats_flow())

    def doctor(self, fix: bool = False, *, batch: int = 1000) -> DoctorReport:
        """Check the queue's derived state against its tasks; with ``fix=True`` repair it.

        Derived state is what the scripts keep so that claims stay cheap: each limit key's
        leased and parked counts, the key-wait entries, the rate window's sum. A hand edit, an
        eviction or a bug can make it disagree with the tasks, and a key whose leased count is
        too high holds its tasks back forever. No task is touched (due, leased, tasks, meta,
        errors and dead stay as they are) but those of a dependency cycle, which never run:
        ``fix=True`` ends them dead; tasks whose data is gone are reported only, since the
        claim drops them. Runs in calls of at most ``batch`` keys or entries (1 to 10,000),
        each atomic for its batch, so a large queue is never blocked for long. Returns a
        ``DoctorReport`` with one ``DoctorFinding`` per problem and ``health``, the queue's
        health as the dashboard judges it (``docs/doctor.md``)."""
        return self.drive(self._core.doctor_flow(fix, batch))

    def rotate_key(
        self,
        to: str,
        *,
        batch: int = 500,
        cursor: str | None = None,
        progress: Callable[[KeyRotation], object] | None = None,
    ) -> KeyRotation:
        """Re-seal every stored payload encrypted with another key than ``to`` (tasks in
        every state, kept results) with key ``to``, online: ``batch`` fields per step (1 to
        10,000), each written only if unchanged since it was read (a task acked, cancelled or
        replaced meanwhile is ``skipped``). The queue's codec must know ``to`` and the old
        keys. ``cursor``: where a stopped rotation left off (its report's ``cursor``);
        ``progress`` is called with the report so far after each batch. Returns a
        ``KeyRotation``; an ``undecryptable`` task is left as it was (docs/payload-codecs.md,
        "Rotating keys")."""
        return self.drive(self._core.rotate_key_flow(to, batch, cursor, progress))

    def reshard(
        self,
        shards: int,
        *,
        batch: int = 500,
        progress: Callable[[ReshardReport], object] | None = None,
    ) -> ReshardReport:
        """Change this sharded queue's shard count to ``shards`` (2 to 256), online: producers
        and workers keep running (every queue object follows the new layout within a second),
        and every task keeps its whole state. Moves ``batch`` ids a step (1 to 10,000);
        ``progress`` is called with the report after each step. Returns once the layout is
        ``shards``; safe to stop at any point (SIGKILL included): calling it again (any
        process) resumes. ConfigurationError on a plain queue, while another reshard runs,
        or while the queue holds what a reshard cannot move yet (per-key limits, fairness,
        outcome events, open batches, parents: docs/sharding.md, "Resharding")."""
        resharder = self._core.resharder()
        report: ReshardReport = self.drive(resharder.start_flow(shards))
        while not report.done:
            report = self.drive(resharder.step_flow(batch))
            if progress is not None:
                progress(report)
            if report.idle:  # a pass moved nothing: leases are out, or writers still follow
                time.sleep(RESHARD_IDLE_S)
        return report

    def list_tasks(
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
        """One page of the tasks in ``state`` ("scheduled", "leased" or "dead"); pass the
        page's ``cursor`` for the next one (None: done).

        Scheduled tasks come by priority (9 first), then due time, then the parked ones (due,
        waiting for their key's limits); leased by lease deadline (``holder`` says who holds
        each); dead by died-at, newest first (as ``q.dead.list``). Filters: ``id_prefix``,
        ``grep`` (text the payload's JSON contains), ``error_type`` (the type of the last
        error record) and ``after``/``before`` (inclusive bounds on the time the state is
        ordered by: due time, lease deadline or died-at). Each call looks at most at 1,000
        tasks (at least ``limit``, at most 1,000), so its cost is bounded whatever the
        queue's size: a page may hold fewer than ``limit`` tasks, even none, before the
        listing is done.
        """
        return self.drive(
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

    def iter_tasks(
        self, state: TaskState, *, page: int = 100, **filters: Any
    ) -> Iterator[TaskInfo]:
        """Every task ``list_tasks`` finds with these filters, page after page (one call per
        page of up to ``page`` tasks)."""
        cursor: str | None = None
        while True:
            found = self.list_tasks(state, limit=page, cursor=cursor, **filters)
            yield from found.tasks
            cursor = found.cursor
            if cursor is None:
                return

    def signal(self, task_id: str, name: str, payload: Any = None) -> int:
        """Send signal ``name`` with ``payload`` (a JSON value) to durable task ``task_id``:
        kept, in order, until the task's ``ctx.wait_for(name)`` takes it (each signal is taken
        by one wait, once); a task handed back to wait for ``name`` is due at once. Returns how
        many signals the task holds not yet taken. TaskNotFound when no live task has that id
        (ended, dead or never scheduled), SignalRefused when it holds
        ``dueq.durable.MAX_PENDING_SIGNALS`` already, InvalidTaskError for a bad name (1-200
        letters, digits, ``_ . : -``), PayloadError for a payload that is not JSON."""
        return self.drive(self._core.signal_flow(task_id, name, payload))

    def run_now(self, task_id: str) -> bool:
        """Make a task due now: a scheduled one (parked ones too) moves to now, a dead one is
        replayed (attempts and errors reset). False for a leased task (it is running: cancel it,
        or wait) and for an unknown id."""
        return self.drive(self._core.run_now_flow(task_id))

    def history(self, minutes: int = 60) -> list[HistoryPoint]:
        """What happened in each of the last ``minutes`` (1 to 1,440; the current minute last):
        tasks scheduled, claimed, acked, retried, dead and expired, as the queue's scripts
        counted them. Redis keeps 24 hours."""
        return self.drive(self._core.history_flow(minutes))

    def due_histogram(self, bucket: Duration = 60.0, buckets: int = 30) -> DueHistogram:
        """How many scheduled tasks fall due in each of ``buckets`` buckets of ``bucket``
        (seconds or a timedelta) from now, every priority counted (one ZCOUNT per bucket and
        priority in use)."""
        return self.drive(self._core.due_histogram_flow(bucket, buckets))

    def workers(self) -> list[WorkerInfo]:
        """The live consumer processes serving this queue (``Worker``, ``AsyncWorker``, ``dueq
        worker``), sorted by worker id, as their last heartbeats described them; a process
        that died is gone within a few heartbeats (see ``dueq.registry``)."""
        return self.drive(self._core.workers_flow())

    def send_heartbeat(self, entry_json: str, ttl_ms: int) -> int:
        return self.drive(self._core.heartbeat_flow(entry_json, ttl_ms, leave=False))

    def leave_registry(self) -> None:
        self.drive(self._core.heartbeat_flow("{}", 0, leave=True))


def _left_s(deadline: float) -> float:
    """Seconds left until a ``time.monotonic()`` deadline (0 once passed)."""
    return max(deadline - time.monotonic(), 0.0)
