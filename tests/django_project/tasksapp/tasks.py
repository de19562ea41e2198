"""The test project's tasks. ``record`` appends its label to a Redis list, so the scenario
can see the order the worker ran tasks in."""

import asyncio
import json

import redis
from django.conf import settings

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


def _redis() -> redis.Redis:
    return redis.Redis.from_url(settings.TASKS["default"]["OPTIONS"]["redis_url"])


@task
def record(label: str) -> str:
    with _redis() as r:
        r.rpush("django-test:ran", label)
    return label


@task
def add(a: int, b: int) -> int:
    return a + b


@task
def fail(message: str) -> None:
    raise ValueError(message)


@task
async def async_add(a: int, b: int) -> dict[str, int]:
    await asyncio.sleep(0)
    return {"sum": a + b}


@task(queue_name="emails")
def send_email(to: str) -> str:
    with _redis() as r:
        r.rpush("django-test:emails", to)
    return f"sent to {to}"


@task(takes_context=True)
def attempt_number(context) -> int:  # type: ignore[no-untyped-def]
    return int(context.attempt)


@task
def returns_a_set() -> object:
    """Counts its runs, then returns a value that is not JSON."""
    with _redis() as r:
        r.incr("django-test:set-runs")
    return {1, 2}


@task(takes_context=True)
def where_am_i(context) -> None:  # type: ignore[no-untyped-def]
    """Records the task its context names: queue, priority, backend (what a re-enqueue keeps)."""
    seen = context.task_result.task
    with _redis() as r:
        r.set("django-test:where", json.dumps([seen.queue_name, seen.priority, seen.backend]))


@task
def fail_with_notes(message: str) -> None:
    error = Oops(message + "\nsecond line")
    error.add_note("a note")
    raise error from KeyError("the cause")


class Oops(Exception):
    """A user's own exception class."""


@task
def gate() -> None:
    """Holds the worker's one handler until the scenario opens the gate."""
    with _redis() as r:
        r.rpush("django-test:gate-started", "1")
        r.blpop(["django-test:gate"], timeout=60)  # blocked, not polling: Redis stays still


@task
def mark(label: str) -> None:
    with _redis() as r:
        r.rpush("django-test:marks", label)
