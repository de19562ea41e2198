"""dueq: delayed and retried tasks on Redis sorted sets.

Tasks wait in a sorted set scored by their next-attempt time; one Lua script atomically claims
every due task and leases it to one consumer; failures come back with backoff until they land
in the dead-letter queue. See docs/guarantees.md for the guarantees.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

from dueq._util.lazy import lazy_exports
from dueq._version import __version__

if TYPE_CHECKING:
    from dueq import operators as operators
    from dueq._util.identity import worker_id
    from dueq._wire.codec import Encrypted
    from dueq._wire.envelope import TaskOptions, TraceContext
    from dueq.async_queue import AsyncQueue
    from dueq.cron.flows import CronDefinition, Occurrence
    from dueq.delivery import AsyncDelivery, Delivery, Item
    from dueq.doctor import DoctorFinding, DoctorReport
    from dueq.durable import AsyncStepContext, StepContext, TaskContext
    from dueq.events.stream import AsyncEvent, Event, EventGroup
    from dueq.exceptions import (
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
        NonDeterministic,
        PayloadError,
        ReplicationTimeout,
        SignalRefused,
        TaskCancelled,
        TaskNotFound,
        TaskTimeout,
        UndecryptableTask,
        UnknownTask,
        Unrecoverable,
        WaitTimeout,
    )
    from dueq.model import (
        BatchInfo,
        BatchSpec,
        ClaimBatch,
        DueHistogram,
        ErrorRecord,
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
        ShardStats,
        StepInfo,
        Task,
        TaskInfo,
        TaskPage,
        TenantShare,
    )
    from dueq.named import AsyncTaskFunction, TaskFunction
    from dueq.queue import Queue
    from dueq.registry import WorkerInfo
    from dueq.retry import RetryPolicy
    from dueq.sharding.layout import keyed_id, shard_of
    from dueq.worker import AsyncWorker, Worker

#: Where each public name lives: ``import dueq`` imports none of these modules; a name is
#: imported the first time it is read (PEP 562), so ``dueq worker`` and a sync worker never
#: load the asyncio front end, events, the doctor or the operators they do not use
#: (docs/benchmarks.md, Start-up). ``from dueq import X`` and ``dueq.X`` work as before.
_LAZY: dict[str, str] = {
    "operators": "operators",
    "AsyncQueue": "async_queue",
    "worker_id": "_util.identity",
    "keyed_id": "sharding.layout",
    "shard_of": "sharding.layout",
    "CronDefinition": "cron.flows",
    "Occurrence": "cron.flows",
    "DoctorFinding": "doctor",
    "DoctorReport": "doctor",
    "TaskOptions": "_wire.envelope",
    "TraceContext": "_wire.envelope",
    "Encrypted": "_wire.codec",
    "AsyncEvent": "events.stream",
    "Event": "events.stream",
    "EventGroup": "events.stream",
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
    "NonDeterministic": "exceptions",
    "PayloadError": "exceptions",
    "SignalRefused": "exceptions",
    "ReplicationTimeout": "exceptions",
    "TaskCancelled": "exceptions",
    "TaskNotFound": "exceptions",
    "TaskTimeout": "exceptions",
    "UndecryptableTask": "exceptions",
    "UnknownTask": "exceptions",
    "Unrecoverable": "exceptions",
    "WaitTimeout": "exceptions",
    "AsyncTaskFunction": "named",
    "TaskContext": "durable",
    "StepContext": "durable",
    "AsyncStepContext": "durable",
    "StepInfo": "model",
    "TaskFunction": "named",
    "ClaimBatch": "model",
    "Queue": "queue",
    "WorkerInfo": "registry",
    "RetryPolicy": "retry",
    "AsyncDelivery": "delivery",
    "BatchInfo": "model",
    "BatchSpec": "model",
    "Item": "delivery",
    "Delivery": "delivery",
    "DueHistogram": "model",
    "ErrorRecord": "model",
    "HistoryPoint": "model",
    "KeyLimit": "model",
    "KeyRotation": "model",
    "ReshardReport": "model",
    "Outcome": "model",
    "Progress": "model",
    "QueueSettings": "model",
    "QueueStats": "model",
    "TenantShare": "model",
    "Rate": "model",
    "ScheduleResult": "model",
    "ShardStats": "model",
    "Task": "model",
    "TaskInfo": "model",
    "TaskPage": "model",
    "AsyncWorker": "worker",
    "Worker": "worker",
}


def _public_home(name: str, value: Any) -> None:
    """Show a public class or function as ``dueq.<name>`` (``repr``, docs, tracebacks), as httpx
    does. Exceptions keep ``dueq.exceptions``: error records and Django results store the raised
    type's ``module.qualname``, which must not depend on whether ``dueq.X`` was read first."""
    if isinstance(value, type) and issubclass(value, BaseException):
        return
    if isinstance(value, type) or (callable(value) and hasattr(value, "__qualname__")):
        value.__module__ = "dueq"


def __getattr__(name: str) -> Any:
    value = _load(name)
    if not isinstance(value, ModuleType):
        _public_home(name, value)
    return value


__all__ = [
    "AsyncDelivery",
    "AsyncEvent",
    "AsyncQueue",
    "AsyncStepContext",
    "AsyncTaskFunction",
    "AsyncWorker",
    "BatchCompleted",
    "BatchCompletionTaken",
    "BatchInfo",
    "BatchSpec",
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
    "Encrypted",
    "ErrorRecord",
    "Event",
    "EventGroup",
    "EventsTrimmed",
    "HistoryPoint",
    "InvalidArguments",
    "InvalidTaskError",
    "Item",
    "KeyCooldown",
    "KeyLimit",
    "KeyRotation",
    "LeaseLost",
    "NonDeterministic",
    "Occurrence",
    "Outcome",
    "PayloadError",
    "Progress",
    "Queue",
    "QueueSettings",
    "QueueStats",
    "Rate",
    "ReplicationTimeout",
    "ReshardReport",
    "RetryPolicy",
    "ScheduleResult",
    "ShardStats",
    "SignalRefused",
    "StepContext",
    "StepInfo",
    "Task",
    "TaskCancelled",
    "TaskContext",
    "TaskFunction",
    "TaskInfo",
    "TaskNotFound",
    "TaskOptions",
    "TaskPage",
    "TaskTimeout",
    "TenantShare",
    "TraceContext",
    "UndecryptableTask",
    "UnknownTask",
    "Unrecoverable",
    "WaitTimeout",
    "Worker",
    "WorkerInfo",
    "__version__",
    "keyed_id",
    "operators",
    "shard_of",
    "worker_id",
]

_load, __dir__ = lazy_exports(__name__, globals(), _LAZY, __all__)
