"""The ``django.tasks`` names dueq's backend uses, from Django 6's built-in ``django.tasks`` or,
on Django 4.2-5.x, from the ``django-tasks`` backport (``django_tasks``): one place decides."""

from __future__ import annotations

from typing import Any

try:  # Django >= 6.0 (Python >= 3.12): the framework's own module
    from django.tasks import (
        DEFAULT_TASK_QUEUE_NAME,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        task_backends,
    )
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TaskError
    from django.tasks.exceptions import TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started

    SOURCE = "django.tasks"
except ImportError:  # Django 4.2-5.x: the backport, or neither (then say which extra to install)
    try:
        from django_tasks import (
            DEFAULT_TASK_QUEUE_NAME,
            TaskContext,
            TaskResult,
            TaskResultStatus,
            task_backends,
        )
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import TaskError
        from django_tasks.exceptions import TaskResultDoesNotExist
        from django_tasks.signals import task_enqueued, task_finished, task_started
    except ImportError as exc:
        raise ImportError(
            "dueq.django needs Django 6 (django.tasks) or, on Django 4.2-5.x, the django-tasks "
            "backport: pip install 'dueq[django]'"
        ) from exc

    SOURCE = "django_tasks"


def normalize_json(obj: Any) -> Any:
    """``obj`` as JSON types (what Django's task backends store for arguments and return
    values): mappings, sequences, bytes as UTF-8 text; anything else raises TypeError."""
    if isinstance(obj, dict):
        return {normalize_json(k): normalize_json(v) for k, v in obj.items()}
    if isinstance(obj, bytes):
        return obj.decode("utf-8")
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    if isinstance(obj, (list, tuple)):
        return [normalize_json(v) for v in obj]
    raise TypeError(f"Unsupported type: {type(obj)}")


__all__ = [
    "DEFAULT_TASK_QUEUE_NAME",
    "SOURCE",
    "BaseTaskBackend",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
