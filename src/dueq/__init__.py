"""dueq: delayed and retried tasks on Redis sorted sets.

Tasks wait in a sorted set scored by their next-attempt time; one Lua script atomically claims
every due task and leases it to one consumer; failures come back with backoff until they land
in the dead-letter queue. See docs/guarantees.md for the guarantees.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__

if TYPE_CHECKING:
    from . import operators as operators
    from ._async import AsyncQueue
    from ._identity import worker_id
    from ._shard_layout import shard_of
    from .cron import CronDefinition, Occurrence
    from .doctor import DoctorFinding, DoctorReport
    from .envelope import TaskOptions, TraceContext
    from .events import AsyncEvent, Event, EventGroup
    from .exceptions import (
        BatchCompleted,
        BatchCompletionTaken,
        ConfigurationError,
        CorruptQueue,
        CronConflict,
        CronError,
        CronNotFound,
        DependencyCycle,
        DueqError,
        EventsTrimmed,
        InvalidArguments,
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
    from .named import AsyncTaskFunction, TaskContext, TaskFunction
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

#: Where each public name lives: ``import dueq`` imports none of these modules; a name is
#: imported the first time it is read (PEP 562), so ``dueq worker`` and a sync worker never
#: load the asyncio front end, events, the doctor or the operators they do not use
#: (docs/benchmarks.md, Start-up). ``from dueq import X`` and ``dueq.X`` work as before.
_LAZY: dict[str, str] = {
    "operators": "operators",
    "AsyncQueue": "_async",
    "worker_id": "_identity",
    "shard_of": "_shard_layout",
    "CronDefinition": "cron",
    "Occurrence": "cron",
    "DoctorFinding": "doctor",
    "DoctorReport": "doctor",
    "TaskOptions": "envelope",
    "TraceContext": "envelope",
    "AsyncEvent": "events",
    "Event": "events",
    "EventGroup": "events",
    "BatchCompleted": "exceptions",
    "BatchCompletionTaken": "exceptions",
    "ConfigurationError": "exceptions",
    "CorruptQueue": "exceptions",
    "CronConflict": "exceptions",
    "CronError": "exceptions",
    "CronNotFound": "exceptions",
    "DependencyCycle": "exceptions",
    "DueqError": "exceptions",
    "EventsTrimmed": "exceptions",
    "InvalidArguments": "exceptions",
    "InvalidTaskError": "exceptions",
    "KeyCooldown": "exceptions",
    "LeaseLost": "exceptions",
    "PayloadError": "exceptions",
    "ReplicationTimeout": "exceptions",
    "TaskCancelled": "exceptions",
    "TaskNotFound": "exceptions",
    "TaskTimeout": "exceptions",
    "UnknownTask": "exceptions",
    "Unrecoverable": "exceptions",
    "WaitTimeout": "exceptions",
    "AsyncTaskFunction": "named",
    "TaskContext": "named",
    "TaskFunction": "named",
    "ClaimBatch": "queue",
    "Queue": "queue",
    "WorkerInfo": "registry",
    "RetryPolicy": "retry",
    "AsyncDelivery": "task",
    "BatchInfo": "task",
    "Delivery": "task",
    "DueHistogram": "task",
    "ErrorRecord": "task",
    "HistoryPoint": "task",
    "KeyLimit": "task",
    "Outcome": "task",
    "QueueSettings": "task",
    "QueueStats": "task",
    "Rate": "task",
    "ScheduleResult": "task",
    "Task": "task",
    "TaskInfo": "task",
    "TaskPage": "task",
    "AsyncWorker": "worker",
    "Worker": "worker",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dueq' has no attribute {name!r}")
    found = importlib.import_module(f".{module}", __name__)
    value = found if name == module else getattr(found, name)
    globals()[name] = value  # once: later reads are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "AsyncDelivery",
    "AsyncEvent",
    "AsyncQueue",
    "AsyncTaskFunction",
    "AsyncWorker",
    "BatchCompleted",
    "BatchCompletionTaken",
    "BatchInfo",
    "ClaimBatch",
    "ConfigurationError",
    "CorruptQueue",
    "CronConflict",
    "CronDefinition",
    "CronError",
    "CronNotFound",
    "Delivery",
    "DependencyCycle",
    "DoctorFinding",
    "DoctorReport",
    "DueHistogram",
    "DueqError",
    "ErrorRecord",
    "Event",
    "EventGroup",
    "EventsTrimmed",
    "HistoryPoint",
    "InvalidArguments",
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
    "TaskContext",
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
