"""The values dueq hands out: tasks to schedule, task snapshots, settings, stats and outcomes.

Plain values only: nothing here calls a queue or Redis. The delivery handles, which do, live in
``dueq.delivery``; the stored form and the input checks live in ``dueq._wire.envelope``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, ClassVar, Literal

from dueq._util.checks import whole_number
from dueq._util.clock import Duration, datetime_ms, duration_ms
from dueq._wire.envelope import (
    MAX_TIMEOUT_MS,
    NO_OPTIONS,
    TaskOptions,
    validate_key,
    validate_priority,
    validate_task_attempts,
)
from dueq.exceptions import ConfigurationError, InvalidTaskError

#: A task's state; "done", "cancelled" and "expired" only while the queue keeps results
#: (keep_results); "waiting": scheduled with parents (``after=``) not all acked yet.
TaskState = Literal["scheduled", "leased", "dead", "done", "cancelled", "expired", "waiting"]
#: The states a task ends in (``q.wait`` returns in one of them).
FINAL_STATES = frozenset({"dead", "done", "cancelled", "expired"})


def iso_ms(at: datetime | None) -> str | None:
    """``at`` as ``2030-01-02T03:04:05.678Z`` (ISO 8601, UTC, milliseconds); None as None: the
    form of every time in a task's JSON (``TaskInfo.to_json``)."""
    if at is None:
        return None
    return at.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


OutcomeKind = Literal["acked", "retried", "dead", "released", "lost", "cancelled", "expired"]


@dataclass(frozen=True)
class Task:
    """A task to schedule with ``Queue.schedule_many``: due at ``at``, after ``delay``, or now.

    Options kept with the task: ``priority`` (0-9; among due tasks the higher runs first),
    ``key`` (the limit group the queue's ``key_rate``/``key_concurrency`` apply to),
    ``timeout`` (overrides the consumer's for this task) and ``max_attempts`` (overrides the
    consumer's retry policy's).

    ``task`` names the function that runs it (``@q.task``; ``payload`` is then a dict of its
    arguments, checked against its signature when the queue has it registered); None for a
    plain payload task, which goes to the worker's handler.

    ``expires`` (a duration from now, or an aware datetime): the task never starts after it;
    a claim that finds it past its expiry ends it ``expired``, and so does a failure whose
    next attempt would come at or after it. ``debounce`` (needs ``id``): scheduling the id
    again within the delay moves it to the last call + ``debounce`` with the latest payload,
    never later than the first call + ``max_wait``; while it runs, the latest call waits as
    its one follow-up, due once the run ends (at/delay cannot be given with it).
    """

    payload: Any
    id: str | None = None
    at: datetime | None = None
    delay: Duration | None = None
    priority: int = 0
    key: str | None = None
    timeout: Duration | None = None
    max_attempts: int | None = None
    task: str | None = None
    expires: Duration | datetime | None = None
    debounce: Duration | None = None
    max_wait: Duration | None = None
    #: the batch it joins when it is added (``close_batch``); ``schedule_many(batch=)`` gives
    #: one to every task without its own
    batch: str | None = None
    #: ids of the tasks it waits for: it runs once every one has been acked (state "waiting"
    #: until then); a parent that ends dead, cancelled or expired ends it dead, unless
    #: ``after_policy="run"`` (it runs once they have all ended, however)
    after: Sequence[str] = ()
    after_policy: Literal["fail", "run"] = "fail"
    #: the tenant a fair queue (``configure(fairness="key")``) shares its claims between, when
    #: it is not ``key``: a tenant whose tasks have many limit keys is one participant
    fair_key: str | None = None

    def expiry(self) -> tuple[int | None, bool]:
        """The expiry as stored in the head (ms), and whether it is ms from now (a duration)
        rather than epoch ms (a datetime); (None, False) without one."""
        if self.expires is None:
            return None, False
        if isinstance(self.expires, datetime):
            return datetime_ms(self.expires), False
        expires_ms = duration_ms(self.expires, "expires")
        if not 0 < expires_ms <= MAX_TIMEOUT_MS:
            raise InvalidTaskError(
                f"expires must be more than 0 s and at most a year, got {self.expires!r}"
            )
        return expires_ms, True

    def debounce_ms(self) -> tuple[int, int | None] | None:
        """(debounce ms, max wait ms or None), or None when the task is not debounced."""
        if self.debounce is None:
            if self.max_wait is not None:
                raise InvalidTaskError("max_wait= needs debounce=")
            return None
        if self.id is None:
            raise InvalidTaskError("debounce= needs an id= (repeated schedules of one id)")
        if self.at is not None or self.delay is not None:
            raise InvalidTaskError("debounce= sets the due time: give no at= or delay=")
        delay_ms = duration_ms(self.debounce, "debounce")
        wait_ms = None if self.max_wait is None else duration_ms(self.max_wait, "max_wait")
        if wait_ms is not None and wait_ms < delay_ms:
            raise InvalidTaskError(f"max_wait ({self.max_wait!r}) is shorter than debounce")
        return delay_ms, wait_ms

    def options(self, expires_ms: int | None = None) -> TaskOptions:
        """The options kept with the task, validated (InvalidTaskError names what is wrong);
        ``expires_ms`` as ``expiry()`` gives it."""
        if (self.priority, self.key, self.timeout, self.max_attempts, expires_ms) == (
            0,
            None,
            None,
            None,
            None,
        ) and (self.fair_key is None or self.fair_key == self.key):
            return NO_OPTIONS
        timeout_ms = None
        if self.timeout is not None:
            timeout_ms = duration_ms(self.timeout, "timeout")
            if not 0 < timeout_ms <= MAX_TIMEOUT_MS:
                raise InvalidTaskError(
                    f"timeout must be more than 0 s and at most a year, got {self.timeout!r}"
                )
        return TaskOptions(
            validate_priority(self.priority),
            None if self.key is None else validate_key(self.key),
            timeout_ms,
            None if self.max_attempts is None else validate_task_attempts(self.max_attempts),
            expires_ms,
            fair_key_of(self.fair_key, self.key),
        )


