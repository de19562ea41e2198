"""``dueq batches``: the batches of a queue with their counts (``Queue.batches``)."""

from __future__ import annotations

import click

from dueq.cli.connection import RedisTarget, open_queue, redis_options
from dueq.cli.jsonout import emit, json_option
from dueq.cli.output import console, safe, titled_table
from dueq.model import BatchInfo


def batches_table(title: str, found: list[BatchInfo]) -> object:
    """One row per batch: id, state, total and each outcome's count, pending."""
    counts = ("total", "acked", "dead", "cancelled", "expired", "pending")
    table = titled_table(title, ("batch", "state", *counts), right=set(counts))
    for b in found:
        table.add_row(
            safe(b.id),
            b.state,
            *(str(n) for n in (b.total, b.acked, b.dead, b.cancelled, b.expired, b.pending)),
        )
    return table


@click.command()
@click.argument("queue")
@click.argument("batch", required=False)
@click.option("--limit", type=click.IntRange(1), default=100, show_default=True)
@json_option
@redis_options
def batches(queue: str, batch: str | None, limit: int, as_json: bool, target: RedisTarget) -> None:
    """Show the batches of QUEUE (or only BATCH) with their counts.

    \b
    dueq batches imports
    dueq batches imports import-2026-11-26 --json
    A batch is open until close_batch, closed until every member has ended, then complete
    (its completion task was scheduled; "completion id taken" when a task with its id was
    scheduled after the close, so it was not); complete ones are kept a week. --json prints
    {"queue", "batches": [{"id", "total", "acked", "dead", "cancelled", "expired",
    "pending", "complete", "closed", "created_at", "closed_at", "completed_at",
    "completion_taken"}]}.
    """
    q = open_queue(target, queue)
    if batch is None:
        found = q.batches(limit)
    else:
        one = q.batch(batch)
        found = [] if one is None else [one]
    if as_json:
        emit({"queue": queue, "batches": [b.to_json() for b in found]})
        return
    out = console()
    if not found:
        out.print(f"no batches in {safe(queue)!s}" if batch is None else f"no batch {batch!r}")
        return
    out.print(batches_table(f"batches of {queue}", found))
