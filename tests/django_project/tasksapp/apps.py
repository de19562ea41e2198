"""The test app: ``ready`` connects receivers of Django's task signals that record each one in
a Redis list (``django-test:signals``), in whatever process sends it (the worker sends
``task_started`` and ``task_finished``), so the contract scenario can see them."""

import json

import redis
from django.apps import AppConfig
from django.conf import settings

try:
    from django.tasks.signals import task_enqueued, task_finished, task_started
except ImportError:
    from django_tasks.signals import task_enqueued, task_finished, task_started

SIGNALS_KEY = "django-test:signals"


def _recorder(name: str):  # type: ignore[no-untyped-def]
    def record(sender, task_result, **kwargs):  # type: ignore[no-untyped-def]
        url = settings.TASKS["default"]["OPTIONS"]["redis_url"]
        entry = {
            "signal": name,
            "id": task_result.id,
            "status": str(task_result.status),
            "errors": [e.exception_class_path for e in task_result.errors],
        }
        with redis.Redis.from_url(url) as r:
            r.rpush(SIGNALS_KEY, json.dumps(entry))

    return record


class TasksAppConfig(AppConfig):
    name = "django_project.tasksapp"

    def ready(self) -> None:
        for name, signal in (
            ("enqueued", task_enqueued),
            ("started", task_started),
            ("finished", task_finished),
        ):
            signal.connect(_recorder(name), weak=False, dispatch_uid=f"test-{name}")
