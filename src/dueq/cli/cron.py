"""``dueq cron``: add, list, remove, pause, resume and run now the recurring tasks of a queue.

Thin commands over ``Queue.cron``: the library validates, and its errors become one line.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import click

from dueq import discovery
from dueq.cli.connection import RedisTarget, open_queue, redis_options
from dueq.cli.errors import CliError
from dueq.cli.jsonout import emit, iso, json_option
from dueq.cli.output import console, safe, seconds, titled_table, when
from dueq.cli.task_input import parse_json
from dueq.cron.flows import DEFAULT_MAX_MISSED, MAX_MISSED_LIMIT, CronDefinition, MissedPolicy
from dueq.exceptions import CronConflict

PAYLOAD_WIDTH = 40


def _payload(_ctx: click.Context, _param: click.Parameter, value: str) -> Any:
    try:
        return parse_json(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _short(payload: Any) -> str:
    shown = safe(json.dumps(payload, ensure_ascii=False, separators=(",", ":")))
    return shown if len(shown) <= PAYLOAD_WIDTH else shown[: PAYLOAD_WIDTH - 1] + "…"


def _outcome(d: CronDefinition, now: datetime) -> str:
    """The last firing's outcome for the table: ``acked 3 min ago``, ``dead: KeyError 4.0 s
    ago``, ``-`` before any."""
    if d.last_outcome is None or d.last_outcome_at is None:
        return "-"
    error = f": {safe(d.last_error_type)}" if d.last_error_type else ""
    ago = max(0.0, (now - d.last_outcome_at).total_seconds())
    return f"{d.last_outcome}{error} {seconds(ago)} ago"


@click.group()
def cron() -> None:
    """Recurring tasks, kept in Redis; every worker of the queue keeps them going."""


def _instant(_ctx: click.Context, _param: click.Parameter, value: str | None) -> datetime | None:
    """An ISO 8601 time with its offset (``2026-05-01T03:00:00+02:00``), or None."""
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not an ISO 8601 time") from None
    if parsed.tzinfo is None:
        raise click.BadParameter(f"{value!r} has no time zone offset (add Z or +02:00)")
    return parsed


def _span(d: Any) -> str:
    return "-" if d is None else seconds(d.total_seconds())


def _policies(d: CronDefinition) -> str:
    """The policies of a definition, shortest first, for the table (``-`` for none)."""
    parts = []
    if d.overlap != "allow_all":
        parts.append(f"overlap {d.overlap}")
    if d.start or d.end:
        parts.append(f"window {iso(d.start) or '…'} to {iso(d.end) or '…'}")
    if d.limit is not None:
        parts.append(f"limit {d.fired}/{d.limit}")
    if d.jitter is not None:
        parts.append(f"jitter {_span(d.jitter)}")
    if d.catchup_window is not None:
        parts.append(f"catch-up {_span(d.catchup_window)}")
    if d.expires is not None:
        parts.append(f"expires {_span(d.expires)}")
    if d.pause_after_failures is not None:
        parts.append(f"failures {d.failures}/{d.pause_after_failures}")
    if d.skipped:
        parts.append(f"skipped {d.skipped}")
    if d.task is not None:
        parts.append(f"task {safe(d.task)}")
    return ", ".join(parts) or "-"


def _next(d: CronDefinition, now: datetime) -> str:
    if d.paused:
        return "paused" if d.paused_reason in (None, "paused") else f"paused ({d.paused_reason})"
    if d.finished:
        return f"finished ({d.finished})"
    return when(d.next_at, now)


@cron.command("add")
@click.argument("queue")
@click.argument("name")
@click.argument("expr", required=False)
@click.option(
    "--every",
    type=click.FloatRange(min=1),
    metavar="SECONDS",
    help="Fire every SECONDS (whole) since the Unix epoch instead of EXPR.",
)
@click.option(
    "--offset",
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    help="With --every: slots at the multiples plus SECONDS.",
)
@click.option(
    "--overlap",
    type=click.Choice(["allow_all", "skip", "buffer_one", "cancel_other"]),
    default="allow_all",
    show_default=True,
    help="What a slot does while the previous occurrence still runs or retries.",
)
@click.option("--start", callback=_instant, metavar="ISO", help="No slot before this time.")
@click.option("--end", callback=_instant, metavar="ISO", help="No slot after this time.")
@click.option("--limit", type=click.IntRange(min=1), help="Fire this many times, then finish.")
@click.option(
    "--jitter",
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    help="Delay each slot by a fixed per-slot offset below SECONDS.",
)
@click.option(
    "--catchup-window",
    type=click.FloatRange(min=1),
    metavar="SECONDS",
    help="Missed slots older than SECONDS never run.",
)
@click.option(
    "--pause-after-failures",
    type=click.IntRange(min=1),
    metavar="N",
    help="Pause after N consecutive dead occurrences.",
)
@click.option("--task", "task_name", metavar="NAME", help="Occurrences call this named task.")
@click.option("--priority", type=click.IntRange(0, 9), default=0, show_default=True)
@click.option("--key", metavar="KEY", help="The occurrences' limit key.")
@click.option(
    "--timeout", type=click.FloatRange(min=0.001), metavar="SECONDS", help="Each attempt's timeout."
)
@click.option("--max-attempts", type=click.IntRange(min=1), help="Attempts per occurrence.")
@click.option(
    "--expires",
    type=click.FloatRange(min=0.001),
    metavar="SECONDS",
    help="Each occurrence not started SECONDS after its slot ends expired.",
)
@click.option(
    "--payload",
    default="null",
    metavar="JSON",
    callback=_payload,
    help="Each occurrence's payload.",
)
@click.option("--tz", default="UTC", show_default=True, help="IANA time zone of EXPR.")
@click.option(
    "--missed",
    type=click.Choice(["skip", "latest", "all"]),
    default="latest",
    show_default=True,
    help="What runs of slots missed while no worker claimed.",
)
@click.option(
    "--max-missed",
    type=click.IntRange(1, MAX_MISSED_LIMIT),
    default=DEFAULT_MAX_MISSED,
    show_default=True,
    help="Most missed slots --missed all runs.",
)
@click.option("--replace", is_flag=True, help="Replace a different definition of NAME.")
@redis_options
def add_cron(
    queue: str,
    name: str,
    expr: str,
    payload: Any,
    tz: str,
    missed: MissedPolicy,
    max_missed: int,
    replace: bool,
    target: RedisTarget,
    **policies: Any,
) -> None:
    """Define NAME in QUEUE to run at EXPR (or --every), and schedule its next occurrence.

    EXPR is 5-field cron, 6 fields with seconds first, or @hourly, @daily, @weekly, @monthly,
    @yearly; quote it:

    \b
        dueq cron add reports nightly "30 2 * * *" --tz Europe/Berlin

    \b
        dueq cron add jobs poll --every 300 --offset 10 --overlap skip

    Adding the same definition again changes nothing; a different one needs --replace.
    The policies are described in docs/cron-policies.md.
    """
    q = discovery.open_queue(target.open().client, queue)
    policies["task"] = policies.pop("task_name")
    try:
        result = q.cron.add(
            name,
            expr,
            payload=payload,
            tz=tz,
            missed=missed,
            max_missed=max_missed,
            replace=replace,
            **policies,
        )
    except CronConflict:
        raise CliError(
            f"cron {name!r} is already defined differently in queue {queue!r}; "
            "add it with --replace to replace it"
        ) from None
    definition = q.cron.get(name)
    next_at = when(definition.next_at if definition else None, datetime.now(timezone.utc))
    click.echo(f"{result} cron {name!r} in {queue!r}; next occurrence {next_at}")


def _cli_words(problem: str) -> str:
    """A library message as the command line says it: ``replace=True`` is ``--replace``."""
    return problem.replace("replace=True", "--replace")


@cron.command("list")
@click.argument("queue")
@json_option
@redis_options
def list_cron(queue: str, as_json: bool, target: RedisTarget) -> None:
    """List the cron definitions of QUEUE, with next and last fired slots.

    A paused definition shows "paused" as its next slot (with the reason when
    --pause-after-failures paused it), a finished one "finished (limit)" or "finished (end)".
    "last outcome" is what became of its last firing: acked, retrying, dead (with the error
    type) or cancelled, and how long ago. "policies" shows overlap, window, limit (fired/limit),
    jitter, catch-up window, expiry of each occurrence after its slot, failures (consecutive
    dead/pause after) and skipped slots.

    Definitions whose data in Redis cannot be read are listed too, each problem below.
    --json prints {"queue", "definitions": [...]}, each with every field ("problem" null
    when healthy; "last_outcome", "last_outcome_at", "last_occurrence", "last_error_type" and
    "last_success_at" null before an outcome).
    """
    definitions = open_queue(target, queue).cron.list()
    if as_json:
        emit({"queue": queue, "definitions": definitions})
        return
    out = console()
    if not definitions:
        out.print(f"no cron definitions in {queue!r}")
        return
    now = datetime.now(timezone.utc)
    columns = (
        "name",
        "expr",
        "tz",
        "missed",
        "next",
        "last fired",
        "last outcome",
        "policies",
        "payload",
    )
    table = titled_table(f"cron definitions of {queue!r}", columns)
    for d in definitions:
        missed = f"all (max {d.max_missed})" if d.missed == "all" else d.missed
        expr = d.expr
        if d.every is not None:
            expr = f"every {_span(d.every)}" + (f" +{_span(d.offset)}" if d.offset else "")
        table.add_row(
            safe(d.name),
            safe(expr),
            safe(d.tz),
            missed,
            _next(d, now),
            when(d.last_fired_at, now),
            _outcome(d, now),
            _policies(d),
            _short(d.payload),
        )
    out.print(table)
    for d in definitions:
        if d.problem is not None:
            problem = _cli_words(d.problem)
            out.print(
                f"cron {safe(repr(d.name))} cannot be kept going: {safe(problem)}", style="red"
            )


@cron.command("backfill")
@click.argument("queue")
@click.argument("name")
@click.option("--start", callback=_instant, required=True, metavar="ISO", help="First instant.")
@click.option("--end", callback=_instant, required=True, metavar="ISO", help="End (excluded).")
@redis_options
def backfill_cron(
    queue: str, name: str, start: datetime, end: datetime, target: RedisTarget
) -> None:
    """Schedule NAME's slots in [--start, --end) of QUEUE, due now; prints how many.

    Running it again adds nothing: a slot backfilled once is never backfilled again. At most
    1000 slots per call.
    """
    added = open_queue(target, queue).cron.backfill(name, start=start, end=end)
    click.echo(f"backfilled {added} occurrence(s) of cron {name!r} in {queue!r}")


@cron.command("remove")
@click.argument("queue")
@click.argument("names", metavar="NAME...", nargs=-1, required=True)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@redis_options
def remove_cron(queue: str, names: tuple[str, ...], yes: bool, target: RedisTarget) -> None:
    """Delete cron definitions of QUEUE and their pending occurrences.

    An occurrence already running or waiting for a retry still finishes.
    """
    q = open_queue(target, queue)
    defined = {d.name for d in q.cron.list()}
    unknown = [n for n in names if n not in defined]
    if unknown:
        raise CliError(f"no cron definition in {queue!r} named {', '.join(map(repr, unknown))}")
    if not yes:
        click.confirm(
            f"Remove {len(names)} cron definition(s) from {queue!r}?", abort=True, err=True
        )
    removed = sum(q.cron.remove(n) for n in dict.fromkeys(names))
    click.echo(f"removed {removed} cron definition(s) from {queue!r}")


@cron.command("pause")
@click.argument("queue")
@click.argument("name")
@redis_options
def pause_cron(queue: str, name: str, target: RedisTarget) -> None:
    """Stop scheduling the occurrences of NAME in QUEUE, in every worker.

    Its pending occurrence is withdrawn; one already running finishes. Adding the same
    definition again keeps it paused; dueq cron resume undoes it.
    """
    if open_queue(target, queue).cron.pause(name):
        click.echo(f"paused cron {name!r} in {queue!r}")
    else:
        click.echo(f"cron {name!r} in {queue!r} was already paused")


@cron.command("resume")
@click.argument("queue")
@click.argument("name")
@redis_options
def resume_cron(queue: str, name: str, target: RedisTarget) -> None:
    """Schedule NAME in QUEUE again from its next slot after now.

    Slots that fell into the pause are not run.
    """
    q = open_queue(target, queue)
    if not q.cron.resume(name):
        click.echo(f"cron {name!r} in {queue!r} was not paused")
        return
    definition = q.cron.get(name)
    next_at = when(definition.next_at if definition else None, datetime.now(timezone.utc))
    click.echo(f"resumed cron {name!r} in {queue!r}; next occurrence {next_at}")


@cron.command("run-now")
@click.argument("queue")
@click.argument("name")
@redis_options
def run_now_cron(queue: str, name: str, target: RedisTarget) -> None:
    """Schedule one extra occurrence of NAME in QUEUE, due now, and print its task id.

    It carries the definition's payload and does not move the schedule; it runs also while
    NAME is paused.
    """
    task_id = open_queue(target, queue).cron.run_now(name)
    click.echo(f"scheduled {safe(task_id)} in {queue!r}, due now")
