"""Shared output: a rich console, time formatting and a progress bar that stays quiet in pipes.

Everything the command line prints that came from Redis or from a user (ids, payloads,
error types, messages and tracebacks, queue and cron names, error messages) goes through
``safe``: a task id or an exception message can hold terminal escape sequences (``ESC [2J``
clears the screen, ``ESC ]`` sets the window title or a link, a C1 ``CSI`` does the same in
one byte) and bidirectional overrides that make text read differently than it is. Those are
shown escaped (``\x1b``, ``\u202e``), never sent to the terminal.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # rich is imported where a table or a bar is drawn: dueq worker needs none
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

#: Width of tables when stdout is not a terminal (rich would otherwise assume 80 columns).
PIPE_WIDTH = 160


@cache
def _escaped(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def safe(value: object) -> str:
    """``value`` as text a terminal shows as it is: every character that is not printable
    (control characters, C1 codes, bidi overrides, lone surrogates, line breaks) escaped."""
    text = value if isinstance(value, str) else str(value)
    if text.isprintable():  # the usual case, at C speed
        return text
    return "".join(ch if ch.isprintable() else _escaped(ch) for ch in text)


def safe_lines(value: object) -> list[str]:
    """``value``'s lines, each made ``safe`` (for tracebacks and other multi-line text)."""
    return [safe(line) for line in str(value).splitlines()]


def console() -> Console:
    """A console on the current stdout; wide enough for tables when it is not a terminal.

    Markup and emoji codes are off: queue names, ids and errors are shown as they are.
    """
    from rich.console import Console

    out = Console(highlight=False, markup=False, emoji=False)
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out = Console(highlight=False, markup=False, emoji=False, width=PIPE_WIDTH)
    return out


def titled_table(title: str, columns: Sequence[str], right: Collection[str] = ()) -> Table:
    """A table with a left-aligned title; the columns named in ``right`` align right."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column, justify="right" if column in right else "left")
    return table


def seconds(value: float) -> str:
    """A duration for people: ``850 ms``, ``12.5 s``, ``4 min``, ``3.2 h``, ``2.0 d``."""
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 60:
        return f"{value:.1f} s"
    if value < 3600:
        return f"{value / 60:.0f} min"
    if value < 86400:
        return f"{value / 3600:.1f} h"
    return f"{value / 86400:.1f} d"


def when(at: datetime | None, now: datetime) -> str:
    """``at`` in UTC with how far it is from ``now``: ``2030-01-02 03:04:05Z (in 3.0 s)``."""
    if at is None:
        return "-"
    delta = (at - now).total_seconds()
    relative = f"in {seconds(delta)}" if delta >= 0 else f"{seconds(-delta)} ago"
    return f"{at:%Y-%m-%d %H:%M:%S}Z ({relative})"


class Steps:
    """Progress of a long operation: a rich bar on a terminal, nothing otherwise."""

    def __init__(self, progress: Progress | None, total: int, description: str) -> None:
        self._progress = progress
        self._task = progress.add_task(description, total=total) if progress else None

    def advance(self, count: int) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, count)


@contextmanager
def steps(out: Console, total: int, description: str) -> Iterator[Steps]:
    """A progress bar over ``total`` items while the block runs (only on a terminal)."""
    if not out.is_terminal:
        yield Steps(None, total, description)
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=out) as progress:
        yield Steps(progress, total, description)
