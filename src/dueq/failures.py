"""Error records: what a failed attempt leaves in the task's error history.

A record is a JSON object ``{"at", "attempt", "type", "message", "traceback"}``; the scripts
add ``at`` from the queue clock. Messages and tracebacks are shortened so that one huge error
cannot bloat Redis.
"""

from __future__ import annotations

import json
import traceback
from typing import Any

from .clock import ms_datetime
from .task import ErrorRecord

MAX_MESSAGE_CHARS = 2000
MAX_TRACEBACK_CHARS = 4000
TRACEBACK_FRAMES = 8


def _shorten(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n... [{len(text) - limit} characters cut] ...\n{text[-half:]}"


def error_record(error: BaseException | str, attempt: int) -> str:
    """The JSON record (without "at") of a failed attempt."""
    if isinstance(error, BaseException):
        kind = type(error).__qualname__
        message = str(error)
        trace: str | None = None
        if error.__traceback__ is not None:  # the last frames, then the "Type: message" line
            tail = traceback.extract_tb(error.__traceback__)[-TRACEBACK_FRAMES:]
            last_line = traceback.format_exception_only(type(error), error)[-1]
            trace = "".join(traceback.format_list(tail)) + last_line
    else:
        kind, message, trace = "Error", str(error), None
    record = {
        "attempt": attempt,
        "type": kind,
        "message": _shorten(message, MAX_MESSAGE_CHARS),
        "traceback": _shorten(trace, MAX_TRACEBACK_CHARS) if trace else None,
    }
    return json.dumps(record, ensure_ascii=False)


def parse_error_records(raw: bytes | str | None) -> list[ErrorRecord]:
    """The error history stored for a task (an empty list when there is none)."""
    if not raw:
        return []
    try:
        items: Any = json.loads(raw)
    except ValueError:
        return [
            ErrorRecord(
                attempt=0, type="Unreadable", message=str(raw)[:200], traceback=None, at=None
            )
        ]
    return [
        ErrorRecord(
            attempt=int(item.get("attempt", 0)),
            type=str(item.get("type", "")),
            message=str(item.get("message", "")),
            traceback=item.get("traceback"),
            at=ms_datetime(item["at"]) if isinstance(item.get("at"), int) else None,
        )
        for item in items
        if isinstance(item, dict)
    ]
