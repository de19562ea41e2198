"""Settings of the test project: the Redis URL and queue prefix come from the environment
(DUEQ_REDIS_URL, DUEQ_DJANGO_PREFIX), set by tests/test_django.py."""

import os

try:  # Django 6: django.tasks is built in; Django 4.2-5.x: the backport's app
    import django.tasks  # noqa: F401

    BACKPORT_APPS: list[str] = []
except ImportError:
    BACKPORT_APPS = ["django_tasks"]

SECRET_KEY = "dueq-test-project"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DATABASES: dict[str, object] = {}
INSTALLED_APPS = [*BACKPORT_APPS, "dueq.django", "django_project.tasksapp"]

#: a Django queue name of 41 characters (result ids must still fit in 64)
LONG_QUEUE = "reports-for-the-finance-team-each-quarter"

TASKS = {
    "default": {
        "BACKEND": "dueq.django.DueqBackend",
        "QUEUES": ["default", "emails", LONG_QUEUE],
        "OPTIONS": {
            "redis_url": os.environ.get("DUEQ_REDIS_URL", "redis://127.0.0.1:6379/0"),
            "prefix": os.environ.get("DUEQ_DJANGO_PREFIX", "django."),
            "keep_results": int(os.environ.get("DUEQ_DJANGO_KEEP_RESULTS", "3600")),
            "max_attempts": int(os.environ.get("DUEQ_DJANGO_MAX_ATTEMPTS", "1")),
        },
    }
}

# Django's own task log lines ("Task id=... state=SUCCESSFUL") on stderr, for the scenarios
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "loggers": {
        name: {"handlers": ["stderr"], "level": "INFO"} for name in ("django.tasks", "django_tasks")
    },
}
