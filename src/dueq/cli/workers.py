"""``dueq workers``: the live consumer processes of some queues, or of every queue found.

Each ``dueq worker`` (and each ``Worker`` or ``AsyncWorker`` in an application) keeps a
heartbeat entry in the registry of every queue it serves (``dueq.registry``); this command
reads them (``Queue.workers``), one row per process. A process serving several queues shows
once, with all of them.
"""

from __future__ import annotations

from datetime import datetime, timezone

import click

from dueq.cli.connection import Connection, RedisTarget, queue_names, redis_options
from dueq.cli.jsonout import emit, json_option, plain
from dueq.cli.output import console, safe, seconds, titled_table
from dueq.discovery import discover_workers
from dueq.registry import WorkerInfo


def read_workers(conn: Connection, names: list[str]) -> list[WorkerInfo]:
    """The live workers of the queues ``names`` (every queue found when empty), one per
    process (``dueq.discovery.discover_workers``)."""
    return discover_workers(conn.client, names or queue_names(conn.client))


def workers_table(title: str, found: list[WorkerInfo], now: datetime) -> object:
    """One row per worker: id, pid, queues, started, last seen, in flight, processed, failed."""
    counts = ("in flight", "processed", "failed")
    columns = ("worker", "pid", "queues", "up", "last seen", *counts)
    table = titled_table(title, columns, right={"pid", "up", "last seen", *counts})
    for w in found:
        table.add_row(
            safe(w.worker_id),
            str(w.pid),
            safe(", ".join(w.queues)),
            seconds(max((now - w.started_at).total_seconds(), 0.0)),
            seconds(max((now - w.last_seen_at).total_seconds(), 0.0)) + " ago",
            str(w.in_flight),
            str(w.processed),
            str(w.failed),
        )
    return table


@click.command()
@click.argument("queues", nargs=-1, metavar="[QUEUE]...")
@json_option
@redis_options
def workers(queues: tuple[str, ...], as_json: bool, target: RedisTarget) -> None:
    """Show the live worker processes of QUEUEs (default: every queue found).

    A worker announces itself every few seconds (dueq worker, dueq.Worker, dueq.AsyncWorker)
    and is gone a few heartbeats after its process dies; a clean stop removes it at once.
    --json prints {"redis", "workers": [{"worker_id", "host", "pid", "queues", "started_at",
    "last_seen_at", "in_flight", "processed", "failed", "tasks"}]} ("tasks": queue -> named
    task -> its parameters).
    """
    conn = target.open()
    found = read_workers(conn, list(queues))
    if as_json:
        emit({"redis": conn.shown, "workers": plain(found)})
        return
    out = console()
    if not found:
        where = ", ".join(repr(q) for q in queues) if queues else "any queue"
        out.print(f"no live workers on {safe(where)} at {safe(conn.shown)}")
        return
    out.print(workers_table(f"dueq workers at {conn.shown}", found, datetime.now(timezone.utc)))
