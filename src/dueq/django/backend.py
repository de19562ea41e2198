"""``DueqBackend``: Django's task framework (``django.tasks``) on dueq queues.

Each Django queue name is one dueq queue (``OPTIONS["prefix"]`` + the name). A task travels as
a plain dueq payload naming the Django task by its module path, with its arguments as JSON, so
any process with the project's code (``python -m django dueq_worker``) can run it; the task's
result id is its dueq task id, ``<queue name>:<32 hex digits>`` (the queue name cut to its first
31 characters, so that the id fits in Django's 64).

A payload's module path is data anyone who can write to the queue controls, so it is never
imported: the backend imports the project's task modules itself (each installed app's
``tasks`` module and ``OPTIONS["task_modules"]``), once, and a path resolves only to a Django
``Task`` that an already imported module holds under that name (``resolve_task``). Any other
path fails the attempt with ``ConfigurationError`` before any code it names could run.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from traceback import format_exception
from typing import Any

import redis
from django.utils import timezone as django_timezone

from dueq._util.identity import worker_id
from dueq._wire.codec import Compression, Encrypted, PayloadCodec, configured_codec
from dueq._wire.envelope import validate_id
from dueq._wire.keys import validate_queue_name
from dueq.delivery import Delivery
from dueq.django._compat import (
    DEFAULT_TASK_QUEUE_NAME,
    BaseTaskBackend,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_enqueued,
    task_finished,
    task_started,
)
from dueq.durable import StepContext, Suspended, step_context
from dueq.exceptions import ConfigurationError, InvalidTaskError
from dueq.model import ErrorRecord, TaskInfo
from dueq.queue import Queue
from dueq.retry import RetryPolicy

logger = logging.getLogger(__name__)

#: Django's priority range, and dueq's levels it maps onto (``dueq_priority``)
DJANGO_MIN_PRIORITY, DJANGO_MAX_PRIORITY = -100, 100
DUEQ_LEVELS = 10

#: characters of the queue name a result id starts with: ``<queue name>:<32 hex digits>`` fits
#: in the 64 characters Django allows a result id (a longer name is cut, see ``_find``)
ID_QUEUE_CHARS = 64 - 1 - 32

#: the payload field that marks a dueq task as one of this backend's
PAYLOAD_MARK = "django_task"

#: dueq states, as Django statuses (a task kept after it ended, ``keep_results``, is done,
#: dead, cancelled or expired; Django has no word for the last two, which never ran to the end)
STATUS_OF_STATE = {
    "waiting": "READY",
    "scheduled": "READY",
    "leased": "RUNNING",
    "done": "SUCCESSFUL",
    "dead": "FAILED",
    "cancelled": "FAILED",
    "expired": "FAILED",
}


def dueq_priority(priority: int) -> int:
    """Django's priority (-100..100, higher runs first) as one of dueq's ten levels (0..9,
    higher runs first), in bands of 20: -100..-80 is 0, -79..-60 is 1, ..., -19..0 (with the
    default, 0) is 4, 1..20 is 5, ..., 81..100 is 9. Order is kept: a higher Django priority
    never maps lower, and any priority above the default runs before default ones."""
    if not DJANGO_MIN_PRIORITY <= priority <= DJANGO_MAX_PRIORITY:
        raise ConfigurationError(f"priority must be in -100..100, got {priority!r}")
    span = DJANGO_MAX_PRIORITY - DJANGO_MIN_PRIORITY + 1
    return (priority - DJANGO_MIN_PRIORITY) * DUEQ_LEVELS // span


def ceil_ms(when: datetime) -> datetime:
    """``when`` rounded up to a whole millisecond, dueq's resolution: a task scheduled then is
    never started (its ``started_at``, in milliseconds) before ``when``."""
    extra_us = when.microsecond % 1000
    return when + timedelta(microseconds=1000 - extra_us) if extra_us else when


def _seconds(value: object, name: str, *, allow_zero: bool) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(f"OPTIONS[{name!r}] must be seconds or a timedelta")
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigurationError(f"OPTIONS[{name!r}] must be positive, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class BackendOptions:
    """The backend's ``OPTIONS``, checked once (an unknown key is a mistake, not ignored).

    ``redis_url``: where the queues live. ``prefix``: put before each Django queue name to
    name its dueq queue. ``keep_results``: seconds (or a timedelta) finished tasks stay
    readable with ``get_result``, set on each queue when the backend first uses it (0 or
    None: the queue's own setting stays, ``dueq configure Q --keep-results``; without one a
    finished task is gone and ``get_result`` raises ``TaskResultDoesNotExist``).
    ``max_attempts``: deliveries per task (1, the default: no retries, as Django's own
    backends; more: a failing task is retried with dueq's backoff, READY between attempts).
    ``lease``: seconds a worker holds a task before another may take it over.
    ``task_modules``: modules holding tasks beyond the installed apps' ``tasks`` modules
    (imported by the backend; a payload's path is never imported, see the module doc).
    ``keys`` (``"k1=<base64>,k2=..."`` as ``DUEQ_KEYS``, or a mapping or callable as
    ``dueq.Encrypted(keys=)`` takes) with ``active_key``, or ``codec`` (a ``dueq.Encrypted``):
    every queue's payloads, results and step results sealed and opened with them, in the
    producer and the worker alike (``_wire.codec.configured_codec``; none by default).
    ``compression``: ``"zstd"`` or ``"auto"``, as ``Queue(compression=)``.
    """

    redis_url: str = "redis://127.0.0.1:6379/0"
    prefix: str = "django."
    keep_results_s: float = 86_400.0
    max_attempts: int = 1
    lease_s: float = 30.0
    task_modules: tuple[str, ...] = ()
    codec: Encrypted | None = None
    compression: Compression | None = None

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> BackendOptions:
        known = {
            "redis_url",
            "prefix",
            "keep_results",
            "max_attempts",
            "lease",
            "task_modules",
            "keys",
            "active_key",
            "codec",
            "compression",
        }
        unknown = sorted(set(options) - known)
        if unknown:
            raise ConfigurationError(
                f"unknown dueq backend OPTIONS {unknown}; known: {sorted(known)}"
            )
        url = options.get("redis_url", cls.redis_url)
        prefix = options.get("prefix", cls.prefix)
        if not isinstance(url, str) or not isinstance(prefix, str):
            raise ConfigurationError("OPTIONS 'redis_url' and 'prefix' must be strings")
        try:
            redis.connection.parse_url(url)  # type: ignore[no-untyped-call]  # redis-py untyped
        except ValueError as exc:  # redis-py's words for a URL it cannot read
            raise ConfigurationError(f"OPTIONS['redis_url'] cannot be read: {exc}") from exc
        keep = options.get("keep_results", cls.keep_results_s)
        attempts = options.get("max_attempts", cls.max_attempts)
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            raise ConfigurationError(f"OPTIONS['max_attempts'] must be >= 1, got {attempts!r}")
        modules = options.get("task_modules", ())
        if isinstance(modules, str) or not all(isinstance(m, str) and m for m in modules):
            raise ConfigurationError("OPTIONS['task_modules'] must be a list of module names")
        if "codec" in options and ("keys" in options or "active_key" in options):
            raise ConfigurationError("give OPTIONS 'codec' or 'keys' (and 'active_key'), not both")
        if "codec" in options and not isinstance(options["codec"], Encrypted):
            raise ConfigurationError(
                f"OPTIONS['codec'] must be a dueq.Encrypted, got {options['codec']!r}"
            )
        codec = configured_codec(
            options.get("codec", options.get("keys")),
            options.get("active_key"),
            where="OPTIONS['keys']",
        )
        compression: Compression | None = options.get("compression")
        PayloadCodec(None, compression)  # checks it (and that zstd is installed) now
        return cls(
            redis_url=url,
            prefix=prefix,
            keep_results_s=0.0 if keep is None else _seconds(keep, "keep_results", allow_zero=True),
            max_attempts=attempts,
            lease_s=_seconds(options.get("lease", cls.lease_s), "lease", allow_zero=False),
            task_modules=tuple(modules),
            codec=codec,
            compression=compression,
        )


def _ms_datetime(ms: object) -> datetime | None:
    if isinstance(ms, bool) or not isinstance(ms, int):
        return None
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


def _iso_datetime(text: object) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:  # a payload written by hand: the time is unknown, not an error
        return None


def task_error(record: ErrorRecord) -> Any:
    """A dueq error record as Django's ``TaskError``: the exception class's module and
    qualified name, as dueq keeps them. A record written before dueq kept the module: the
    traceback's last line (``module.Name: message``) gives it, and a name without one there
    is a builtin (``builtins.ValueError``)."""
    trace = record.traceback or f"{record.type}: {record.message}"
    last = trace.rstrip().rsplit("\n", 1)[-1].split(":", 1)[0].strip()
    if record.module:
        path = f"{record.module}.{record.type}"
    elif last.endswith("." + record.type):
        path = last
    elif "." not in record.type:
        path = f"builtins.{record.type}"
    else:
        path = record.type
    return TaskError(exception_class_path=path, traceback=trace)


def class_path(error: BaseException) -> str:
    """The import path of ``error``'s class (what ``TaskError.exception_class`` imports)."""
    return f"{type(error).__module__}.{type(error).__qualname__}"


def unstored_error(error: BaseException) -> dict[str, str]:
    """What the worker keeps of the error that made a return value unstorable."""
    return {"class": class_path(error), "traceback": "".join(format_exception(error))}


class DueqBackend(BaseTaskBackend):  # type: ignore[misc]  # django's class (no type hints)
    """A ``django.tasks`` backend on dueq: ``run_after``, priorities (mapped onto dueq's
    levels, ``dueq_priority``), one dueq queue per Django queue name, results with
    ``get_result``/``refresh()``, and async task functions. Run tasks with
    ``python -m django dueq_worker``."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        #: what is wrong with OPTIONS, reported by ``check`` (``manage.py check`` and every
        #: command's system checks) and raised by every use of Redis; None when they are right
        self.options_error: ConfigurationError | None = None
        try:
            self.dueq_options = BackendOptions.parse(self.options)
            for name in sorted(self.queues) or [DEFAULT_TASK_QUEUE_NAME]:
                self._check_prefix(name)
        except ConfigurationError as exc:
            self.options_error = exc
            self.dueq_options = BackendOptions()  # never reaches Redis: _client raises exc
        self._redis: redis.Redis | None = None
        self._queues: dict[str, Queue] = {}
        self._task_modules_loaded = False

    def _check_prefix(self, name: str) -> None:
        try:
            validate_queue_name(self.dueq_options.prefix + name)
        except ConfigurationError as exc:
            raise ConfigurationError(
                f"OPTIONS['prefix'] {self.dueq_options.prefix!r} with queue {name!r}: {exc}"
            ) from exc

    def check(self, **kwargs: Any) -> list[Any]:
        """Django's system check of this backend: an error for bad OPTIONS (dueq.E001)."""
        from django.core import checks

        found = list(super().check(**kwargs))
        if self.options_error is not None:
            found.append(
                checks.Error(f"TASKS[{self.alias!r}]: {self.options_error}", id="dueq.E001")
            )
        return found

    # -- queues -------------------------------------------------------------------------------

    def queue_names(self) -> list[str]:
        """The Django queue names this backend accepts (``QUEUES``), sorted."""
        return sorted(self.queues)

    def queue(self, queue_name: str) -> Queue:
        """The dueq queue of Django queue ``queue_name`` (made, and its ``keep_results`` set,
        once per backend instance)."""
        q = self._queues.get(queue_name)
        if q is not None:
            return q
        if self.queues and queue_name not in self.queues:
            raise ConfigurationError(f"queue {queue_name!r} is not in this backend's QUEUES")
        opts = self.dueq_options
        q = Queue(
            opts.prefix + queue_name,
            self._client(),
            retry=RetryPolicy(max_attempts=opts.max_attempts),
            lease=opts.lease_s,
            codec=opts.codec,
            compression=opts.compression,
        )
        if opts.keep_results_s:  # 0/None: leave the queue's own setting (dueq configure)
            q.configure(keep_results=opts.keep_results_s)
        self._queues[queue_name] = q
        return q

    def ping(self) -> None:
        """PING the backend's Redis (redis-py's ConnectionError when it cannot be reached)."""
        self._client().ping()

    def _client(self) -> redis.Redis:
        if self.options_error is not None:
            raise self.options_error
        if self._redis is None:
            self._redis = redis.Redis.from_url(self.dueq_options.redis_url)
        return self._redis

    # -- tasks --------------------------------------------------------------------------------

    def load_task_modules(self) -> None:
        """Import the project's task modules, once: each installed app's ``tasks`` module (when
        it has one) and ``OPTIONS["task_modules"]`` (an ImportError of those is the project's
        and propagates)."""
        if self._task_modules_loaded:
            return
        from django.apps import apps

        packages = [c for c in apps.get_app_configs() if hasattr(c.module, "__path__")]
        for name in [f"{config.name}.tasks" for config in packages]:
            if importlib.util.find_spec(name) is not None:
                importlib.import_module(name)
        for name in self.dueq_options.task_modules:
            importlib.import_module(name)
        self._task_modules_loaded = True

    def resolve_task(self, path: object) -> Any:
        """The Django ``Task`` a payload names by module path, without importing anything the
        path names: only a ``Task`` held under that name by a module already imported (the
        project's task modules, ``load_task_modules``) resolves; else ConfigurationError."""
        self.load_task_modules()
        if not isinstance(path, str):
            raise ConfigurationError(f"not a task path: {path!r}")
        module_name, _, name = path.rpartition(".")
        module = sys.modules.get(module_name)
        found = getattr(module, name, None) if module is not None and name else None
        if not isinstance(found, self.task_class) or found.module_path != path:
            raise ConfigurationError(
                f"{path!r} is not a registered Django task (not a @task in the installed "
                "apps' tasks modules or OPTIONS['task_modules'])"
            )
        return found

    # -- producing ----------------------------------------------------------------------------

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        self.validate_task(task)
        now = django_timezone.now()
        result_id = f"{task.queue_name[:ID_QUEUE_CHARS]}:{uuid.uuid4().hex}"
        result = TaskResult(
            task=task,
            id=result_id,
            status=TaskResultStatus.READY,
            enqueued_at=now,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )  # normalizes args and kwargs to JSON (TypeError for anything else)
        run_after = task.run_after
        if run_after is not None and django_timezone.is_naive(run_after):
            run_after = django_timezone.make_aware(run_after)
        payload = {
            PAYLOAD_MARK: task.module_path,
            "args": result.args,
            "kwargs": result.kwargs,
            "priority": task.priority,
            "run_after": None if run_after is None else run_after.isoformat(),
            "enqueued_at": now.isoformat(),
            "backend": self.alias,
        }
        self.queue(task.queue_name).schedule(
            payload,
            id=result_id,
            at=None if run_after is None else ceil_ms(run_after),
            priority=dueq_priority(task.priority),
            max_attempts=self.dueq_options.max_attempts,
        )
        task_enqueued.send(type(self), task_result=result)
        return result

    # -- results ------------------------------------------------------------------------------

    def _find(self, result_id: object) -> tuple[str, TaskInfo]:
        """The Django queue name and dueq task of a result id; TaskResultDoesNotExist when
        there is none, or the id is one no task of this backend can have (no queue part,
        another backend's queue, not a dueq id). The id's queue part is the queue name, or
        its first ``ID_QUEUE_CHARS`` characters (``enqueue``): then each queue of ``QUEUES``
        that starts so is looked in (with ``QUEUES`` empty, only a whole name is)."""
        tag, sep, _ = str(result_id).rpartition(":")
        try:
            validate_id(result_id)
        except InvalidTaskError as exc:  # too long, not UTF-8, ...: no such task
            raise TaskResultDoesNotExist(result_id) from exc
        if not self.queues:  # any queue name: only whole ones can be found
            names = [tag]
        elif len(tag) < ID_QUEUE_CHARS:
            names = [tag] if tag in self.queues else []
        else:
            names = sorted(q for q in self.queues if q.startswith(tag))
        for name in names if sep else []:
            info = self.queue(name).get(str(result_id))
            if info is not None and isinstance(info.payload, dict) and PAYLOAD_MARK in info.payload:
                return name, info
        raise TaskResultDoesNotExist(result_id)

    def get_result(self, result_id: str) -> Any:
        queue_name, info = self._find(result_id)
        return self.result_of(info, queue_name)

    def wait(self, result_id: str, timeout: float = 10.0) -> Any:
        """The ``TaskResult`` of ``result_id`` once the task has ended (SUCCESSFUL or FAILED),
        woken by the queue when it does (``Queue.wait``, no polling); raises
        ``dueq.WaitTimeout`` if it has not ended within ``timeout`` seconds. Needs
        ``keep_results``."""
        queue_name, _ = self._find(result_id)
        self.queue(queue_name).wait(result_id, timeout=timeout)
        return self.get_result(result_id)

    def task_as_enqueued(self, payload: dict[str, Any], queue_name: str) -> Any:
        """The Django ``Task`` a payload names, as the caller enqueued it: its ``.using()``
        queue name, priority and ``run_after``, on this backend."""
        task = self.resolve_task(payload[PAYLOAD_MARK])
        run_after = _iso_datetime(payload.get("run_after"))
        return task.using(
            queue_name=queue_name,
            priority=payload.get("priority", task.priority),
            backend=self.alias,
            **({"run_after": run_after} if run_after is not None else {}),
        )

    def result_of(self, info: TaskInfo, queue_name: str) -> Any:
        """The ``TaskResult`` a stored dueq task reads as."""
        payload = info.payload
        task = self.task_as_enqueued(payload, queue_name)
        status = TaskResultStatus(STATUS_OF_STATE.get(info.state, "READY"))
        stored = getattr(info, "result", None)  # the worker's record of the last attempt
        stored = stored if isinstance(stored, dict) else {}
        errors = [task_error(e) for e in info.errors]
        unstored = stored.get("unstored")
        if status == TaskResultStatus.SUCCESSFUL and isinstance(unstored, dict):
            status = TaskResultStatus.FAILED  # it ran, but its return value is not JSON
            errors.append(
                TaskError(
                    exception_class_path=str(unstored.get("class", "builtins.TypeError")),
                    traceback=str(unstored.get("traceback", "")),
                )
            )
        # one worker id per attempt: the failed ones name theirs, the last its own record
        worker_ids = [e.worker or "" for e in info.errors if e.attempt > 0]
        last_started = _ms_datetime(stored.get("started_ms"))
        if info.state == "leased" and info.holder:
            worker_ids.append(info.holder)
        elif info.state == "done":  # its last attempt ran to the end (SUCCESSFUL, or not JSON)
            worker_ids.append(str(stored.get("worker", "")))
        if last_started is None:
            last_started = info.errors[-1].at if info.errors else info.first_claimed_at
        finished_at = getattr(info, "finished_at", None)
        if finished_at is None and status == TaskResultStatus.FAILED:
            finished_at = info.died_at
        result = TaskResult(
            task=task,
            id=info.id,
            status=status,
            enqueued_at=_iso_datetime(payload.get("enqueued_at")),
            started_at=info.first_claimed_at or _ms_datetime(stored.get("first_started_ms")),
            finished_at=finished_at,
            last_attempted_at=last_started if info.attempt else None,
            args=payload.get("args", []),
            kwargs=payload.get("kwargs", {}),
            backend=self.alias,
            errors=errors,
            worker_ids=worker_ids,
        )
        if status == TaskResultStatus.SUCCESSFUL:
            object.__setattr__(result, "_return_value", stored.get("value"))
        return result

    # -- consuming ----------------------------------------------------------------------------

    def run_delivery(self, delivery: Delivery) -> dict[str, Any]:
        """Run the Django task a delivery carries (the ``dueq_worker`` handler). Returns what
        the queue keeps as the result: the return value (as JSON types), who ran it and when;
        an exception fails the attempt (retried up to ``max_attempts``, then FAILED)."""
        payload = delivery.payload
        if not isinstance(payload, dict) or PAYLOAD_MARK not in payload:
            raise ConfigurationError(f"task {delivery.id!r} is not a Django task of dueq's")
        prefix, dueq_queue = self.dueq_options.prefix, delivery.queue_name
        task = self.task_as_enqueued(payload, dueq_queue.removeprefix(prefix))
        args, kwargs = payload.get("args", []), payload.get("kwargs", {})
        me = worker_id()
        running = TaskResult(
            task=task,
            id=delivery.id,
            status=TaskResultStatus.RUNNING,
            enqueued_at=_iso_datetime(payload.get("enqueued_at")),
            started_at=_ms_datetime(delivery.first_claimed_ms),
            finished_at=None,
            last_attempted_at=_ms_datetime(delivery.claimed_ms),
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[me] * delivery.attempt,
        )
        task_started.send(type(self), task_result=running)
        context: StepsTaskContext | None = None
        try:
            if task.takes_context:
                steps = step_context(delivery, awaited=False)
                assert isinstance(steps, StepContext)  # (a blocking Queue's delivery)
                context = StepsTaskContext(task_result=running, steps=steps)
                value = task.call(context, *args, **kwargs)
                context.steps.finish()  # NonDeterministic when it stopped short of its steps
            else:
                value = task.call(*args, **kwargs)
        except Suspended:  # a sleep or a wait handed the task back: nothing to record yet
            return {}
        except Exception as exc:  # re-raised (the attempt fails); the last one is FAILED
            if delivery.attempt >= (delivery.max_attempts or self.dueq_options.max_attempts):
                self._finished(running, exc)
            raise
        record: dict[str, Any] = {
            "value": None,
            "worker": me,
            "started_ms": delivery.claimed_ms,  # this attempt's start
            "first_started_ms": delivery.first_claimed_ms,  # the first attempt's
        }
        try:
            record["value"] = normalize_json(value)
        except (TypeError, ValueError, RecursionError) as exc:  # not JSON: the body ran, so
            # the task is acked (never run again) and reads FAILED with this error, as the core
            # queue acks a handler's unstorable value and marks it unstored
            record["unstored"] = unstored_error(exc)
            self._finished(running, exc)
        else:
            object.__setattr__(running, "_return_value", record["value"])
            self._finished(running, None)
        return record

    def _finished(self, result: Any, error: BaseException | None) -> None:
        """Send ``task_finished`` for ``result`` (made SUCCESSFUL, or FAILED with ``error``),
        inside the handler of ``error`` as Django's backends do, so that its log line has the
        exception. Receivers' errors are logged: the body has run, an error now must not fail
        the attempt (and run it again)."""
        now = django_timezone.now()
        object.__setattr__(result, "finished_at", now)
        if error is None:
            object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
        else:
            object.__setattr__(result, "status", TaskResultStatus.FAILED)
            result.errors.append(
                TaskError(
                    exception_class_path=class_path(error),
                    traceback="".join(format_exception(error)),
                )
            )
        for receiver, failure in task_finished.send_robust(type(self), task_result=result):
            if isinstance(failure, Exception):
                logger.error(
                    "task_finished receiver %r failed for %s", receiver, result.id, exc_info=failure
                )


__all__ = ["BackendOptions", "DueqBackend", "dueq_priority", "task_error"]


@dataclass(frozen=True, kw_only=True)
class StepsTaskContext(TaskContext):  # type: ignore[misc]  # (django-stubs: a final dataclass)
    """Django's ``TaskContext`` for a ``@task(takes_context=True)`` function run by dueq's
    backend, with dueq's durable steps (docs/durable.md): ``context.step(name, fn, *args)``
    commits ``fn``'s result so that a later run of the task returns it without calling ``fn``;
    ``context.sleep(d)`` and ``context.wait_for(name, timeout=)`` hand the task back, no worker
    held (``q.signal`` on the dueq queue sends the signal); ``context.step_id`` is an
    idempotency key. A task that calls none of them runs as ever."""

    steps: StepContext

    def step(self, name: str, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        return self.steps.step(name, fn, *args, **kwargs)

    def sleep(self, duration: Any) -> None:
        self.steps.sleep(duration)

    def wait_for(self, name: str, timeout: Any = None) -> Any:
        return self.steps.wait_for(name, timeout)

    @property
    def step_id(self) -> str:
        return self.steps.step_id
