"""Queues with tasks in every state, for the dashboard tests (app and browser)."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import redis

from dueq import Queue, RetryPolicy, Task, Worker

XSS = "<script>window.__dueq_xss = 1</script>"


def boom(kind: type[Exception], message: str) -> Exception:
    """An exception with a real traceback (raised and caught)."""
    try:
        raise kind(message)
    except Exception as exc:  # caught on purpose: the test wants the raised exception
        return exc


def seed(r: redis.Redis) -> dict[str, Queue]:
    """``emails``: 3 scheduled (one with a <script> payload), 1 leased (holder
    ``worker-test``), 3 dead (2 ValueError, 1 KeyError); ``reports``: 2 scheduled."""
    emails = Queue("emails", r, retry=RetryPolicy(max_attempts=1), holder="worker-test")
    reports = Queue("reports", r)
    for i in range(5):
        emails.schedule({"n": i}, id=f"fail-{i}")
    for d in emails.claim(limit=5):
        if d.id == "fail-0":
            d.fail(boom(KeyError, "no such key"))
        elif d.id in ("fail-1", "fail-2"):
            d.fail(boom(ValueError, f"bad value {d.id}"))
        elif d.id == "fail-3":
            pass  # stays leased
        else:
            d.release(delay=3600)
    emails.schedule({"to": "ann@example.com"}, id="welcome:42", delay=600)
    emails.schedule({"html": XSS}, id="xss-1", delay=900)
    reports.schedule({"r": 1}, id="daily-1", delay=60)
    reports.schedule({"r": 2}, id="daily-2", delay=7000)
    return {"emails": emails, "reports": reports}


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, "no CSRF field on the page"
    return found.group(1)


@contextlib.contextmanager
def running_worker(*queues: Queue) -> Iterator[Worker]:
    """A real ``dueq.Worker`` on ``queues`` in a thread, until it has announced itself."""
    worker = Worker(list(queues), lambda d: None, heartbeat=0.2)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not queues[0].workers():
        assert time.monotonic() < deadline, "the worker never announced itself"
        time.sleep(0.05)
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Served:
    """A real uvicorn server of the dashboard app in a thread, on a free loopback port."""

    def __init__(self, app: Any, host: str = "127.0.0.1") -> None:
        import uvicorn

        self.host = host
        self.port = free_port()
        config = uvicorn.Config(app, host=host, port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Served:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.05)
        return self

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.port}{path}"


def overdue(q: Queue, *, count: int, minutes: float) -> None:
    """``count`` tasks of ``q`` that fell due ``minutes`` ago and have waited since.

    A past ``at=`` would be stored as now (docs/lag.md: lag counts from when a task was
    scheduled), so they are scheduled, due at once, by a producer whose clock reads
    ``minutes`` ago: the same data a producer writing then would have left.
    """
    then_s = time.time() - minutes * 60
    producer = Queue(q.name, q.redis, clock=lambda: then_s)
    producer.schedule_many(Task({"n": i}, id=f"late-{i}") for i in range(count))
