"""Tasks typed or read by the command line: JSON payloads, ISO times and JSON Lines task files.

A task file has one JSON object per line: ``{"payload": ..., "id": "...", "at": "ISO time"}``
or ``"delay": seconds`` instead of ``at``; only ``payload`` is required, blank lines are
skipped. Every line is checked before anything is written, so a bad line rejects the file.

The checks are the library's own (``validate_id``, ``duration_ms``, ``datetime_ms``,
``encode_envelope``: lone surrogates, numbers beyond float range, times outside 1970..9999,
payloads nested too deep), run per line so that the error can name the line. JSON parsing
itself can raise RecursionError (a line nested thousands deep) besides ValueError; both
become the line's error, never "unexpected".
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import click

from dueq._util.clock import datetime_ms, duration_ms
from dueq._wire.envelope import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    encode_envelope,
    validate_id,
    validate_task_name,
)
from dueq.exceptions import InvalidTaskError
from dueq.model import Task

#: Per-task options a line (or the command line, for every line without them) may give.
OPTION_KEYS = ("priority", "key", "timeout", "max_attempts", "task")
LINE_KEYS = frozenset({"payload", "id", "at", "delay", *OPTION_KEYS})


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_json(text: str) -> Any:
    """A JSON value; NaN and Infinity are refused, as JSON has neither."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON: {exc}") from None
    except RecursionError:  # arrays/objects nested deeper than Python's recursion limit
        raise ValueError("JSON nests too deep (arrays/objects thousands of levels)") from None


def parse_time(text: str) -> datetime:
    """An ISO-8601 time with an offset (``Z`` for UTC); a time without one is refused."""
    value = text.strip()
    if value[-1:] in ("Z", "z"):  # Python 3.10's fromisoformat does not read "Z"
        value = value[:-1] + "+00:00"
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{text!r} is not an ISO-8601 time") from None
    if at.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone; add one such as Z or +02:00")
    return at


def time_option(_ctx: object, _param: object, value: str | None) -> datetime | None:
    """A click callback: an ``--at ISO`` option as an aware datetime (click.BadParameter)."""
    if value is None:
        return None
    try:
        return parse_time(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@dataclass(frozen=True)
class Timing:
    """When a task is due: ``at``, after ``delay`` seconds, or (neither) now."""

    at: datetime | None = None
    delay: float | int | None = None


def checked_task(
    payload: Any, task_id: str | None, timing: Timing, options: Mapping[str, Any] | None = None
) -> Task:
    """A Task whose id, timing, payload and options (``OPTION_KEYS``) dueq accepts (ValueError
    naming the problem)."""
    if task_id is not None:
        validate_id(task_id)
    if timing.at is not None:
        datetime_ms(timing.at)
    if timing.delay is not None:
        duration_ms(timing.delay, "delay")
    task = Task(payload, id=task_id, at=timing.at, delay=timing.delay, **(options or {}))
    name = None
    if task.task is not None:  # a named task: its payload is a dict of the function's arguments
        name = validate_task_name(task.task)
        if not isinstance(payload, dict):
            raise InvalidTaskError(
                f"the payload of named task {name!r} must be a JSON object of its arguments"
            )
    task.expiry()
    task.debounce_ms()
    encode_envelope(payload, DEFAULT_MAX_PAYLOAD_BYTES, task.options(), task_name=name)
    return task


#: A further check of a task (a ValueError names the problem): the named tasks' arguments
Check = Callable[[Task], None]


def task_from_line(
    line: str,
    default: Timing,
    options: Mapping[str, Any] | None = None,
    check: Check | None = None,
) -> Task:
    """The task on one line of a task file; ``default`` timing when it gives none, and the
    ``options`` it does not give itself; ``check`` judges it too."""
    item = parse_json(line)
    if not isinstance(item, dict):
        raise ValueError('a line must be a JSON object like {"payload": {...}}')
    unknown = sorted(set(item) - LINE_KEYS)
    if unknown:
        raise ValueError(f"unknown key(s) {unknown}; a line has {sorted(LINE_KEYS)}")
    if "payload" not in item:
        raise ValueError('no "payload"')
    task_id = item.get("id")
    if task_id is not None and not isinstance(task_id, str):
        raise ValueError(f'"id" must be a string, got {task_id!r}')
    at, delay = item.get("at"), item.get("delay")
    if at is not None and delay is not None:
        raise ValueError('give "at" or "delay", not both')
    if at is not None:
        if not isinstance(at, str):
            raise ValueError(f'"at" must be an ISO-8601 string, got {at!r}')
        timing = Timing(at=parse_time(at))
    elif delay is not None:
        if isinstance(delay, bool) or not isinstance(delay, (int, float)):
            raise ValueError(f'"delay" must be a number of seconds, got {delay!r}')
        timing = Timing(delay=delay)  # checked by duration_ms: an int may be beyond float range
    else:
        timing = default
    given = {name: item[name] for name in OPTION_KEYS if name in item}
    task = checked_task(item["payload"], task_id, timing, {**(options or {}), **given})
    if check is not None:
        check(task)
    return task


class BadLine(ValueError):
    """A line of a task file that is not a task: ``number`` and the reason."""

    def __init__(self, number: int, reason: str) -> None:
        super().__init__(f"line {number}: {reason}")
        self.number = number


def tasks_from_lines(
    lines: Iterable[str],
    default: Timing,
    options: Mapping[str, Any] | None = None,
    check: Check | None = None,
) -> Iterator[Task]:
    """The tasks of a task file's lines; BadLine at the first line that is not one (or that
    ``check`` refuses)."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield task_from_line(line, default, options, check)
        except (ValueError, RecursionError, OverflowError) as exc:  # any bad value on a line
            raise BadLine(number, str(exc) or type(exc).__name__) from None