def fair_key_of(fair_key: object, key: str | None) -> str | None:
    """A task's ``fair_key`` as its head keeps it: None when it is unset or the same as its
    limit key (the key is then its tenant already); validated as a key is."""
    if fair_key is None:
        return None
    try:
        fair = validate_key(fair_key)
    except InvalidTaskError as exc:
        raise InvalidTaskError(f"fair_key: {exc}") from None
    return None if fair == key else fair


@dataclass(frozen=True)
class ErrorRecord:
    """One failed attempt: when, which attempt, the exception's type, message and traceback,
    and ``worker``, who ran it (the lease holder, see ``Queue(holder=...)``; for a
    ``LeaseExpired`` record the holder whose lease ran out): None when not named, and in
    records written before dueq named workers. ``module``: the exception class's module
    (``type`` is its qualified name), None for records written before dueq kept it."""

    attempt: int
    type: str
    message: str
    traceback: str | None
    at: datetime | None
    worker: str | None = None
    module: str | None = None

    def to_json(self) -> dict[str, Any]:
        """This record as JSON types: at, attempt, type, message, traceback, worker."""
        return {
            "at": iso_ms(self.at),
            "attempt": self.attempt,
            "type": self.type,
            "message": self.message,
            "traceback": self.traceback,
            "worker": self.worker,
        }


#: What a durable task's step is: a ``ctx.step``, a ``ctx.sleep`` or a ``ctx.wait_for``.
StepKind = Literal["step", "sleep", "wait"]
#: ``done``: its result is committed; ``failed``: its body raised (retried on a later run);
#: ``waiting``: a ``wait_for`` the task was handed back for, until a signal or its deadline.
StepState = Literal["done", "failed", "waiting"]


