"""``dueq top``: a live view of real queues, as the demo's view is of its own.

Per queue: tasks by state with bars (``bars.state_table``, shared with the demo), paused or
not, per-minute rates of the last minutes (``Queue.history``), when scheduled tasks fall due
(``Queue.due_histogram``), the live workers (``Queue.workers``) and the latest failures with
the worker that ran each (the error records of the newest dead tasks, ``Queue.dead.list``).
Every number comes from a library read; this module only lays them out. ``--once`` prints one
frame and exits (for scripts, tests and a quick look); otherwise the frame is redrawn every
``--interval`` on a terminal (printed each time elsewhere) until Ctrl-C, which exits 130.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta

import click
import redis
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from dueq.cli.bars import STYLES, sparkline, state_counts, state_table
from dueq.cli.connection import Connection, RedisTarget, queue_names, redis_options, require_queue
from dueq.cli.errors import EXIT_INTERRUPTED
from dueq.cli.options import seconds_option
from dueq.cli.output import console, safe, seconds
from dueq.discovery import open_queue
from dueq.exceptions import DueqError
from dueq.model import DueHistogram, HistoryPoint, QueueStats
from dueq.queue import Queue
from dueq.registry import WorkerInfo

#: The per-minute counters shown, in order.
RATES = ("scheduled", "claimed", "acked", "retried", "dead", "expired")
#: Dead tasks whose error records the failure list reads, and failure lines shown.
DEAD_READ = 50
FAILURES_SHOWN = 5
#: The due histogram's buckets (one minute each).
DUE_BUCKETS = 10


@dataclass(frozen=True)
class Failure:
    """One failed attempt of a dead task: when, who ran it, which task, what went wrong."""

    at: datetime | None
    worker: str | None
    task_id: str
    error: str


@dataclass(frozen=True)
class QueueView:
    """What one queue's panel shows, read through the library."""

    name: str
    stats: QueueStats
    history: list[HistoryPoint]
    due: DueHistogram
    workers: list[WorkerInfo]
    failures: list[Failure]


def read_view(q: Queue, minutes: int) -> QueueView:
    """One queue's panel data: stats, history, due histogram, workers, recent failures."""
    failures = [
        Failure(e.at, e.worker, t.id, f"{e.type}: {e.message}")
        for t in q.dead.list(limit=DEAD_READ)
        for e in t.errors
    ]
    failures.sort(key=lambda f: f.at.timestamp() if f.at else 0.0, reverse=True)
    return QueueView(
        q.name,
        q.stats(),
        q.history(minutes),
        q.due_histogram(timedelta(minutes=1), DUE_BUCKETS),
        q.workers(),
        failures,
    )


def _rates(history: list[HistoryPoint]) -> Table:
    minutes = len(history)
    table = Table(box=None, padding=(0, 1))
    table.add_column("per minute")
    table.add_column("now", justify="right")
    table.add_column(f"last {minutes} min", justify="left")
    table.add_column("total", justify="right")
    for name in RATES:
        counts = [getattr(p, name) for p in history]
        table.add_row(
            Text(name, style=STYLES.get(name, "")),
            str(counts[-1] if counts else 0),
            Text(sparkline(counts), style=STYLES.get(name, "")),
            str(sum(counts)),
        )
    return table


def _due(h: DueHistogram) -> Table:
    """The due histogram as two rows: the buckets ahead, and how many tasks each holds."""
    minutes = len(h.counts)
    labels = ["overdue", *(f"{i}-{i + 1}m" for i in range(minutes)), f">{minutes}m"]
    counts = [h.overdue, *h.counts, h.later]
    table = Table(box=None, padding=(0, 1))
    table.add_column("falls due")
    for label in labels:
        table.add_column(label, justify="right")
    table.add_row("tasks", *(str(n) for n in counts))
    return table


def _workers(found: list[WorkerInfo], now: datetime) -> RenderableType:
    if not found:
        return Text("workers: none alive", style="dim")
    table = Table(box=None, padding=(0, 1), title=f"workers: {len(found)} alive")
    table.title_justify = "left"
    for column in ("worker", "pid", "in flight", "processed", "failed", "seen"):
        table.add_column(column, justify="left" if column == "worker" else "right")
    for w in found:
        ago = seconds(max((now - w.last_seen_at).total_seconds(), 0.0))
        row = (w.pid, w.in_flight, w.processed, w.failed)
        table.add_row(safe(w.worker_id), *(str(n) for n in row), f"{ago} ago")
    return table


def _failures(failures: list[Failure]) -> list[RenderableType]:
    if not failures:
        return [Text("recent failures: none", style="dim")]
    by_worker = Counter(f.worker or "?" for f in failures)
    counts = ", ".join(f"{safe(w)} {n}" for w, n in by_worker.most_common())
    lines: list[RenderableType] = [Text(f"recent failures by worker: {counts}")]
    for f in failures[:FAILURES_SHOWN]:
        at = f"{f.at:%H:%M:%S}Z" if f.at else "-"
        line = Text(f"  {at}  ", no_wrap=True, overflow="ellipsis")
        line.append(safe(f.worker or "?"), style="yellow")
        line.append(f"  {safe(f.task_id)}  ")
        line.append(safe(f.error.splitlines()[0] if f.error else ""), style="red")
        lines.append(line)
    return lines


