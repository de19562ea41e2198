"""Error records: what a failed attempt leaves in the task's error history.

A record is a JSON object ``{"at", "attempt", "type", "message", "traceback", "worker",
"module"}``; the scripts add ``at`` from the queue clock. ``type`` is the exception class's
qualified name and ``module`` its module (together its import path, which Django's
``TaskError.exception_class_path`` needs); ``traceback`` is Python's whole report of it
(header, frames, notes, and the ``__cause__``/``__context__`` chain). ``worker`` is the lease
holder of the failed attempt (the holder part of its lease token, ``<seq>@<holder>``), absent
when the lease named none and in records older than the worker registry. Messages and
tracebacks are shortened (a traceback keeps its head and tail) so that one huge error cannot
bloat Redis.
"""

from __future__ import annotations

import json
import traceback
from typing import Any

from dueq._util.clock import stored_datetime
from dueq.model import ErrorRecord

MAX_MESSAGE_CHARS = 2000
MAX_TRACEBACK_CHARS = 4000


def _shorten(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, lone surrogates (not UTF-8) replaced by "?"."""
    if not text.isascii():
        text = text.encode("utf-8", "replace").decode("utf-8")
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n... [{len(text) - limit} characters cut] ...\n{text[-half:]}"


def token_holder(token: str) -> str | None:
    """The holder a lease token names (``<seq>@<holder>``), or None."""
    _, at, holder = token.partition("@")
    return holder if at and holder else None


def error_record(error: BaseException | str, attempt: int, worker: str | None = None) -> str:
    """The JSON record (without "at") of a failed attempt run by ``worker``."""
    module: str | None = None
    if isinstance(error, BaseException):
        kind, module = type(error).__qualname__, type(error).__module__
        message = str(error)
        trace: str | None = None
        if error.__traceback__ is not None:  # the whole report; _shorten keeps head and tail
            trace = "".join(traceback.format_exception(error))
    else:
        kind, message, trace = "Error", str(error), None
    record = {
        "attempt": attempt,
        "type": _shorten(kind, MAX_MESSAGE_CHARS),
        "message": _shorten(message, MAX_MESSAGE_CHARS),
        "traceback": _shorten(trace, MAX_TRACEBACK_CHARS) if trace else None,
    }
    if worker is not None:
        record["worker"] = worker
    if module is not None:
        record["module"] = _shorten(module, MAX_MESSAGE_CHARS)
    return json.dumps(record, ensure_ascii=False)


def parse_error_records(raw: bytes | str | None) -> list[ErrorRecord]:
    """The error history stored for a task (an empty list when there is none).

    Never raises: a history that is not a JSON list of records (corrupted data) comes back as
    one "Unreadable" record holding the start of the stored text, and fields of the wrong type
    are read as empty.
    """
    if not raw:
        return []
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    try:
        items: Any = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested past the recursion limit
        items = None
    if not isinstance(items, list):
        return [
            ErrorRecord(attempt=0, type="Unreadable", message=text[:200], traceback=None, at=None)
        ]
    return [_record(item) for item in items if isinstance(item, dict)]


def _record(item: dict[str, Any]) -> ErrorRecord:
    attempt = item.get("attempt")
    trace = item.get("traceback")
    worker = item.get("worker")
    module = item.get("module")
    return ErrorRecord(
        attempt=attempt if isinstance(attempt, int) and 0 <= attempt <= 2**53 else 0,
        type=_text(item.get("type")),
        message=_text(item.get("message")),
        traceback=trace if isinstance(trace, str) else None,
        at=stored_datetime(item["at"]) if isinstance(item.get("at"), (int, float)) else None,
        worker=worker if isinstance(worker, str) and worker else None,
        module=module if isinstance(module, str) and module else None,
    )


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""