@dataclass(frozen=True)
class StepInfo:
    """One step of a durable task (``TaskInfo.steps``; docs/durable.md).

    ``position`` counts from 0 in the order the function reached its steps; ``name`` is the
    step's (``ctx.step(name, ...)``), the signal's for a wait, ``"sleep"`` for a sleep.
    ``result`` is the committed value (a step's return value, a sleep's wake time as epoch ms,
    a wait's signal payload, None for a wait that timed out: ``timed_out``); ``runs`` counts
    the times its body ran (a failed run included); ``error`` is the last failed run's error
    (``"Type: message"``); ``deadline`` is a waiting step's deadline.
    """

    position: int
    kind: StepKind
    name: str
    state: StepState
    result: Any = None
    runs: int = 1
    started_at: datetime | None = None
    ended_at: datetime | None = None
    error: str | None = None
    deadline: datetime | None = None
    timed_out: bool = False

    def to_json(self) -> dict[str, Any]:
        """This step as JSON types (times ISO 8601 UTC with milliseconds)."""
        return {
            "position": self.position,
            "kind": self.kind,
            "name": self.name,
            "state": self.state,
            "result": self.result,
            "runs": self.runs,
            "started_at": iso_ms(self.started_at),
            "ended_at": iso_ms(self.ended_at),
            "error": self.error,
            "deadline": iso_ms(self.deadline),
            "timed_out": self.timed_out,
        }


@dataclass(frozen=True)
class TaskInfo:
    """A snapshot of one task.

    ``due_at`` is the next-attempt time when scheduled, the due time of the current delivery
    when leased, and ``None`` when dead (``died_at`` is set then). ``attempt`` counts the
    deliveries so far; ``first_claimed_at`` is when the first of them began (None before).
    ``holder`` names who holds a leased task's lease (the worker id its claim gave, see
    ``Queue(holder=...)``), None when not leased or not named. ``task_name`` is the name of
    the function that runs a named task (``@q.task``), None for a plain payload task.

    With ``keep_results`` (``q.configure(keep_results=...)``), finished tasks stay readable as
    ``done`` or ``cancelled`` until their retention ends: ``result`` is the handler's stored
    return value (a JSON value, or None), ``result_unstored`` says why a value could not be
    kept (too big, not JSON), and ``finished_at`` is when the task ended (dead tasks too).
    """

    id: str
    state: TaskState
    payload: Any
    attempt: int
    due_at: datetime | None
    first_claimed_at: datetime | None
    errors: list[ErrorRecord] = field(default_factory=list)
    lease_deadline: datetime | None = None
    died_at: datetime | None = None
    priority: int = 0
    key: str | None = None
    timeout: timedelta | None = None
    max_attempts: int | None = None
    holder: str | None = None
    result: Any = None
    finished_at: datetime | None = None
    result_unstored: str | None = None
    task_name: str | None = None
    #: when the task stops being startable (``expires=``), None without an expiry
    expires_at: datetime | None = None
    #: a durable task's steps so far (``@q.task(durable=True)``), in order; () for others
    steps: tuple[StepInfo, ...] = ()
    #: its tenant on a fair queue when that is not its key (``fair_key=``, docs/fairness.md)
    fair_key: str | None = None

    def to_json(self, queue: str) -> dict[str, Any]:
        """The one JSON form of a task (docs/json.md), as used by the CLI's ``--json``, the
        dashboard's API and Spark's ``errors`` column: a dict of JSON types, every key always
        present (null when it does not apply), times ISO 8601 UTC with milliseconds.
        ``queue`` is the name of the queue the task was read from."""
        due_ms = None if self.due_at is None else round(self.due_at.timestamp() * 1000)
        return {
            "id": self.id,
            "queue": queue,
            "state": self.state,
            "due_at": iso_ms(self.due_at),
            "due_ms": due_ms,
            "attempt": self.attempt,
            "first_claimed_at": iso_ms(self.first_claimed_at),
            "max_attempts": self.max_attempts,
            "priority": self.priority,
            "key": self.key,
            "fair_key": self.fair_key,
            "timeout_s": None if self.timeout is None else self.timeout.total_seconds(),
            "payload": self.payload,
            "errors": [e.to_json() for e in self.errors],
            "holder": self.holder,
            "lease_deadline": iso_ms(self.lease_deadline),
            "died_at": iso_ms(self.died_at),
            "finished_at": iso_ms(self.finished_at),
            "result": self.result,
            "result_unstored": self.result_unstored,
            "steps": [step.to_json() for step in self.steps],
        }


