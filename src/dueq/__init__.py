"""dueq: delayed and retried tasks on Redis sorted sets.

Tasks wait in a sorted set scored by their next-attempt time; one Lua script atomically claims
every due task and leases it to one consumer; failures come back with backoff until they land
in the dead-letter queue. See docs/guarantees.md for the guarantees.
"""

from . import operators
from ._async import AsyncQueue
from ._identity import worker_id
from ._shard_layout import shard_of
from ._version import __version__
from .cron import CronDefinition, Occurrence
from .doctor import DoctorFinding, DoctorReport
from .envelope import TaskOptions, TraceContext
from .events import AsyncEvent, Event
from .exceptions import (
    BatchCompleted,
    ConfigurationError,
    CorruptQueue,
    CronConflict,
    CronError,
    CronNotFound,
    DueqError,
    EventsTrimmed,
    InvalidTaskError,
    KeyCooldown,
    LeaseLost,
    PayloadError,
    ReplicationTimeout,
    TaskCancelled,
    TaskNotFound,
    TaskTimeout,
    UnknownTask,
    Unrecoverable,
    WaitTimeout,
)
from .named import AsyncTaskFunction, TaskFunction
from .queue import ClaimBatch, Queue
from .registry import WorkerInfo
from .retry import RetryPolicy
from .task import (
    AsyncDelivery,
    BatchInfo,
    Delivery,
    DueHistogram,
    ErrorRecord,
    HistoryPoint,
    KeyLimit,
    Outcome,
    QueueSettings,
    QueueStats,
    Rate,
    ScheduleResult,
    Task,
    TaskInfo,
    TaskPage,
)
from .worker import AsyncWorker, Worker

__all__ = [
    "AsyncDelivery",
    "AsyncEvent",
    "AsyncQueue",
    "AsyncTaskFunction",
    "AsyncWorker",
    "BatchCompleted",
    "BatchInfo",
    "ClaimBatch",
    "ConfigurationError",
    "CorruptQueue",
    "CronConflict",
    "CronDefinition",
    "CronError",
    "CronNotFound",
    "Delivery",
    "DoctorFinding",
    "DoctorReport",
    "DueHistogram",
    "DueqError",
    "ErrorRecord",
    "Event",
    "EventsTrimmed",
    "HistoryPoint",
    "InvalidTaskError",
    "KeyCooldown",
    "KeyLimit",
    "LeaseLost",
    "Occurrence",
    "Outcome",
    "PayloadError",
    "Queue",
    "QueueSettings",
    "QueueStats",
    "Rate",
    "ReplicationTimeout",
    "RetryPolicy",
    "ScheduleResult",
    "Task",
    "TaskCancelled",
    "TaskFunction",
    "TaskInfo",
    "TaskNotFound",
    "TaskOptions",
    "TaskPage",
    "TaskTimeout",
    "TraceContext",
    "UnknownTask",
    "Unrecoverable",
    "WaitTimeout",
    "Worker",
    "WorkerInfo",
    "__version__",
    "operators",
    "shard_of",
    "worker_id",
]
