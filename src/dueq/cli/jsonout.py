"""``--json``: what read commands print for machines, one JSON document per line.

Every read command (``stats``, ``list``, ``show``, ``dead list``, ``dead show``, ``cron list``)
takes ``--json`` and then prints one JSON object on one line (``stats --watch --json``: one per
refresh, JSON Lines), parsed by ``jq`` or a script instead of scraping a table. A task has one
JSON form, ``TaskInfo.to_json`` (docs/json.md), in every command that prints tasks. The other
dataclasses (``QueueStats``, ``CronDefinition``, ...) are converted field by field (``plain``):
times as ISO-8601 UTC strings ending in ``Z``, durations as seconds (a float), so a field added
to a dataclass appears without a change here. Output is ASCII (``ensure_ascii``): an id or
error message with terminal escapes or bidi overrides shows as ``\\u001b``, never raw.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import click

from dueq.model import iso_ms


def iso(at: datetime | None) -> str | None:
    """``at`` as ``2030-01-02T03:04:05.678Z`` (UTC, milliseconds), None as None: the form a
    task's times take too (``dueq.model.iso_ms``)."""
    return iso_ms(at)


def plain(value: Any) -> Any:
    """``value`` as JSON types: dataclasses field by field, times ISO, durations in seconds."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, timedelta):
        return value.total_seconds()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in value]
    return str(value)


def emit(document: Any) -> None:
    """Print ``document`` as one line of JSON on stdout."""
    click.echo(json.dumps(plain(document), ensure_ascii=True, separators=(",", ":")))


def json_option(command: Any) -> Any:
    """Add ``--json`` (the command receives ``as_json: bool``)."""
    return click.option(
        "--json", "as_json", is_flag=True, help="Print one JSON object (for scripts, jq)."
    )(command)