@dataclass(frozen=True)
class TaskPage:
    """One page of a task listing (``Queue.list_tasks``): the tasks found, and the cursor to
    pass for the next page (None when the listing is done). A page may hold fewer tasks than
    asked for, even none, while ``cursor`` is not None: each call looks at a bounded number of
    tasks, as Redis's SCAN does. ``looked_at`` says how many."""

    tasks: list[TaskInfo]
    cursor: str | None
    looked_at: int = 0


#: The counters the per-minute history keeps (``Queue.history``).
HISTORY_COUNTERS = ("scheduled", "claimed", "acked", "retried", "dead", "expired")


@dataclass(frozen=True)
class HistoryPoint:
    """What happened in one minute of a queue (``Queue.history``): tasks scheduled, claimed
    (deliveries leased), acked, retried (failures that will run again), dead (sent to the
    dead-letter queue) and expired (leases that ran out), counted by the scripts that made
    those changes. ``minute`` is the start of the minute on the queue's clock."""

    minute: datetime
    scheduled: int = 0
    claimed: int = 0
    acked: int = 0
    retried: int = 0
    dead: int = 0
    expired: int = 0


@dataclass(frozen=True)
class DueHistogram:
    """How many scheduled tasks fall due in each bucket ahead (``Queue.due_histogram``), from
    ``now``: ``overdue`` are due at or before now (parked tasks included), ``counts[i]`` fall
    due in (now + i * bucket, now + (i + 1) * bucket], ``later`` after the last bucket."""

    now: datetime
    bucket: timedelta
    overdue: int
    counts: list[int]
    later: int


@dataclass(frozen=True)
class ScheduleResult:
    """What ``schedule_many`` did: tasks added, ids that already existed, tasks replaced."""

    added: int
    existing: int
    replaced: int
    ids: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ReshardReport:
    """What ``q.reshard(M)`` reports (docs/sharding.md, "Resharding"): where a reshard of
    ``name`` from ``from_shards`` to ``to_shards`` stands. ``moved``: tasks (or kept results)
    put on their new shard so far; ``existing``: ids the new shard had already (a producer
    wrote them there first: its version is kept); ``waiting``: tasks found leased on a wrong
    shard in the current pass (moved once they settle); ``kept``: tasks that cannot move (a
    limit key, a batch, parents); ``passes``: passes over every shard begun; ``done`` once
    the layout key says ``to_shards``; ``cursor``: the next step's place ("<shard>/<set>/
    <scan cursor>"), None when done; ``left``: what the shards being dropped still held at the
    end of the last pass."""

    name: str
    from_shards: int
    to_shards: int
    moved: int = 0
    existing: int = 0
    waiting: int = 0
    kept: int = 0
    passes: int = 0
    done: bool = False
    cursor: str | None = None
    #: the last step ended a pass that moved nothing (the mover waits a little for leases)
    idle: bool = False
    #: tasks, kept results and done marks still on the shards the new layout drops, at the
    #: end of the last pass (the reshard ends once none is left)
    left: int = 0


@dataclass(frozen=True)
class KeyRotation:
    """What ``q.rotate_key(to=...)`` did (docs/payload-codecs.md, "Rotating keys"), counted
    over stored tasks (every state) and kept results: ``resealed`` encrypted again with key
    ``to``; ``skipped`` changed meanwhile (acked, cancelled, replaced: left to the change);
    ``already`` on ``to``; ``undecryptable`` opened by no key of the queue's codec (left as
    they were; the first ``MAX_LISTED`` ids in ``undecryptable_ids``); ``unsealed`` not
    encrypted (plain or only compressed: left as they are). ``cursor`` is where to resume
    (``rotate_key(cursor=...)``), None once every value was looked at; ``batches`` the HSCAN
    batches looked at."""

    to: str
    resealed: int = 0
    skipped: int = 0
    already: int = 0
    undecryptable: int = 0
    unsealed: int = 0
    undecryptable_ids: tuple[str, ...] = ()
    cursor: str | None = None
    batches: int = 0

    #: Most undecryptable ids a report lists.
    MAX_LISTED: ClassVar[int] = 100

    @property
    def done(self) -> bool:
        """Every stored value was looked at (no cursor to resume from)."""
        return self.cursor is None

    def plus(self, other: KeyRotation) -> KeyRotation:
        """Both reports' counts added (``other``'s cursor: the later one)."""
        ids = (self.undecryptable_ids + other.undecryptable_ids)[: self.MAX_LISTED]
        return KeyRotation(
            self.to,
            self.resealed + other.resealed,
            self.skipped + other.skipped,
            self.already + other.already,
            self.undecryptable + other.undecryptable,
            self.unsealed + other.unsealed,
            ids,
            other.cursor,
            self.batches + other.batches,
        )


