"""``dueq worker``: run ``dueq.Worker`` on a handler named ``module:function``, or on a queue
object named ``module:attribute`` and the named tasks registered on it (``@q.task``).

``--log-format json`` writes one JSON object per log line (``dueq.logs.JsonFormatter``); text
lines name the worker too. ``--metrics-port`` serves Prometheus metrics from this process: the
worker's own handler time, delivery lag and outcomes (``dueq.metrics.WorkerMetrics``, measured
around the handler and read from ``Worker.outcomes``), labelled ``worker=--name`` (default:
the host name, so a restarted worker continues its series). The queue's gauges and counters
(``dueq.metrics.QueueCollector``) are queue-wide, the same from every process: ``dueq metrics``
exports them once per Redis; a worker adds them only with ``--queue-metrics``
(docs/metrics-series.md).

``--batch-max N`` (and ``--linger MS``) makes the plain handler a bulk handler: ``Worker(...,
batch=dueq.BatchSpec(max=N, linger=MS / 1000))``, called with a list of up to N ``dueq.Item``
(docs/bulk-handlers.md). The BatchSpec is made before anything is imported or connected, so a
bad value is refused at once with its own ConfigurationError. A worker of named tasks (a queue
object and no handler) refuses it: a named bulk task takes its BatchSpec from
``@q.task(batch=...)``, and there is no plain handler to make one. With ``--metrics-port``, a
bulk handler's calls are measured as calls (``WorkerMetrics.wrap(..., bulk=True)``: calls,
items per call, call time) and a named bulk task's through the dispatcher's ``run_bulk``.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import logging
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from dueq._flows.core import QueueCore
from dueq.cli.connection import RedisTarget, payload_settings, redis_options
from dueq.cli.errors import CliError, Settings
from dueq.cli.metrics import DEFAULT_HOST, metrics_module, start_exporter
from dueq.cli.options import (
    compression_option,
    replication_options,
    seconds_option,
    shards_option,
)
from dueq.cli.output import safe, safe_lines
from dueq.discovery import open_queue
from dueq.logs import JsonFormatter, WorkerFilter
from dueq.model import BatchSpec
from dueq.named import Dispatcher
from dueq.queue import Queue
from dueq.retry import RetryPolicy
from dueq.worker import AsyncWorker, Worker

if TYPE_CHECKING:
    from dueq.async_queue import AsyncQueue


class SafeFormatter(logging.Formatter):
    """Log lines fit for a terminal: the Redis URL's secrets masked and control characters
    (from task ids and handler error messages) escaped, as everywhere in the CLI."""

    def __init__(self, settings: Settings, fmt: str) -> None:
        super().__init__(fmt)
        self._settings = settings

    def format(self, record: logging.LogRecord) -> str:
        return "\n".join(safe_lines(self._settings.redact(super().format(record))))


class HandlerImportError(CliError):
    """The handler named on the command line cannot be imported or is not callable."""


def load_handler(spec: str) -> Callable[..., Any]:
    """The callable ``module:attribute`` names (the attribute may be dotted).

    The current directory is searched first, as ``python -m`` and other task runners do.
    """
    target = load_object(spec, "HANDLER", "module:function")
    if not callable(target):
        raise HandlerImportError(f"{spec!r} is a {type(target).__name__}, not a function")
    handler: Callable[..., Any] = target
    return handler


def load_object(spec: str, hint: str = "HANDLER", form: str = "module:function") -> Any:
    """The object ``module:attribute`` names (see ``load_handler``)."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise click.BadParameter(f"{spec!r} is not {form}", param_hint=hint)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as exc:  # the module itself may raise anything while importing
        raise HandlerImportError(f"cannot import {spec!r}: {type(exc).__name__}: {exc}") from exc
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise HandlerImportError(f"cannot import {spec!r}: no attribute {part!r} in {target!r}")
        target = getattr(target, part)
    return target


