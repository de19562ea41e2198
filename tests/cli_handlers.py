"""Handlers for the ``dueq worker`` tests (imported by name, from this folder)."""

from __future__ import annotations

import gc
import os

import dueq
from dueq.cli.connection import client_from_url

NOT_CALLABLE = 42

_client = client_from_url(os.environ.get("DUEQ_REDIS_URL", "redis://127.0.0.1:6379/0"))


def record(d: dueq.Delivery) -> None:
    """Push the task's id and attempt to the list ``handled``; fail when the payload says so."""
    _client.rpush("handled", f"{d.id}:{d.attempt}")
    if d.payload.get("fail"):
        raise ValueError("asked to fail")


def hostile(d: dueq.Delivery) -> None:
    """Fail with terminal escape sequences in the message."""
    raise ValueError("title \x1b]0;pwned\x07 clear \x1b[2J csi \x9b2J")


def freeze_count(d: dueq.Delivery) -> None:
    """Push how many objects the garbage collector holds frozen to the list ``frozen``."""
    _client.rpush("frozen", gc.get_freeze_count())


def noop(d: dueq.Delivery) -> None:
    """Succeed without touching Redis (failover tests: only dueq's own calls may fail)."""


#: A queue object with a named task, for ``dueq worker cli_handlers:named_queue``.
named_queue = dueq.Queue("named", _client, retry=dueq.RetryPolicy(max_attempts=1))


@named_queue.task(name="greet")
def greet(who: str) -> str:
    """Push ``who`` to the list ``greeted``."""
    _client.rpush("greeted", who)
    return who