@dataclass(frozen=True)
class BatchInfo:
    """A batch's counts (``q.batch(id)``): members added, and how many ended acked, dead,
    cancelled or expired; ``pending`` have not ended. ``complete`` once it was closed
    (``close_batch``) with nothing pending: its completion task was scheduled then, unless
    ``completion_taken``: a task with the completion task's id was scheduled after the close,
    so the completion task was not (``close_batch`` refuses an id taken when it closes)."""

    id: str
    total: int
    acked: int
    dead: int
    cancelled: int
    expired: int
    pending: int
    complete: bool
    created_at: datetime | None = None
    closed_at: datetime | None = None
    completed_at: datetime | None = None
    completion_taken: bool = False

    @property
    def closed(self) -> bool:
        """Whether ``close_batch`` was called for it."""
        return self.closed_at is not None

    @property
    def state(self) -> str:
        """``open``, ``closed``, ``complete``, or ``complete, completion id taken`` (what
        ``dueq batches`` and the dashboard show)."""
        if self.complete:
            return "complete, completion id taken" if self.completion_taken else "complete"
        return "closed" if self.closed else "open"

    def to_json(self) -> dict[str, Any]:
        """This batch as JSON types (times as ISO 8601 UTC with milliseconds)."""
        return {
            "id": self.id,
            "total": self.total,
            "acked": self.acked,
            "dead": self.dead,
            "cancelled": self.cancelled,
            "expired": self.expired,
            "pending": self.pending,
            "complete": self.complete,
            "closed": self.closed,
            "created_at": iso_ms(self.created_at),
            "closed_at": iso_ms(self.closed_at),
            "completed_at": iso_ms(self.completed_at),
            "completion_taken": self.completion_taken,
        }


@dataclass(frozen=True)
class Rate:
    """At most ``n`` claims per ``per`` seconds, across every consumer of a queue
    (``q.configure(rate=dueq.Rate(100, per=1.0))``). Exact in every window of that length: the
    claim script keeps the claim times of the last window."""

    n: int
    per: float = 1.0

    def __post_init__(self) -> None:
        whole_number(self.n, "Rate n", low=1, high=MAX_RATE_N)
        per_ms = duration_ms(self.per, "Rate per", error=ConfigurationError)
        if not 1 <= per_ms <= MAX_RATE_PER_MS:
            raise ConfigurationError(
                f"Rate per must be from 1 ms to 366 days ({MAX_RATE_PER_MS} ms), got {self.per!r}"
            )
        object.__setattr__(self, "per", per_ms / 1000)

    @property
    def per_ms(self) -> int:
        return round(self.per * 1000)

    def __str__(self) -> str:
        return f"{self.n}/{self.per:g}s"


