"""A minimal project using dueq as its Django task backend (docs/django.md)."""

import os

try:  # Django 6 has django.tasks built in; Django 4.2-5.x needs the backport's app
    import django.tasks  # noqa: F401

    TASKS_APP: list[str] = []
except ImportError:
    TASKS_APP = ["django_tasks"]

SECRET_KEY = "change-me"
USE_TZ = True
DATABASES: dict[str, object] = {}
INSTALLED_APPS = [*TASKS_APP, "dueq.django", "shop"]

TASKS = {
    "default": {
        "BACKEND": "dueq.django.DueqBackend",
        "QUEUES": ["default", "reports"],
        "OPTIONS": {
            "redis_url": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
            "prefix": "shop.",  # dueq queues shop.default and shop.reports
            "keep_results": 3600,  # seconds finished tasks stay readable
            "max_attempts": 1,  # more: failed attempts are retried with backoff
        },
    }
}
