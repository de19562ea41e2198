"""Log records a machine can read: one JSON object per line, naming the worker.

``WorkerFilter`` puts this process's worker id (``dueq._identity.worker_id()``) on every record
as ``record.worker``, so a text format can show ``%(worker)s`` and ``JsonFormatter`` always has
it. Library log lines about a task pass ``extra=task_fields(queue, task_id, attempt)``; those
become the ``queue``, ``task_id`` and ``attempt`` keys of the JSON object (the message names
them too, for people reading text logs).

``JsonFormatter`` writes ``{"time", "level", "logger", "message", "worker", ...}`` with
``time`` in UTC ISO-8601 with milliseconds, then every ``extra`` field that JSON can hold
(others as their ``repr``), then ``exception`` (the formatted traceback) when there is one.
Output is ASCII (``ensure_ascii``): task ids and error messages can hold terminal escape
sequences and bidirectional overrides, which JSON then shows as ``\\u001b``, never raw.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from ._identity import worker_id

__all__ = ["JsonFormatter", "WorkerFilter", "task_fields"]

#: Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


def task_fields(queue: str, task_id: str, attempt: int | None = None) -> dict[str, Any]:
    """The ``extra=`` of a log line about one task."""
    fields: dict[str, Any] = {"queue": queue, "task_id": task_id}
    if attempt is not None:
        fields["attempt"] = attempt
    return fields


class WorkerFilter(logging.Filter):
    """Adds ``worker`` (this process's worker id) to every record it sees; drops none."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "worker"):
            record.worker = worker_id()
        return True


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    try:
        json.dumps(value)
    except (TypeError, ValueError):  # not JSON (a set, an object, a cycle): its repr
        return repr(value)
    return value


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (see the module doc).

    ``redact`` (optional) is applied to every string value, e.g. to mask a Redis password.
    """

    def __init__(self, redact: Callable[[str], str] | None = None) -> None:
        super().__init__()
        self._redact = redact or (lambda text: text)

    def format(self, record: logging.LogRecord) -> str:
        at = datetime.fromtimestamp(record.created, timezone.utc)
        entry: dict[str, Any] = {
            "time": at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "worker": getattr(record, "worker", None) or worker_id(),
        }
        for name, value in vars(record).items():
            if name not in _STANDARD and name not in entry:
                entry[name] = _jsonable(value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        entry = {k: self._redact(v) if isinstance(v, str) else v for k, v in entry.items()}
        return json.dumps(entry, ensure_ascii=True, separators=(",", ":"))