# The bounds of the settings the scripts accept (SETTING_MAX_* in lua/include/settings.lua, which
# must be the same numbers; dueq._wire.snapshot.setting_value applies them to stored values).
#: Most claims a Rate may allow per window (the script keeps one entry per claim of a window).
MAX_RATE_N = 1_000_000
#: Longest window of a Rate, ms (366 days).
MAX_RATE_PER_MS = 366 * 86_400_000
#: The largest key_concurrency setting.
MAX_KEY_CONCURRENCY = 1_000_000
#: Longest remember_done window, ms (366 days).
MAX_REMEMBER_DONE_MS = 366 * 86_400_000
#: Longest keep_results retention, ms (366 days).
MAX_KEEP_RESULTS_MS = 366 * 86_400_000
#: Longest retention of outcome events, ms (366 days).
MAX_EVENTS_MS = 366 * 86_400_000
#: The largest concurrency setting (live leases of the whole queue).
MAX_CONCURRENCY = 1_000_000
#: Most per-key limit overrides a queue keeps (``configure(key_limits=...)``).
MAX_KEY_LIMITS = 1000
#: The largest fair-queue weight a key may have (``KeyLimit(weight=)``; include/fair.lua).
MAX_WEIGHT = 1000
#: What ``configure(fairness=)`` accepts: "key" shares claims between tenants.
FAIRNESS_MODES = ("key",)
#: Longest key cooldown, ms (366 days): ``raise KeyCooldown(seconds)``, ``d.cooldown``.
MAX_COOLDOWN_MS = 366 * 86_400_000


@dataclass(frozen=True)
class KeyLimit:
    """The limits of one named limit key, overriding the queue's ``key_concurrency`` and
    ``key_rate`` for it (``q.configure(key_limits={"tenant:big": dueq.KeyLimit(...)})``): a
    field left None falls back to the queue-wide default. ``weight`` is the key's share as a
    tenant of a fair queue (``configure(fairness="key")``, docs/fairness.md): w tasks claimed
    for every one of a tenant of weight 1 while both have due tasks (None: 1)."""

    #: most of the key's tasks leased at once, across every consumer
    concurrency: int | None = None
    #: claims of the key spaced ``per / n`` apart
    rate: Rate | None = None
    #: its share of a fair queue's claims, 1 to MAX_WEIGHT (None: 1)
    weight: int | None = None

    def __post_init__(self) -> None:
        if self.concurrency is None and self.rate is None and self.weight is None:
            raise ConfigurationError("a KeyLimit needs concurrency=, rate=, weight= or some")
        if self.concurrency is not None:
            whole_number(self.concurrency, "KeyLimit concurrency", low=1, high=MAX_KEY_CONCURRENCY)
        if self.rate is not None and not isinstance(self.rate, Rate):
            raise ConfigurationError(f"KeyLimit rate must be a dueq.Rate, got {self.rate!r}")
        if self.weight is not None:
            whole_number(self.weight, "KeyLimit weight", low=1, high=MAX_WEIGHT)

    @property
    def limits(self) -> bool:
        """Whether it limits the key (concurrency or rate), not only weighs it."""
        return self.concurrency is not None or self.rate is not None

    def __str__(self) -> str:
        parts = [] if self.concurrency is None else [f"concurrency {self.concurrency}"]
        if self.rate is not None:
            parts.append(f"rate {self.rate}")
        if self.weight is not None:
            parts.append(f"weight {self.weight}")
        return ", ".join(parts)


#: Most items one bulk handler call takes (``BatchSpec(max=)``).
MAX_BATCH_ITEMS = 10_000
#: Longest a bulk handler call waits for more items (``BatchSpec(linger=)``), ms.
MAX_LINGER_MS = 60_000


@dataclass(frozen=True)
class BatchSpec:
    """How a bulk handler takes its tasks (``@q.task(batch=dueq.BatchSpec(...))``, or
    ``Worker(q, handler, batch=...)``): one call gets up to ``max`` due tasks of that handler
    as a list of ``dueq.Item``; with ``linger``, a call that has fewer waits at most that long
    after its first task fell due for more to arrive (on the worker's timer: no polling), then
    runs with what it has (docs/bulk-handlers.md)."""

    #: most items in one call, 1 to MAX_BATCH_ITEMS
    max: int = 100
    #: longest a call waits for more items after its first one fell due (0: none)
    linger: Duration = 0

    def __post_init__(self) -> None:
        whole_number(self.max, "BatchSpec max", low=1, high=MAX_BATCH_ITEMS)
        linger_ms = duration_ms(self.linger, "BatchSpec linger", error=ConfigurationError)
        if linger_ms > MAX_LINGER_MS:
            raise ConfigurationError(
                f"BatchSpec linger must be at most {MAX_LINGER_MS // 1000} s, got "
                f"{linger_ms / 1000:g} s"
            )

    @property
    def linger_s(self) -> float:
        """``linger`` in seconds."""
        return duration_ms(self.linger, "BatchSpec linger", error=ConfigurationError) / 1000