def render_view(v: QueueView) -> RenderableType:
    """One queue's panel."""
    s = v.stats
    counts = state_counts(s)
    head = Text(f"queue {safe(v.name)}", style="bold")
    head.append(
        f"  ({'paused' if s.paused else 'running'}; {s.due_now} due now"
        + (f", oldest waiting {seconds(s.oldest_due_lag_s)}" if s.due_now else "")
        + ")"
    )
    total = max(counts.values(), default=0)
    return Group(
        head,
        state_table(counts, total, meanings=False),
        Text(""),
        _rates(v.history),
        Text(""),
        _due(v.due),
        Text(""),
        _workers(v.workers, s.now),
        *_failures(v.failures),
        Text(""),
    )


def _busiest(conn: Connection, names: list[str]) -> list[str]:
    """``names``, busiest first: tasks running or due now, then tasks held in any state (a
    queue that cannot be read goes last; its panel says why)."""

    def load(name: str) -> tuple[int, int]:
        try:
            s = open_queue(conn.client, name).stats()
        except (redis.exceptions.NoPermissionError, redis.ResponseError, DueqError):
            return (-1, -1)  # unreadable: shown last, its panel says why
        return (s.leased + s.due_now, s.scheduled + s.leased + s.dead)

    busy = {name: load(name) for name in names}
    return sorted(names, key=lambda name: (-busy[name][0], -busy[name][1], name))


def _panel(conn: Connection, name: str, minutes: int) -> RenderableType:
    try:
        return render_view(read_view(open_queue(conn.client, name), minutes))
    except (redis.exceptions.NoPermissionError, redis.ResponseError, DueqError) as exc:
        # one unreadable queue (permissions, corrupted data) never hides the others
        return Text(f"queue {safe(name)}: cannot read it: {safe(exc)}", style="red")


def frame(conn: Connection, names: list[str], minutes: int, out: Console) -> RenderableType:
    """The whole screen: a title, then one panel per queue (a queue that cannot be read says
    why instead). With no ``names``: the busiest queues found whose panels fit the terminal's
    height (``shutil.get_terminal_size``; at least one), and a line saying how many are not
    shown."""
    title = Text(f"dueq top at {safe(conn.shown)}", style="bold")
    parts: list[RenderableType] = [title]
    if names:
        return Group(title, *(_panel(conn, name, minutes) for name in names))
    found = _busiest(conn, queue_names(conn.client))
    if not found:
        return Group(title, Text(f"no dueq queues at {safe(conn.shown)}"))
    room = shutil.get_terminal_size().lines - 2  # the title and the "not shown" line
    for name in found:
        panel = _panel(conn, name, minutes)
        height = len(out.render_lines(panel, out.options, pad=False))
        if len(parts) > 1 and height > room:
            break
        parts.append(panel)
        room -= height
    left = len(found) - (len(parts) - 1)
    if left:
        parts.append(
            Text(
                f"{left} more queues not shown (busiest first): name them, or make the "
                f"terminal taller",
                style="dim",
            )
        )
    return Group(*parts)


@click.command()
@click.argument("queues", nargs=-1, metavar="[QUEUE]...")
@click.option("--once", is_flag=True, help="Print one frame and exit.")
@seconds_option("--interval", 2.0, "Time between refreshes.", low=0.1)
@click.option(
    "--minutes",
    type=click.IntRange(1, 1440),
    default=30,
    show_default=True,
    help="Minutes of per-minute rates shown.",
)
@redis_options
def top(
    queues: tuple[str, ...], once: bool, interval: float, minutes: int, target: RedisTarget
) -> None:
    """A live view of QUEUEs (default: the busiest queues that fit the terminal), refreshed
    until Ctrl-C.

    Per queue: tasks by state, paused or running, per-minute rates of the last --minutes
    (scheduled, claimed, acked, retried, dead, expired), when scheduled tasks fall due, the
    live workers, and the latest failures with the worker that ran each.
    """
    conn = target.open()
    for name in queues:
        require_queue(conn, name)
    out = console()
    names = list(queues)
    if once:
        out.print(frame(conn, names, minutes, out))
        return
    live = Live(console=out, auto_refresh=False) if out.is_terminal else None
    try:
        with live or contextlib.nullcontext():
            while True:
                shown = frame(conn, names, minutes, out)
                if live is not None:
                    live.update(shown, refresh=True)
                else:
                    out.print(shown)
                time.sleep(interval)
    except KeyboardInterrupt:  # Ctrl-C is how top ends: quietly, with the usual 130
        raise click.exceptions.Exit(EXIT_INTERRUPTED) from None
