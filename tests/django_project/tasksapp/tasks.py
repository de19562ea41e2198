"""The test project's tasks. ``record`` appends its label to a Redis list, so the scenario
can see the order the worker ran tasks in."""

import asyncio

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