@dataclass(frozen=True)
class QueueSettings:
    """A queue's settings, kept in Redis so that every producer and consumer obeys the same
    ones (``q.configure(...)``, ``q.pause()``, ``dueq configure``)."""

    #: claims lease nothing while paused (expired leases are still reclaimed)
    paused: bool = False
    #: how long acked ids are remembered, so scheduling one again is refused as existing
    remember_done: timedelta | None = None
    #: how long finished tasks stay readable with their handler's return value (``q.wait``)
    keep_results: timedelta | None = None
    #: how long outcome events are kept in the queue's events stream (``q.events``), or None
    #: when no events are written
    events: timedelta | None = None
    #: most claims per window across every consumer, or None for no limit
    rate: Rate | None = None
    #: per limit key (``schedule(..., key=)``): claims of one key are spaced ``per / n`` apart
    key_rate: Rate | None = None
    #: per limit key: most of its tasks leased at once, across every consumer
    key_concurrency: int | None = None
    #: most live leases of the whole queue, across every consumer, or None for no cap
    concurrency: int | None = None
    #: limits of named keys, overriding key_concurrency / key_rate for them (key -> KeyLimit)
    key_limits: dict[str, KeyLimit] = field(default_factory=dict, hash=False)
    #: "key": claims are shared between tenants in weighted fair order (docs/fairness.md);
    #: None: by priority, then due time
    fairness: Literal["key"] | None = None
    #: stored values the scripts refuse (hand-edited, or written by another tool), setting ->
    #: the raw value: the queue runs as if those settings were unset (Redis logs each once)
    rejected: dict[str, str] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class TenantShare:
    """One tenant of a fair queue as ``q.stats()`` shows it (docs/fairness.md): its due tasks
    waiting in its lane, and the tasks claimed from its lane in this minute and the one
    before, with their share of all claimed then (0.0 when none were)."""

    #: the tenant (a task's fair_key, else its key; "" for the tasks without a key)
    tenant: str
    due: int
    claimed: int
    share: float

    def to_json(self) -> dict[str, Any]:
        """This tenant as JSON types."""
        return {
            "tenant": self.tenant,
            "due": self.due,
            "claimed": self.claimed,
            "share": self.share,
        }


@dataclass(frozen=True)
class ShardStats:
    """One shard's part of a sharded queue's stats (``QueueStats.shards``): its queue name
    (``emails#0``), its counts per state and the lag of its oldest due task, from the same
    reads as the sums."""

    shard: str
    scheduled: int
    due_now: int
    waiting: int
    leased: int
    dead: int
    next_due_at: datetime | None
    oldest_due_lag_s: float
    missing: int = 0


@dataclass(frozen=True)
class QueueStats:
    """Counts per state and timing of a queue, read in one atomic snapshot (on a sharded
    queue, one snapshot per shard, summed; ``shards`` holds each)."""

    scheduled: int
    due_now: int
    leased: int
    dead: int
    next_due_at: datetime | None
    oldest_due_lag_s: float
    now: datetime
    counters: dict[str, int] = field(default_factory=dict)
    #: Tasks counted in a state whose stored data is gone (evicted or deleted by hand): they
    #: will be dropped when claimed. Anything but 0 means data loss; see maxmemory-policy.
    missing: int = 0
    #: the queue's settings in the same snapshot
    settings: QueueSettings = field(default_factory=QueueSettings)
    #: tasks waiting for their parents (``after=``)
    waiting: int = 0
    #: a fair queue's lanes with due tasks (``configure(fairness="key")``): one per tenant with
    #: due tasks (on a sharded queue, one per tenant per shard)
    fair_lanes: int = 0
    #: tasks claimed from the lanes in this minute and the one before
    fair_claimed: int = 0
    #: the tenants with the most due tasks and the most claimed in the last minute (at most
    #: ten of each), most due first
    tenants: tuple[TenantShare, ...] = ()
    #: a sharded queue's shards, in order, each with its own counts (empty for a plain queue)
    shards: tuple[ShardStats, ...] = ()
    #: while a reshard of a sharded queue runs, its layout ("3>5": from 3 shards to 5; the
    #: shards then list both layouts'), else None (docs/sharding.md, "Resharding")
    resharding: str | None = None

    @property
    def paused(self) -> bool:
        return self.settings.paused

    @property
    def fair(self) -> bool:
        """Whether the queue is fair, or was until lately (its lanes, claims or tenants are
        still counted): what shows tenants (``dueq stats``, the dashboard)."""
        return self.settings.fairness is not None or bool(
            self.fair_lanes or self.fair_claimed or self.tenants
        )


