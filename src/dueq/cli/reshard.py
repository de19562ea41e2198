"""``dueq reshard QUEUE --to M [--batch N]``: change a sharded queue's shard count, online.

Thin: ``Queue.reshard`` does the work (``dueq.sharding.reshard``). This prints a progress line
per pass (and every few seconds within one), then the result; stopped (Ctrl-C, SIGKILL) it
leaves the reshard where it was, and running it again (here or anywhere) resumes it.
"""

from __future__ import annotations

import time

import click

from dueq.cli.connection import RedisTarget, redis_options, require_queue
from dueq.cli.jsonout import emit, json_option, plain
from dueq.cli.output import console, safe
from dueq.discovery import open_queue
from dueq.model import ReshardReport

#: Most seconds between two progress lines within one pass.
PROGRESS_EVERY_S = 2.0


def _line(report: ReshardReport) -> str:
    return (
        f"{report.from_shards} -> {report.to_shards} shards: pass {report.passes}, "
        f"{report.moved} moved, {report.existing} already there, {report.waiting} leased "
        f"(moved once settled), {report.kept} cannot move, {report.left} left on the "
        f"shards being dropped"
    )


@click.command(name="reshard")
@click.argument("queue")
@click.option("--to", "to", required=True, type=click.IntRange(2, 256), metavar="M")
@click.option(
    "--batch",
    type=click.IntRange(1, 10_000),
    default=500,
    show_default=True,
    metavar="N",
    help="Most task ids looked at (and moved) per step.",
)
@json_option
@redis_options
def reshard(queue: str, to: int, batch: int, as_json: bool, target: RedisTarget) -> None:
    """Change sharded QUEUE to --to M shards while its producers and workers run: every task
    moves to its shard in the new layout with its whole state (due time, attempts, errors,
    steps, result), leased ones once they settle. Every queue object follows the new layout
    within a second. Stopped at any point, running it again resumes. Refused, with the
    reason, while the queue has per-key limits, fairness, open batches, tasks waiting for
    parents or outcome events (docs/sharding.md, "Resharding"); cron definitions move with
    their pending occurrence."""
    conn = target.open()
    require_queue(conn, queue)
    out = console()
    last = {"pass": 0, "at": time.monotonic()}

    def progress(report: ReshardReport) -> None:
        now = time.monotonic()
        if as_json or (report.passes == last["pass"] and now - last["at"] < PROGRESS_EVERY_S):
            return
        last.update({"pass": report.passes, "at": now})
        out.print(safe(_line(report)))

    q = open_queue(conn.client, queue)
    report = q.reshard(to, batch=batch, progress=progress)
    if as_json:
        emit({**plain(report), "queue": queue})
    else:
        out.print(f"queue {safe(repr(queue))} has {report.to_shards} shards: {safe(_line(report))}")
