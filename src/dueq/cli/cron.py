"""``dueq cron``: add, list, remove, pause, resume and run now the recurring tasks of a queue.

Thin commands over ``Queue.cron``: the library validates, and its errors become one line.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import click

from .. import discovery
from ..cron import DEFAULT_MAX_MISSED, MAX_MISSED_LIMIT, CronDefinition, MissedPolicy
from ..exceptions import CronConflict
from .connection import RedisTarget, open_queue, redis_options
from .errors import CliError
from .jsonout import emit, json_option
from .output import console, safe, seconds, titled_table, when
from .task_input import parse_json

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


@cron.command("add")
@click.argument("queue")
@click.argument("name")
@click.argument("expr")
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
) -> None:
    """Define NAME in QUEUE to run at EXPR, and schedule its next occurrence.

    EXPR is 5-field cron, 6 fields with seconds first, or @hourly, @daily, @weekly, @monthly,
    @yearly; quote it:

    \b
        dueq cron add reports nightly "30 2 * * *" --tz Europe/Berlin

    Adding the same definition again changes nothing; a different one needs --replace.
    """
    q = discovery.open_queue(target.open().client, queue)
    try:
        result = q.cron.add(
            name,
            expr,
            payload=payload,
            tz=tz,
            missed=missed,
            max_missed=max_missed,
            replace=replace,
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

    A paused definition shows "paused" as its next slot. "last outcome" is what became of its
    last firing: acked, retrying or dead (with the error type), and how long ago.

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
    columns = ("name", "expr", "tz", "missed", "next", "last fired", "last outcome", "payload")
    table = titled_table(f"cron definitions of {queue!r}", columns)
    for d in definitions:
        missed = f"all (max {d.max_missed})" if d.missed == "all" else d.missed
        table.add_row(
            safe(d.name),
            safe(d.expr),
            safe(d.tz),
            missed,
            "paused" if d.paused else when(d.next_at, now),
            when(d.last_fired_at, now),
            _outcome(d, now),
            _short(d.payload),
        )
    out.print(table)
    for d in definitions:
        if d.problem is not None:
            problem = _cli_words(d.problem)
            out.print(
                f"cron {safe(repr(d.name))} cannot be kept going: {safe(problem)}", style="red"
            )


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
