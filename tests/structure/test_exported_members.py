"""The public line: ``dueq.__all__`` names exactly the public API, and every name in it exists.

Adding or removing a public name is a deliberate change: update this list with it (and the
CHANGELOG).
"""

from __future__ import annotations

import inspect

from paths_support import DOCS

import dueq
import dueq.operators

PUBLIC = {
    "DueHistogram",
    "HistoryPoint",
    "TaskPage",
    "AsyncDelivery",
    "AsyncEvent",
    "AsyncQueue",
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
    "DueqError",
    "Encrypted",
    "ErrorRecord",
    "Event",
    "EventGroup",
    "EventsTrimmed",
    "InvalidArguments",
    "InvalidTaskError",
    "Item",
    "KeyCooldown",
    "KeyLimit",
    "KeyRotation",
    "ReshardReport",
    "LeaseLost",
    "Occurrence",
    "Outcome",
    "PayloadError",
    "Progress",
    "Queue",
    "QueueSettings",
    "QueueStats",
    "TenantShare",
    "Rate",
    "ReplicationTimeout",
    "RetryPolicy",
    "ScheduleResult",
    "ShardStats",
    "Task",
    "TaskCancelled",
    "TaskContext",
    "StepContext",
    "AsyncStepContext",
    "StepInfo",
    "NonDeterministic",
    "SignalRefused",
    "TaskFunction",
    "UnknownTask",
    "UndecryptableTask",
    "TaskInfo",
    "TaskNotFound",
    "TaskOptions",
    "TaskTimeout",
    "WaitTimeout",
    "TraceContext",
    "Unrecoverable",
    "Worker",
    "WorkerInfo",
    "__version__",
    "keyed_id",
    "operators",
    "shard_of",
    "worker_id",
}


def test_all_names_exactly_the_public_api() -> None:
    assert set(dueq.__all__) == PUBLIC
    assert len(dueq.__all__) == len(set(dueq.__all__))  # no name twice


def test_every_exported_name_exists_and_is_defined_in_a_dueq_module() -> None:
    for name in dueq.__all__:
        member = getattr(dueq, name)
        if inspect.isclass(member) or inspect.isfunction(member):
            assert member.__module__.startswith("dueq"), name


def test_public_classes_and_functions_show_dueq_as_their_module_but_exceptions_keep_theirs() -> (
    None
):
    # as httpx does: repr, docs and tracebacks name dueq.Queue, not dueq.queue.Queue; an
    # exception keeps dueq.exceptions, since error records store the raised type's module
    for name in dueq.__all__:
        member = getattr(dueq, name)
        if inspect.isclass(member) and issubclass(member, BaseException):
            assert member.__module__ == "dueq.exceptions", name
        elif inspect.isclass(member) or inspect.isfunction(member):
            assert member.__module__ == "dueq", name
    assert repr(dueq.Queue).startswith("<class 'dueq.Queue'")


def test_worker_info_has_exactly_the_fields_the_dashboard_reads() -> None:
    import dataclasses

    fields = {f.name: f.type for f in dataclasses.fields(dueq.WorkerInfo)}
    assert fields == {
        "worker_id": "str",
        "host": "str",
        "pid": "int",
        "queues": "tuple[str, ...]",
        "started_at": "datetime",
        "last_seen_at": "datetime",
        "in_flight": "int",
        "processed": "int",
        "failed": "int",
        "tasks": "Mapping[str, Mapping[str, tuple[str, ...]]]",
    }
    assert dueq.WorkerInfo.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_the_operators_module_exports_process_and_the_handler_type() -> None:
    assert set(dueq.operators.__all__) == {"Handler", "process"}
    assert callable(dueq.operators.process)


def test_docs_errors_page_lists_every_exception_class_dueq_exports() -> None:
    import re

    page = (DOCS / "errors.md").read_text(encoding="utf-8")
    exported = {
        name
        for name in dueq.__all__
        if inspect.isclass(getattr(dueq, name)) and issubclass(getattr(dueq, name), Exception)
    }
    assert exported  # DueqError at least: the test reads the real exports
    missing = sorted(name for name in exported if not re.search(rf"\b{name}\b", page))
    assert missing == [], f"docs/errors.md does not list {missing}"
