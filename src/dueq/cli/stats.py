"""``dueq stats``: a table of every queue's states and timing, once or refreshed."""

from __future__ import annotations

import contextlib
import itertools
import time

import click
import redis
from rich.console import Group
from rich.live import Live

from ..exceptions import DueqError
from ..queue import Queue
from ..task import QueueStats
from .connection import Connection, RedisTarget, queue_names, redis_options, require_queue
from .options import seconds_option
from .output import console, safe, seconds, titled_table, when

#: Lifetime counters shown next to the current states.
COUNTERS = ("acked", "retried", "expired")


def stats_table(conn: Connection, names: list[str]) -> Group:
    """One row per queue: counts per state, next due time, lag of the oldest due task.

    A queue this Redis user may not read, or whose stats cannot be read, is left out with a
    note under the table, so one queue never fails the whole command.
    """
    counts = ("scheduled", "due now", "leased", "dead", *COUNTERS)
    columns = ("queue", *counts, "next due", "oldest due lag")
    table = titled_table(f"dueq queues at {conn.shown}", columns, right={*counts, "oldest due lag"})
    notes: list[str] = []
    for name in names:
        try:
            s: QueueStats = Queue(name, conn.client).stats()
        except redis.exceptions.NoPermissionError:
            notes.append(f"skipped {safe(repr(name))}: this Redis user may not read it")
            continue
        except (redis.ResponseError, DueqError, ValueError) as exc:  # corrupted data
            notes.append(f"skipped {safe(repr(name))}: cannot read its stats: {safe(exc)}")
            continue
        table.add_row(
            safe(name) + (" (paused)" if s.paused else ""),
            *(str(n) for n in (s.scheduled, s.due_now, s.leased, s.dead)),
            *(str(s.counters.get(c, 0)) for c in COUNTERS),
            when(s.next_due_at, s.now),
            seconds(s.oldest_due_lag_s) if s.due_now else "-",
        )
    return Group(table, *notes) if notes else Group(table)


def _queues(conn: Connection, queue: str | None) -> list[str]:
    if queue is not None:
        require_queue(conn, queue)
        return [queue]
    return queue_names(conn.client)


@click.command()
@click.argument("queue", required=False)
@click.option("--watch", is_flag=True, help="Refresh the table until Ctrl-C.")
@seconds_option("--interval", 1.0, "Time between refreshes with --watch.", low=0.01)
@click.option(
    "--count", type=click.IntRange(1), metavar="N", help="With --watch: stop after N refreshes."
)
@redis_options
def stats(
    queue: str | None, watch: bool, interval: float, count: int | None, target: RedisTarget
) -> None:
    """Show scheduled, due, leased and dead tasks of QUEUE (default: every queue found).

    "oldest due lag" is how long the oldest due task has waited past its due time: it
    grows when workers are missing or too few. acked/retried/expired count since the queue
    was created.
    """
    conn = target.open()
    out = console()

    def render() -> Group | str:
        names = _queues(conn, queue)
        return stats_table(conn, names) if names else f"no dueq queues at {safe(conn.shown)}"

    if not watch:
        out.print(render())
        return
    # On a terminal the table is redrawn in place; elsewhere (a log) printed each time.
    live = Live(console=out, auto_refresh=False) if out.is_terminal else None
    refreshes = range(count) if count is not None else itertools.count()
    try:
        with live or contextlib.nullcontext():
            for i in refreshes:
                if i:
                    time.sleep(interval)
                if live is not None:
                    live.update(render(), refresh=True)
                else:
                    out.print(render())
    except KeyboardInterrupt:  # Ctrl-C is how --watch ends
        pass
