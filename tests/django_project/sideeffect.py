"""A module no task lives in: importing it leaves a mark in Redis (``django-test:imported``),
so the contract scenario can see whether a worker imported a module a payload named."""

import os

import redis

with redis.Redis.from_url(os.environ["DUEQ_REDIS_URL"]) as _r:
    _r.rpush("django-test:imported", __name__)


def anything() -> None:
    """Not a task."""