@dataclass(frozen=True)
class Outcome:
    """What became of a delivery: acked, retried (``at`` = next attempt), dead, released,
    cancelled (``q.cancel`` removed the task while it was leased), or lost (its lease expired
    or was taken over before it could be settled, so it is delivered again)."""

    id: str
    kind: OutcomeKind
    attempt: int
    at: datetime | None = None
    error: str | None = None


@dataclass(frozen=True)
class Progress:
    """One progress entry of a task (``d.progress(body)``), as ``q.progress(task_id)`` yields
    it: ``seq`` counts the task's entries from 1 (across its attempts), ``at`` is when it was
    written (queue clock, aware UTC), ``body`` the JSON value reported."""

    task_id: str
    seq: int
    at: datetime
    body: Any

    def to_json(self) -> dict[str, Any]:
        """This entry as JSON types."""
        return {"task_id": self.task_id, "seq": self.seq, "at": iso_ms(self.at), "body": self.body}


def settled_outcome(task_id: str, kind: OutcomeKind, attempt: int) -> Outcome:
    """``Outcome(task_id, kind, attempt)``: the outcome a worker emits per ack.

    Built without the frozen dataclass's ``__init__`` (one ``object.__setattr__`` per field,
    about 0.55 us): its ``__dict__`` is filled at once (0.29 us), the same value in every way
    (fields, equality, hash, repr); a worker makes one per acked task."""
    outcome = _new_object(Outcome)
    outcome.__dict__.update(id=task_id, kind=kind, attempt=attempt, at=None, error=None)
    return outcome


_new_object = object.__new__


class ClaimBatch:
    """One claim call's result: the deliveries and when the next work is due.

    ``now_ms`` is the queue clock when the claim ran, ``now_fraction_ms`` the part of a
    millisecond past it (0 for an injected clock): together they let a consumer sleep until
    ``next_due_ms`` to within the round trip.
    """

    __slots__ = (
        "deliveries",
        "fair",
        "next_due_ms",
        "next_lease_deadline_ms",
        "now_fraction_ms",
        "now_ms",
        "paused",
    )

    def __init__(
        self,
        deliveries: list[Any],
        now_ms: int,
        next_due_ms: int | None,
        next_lease_deadline_ms: int | None,
        now_fraction_ms: float = 0.0,
        paused: bool = False,
        fair: bool = False,
    ) -> None:
        self.deliveries = deliveries
        self.paused = paused
        #: the queue's fairness is on: a consumer holds fewer deliveries ahead of its handlers
        #: (``dueq._consume.prefetch.FAIR_HIGH``), so a tenant's claimed task starts sooner
        self.fair = fair
        self.now_ms = now_ms
        self.now_fraction_ms = now_fraction_ms
        self.next_due_ms = next_due_ms
        self.next_lease_deadline_ms = next_lease_deadline_ms

    def sleep_ms(self, heartbeat_ms: float) -> float:
        """How long a consumer may sleep after this claim: until the next due time or lease
        deadline it reported (to within the round trip), at most ``heartbeat_ms``."""
        upcoming = [ms for ms in (self.next_due_ms, self.next_lease_deadline_ms) if ms is not None]
        if not upcoming:
            return heartbeat_ms
        until_ms = min(upcoming) - self.now_ms - self.now_fraction_ms
        return max(0.0, min(until_ms, heartbeat_ms))