#: The options that build the queue of ``dueq worker QUEUE HANDLER``: a queue object has its
#: own settings, so they are refused with one.
_QUEUE_OPTIONS = (
    "max_attempts",
    "lease",
    "shards",
    "wait_replicas",
    "wait_timeout",
    "compression",
)


def load_queue(spec: str) -> Queue | AsyncQueue:
    """The ``dueq.Queue`` or ``dueq.AsyncQueue`` object ``module:attribute`` names, whose
    registered tasks (``@q.task``) the worker runs; CliError otherwise."""
    found: Queue | AsyncQueue = load_object(
        spec, "QUEUE", "module:queue (or give QUEUE MODULE:FUNCTION)"
    )
    if not isinstance(found, QueueCore):  # a Queue or an AsyncQueue
        raise HandlerImportError(
            f"{spec!r} is a {type(found).__name__}, not a dueq.Queue: name a queue object "
            "(dueq worker myapp.tasks:q), or give QUEUE MODULE:FUNCTION"
        )
    ctx = click.get_current_context()
    given = [
        "--" + name.replace("_", "-")
        for name in _QUEUE_OPTIONS
        if ctx.get_parameter_source(name)
        in (click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT)
    ]
    # The object's own client says which Redis it serves: a --redis-url (after the command or
    # before it, ``dueq --redis-url URL worker``) would be ignored, so it is refused. The
    # environment's $DUEQ_REDIS_URL is not: a deployment sets it for every command, and the
    # module making the queue may well read it itself.
    settings = ctx.find_object(Settings)
    if ctx.get_parameter_source("redis_url") is click.core.ParameterSource.COMMANDLINE or (
        settings is not None and settings.redis_url is not None
    ):
        given.append("--redis-url")
    if given:
        raise click.UsageError(
            f"{', '.join(given)} set up a queue by name; {spec} is a queue object with its own "
            "settings and Redis client (set them where it is made)"
        )
    if not found.tasks:
        logging.getLogger(__name__).warning(
            "queue object %s has no registered tasks (@q.task): its named tasks will fail with "
            "UnknownTask",
            spec,
        )
    return found


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is not a whole number or 'auto'", param_hint="--max-in-flight"
        ) from None


def _batch_spec(
    batch_max: int | None, linger_ms: float | None, handler: str | None
) -> BatchSpec | None:
    """The BatchSpec of ``--batch-max`` and ``--linger`` (None without them); its own
    ConfigurationError for a value it refuses (0, negative, past its limits)."""
    if batch_max is None:
        if linger_ms is not None:
            raise click.UsageError("--linger needs --batch-max (it is how long a bulk call waits)")
        return None
    if handler is None:
        raise click.UsageError(
            "--batch-max makes the plain handler a bulk handler: give QUEUE MODULE:FUNCTION "
            "(named tasks take their own: @q.task(batch=dueq.BatchSpec(...)))"
        )
    return BatchSpec(max=batch_max, linger=(linger_ms or 0) / 1000)


