"""``python -m django dueq_worker``: run the project's Django tasks from dueq queues.

By default the worker holds per queue only as many tasks as it has handlers (``Worker``'s
``max_in_flight`` set to the concurrency): a task it took ahead of a free handler would read
RUNNING, with a ``started_at``, before it ran, and a higher-priority task enqueued meanwhile
would wait behind it. ``--max-in-flight auto`` (or a number) turns dueq's prefetch back on, for
throughput when tasks are short. A worker serving several queues still holds up to one set per
queue.
"""

from __future__ import annotations

import argparse
from typing import Any

import redis
from django.core.management.base import BaseCommand, CommandError, CommandParser

from dueq.django._compat import task_backends
from dueq.django.backend import DueqBackend
from dueq.exceptions import ConfigurationError
from dueq.logs import shown_url
from dueq.worker import Worker


class Command(BaseCommand):  # type: ignore[misc]  # django's class (no type hints)
    help = (
        "Run Django tasks enqueued on a dueq backend until SIGINT or SIGTERM "
        "(then in-flight tasks finish)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--backend", default="default", help="the TASKS alias to serve (default: default)"
        )
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            metavar="NAME",
            help="a Django queue name to serve; repeat for more (default: all of QUEUES)",
        )
        parser.add_argument(
            "--concurrency", type=int, default=8, help="tasks run at a time (default: 8)"
        )
        parser.add_argument(
            "--max-in-flight",
            type=_in_flight,
            default=None,
            metavar="N",
            help="tasks held per queue, running or about to (default: the concurrency, so "
            "none is taken ahead of a free handler; 'auto' or more: dueq's prefetch)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        alias = options["backend"]
        try:
            backend = task_backends[alias]
        except ConfigurationError as exc:  # dueq's OPTIONS check (a bad redis_url, prefix, ...)
            raise CommandError(f"TASKS[{alias!r}]: {exc}") from exc
        except Exception as exc:  # Django's handler raises its own error type per version
            raise CommandError(f"no task backend {alias!r} in TASKS: {exc}") from exc
        if not isinstance(backend, DueqBackend):
            raise CommandError(f"TASKS[{alias!r}] is {type(backend).__name__}, not DueqBackend")
        names = options["queues"] or backend.queue_names()
        unknown = [n for n in names if backend.queues and n not in backend.queues]
        if unknown:
            raise CommandError(f"not in TASKS[{alias!r}]['QUEUES']: {', '.join(unknown)}")
        if options["concurrency"] < 1:
            raise CommandError("--concurrency must be at least 1")
        backend.load_task_modules()  # the tasks a payload may name (see DueqBackend.resolve_task)
        try:
            backend.ping()
            queues = [backend.queue(n) for n in names]
        except (redis.ConnectionError, redis.TimeoutError) as exc:  # one line, as `dueq worker`
            shown = shown_url(backend.dueq_options.redis_url)
            raise CommandError(f"cannot reach Redis at {shown}: {_reason(exc)}") from exc
        except ConfigurationError as exc:  # bad OPTIONS (reported by the checks, --skip-checks)
            raise CommandError(f"TASKS[{alias!r}]: {exc}") from exc
        self.stdout.write(
            f"dueq_worker: serving {', '.join(q.name for q in queues)} "
            f"(backend {alias!r}, concurrency {options['concurrency']})"
        )
        self.stdout.flush()
        held = options["max_in_flight"]
        try:
            worker = Worker(
                queues,
                backend.run_delivery,
                concurrency=options["concurrency"],
                max_in_flight=options["concurrency"] if held is None else held,
            )
        except ConfigurationError as exc:  # out of range
            raise CommandError(str(exc)) from exc
        worker.run()
        self.stdout.write("dueq_worker: stopped")


def _in_flight(text: str) -> int | str:
    """``--max-in-flight``: "auto" or a whole number."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number or 'auto': {text!r}") from None


def _reason(exc: BaseException) -> str:
    """The operating system's words for a failed connection ("Connection refused"), else
    redis-py's."""
    cause = exc.__context__ or exc.__cause__
    return cause.strerror if isinstance(cause, OSError) and cause.strerror else str(exc)
