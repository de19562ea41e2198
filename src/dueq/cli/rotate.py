"""``dueq rotate-key QUEUE --to k2 [--batch N] [--cursor C]``: re-seal a queue's stored
payloads with key k2, online, in bounded batches.

Thin: ``Queue.rotate_key`` does the work (``dueq._flows.rotate``). The keys come from the
environment as for every process of the queue (``DUEQ_KEYS``, docs/payload-codecs.md): the old
keys and ``--to``, which is made the active one here. This prints one progress line per batch
with the cursor to resume from (``--cursor``), then the counts, and sets the exit code, so a
script drops the old key only after a run that exits 0.
"""

from __future__ import annotations

import click

from dueq._wire.codec import Encrypted
from dueq.cli.connection import RedisTarget, redis_options, require_queue
from dueq.cli.jsonout import emit, json_option, plain
from dueq.cli.output import console, safe
from dueq.discovery import open_queue
from dueq.model import KeyRotation

#: Exit code when some payloads no listed key opens (left as they were).
EXIT_UNDECRYPTABLE = 1


def _counts(report: KeyRotation) -> str:
    return (
        f"{report.resealed} re-sealed, {report.skipped} skipped (changed meanwhile), "
        f"{report.already} already on {report.to}, {report.undecryptable} undecryptable, "
        f"{report.unsealed} not encrypted"
    )


@click.command(name="rotate-key")
@click.argument("queue")
@click.option("--to", "to", required=True, metavar="KEY_ID", help="The key id to re-seal with.")
@click.option(
    "--batch",
    type=click.IntRange(1, 10_000),
    default=500,
    show_default=True,
    metavar="N",
    help="Most stored values looked at (and written) per step.",
)
@click.option("--cursor", default=None, metavar="C", help="Resume where a run stopped.")
@json_option
@redis_options
def rotate_key(
    queue: str, to: str, batch: int, cursor: str | None, as_json: bool, target: RedisTarget
) -> None:
    """Re-seal every stored payload of QUEUE encrypted with another key (tasks in every
    state, kept results) with key --to, online, in batches of --batch. Keys come from
    DUEQ_KEYS ("k1=<base64>,k2=<base64>"): list the old keys and the new one. A task changed
    meanwhile is skipped (its new value is the writer's); a payload no listed key opens is
    left as it was and counted. Prints a line per batch with the cursor to resume from
    (--cursor), then the counts (--json: one JSON object at the end).

    Exit code: 0 when every value was looked at and none is undecryptable (the old key may
    then be dropped); 1 when some are undecryptable, or on an error.
    """
    codec = Encrypted(active=to)  # DUEQ_KEYS; a --to it does not list is refused here
    conn = target.open()
    require_queue(conn, queue)
    out = console()

    def progress(report: KeyRotation) -> None:
        if not as_json:
            where = report.cursor or "done"
            out.print(f"batch {report.batches}: {safe(_counts(report))}; cursor {safe(where)}")

    q = open_queue(conn.client, queue, codec=codec)
    report = q.rotate_key(to, batch=batch, cursor=cursor, progress=progress)
    if as_json:
        emit({**plain(report), "queue": queue, "done": report.done})
    else:
        out.print(f"queue {safe(repr(queue))} on key {safe(to)}: {safe(_counts(report))}")
        for task_id in report.undecryptable_ids:
            out.print(f"undecryptable: {safe(task_id)}")
    if report.undecryptable:
        click.get_current_context().exit(EXIT_UNDECRYPTABLE)