@click.command()
@click.argument("queue", metavar="QUEUE|MODULE:QUEUE")
@click.argument("handler", metavar="[MODULE:FUNCTION]", required=False)
@click.option(
    "--concurrency",
    type=click.IntRange(1, 1024),
    default=8,
    show_default=True,
    help="Most handlers running at a time (threads are added only while they help; "
    "coroutines for an async def).",
)
@click.option(
    "--max-in-flight",
    default="auto",
    show_default=True,
    metavar="N|auto",
    help="Deliveries held at a time (running plus waiting); auto adapts to how fast the "
    "handlers settle them, from twice --concurrency up to 4,096 (1,024 on asyncio).",
)
@click.option(
    "--max-attempts",
    type=click.IntRange(1),
    default=5,
    show_default=True,
    help="Deliveries of a task before it goes to the dead-letter queue.",
)
@seconds_option(
    "--lease", 30.0, "How long a task is held before another worker may take it.", low=0.001
)
@seconds_option("--grace", 30.0, "On SIGINT/SIGTERM, time running handlers get to finish.")
@seconds_option(
    "--timeout",
    None,
    "Fail an attempt that runs longer (retried like any failure); none by default.",
    low=0.001,
)
@seconds_option(
    "--heartbeat",
    5.0,
    "How often the worker announces itself (dueq workers) and idle claim loops look again; "
    "its entry expires after 3 missed beats.",
    low=0.01,
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="json: one JSON object per line (time, level, logger, message, worker, queue, ...).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    metavar="PORT",
    help="Serve Prometheus metrics of this worker and its queue on PORT (metrics extra).",
)
@click.option(
    "--metrics-host",
    default=DEFAULT_HOST,
    show_default=True,
    help="With --metrics-port: the address to bind.",
)
@click.option(
    "--name",
    metavar="NAME",
    help="With --metrics-port: the worker label of this worker's series; default: the host "
    "name (keep it the same across restarts).",
)
@click.option(
    "--queue-metrics",
    is_flag=True,
    help="With --metrics-port: also export the queue's gauges and counters (queue-wide, the "
    "same from every process; dueq metrics exports them once).",
)
@click.option(
    "--batch-max",
    type=int,
    metavar="N",
    help="Make HANDLER a bulk handler: called with a list of up to N dueq.Item (1 to 10,000; "
    "docs/bulk-handlers.md). Named tasks take their own: @q.task(batch=dueq.BatchSpec(...)).",
)
@click.option(
    "--linger",
    type=float,
    metavar="MS",
    help="With --batch-max: how long a call with fewer than N items waits for more after its "
    "first one fell due, in milliseconds (at most 60,000); none by default.",
)
@compression_option
@shards_option
@replication_options
@redis_options
@click.pass_obj
def worker(
    settings: Settings,
    queue: str,
    handler: str | None,
    concurrency: int,
    max_in_flight: str,
    max_attempts: int,
    lease: float,
    grace: float,
    timeout: float | None,
    heartbeat: float,
    log_format: str,
    metrics_port: int | None,
    metrics_host: str,
    name: str | None,
    queue_metrics: bool,
    batch_max: int | None,
    linger: float | None,
    compression: str | None,
    shards: int | None,
    wait_replicas: int,
    wait_timeout: float,
    target: RedisTarget,
) -> None:
    """Run HANDLER on the tasks of QUEUE until SIGINT or SIGTERM.

    HANDLER takes a dueq.Delivery (d.payload, d.id, d.attempt); returning acks the task,
    raising fails it (retried with jittered exponential backoff, then dead). On SIGINT or
    SIGTERM the worker stops claiming, lets running handlers finish within --grace, gives
    the rest back and logs what became of its tasks; a second signal cuts the grace short.

    With one argument, MODULE:QUEUE names a dueq.Queue (or AsyncQueue) object: the worker
    serves that queue, with its client and settings, and runs its named tasks (@q.task) by
    name (docs/named-tasks.md); --redis-url and the queue's settings are refused there.

    With --batch-max N, HANDLER is a bulk handler: it takes a list of up to N dueq.Item
    (item.payload, item.fail(exc), item.release(), item.result(value)); returning acks every
    item without a verdict, raising fails them.

    With DUEQ_KEYS set ("k1=<base64 of 32 bytes>,k2=..."), sealed payloads are opened with
    those keys, and what the worker writes (results, tasks scheduled by handlers) is sealed
    with DUEQ_ACTIVE_KEY (default: the last listed). Without a key for it, a sealed task goes
    dead (UndecryptableTask, one log line each, its data kept): replay it once the key is
    set. A queue object uses its own codec (Queue(..., codec=...)).
    """
    batch = _batch_spec(batch_max, linger, handler)
    q: Queue | AsyncQueue
    if handler is None:
        if ":" not in queue:
            raise click.UsageError(
                f"give QUEUE MODULE:FUNCTION, or a queue object as MODULE:QUEUE (not {queue!r})"
            )
        q = load_queue(queue)
        function: Callable[..., Any] = Dispatcher([q], None)
        handler, queue, shown = "named tasks", q.name, repr(q)
    else:
        function = load_handler(handler)
        payloads = payload_settings(compression)  # DUEQ_KEYS, checked before connecting
        conn = target.open()
        shown = conn.shown
        q = open_queue(
            conn.client,
            queue,
            shards=shards,
            retry=RetryPolicy(max_attempts=max_attempts),
            lease=lease,
            wait_replicas=wait_replicas,
            wait_timeout=wait_timeout,
            **payloads,
        )
    log = logging.StreamHandler(sys.stderr)
    log.addFilter(WorkerFilter())
    log.setFormatter(
        JsonFormatter(settings.redact)
        if log_format == "json"
        else SafeFormatter(settings, "%(asctime)s %(levelname)s %(name)s [%(worker)s]: %(message)s")
    )
    logging.basicConfig(level=logging.DEBUG if settings.debug else logging.INFO, handlers=[log])
    measured: Any = None
    if metrics_port is not None:
        m = metrics_module()
        registry = m.new_registry()
        if queue_metrics:
            if not isinstance(q, Queue):
                raise click.UsageError("--queue-metrics needs a dueq.Queue, not an AsyncQueue")
            registry.register(m.QueueCollector(q.redis, [queue]))
        measured = m.WorkerMetrics(registry, worker=name)
        function = measured.wrap(queue, function, bulk=batch is not None)
        for fn in q.tasks.values():  # a named bulk task's series, at 0 from the start
            if fn.batch is not None:
                measured.watch_bulk(queue, fn.name)
        server = start_exporter(registry, metrics_port, metrics_host)
        click.get_current_context().call_on_close(server.shutdown)
        logging.getLogger(__name__).info(
            "serving metrics on http://%s:%d/metrics", metrics_host, server.server_port
        )
    settings_kw: dict[str, Any] = {
        "concurrency": concurrency,
        "max_in_flight": None if max_in_flight == "auto" else _whole(max_in_flight),
        "grace": grace,
        "timeout": timeout,
        "heartbeat": heartbeat,
        "batch": batch,
    }
    w: Worker | AsyncWorker
    if not isinstance(q, Queue):  # an AsyncQueue (the asyncio front end is imported by it)
        w = AsyncWorker(q, function, **settings_kw)
    else:
        w = Worker(q, function, **settings_kw)
    if measured is not None:
        measured.follow(queue, w.outcomes)
    banner = f"worker on {queue!r} at {shown}: {safe(handler)}, concurrency {concurrency}"
    codec = q.payload_codec.codec
    if codec is not None:  # key ids only, never a key
        banner += f", payloads sealed with key {codec.active}"
    if batch is not None:
        banner += f", bulk calls of up to {batch.max}"
        if batch.linger_s:
            banner += f" (linger {batch.linger_s * 1000:g} ms)"
    if log_format == "json":  # every stderr line is then one JSON object
        logging.getLogger(__name__).info("%s", banner, extra={"queue": queue})
    else:
        click.echo(banner, err=True)
    # What this process imported and set up (about 40,000 objects) lives as long as it does:
    # frozen out of the collector's reach, a full collection walks only what the handlers make
    # (measured on a 2-core VM: 6-13 ms for those objects, a pause every consumer in the
    # process waits out, and 20 ms with a benchmark's data beside them; under 0.01 ms frozen).
    # Undone when the worker ends, for a caller that runs this command in its own process.
    gc.freeze()
    try:
        # it logs what became of its tasks ("worker stopped: {...}"), once, on stderr
        if isinstance(w, AsyncWorker):
            asyncio.run(w.run())
        else:
            w.run()
    finally:
        gc.unfreeze()
