"""The import paths and logger names a user may have written, pinned across moves of the modules.

``dueq.__all__`` is pinned by test_exported_members; this pins the rest of what the docs, README and
examples show: submodules imported by their dotted path (``import dueq.spark``, ``from dueq.metrics
import serve``) and the names of the loggers a user configures
(``logging.getLogger("dueq.worker")``). Moving code into concept folders (dueq/_consume, dueq/cron,
...) must keep each: a moved module leaves its public name behind as a package or a re-export, and a
module that logs keeps the logger name it was documented with, not its new ``__name__``. Found with
``grep -rhoE 'dueq(\\.[a-z_]+)+|from dueq[a-z_.]* import' docs README.md examples``; the optional
extras (Django, Starlette, pyspark) skip when they are not installed.
"""

from __future__ import annotations

import importlib
import logging

import pytest

# (module, attribute) a user may reach by that dotted path; the attribute None is the module itself.
PATHS = [
    ("dueq.operators", "process"),
    ("dueq.spark", "register"),
    ("dueq.spark", "read_tasks"),
    ("dueq.spark", "schedule_dataframe"),
    ("dueq.spark", "foreach_batch"),
    ("dueq.metrics", "serve"),
    ("dueq.metrics", "WorkerMetrics"),
    ("dueq.metrics", "QueueCollector"),
    ("dueq.metrics", "new_registry"),
    ("dueq.logs", "JsonFormatter"),
    ("dueq.logs", "WorkerFilter"),
    ("dueq.logs", "stderr_fallback"),
    ("dueq.discovery", "discover_workers"),
    ("dueq.discovery", "open_queue"),
    ("dueq.discovery", "queue_exists"),
    ("dueq.discovery", "async_queue_exists"),
    ("dueq.acl", "acl_rule"),
    ("dueq.health", "judge_health"),
    ("dueq.health", "HealthRules"),
    ("dueq.cron", "occurrence_id"),
    ("dueq.cli", "COMMANDS"),
    ("dueq.cli", "main"),
    ("dueq.server", "RedisServer"),
    ("dueq.events", "Event"),
    ("dueq.worker", "Worker"),
    ("dueq.queue", "Queue"),
    ("dueq", "worker_id"),
]

# The same, behind an optional extra: (module, attribute, the package whose absence skips it).
EXTRA_PATHS = [
    ("dueq.django", "DueqBackend", "django"),
    ("dueq.dashboard", "create_app", "starlette"),
    ("dueq.dashboard", "DashboardSettings", "starlette"),
    ("dueq.dashboard", "HealthRules", "starlette"),
    ("dueq.dashboard", "judge_health", "starlette"),
    ("dueq.dashboard", "human_duration", "starlette"),
    ("pyspark_dueq", None, "pyspark"),
]

# module -> the logger name its ``logger`` logs on, as documented (docs/worker-output.md:
# dueq.worker, dueq.operators._process; docs/results.md: dueq.queue; docs/events.md: dueq.events) or
# as it was before the modules moved into folders (a user's logging config names these; a rename is
# a change they see).
LOGGERS = {
    "dueq.worker": "dueq.worker",
    "dueq.queue": "dueq.queue",
    "dueq.async_queue": "dueq.queue",
    "dueq._flows.base": "dueq.queue",
    "dueq._flows.lease": "dueq.queue",
    "dueq._flows.schedule": "dueq.queue",
    "dueq._flows.settings": "dueq.queue",
    "dueq._flows.view": "dueq.queue",
    "dueq._flows.registry": "dueq.queue",
    "dueq._wire.server_check": "dueq.queue",
    "dueq.operators._process": "dueq.operators._process",
    "dueq.operators._async_process": "dueq.operators._process",
    "dueq.operators._settle": "dueq.operators._process",
    "dueq.operators._emit": "dueq.operators",
    "dueq.cron._keeper": "dueq.cron",
    "dueq.cron.flows": "dueq.cron",
    "dueq.events.stream": "dueq.events",
    "dueq.events.aio": "dueq.events",
    "dueq.registry": "dueq.registry",
    "dueq.retry": "dueq.retry",
    "dueq.metrics": "dueq.metrics",
    "dueq._consume.wake": "dueq.wake",
    "dueq._consume.ended": "dueq._ended",
    "dueq._consume.rules": "dueq.observe",
    "dueq._util.tracing": "dueq._tracing",
    "dueq._util.outage": "dueq.outage",
    "dueq._wire.scripts": "dueq.scripts",
}

EXTRA_LOGGERS = {
    "dueq.spark._source": ("dueq.spark", "pyspark"),
    "dueq.spark._events": ("dueq.spark", "pyspark"),
    "dueq.spark._batch": ("dueq.spark", "pyspark"),
    "dueq.dashboard._context": ("dueq.dashboard", "starlette"),
    "dueq.django.backend": ("dueq.django.backend", "django"),
}


@pytest.mark.parametrize(("module", "name"), PATHS, ids=[f"{m}.{n}" for m, n in PATHS])
def test_public_path(module: str, name: str) -> None:
    imported = importlib.import_module(module)
    assert getattr(imported, name) is not None


@pytest.mark.parametrize(
    ("module", "name", "needs"), EXTRA_PATHS, ids=[f"{m}.{n}" for m, n, _ in EXTRA_PATHS]
)
def test_public_path_of_an_extra(module: str, name: str | None, needs: str) -> None:
    pytest.importorskip(needs)
    imported = importlib.import_module(module)
    if name is not None:
        assert getattr(imported, name) is not None


def test_import_dueq_spark_reaches_its_functions_by_attribute() -> None:
    # the docs write `import dueq.spark` and then `dueq.spark.register(spark)`,
    # `dueq.spark.read_tasks`
    import dueq.spark

    assert callable(dueq.spark.register) and callable(dueq.spark.read_tasks)


@pytest.mark.parametrize(("module", "logger_name"), sorted(LOGGERS.items()))
def test_logger_name(module: str, logger_name: str) -> None:
    logger = importlib.import_module(module).logger
    assert isinstance(logger, logging.Logger) and logger.name == logger_name


@pytest.mark.parametrize(("module", "expected"), sorted(EXTRA_LOGGERS.items()))
def test_logger_name_of_an_extra(module: str, expected: tuple[str, str]) -> None:
    logger_name, needs = expected
    pytest.importorskip(needs)
    assert importlib.import_module(module).logger.name == logger_name


def test_the_fallback_logger_is_the_package_logger() -> None:
    # docs/logs-and-tracing.md: stderr_fallback prints dueq's records while nothing handles "dueq"
    from dueq.logs import FALLBACK_LOGGER

    assert FALLBACK_LOGGER == "dueq"
