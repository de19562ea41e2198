"""``dueq doctor QUEUE [--fix] [--json]``: check (and repair) a queue's derived state, and say
its health as the dashboard judges it.

Thin: ``Queue.doctor`` does the work (``docs/doctor.md``): the derived-state checks, then the
health verdict of ``dueq.health.judge_health`` (the dashboard's one rule), so the two never
disagree. This prints the report and sets the exit code, so a cron job or a health check can
run it.
"""

from __future__ import annotations

import click

from dueq.cli.connection import RedisTarget, redis_options, require_queue
from dueq.cli.jsonout import emit, json_option, plain
from dueq.cli.output import console, safe
from dueq.discovery import open_queue

#: Exit code when problems were found and not fixed, or the queue's health is ``bad`` (0:
#: consistent, or everything found was fixed, and the health ``ok`` or ``warn``).
EXIT_PROBLEMS = 1


@click.command()
@click.argument("queue")
@click.option(
    "--fix",
    is_flag=True,
    help="Repair what is found (touches no task but a dependency cycle's: they end dead).",
)
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
    entries, the rate window's sum, dependency cycles) against its tasks; with --fix, repair
    it. No task is changed but a dependency cycle's (they end dead, as they can never run);
    tasks whose data is gone are reported only. Then judge its health as the dashboard does
    (due tasks with no live worker, the oldest due task's wait, recent dead letters). Prints
    one line per finding and the verdict (--json: one JSON object).

    Exit code: 0 when the derived state is consistent (or everything found was fixed) and the
    health is ok or warn; 1 when problems were found and not fixed, when the health is bad
    (the dashboard's red), or on an error.
    """
    conn = target.open()
    require_queue(conn, queue)
    report = open_queue(conn.client, queue).doctor(fix=fix, batch=batch)
    health = report.health
    assert health is not None  # Queue.doctor always judges it
    if as_json:
        emit(
            {
                **plain(report),
                "consistent": report.consistent,
                "healthy": report.healthy,
                "problems": len(report.problems),
            }
        )
    else:
        out = console()
        for finding in report.findings:
            where = f"[{safe(finding.queue)}] " if finding.queue != queue else ""
            out.print(where + safe(finding.line()))
        for note in report.notes:
            out.print(f"note: {safe(note)}")
        fixed = len(report.findings) - len(report.problems)
        state = (
            "derived state consistent"
            if report.consistent
            else f"{len(report.findings)} finding(s), {fixed} fixed, {len(report.problems)} not"
        )
        verdict = f"health {health.level}" + (f": {health.reason}" if health.reasons else "")
        summary = "healthy" if report.healthy else f"{state}; {verdict}"
        out.print(f"queue {safe(repr(queue))}: {safe(summary)}")
    if report.problems or health.level == "bad":
        click.get_current_context().exit(EXIT_PROBLEMS)
