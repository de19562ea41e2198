"""The Queue: schedule, claim, ack, fail, extend, release, cancel, reschedule, inspect.

Every state change is one Lua script call (see ``dueq/lua``); this module validates input,
encodes payloads and turns script replies into dueq values.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

import redis
from reactivex import Observable, abc
from redis.cluster import RedisCluster

from .checks import whole_number
from .clock import Clock, Duration, clock_ms, datetime_ms, duration_ms, ms_datetime
from .clock import positive_duration_ms as _positive_ms
from .cron import Crons
from .dead import DeadLetters
from .envelope import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    FLAG_ABSOLUTE,
    FLAG_GENERATED_ID,
    decode_envelope,
    encode_envelope,
    generated_ids,
    pack_task,
    repack_with_id,
    validate_id,
)
from .exceptions import (
    ConfigurationError,
    DueqError,
    InvalidTaskError,
    LeaseLost,
    PayloadError,
    Unrecoverable,
)
from .failures import error_record
from .keys import QueueKeys
from .observe import observe_queue
from .retry import RetryPolicy
from .scripts import FAIL_DEAD, FAIL_LOST, Scripts
from .snapshot import queue_stats, task_infos, text
from .task import Delivery, Outcome, OutcomeKind, QueueStats, ScheduleResult, Task, TaskInfo

logger = logging.getLogger(__name__)

#: Most tasks one claim call may lease; most tasks and bytes sent in one schedule call (Redis
#: refuses arguments over proto-max-bulk-len, 512 MB by default, and a long script blocks it).
MAX_CLAIM_BATCH = 1000
SCHEDULE_BATCH = 1000
SCHEDULE_BATCH_BYTES = 8 * 1024 * 1024
#: Largest payload limit a queue accepts.
MAX_PAYLOAD_LIMIT = 64 * 1024 * 1024
#: Oldest Redis the scripts run on (ZMSCORE).
MIN_REDIS_VERSION = (6, 2)
#: Fields before the first delivery in claim.lua's reply.
CLAIM_REPLY_HEAD = 8
#: Rounds of fresh ids for generated ids that already existed (72-bit ids: one is plenty).
ID_RETRIES = 5


def _batches(records: list[bytes]) -> Iterator[list[int]]:
    """Positions of records, in runs of at most SCHEDULE_BATCH tasks and SCHEDULE_BATCH_BYTES."""
    batch: list[int] = []
    size = 0
    for i, record in enumerate(records):
        if batch and (len(batch) == SCHEDULE_BATCH or size + len(record) > SCHEDULE_BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(i)
        size += len(record)
    if batch:
        yield batch


class ClaimBatch:
    """One claim call's result: the deliveries and when the next work is due.

    ``now_ms`` is the queue clock when the claim ran, ``now_fraction_ms`` the part of a
    millisecond past it (0 for an injected clock): together they let a consumer sleep until
    ``next_due_ms`` to within the round trip.
    """

    __slots__ = ("deliveries", "next_due_ms", "next_lease_deadline_ms", "now_fraction_ms", "now_ms")

    def __init__(
        self,
        deliveries: list[Delivery],
        now_ms: int,
        next_due_ms: int | None,
        next_lease_deadline_ms: int | None,
        now_fraction_ms: float = 0.0,
    ) -> None:
        self.deliveries = deliveries
        self.now_ms = now_ms
        self.now_fraction_ms = now_fraction_ms
        self.next_due_ms = next_due_ms
        self.next_lease_deadline_ms = next_lease_deadline_ms


class Queue:
    """A named queue of delayed tasks in one Redis database.

    ``retry`` decides how often a task is delivered and the backoff between attempts;
    ``lease`` is how long a consumer holds a claimed task before it is delivered again.
    ``clock`` (zero-argument callable returning epoch seconds) replaces the Redis server's
    ``TIME``, for tests and simulations. The dead-letter queue keeps at most
    ``dead_max_count`` tasks, none older than ``dead_max_age``.

    ``remember_done`` (off by default) keeps the ids of acked tasks for that long, and
    scheduling such an id again counts it as existing (unless ``replace=True``), so a re-run
    producer does not re-create tasks that already ran. Give it to producers and consumers.

    ``wait_replicas`` (0: off) makes every change that must survive a failover wait until that
    many replicas confirm it (Redis ``WAIT``, at most ``wait_timeout``): schedule, cancel,
    reschedule, dead-letter replay/purge and cron definitions raise ReplicationTimeout when
    fewer confirm (the change is made on the primary; scheduling again by id is safe); acks,
    failures and releases log a warning instead.
    """

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
    ) -> None:
        self.keys = QueueKeys.for_queue(name)
        self.name = name
        if not isinstance(redis_client, (redis.Redis, RedisCluster)):
            raise ConfigurationError(
                "redis_client must be a redis.Redis or redis.cluster.RedisCluster, "
                f"got {type(redis_client).__name__}"
            )
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise ConfigurationError(f"retry must be a dueq.RetryPolicy, got {retry!r}")
        if clock is not None and not callable(clock):
            raise ConfigurationError("clock must be a zero-argument callable returning seconds")
        whole_number(max_payload_bytes, "max_payload_bytes", low=1, high=MAX_PAYLOAD_LIMIT)
        whole_number(dead_max_count, "dead_max_count", low=1)
        whole_number(wait_replicas, "wait_replicas", low=0, high=100)
        self.redis = redis_client
        self.retry = retry or RetryPolicy()
        self.lease_ms = _positive_ms(lease, "lease")
        self.clock = clock
        self.max_payload_bytes = max_payload_bytes
        self.dead_max_count = dead_max_count
        self.dead_max_age_ms = _positive_ms(dead_max_age, "dead_max_age")
        self.remember_done_ms = (
            0 if remember_done is None else _positive_ms(remember_done, "remember_done")
        )
        self.dead = DeadLetters(self)
        self.cron = Crons(self)
        self.wait_replicas = wait_replicas
        self._scripts = Scripts(
            redis_client,
            wait_replicas=wait_replicas,
            wait_timeout_ms=_positive_ms(wait_timeout, "wait_timeout"),
        )
        self._server_checked = False

    def __repr__(self) -> str:
        return f"Queue({self.name!r})"

    # -- helpers -----------------------------------------------------------------------------

    def _now_arg(self) -> str:
        return "" if self.clock is None else str(clock_ms(self.clock))

    def _run(self, script: str, keys: list[str], *args: Any) -> Any:
        return self._scripts.run(script, keys, [self._now_arg(), *args])

    @staticmethod
    def _due(at: datetime | None, delay: Duration | None) -> tuple[int, int]:
        """(FLAG_ABSOLUTE, epoch ms) for at=, (0, delay ms) for delay= or neither."""
        if at is not None:
            if delay is not None:
                raise InvalidTaskError("give at= or delay=, not both")
            return FLAG_ABSOLUTE, datetime_ms(at)
        return 0, 0 if delay is None else duration_ms(delay, "delay")

    def check_server(self) -> None:
        """Check the Redis server once: refuse versions before 6.2, and log a warning when it
        may evict keys (only ``noeviction`` is safe for a queue)."""
        version = str(self.redis.info("server").get("redis_version", "0"))
        if tuple(int(part) for part in version.split(".")[:2]) < MIN_REDIS_VERSION:
            raise ConfigurationError(f"dueq needs Redis >= 6.2; this server runs {version}")
        self._server_checked = True
        try:
            policy = self.redis.config_get("maxmemory-policy").get("maxmemory-policy")
        except redis.ResponseError:  # CONFIG is disabled on some managed services
            logger.debug("cannot read maxmemory-policy; skipping the eviction check")
            return
        if policy is not None and text(policy) != "noeviction":
            logger.warning(
                "Redis maxmemory-policy is %r: Redis may evict queue keys and lose tasks; "
                "set maxmemory-policy noeviction",
                text(policy),
            )

    # -- scheduling --------------------------------------------------------------------------

    def schedule(
        self,
        payload: Any,
        *,
        delay: Duration | None = None,
        at: datetime | None = None,
        id: str | None = None,  # the public API names it id
        replace: bool = False,
    ) -> str:
        """Schedule one task; returns its id. An existing id is left alone unless ``replace``."""
        result = self.schedule_many([Task(payload, id=id, at=at, delay=delay)], replace=replace)
        return result.ids[0]

    def schedule_many(self, tasks: Iterable[Task], *, replace: bool = False) -> ScheduleResult:
        """Schedule many tasks, one round trip per batch of up to 1,000.

        Every task is validated and encoded before anything is written, so a bad one raises
        (InvalidTaskError or PayloadError) and leaves the queue unchanged. Each batch is atomic;
        if Redis fails between batches the earlier ones stay, and re-running with the same
        explicit ids adds only what is missing.
        """
        ids: list[str] = []
        records: list[bytes] = []
        fresh_ids = generated_ids()
        max_bytes = self.max_payload_bytes
        due = self._due
        for position, task in enumerate(tasks):
            if not isinstance(task, Task):
                raise InvalidTaskError(f"task {position} is a {type(task).__name__}, not dueq.Task")
            if task.id is None:
                task_id, flags = next(fresh_ids), FLAG_GENERATED_ID
            else:
                task_id, flags = validate_id(task.id), 0
            try:
                if task.at is None and task.delay is None:
                    time_flag, due_ms = 0, 0  # due now
                else:
                    time_flag, due_ms = due(task.at, task.delay)
                envelope = encode_envelope(task.payload, max_bytes)
            except (InvalidTaskError, PayloadError) as exc:
                raise type(exc)(f"task {position} ({task_id!r}): {exc}") from exc
            records.append(pack_task(flags | time_flag, due_ms, task_id, envelope))
            ids.append(task_id)
        return self._schedule_records(ids, records, replace, fresh_ids)

    def _schedule_records(
        self, ids: list[str], records: list[bytes], replace: bool, fresh_ids: Iterator[str]
    ) -> ScheduleResult:
        k = self.keys
        keys = [k.due, k.tasks, k.meta, k.errors, k.leased, k.dead, k.stats, k.wake, k.done]
        flag = "1" if replace else "0"
        window = self.remember_done_ms
        added = existing = replaced = 0
        for batch in _batches(records):
            pending = batch
            for _ in range(ID_RETRIES):
                blob = b"".join(records[i] for i in pending)
                reply = self._run("schedule", keys, flag, blob, window)
                added, existing = added + int(reply[0]), existing + int(reply[1])
                replaced += int(reply[2])
                pending = [pending[int(p) - 1] for p in reply[3:]]
                if not pending:
                    break
                for i in pending:  # a generated id that was taken: draw another
                    ids[i] = next(fresh_ids)
                    records[i] = repack_with_id(records[i], ids[i])
            else:
                raise DueqError(f"no unused id found for {len(pending)} task(s)")
        return ScheduleResult(added=added, existing=existing, replaced=replaced, ids=ids)

    def cancel(self, task_id: str) -> bool:
        """Remove a task in any state; True if it existed. A live lease on it is revoked."""
        k = self.keys
        keys = [k.due, k.leased, k.dead, k.tasks, k.meta, k.errors, k.stats]
        return bool(self._run("cancel", keys, validate_id(task_id)))

    def reschedule(
        self, task_id: str, *, at: datetime | None = None, delay: Duration | None = None
    ) -> bool:
        """Move a scheduled task to a new due time; False if it is not scheduled."""
        if at is None and delay is None:
            raise InvalidTaskError("reschedule needs at= or delay=")
        flags, due_ms = self._due(at, delay)
        keys = [self.keys.due, self.keys.wake]
        return int(self._run("reschedule", keys, validate_id(task_id), flags, due_ms)) >= 0

    # -- consuming ---------------------------------------------------------------------------

    def claim(self, limit: int = 100, *, lease: Duration | None = None) -> list[Delivery]:
        """Lease up to ``limit`` due tasks (earliest first) to this caller, atomically.

        Expired leases are first returned to due (the attempt counts) or buried. Tasks whose
        stored envelope cannot be decoded go to the dead-letter queue and are not returned.
        """
        return self.claim_batch(limit, lease=lease).deliveries

    def claim_batch(self, limit: int = 100, *, lease: Duration | None = None) -> ClaimBatch:
        """Like ``claim``, also telling when the next task is due and the next lease ends."""
        whole_number(limit, "limit", low=0, high=MAX_CLAIM_BATCH)
        if not self._server_checked:
            self.check_server()
        lease_ms = self.lease_ms if lease is None else _positive_ms(lease, "lease")
        k = self.keys
        reply = self._run(
            "claim",
            [k.due, k.leased, k.tasks, k.meta, k.errors, k.dead, k.stats],
            limit,
            lease_ms,
            self.retry.max_attempts,
            max(limit, 100),
            self.dead_max_count,
            self.dead_max_age_ms,
            *self.retry.backoff_table_ms(),
        )
        now_ms, next_due, next_deadline = int(reply[0]), int(reply[1]), int(reply[2])
        token, deadline = text(reply[3]), int(reply[4])
        dropped, buried = int(reply[6]), int(reply[7])
        if dropped:
            logger.error(
                "queue %r: %d due task(s) had no stored data and were dropped: their keys were "
                "evicted or deleted (set maxmemory-policy noeviction)",
                self.name,
                dropped,
            )
        if buried:
            logger.error(
                "queue %r: %d due task(s) moved to dead at claim (unreadable attempt record, "
                "or max_attempts already reached); see their errors",
                self.name,
                buried,
            )
        deliveries: list[Delivery] = []
        for i in range(CLAIM_REPLY_HEAD, len(reply), 5):
            task_id, raw, attempt = text(reply[i]), reply[i + 1], int(reply[i + 2])
            try:
                payload = decode_envelope(raw)
            except PayloadError as exc:
                self._bury_undecodable(task_id, token, attempt, exc)
                continue
            due_ms, first_ms = int(reply[i + 3]), int(reply[i + 4])
            deliveries.append(
                Delivery(self, task_id, payload, attempt, due_ms, deadline, token, first_ms, now_ms)
            )
        deliveries, cron_due = self.cron.on_claim(deliveries, now_ms)
        if cron_due is not None and (next_due < 0 or cron_due < next_due):
            next_due = cron_due
        return ClaimBatch(
            deliveries,
            now_ms,
            None if next_due < 0 else next_due,
            None if next_deadline < 0 else next_deadline,
            int(reply[5]) / 1000,
        )

    def _bury_undecodable(self, task_id: str, token: str, attempt: int, exc: PayloadError) -> None:
        logger.error(
            "task %r in queue %r has an undecodable envelope; moved to dead: %s",
            task_id,
            self.name,
            exc,
        )
        self._fail_script(task_id, token, error_record(exc, attempt), "dead", 0)

    def ack_many(self, deliveries: Sequence[Delivery]) -> int:
        """Ack a batch in one round trip; returns how many were acked.

        Raises LeaseLost (with ``.ids``) if some leases were lost; the others are still acked.
        """
        if not deliveries:
            return 0
        args: list[str | int] = [self.remember_done_ms]
        for d in deliveries:
            args += (d.id, d.token)
        k = self.keys
        reply = self._run("ack", [k.leased, k.tasks, k.meta, k.errors, k.stats, k.done], *args)
        lost = [text(x) for x in reply[1:]]
        lost_ids = set(lost)
        for d in deliveries:
            d._settled(Outcome(d.id, "lost", d.attempt) if d.id in lost_ids else None)
        if lost:
            raise LeaseLost(f"lease lost on {len(lost)} task(s), not acked: {lost[:10]}", lost)
        return int(reply[0])

    def fail(
        self, delivery: Delivery, error: BaseException | str, *, retry_in: Duration | None = None
    ) -> Outcome:
        """Record a failed delivery; it is retried after the backoff (or ``retry_in``), or dead.

        ``Unrecoverable`` errors, and failures of the last allowed attempt, go to dead.
        """
        exc = error if isinstance(error, BaseException) else None
        age_s = max(delivery.claimed_ms - delivery.first_claimed_ms, 0) / 1000
        delay_ms = 0
        if isinstance(error, Unrecoverable) or self.retry.gives_up(delivery.attempt, age_s, exc):
            action = "dead"
        else:
            action = "retry"
            if retry_in is not None:
                delay_ms = duration_ms(retry_in, "retry_in")
            else:
                delay_ms = round(self.retry.delay_s(delivery.attempt, age_s, exc) * 1000)
        record = error_record(error, delivery.attempt)
        status, at_ms = self._fail_script(delivery.id, delivery.token, record, action, delay_ms)
        message = f"{type(error).__name__}: {error}" if exc else str(error)
        if status == FAIL_LOST:
            delivery._settled(Outcome(delivery.id, "lost", delivery.attempt, None, message))
            raise LeaseLost(
                f"lease on task {delivery.id!r} was lost; failure not recorded", [delivery.id]
            )
        kind: OutcomeKind = "dead" if status == FAIL_DEAD else "retried"
        outcome = Outcome(delivery.id, kind, delivery.attempt, ms_datetime(at_ms), message)
        delivery._settled(outcome)
        return outcome

    def _fail_script(
        self, task_id: str, token: str, record: str, action: str, delay_ms: int
    ) -> tuple[int, int]:
        k = self.keys
        status, at_ms = self._run(
            "fail",
            [k.due, k.leased, k.tasks, k.meta, k.errors, k.dead, k.stats, k.wake],
            task_id,
            token,
            record,
            action,
            delay_ms,
            self.dead_max_count,
            self.dead_max_age_ms,
        )
        return int(status), int(at_ms)

    def extend(self, delivery: Delivery, seconds: Duration) -> datetime:
        """Extend a held lease to ``seconds`` from now; raises LeaseLost if it is not held."""
        ms = _positive_ms(seconds, "lease extension")
        deadline = int(
            self._run("extend", [self.keys.leased, self.keys.meta], delivery.id, delivery.token, ms)
        )
        if deadline < 0:
            raise LeaseLost(f"lease on task {delivery.id!r} was lost; not extended", [delivery.id])
        delivery.lease_deadline_ms = deadline
        return ms_datetime(deadline)

    def release(self, delivery: Delivery, *, delay: Duration = 0) -> Outcome:
        """Give a leased task back, due after ``delay``; the delivery does not count."""
        k = self.keys
        due = int(
            self._run(
                "release",
                [k.due, k.leased, k.meta, k.stats, k.wake],
                delivery.id,
                delivery.token,
                duration_ms(delay, "delay"),
            )
        )
        if due < 0:
            delivery._settled(Outcome(delivery.id, "lost", delivery.attempt))
            raise LeaseLost(f"lease on task {delivery.id!r} was lost; not released", [delivery.id])
        outcome = Outcome(delivery.id, "released", delivery.attempt, ms_datetime(due))
        delivery._settled(outcome)
        return outcome

    def observe(
        self,
        max_in_flight: int = 64,
        *,
        scheduler: abc.SchedulerBase | None = None,
        wake: bool = True,
        heartbeat: Duration = 5.0,
    ) -> Observable[Delivery]:
        """An observable of this queue's deliveries, each emitted the moment it is due.

        Each subscription claims at most as many tasks as it has free slots (``max_in_flight``
        minus deliveries emitted and not yet acked, failed or released), then sleeps until the
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

    # -- inspection --------------------------------------------------------------------------

    def get(self, task_id: str) -> TaskInfo | None:
        """A snapshot of one task, or None if there is no such task."""
        found = self._inspect("ids", validate_id(task_id))
        return found[0] if found else None

    def _inspect(self, mode: str, *args: Any) -> list[TaskInfo]:
        k = self.keys
        keys = [k.due, k.leased, k.dead, k.tasks, k.meta, k.errors]
        return task_infos(self._run("inspect", keys, mode, *args))

    def stats(self) -> QueueStats:
        """Counts per state, the next due time and the lag of the oldest due task."""
        k = self.keys
        return queue_stats(self._run("stats", [k.due, k.leased, k.dead, k.stats, k.tasks]))
