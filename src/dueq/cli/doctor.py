"""``dueq doctor QUEUE [--fix] [--json]``: check (and repair) a queue's derived state.

Thin: ``Queue.doctor`` does the work (``docs/doctor.md``); this prints its report and sets the
exit code, so a cron job or a health check can run it.
"""

from __future__ import annotations

import click

from ..discovery import open_queue
from .connection import RedisTarget, redis_options, require_queue
from .jsonout import emit, json_option, plain
from .output import console, safe

#: Exit code when problems were found and not fixed (0: healthy, or everything found was fixed).
EXIT_PROBLEMS = 1


@click.command()
@click.argument("queue")
@click.option("--fix", is_flag=True, help="Repair what is found (never touches a task).")
@click.option(
    "--batch",
    type=click.IntRange(1, 10_000),
    default=1000,
    show_default=True,
    metavar="N",
    help="Most keys or entries looked at per script call.",
)
@json_option
@redis_options
def doctor(queue: str, fix: bool, batch: int, as_json: bool, target: RedisTarget) -> None:
    """Check QUEUE's derived state (each limit key's leased and parked counts, key-wait
    entries, the rate window's sum) against its tasks; with --fix, repair it. Tasks are never
    changed; tasks whose data is gone are reported only. Prints one line per finding (--json:
    one JSON object).

    Exit code: 0 when healthy or everything found was fixed, 1 when problems were found and
    not fixed (or on an error).
    """
    conn = target.open()
    require_queue(conn, queue)
    report = open_queue(conn.client, queue).doctor(fix=fix, batch=batch)
    if as_json:
        emit({**plain(report), "healthy": report.healthy, "problems": len(report.problems)})
    else:
        out = console()
        for finding in report.findings:
            where = f"[{safe(finding.queue)}] " if finding.queue != queue else ""
            out.print(where + safe(finding.line()))
        for note in report.notes:
            out.print(f"note: {safe(note)}")
        fixed = len(report.findings) - len(report.problems)
        summary = (
            "healthy"
            if report.healthy
            else f"{len(report.findings)} finding(s), {fixed} fixed, {len(report.problems)} not"
        )
        out.print(f"queue {safe(repr(queue))}: {summary}")
    if report.problems:
        click.get_current_context().exit(EXIT_PROBLEMS)
