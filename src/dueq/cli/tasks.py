"""``dueq list``, ``show``, ``cancel``, ``reschedule`` and ``run-now``: see and steer tasks in any
state.

The commands are thin: filtering, paging and validation are the library's (``Queue.list_tasks``
pages with a cursor and looks at a bounded number of tasks per call, ``Queue.get``,
``cancel``, ``reschedule``, ``run_now``). ``--json`` prints one JSON document,
``{"queue", "tasks": [...]}`` (each task in its one form, ``TaskInfo.to_json``; a listing adds
``next_cursor``), for scripts, instead of a table.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, cast

import click
from rich.table import Table

from dueq._util.clock import ms_datetime
from dueq.cli.connection import RedisTarget, open_queue, redis_options
from dueq.cli.errors import CliError
from dueq.cli.jsonout import emit, json_option
from dueq.cli.options import TakesIds, decrypt_option
from dueq.cli.output import console, safe, safe_lines, titled_table, when
from dueq.cli.task_input import time_option
from dueq.model import ErrorRecord, StepInfo, TaskInfo, TaskState, iso_ms
from dueq.queue import Queue

ERROR_WIDTH = 60
PAYLOAD_WIDTH = 40


def task_json(info: TaskInfo, queue: str) -> dict[str, Any]:
    """One task as JSON: its one form, ``TaskInfo.to_json`` (docs/json.md)."""
    return info.to_json(queue)


def tasks_document(queue: str, infos: list[TaskInfo], **more: Any) -> dict[str, Any]:
    """What ``show``/``dead show`` (and, with ``next_cursor``, ``list``/``dead list``) print
    with --json: ``{"queue", "tasks": [...], ...}``."""
    return {"queue": queue, "tasks": [task_json(i, queue) for i in infos], **more}


def page_of(
    q: Queue, state: TaskState, limit: int, cursor: str | None, **filters: Any
) -> tuple[list[TaskInfo], str | None]:
    """Up to ``limit`` tasks in ``state`` from ``cursor`` on (``Queue.list_tasks``'s order),
    and the cursor after the last of them (None: nothing more)."""
    infos: list[TaskInfo] = []
    while True:
        page = q.list_tasks(state, limit=min(limit - len(infos), 1000), cursor=cursor, **filters)
        infos += page.tasks
        cursor = page.cursor
        if cursor is None or len(infos) >= limit:
            return infos, cursor


def cursor_option(command: Any) -> Any:
    """Add ``--cursor`` (the command receives ``cursor``): a --json listing's next_cursor."""
    return click.option(
        "--cursor", metavar="CURSOR", help="Go on from a --json listing's next_cursor."
    )(command)


def _short(text: str, width: int) -> str:
    line = safe((text.splitlines() or [""])[0])
    return line if len(line) <= width else line[: width - 1] + "…"


def _last_error(info: TaskInfo) -> str:
    if not info.errors:
        return "-"
    e = info.errors[-1]
    return _short(f"{e.type}: {e.message}", ERROR_WIDTH)


def _result_text(info: TaskInfo, width: int = PAYLOAD_WIDTH) -> str:
    """A kept result on one line: its JSON, or why it was not kept ("-": none)."""
    if info.result_unstored is not None:
        return _short(f"(not kept: {info.result_unstored})", width)
    if info.result is None:
        return "-"
    return _short(json.dumps(info.result, ensure_ascii=False), width)


def task_table(title: str, state: TaskState, infos: list[TaskInfo]) -> Table:
    """The table of tasks in one ``state`` (``list --state STATE``; ``dead list`` too)."""
    now = datetime.now(timezone.utc)
    if state == "scheduled":
        columns: tuple[str, ...] = ("id", "due", "priority", "attempt", "payload")
    elif state == "leased":
        columns = ("id", "holder", "lease ends", "attempt", "payload")
    elif state in ("done", "cancelled", "expired"):
        columns = ("id", "finished", "attempt", "result")
    else:
        columns = ("id", "died", "attempt", "last error")
    table = titled_table(title, columns, right={"attempt"})
    for info in infos:
        payload = _short(json.dumps(info.payload, ensure_ascii=False), PAYLOAD_WIDTH)
        row: tuple[str, ...]
        if state == "scheduled":
            row = (when(info.due_at, now), str(info.priority), str(info.attempt), payload)
        elif state == "leased":
            row = (safe(info.holder or "-"), when(info.lease_deadline, now), str(info.attempt))
            row += (payload,)
        elif state in ("done", "cancelled", "expired"):
            row = (when(info.finished_at, now), str(info.attempt), _result_text(info))
        else:
            row = (when(info.died_at, now), str(info.attempt), _last_error(info))
        table.add_row(safe(info.id), *row)
    return table


@click.command("list")
@click.argument("queue")
@click.option(
    "--state",
    type=click.Choice(["scheduled", "leased", "dead", "done", "cancelled", "expired", "waiting"]),
    default="scheduled",
    show_default=True,
    help="Which tasks (done and cancelled: kept while the queue keeps results, "
    "dueq configure --keep-results).",
)
@click.option(
    "--limit", type=click.IntRange(1), default=50, show_default=True, help="Most tasks shown."
)
@click.option("--grep", metavar="TEXT", help="Only tasks whose payload JSON contains TEXT.")
@click.option("--error-type", metavar="NAME", help="Only tasks whose last error is NAME.")
@click.option("--id-prefix", metavar="PREFIX", help="Only tasks whose id starts with PREFIX.")
@click.option(
    "--after",
    metavar="ISO",
    callback=time_option,
    help="Only tasks due (leased: whose lease ends; dead: that died) at or after this time.",
)
@click.option("--before", metavar="ISO", callback=time_option, help="... at or before this time.")
@cursor_option
@decrypt_option
@json_option
@redis_options
def list_tasks(
    queue: str,
    state: str,
    limit: int,
    grep: str | None,
    error_type: str | None,
    id_prefix: str | None,
    after: datetime | None,
    before: datetime | None,
    cursor: str | None,
    decrypt: bool,
    as_json: bool,
    target: RedisTarget,
) -> None:
    """List tasks of QUEUE in one state, page by page: scheduled ones by priority then due
    time (then parked ones), leased ones by lease deadline with their holder, dead ones by
    when they died, newest first (as dueq dead list); done and cancelled ones (kept with
    their results while the queue keeps results) by when they finished, newest first.

    --json prints {"queue", "tasks": [...], "next_cursor"} (docs/json.md); pass next_cursor
    as --cursor for the next page. Encrypted payloads show as <encrypted KEY, N B> unless
    --decrypt.
    """
    q = open_queue(target, queue, decrypt=decrypt)
    infos, next_cursor = page_of(
        q,
        cast(TaskState, state),
        limit,
        cursor,
        grep=grep,
        error_type=error_type,
        id_prefix=id_prefix,
        after=after,
        before=before,
    )
    more = next_cursor is not None
    if as_json:
        emit(tasks_document(queue, infos, next_cursor=next_cursor))
        return
    out = console()
    if not infos:
        out.print(f"no {state} tasks in {queue!r}")
        return
    out.print(task_table(f"{state} tasks of {queue!r}", cast(TaskState, state), infos))
    if more:
        out.print(f"showing the first {limit}; --limit shows more")


@click.command("show", cls=TakesIds)
@click.argument("queue")
@click.argument("ids", metavar="ID...", nargs=-1, required=True)
@decrypt_option
@json_option
@redis_options
def show(
    queue: str, ids: tuple[str, ...], decrypt: bool, as_json: bool, target: RedisTarget
) -> None:
    """Show tasks of QUEUE in any state: payload, times, options, holder and every error
    with its time, worker and traceback (all that dueq dead show shows). Encrypted payloads
    show as <encrypted KEY, N B> unless --decrypt.

    --json prints {"queue", "tasks": [...]} (docs/json.md).
    """
    q = open_queue(target, queue, decrypt=decrypt)
    found = {i: q.get(i) for i in dict.fromkeys(ids)}
    missing = [i for i, info in found.items() if info is None]
    infos = [info for info in found.values() if info is not None]
    if as_json:
        emit(tasks_document(queue, infos))
    else:
        print_tasks(infos)
    if missing:
        raise CliError(f"no task in {queue!r} with id {', '.join(safe(i) for i in missing)}")


def error_lines(e: ErrorRecord) -> list[str]:
    """One failed attempt for people: when, on which worker, the error, its traceback."""
    at = f" at {e.at:%Y-%m-%d %H:%M:%S.%f}"[:-3] + "Z" if e.at else ""
    at += f" on {safe(e.worker)}" if e.worker else ""
    message, *more = safe_lines(f"{e.type}: {e.message}") or [""]
    lines = [f"  attempt {e.attempt}{at}: {message}", *("    " + line for line in more)]
    if e.traceback:
        lines += ["    " + line for line in safe_lines(e.traceback.rstrip())]
    return lines


def print_tasks(infos: list[TaskInfo]) -> None:
    """Every field of each task for people (``show`` and ``dead show``): state and attempt,
    its times, options, payload, and every error with its time, worker and traceback."""
    out = console()
    now = datetime.now(timezone.utc)
    for info in infos:
        out.print(f"id: {safe(info.id)}    state: {info.state}    attempt: {info.attempt}")
        if info.state in ("scheduled", "waiting"):  # waiting: for its parents, or a signal
            out.print(f"due: {when(info.due_at, now)}")
        elif info.state == "leased":
            out.print(f"held by: {safe(info.holder or '-')}")
            out.print(f"lease ends: {when(info.lease_deadline, now)}")
        elif info.state in ("done", "cancelled", "expired"):
            out.print(f"finished: {when(info.finished_at, now)}")
        else:
            out.print(f"died: {when(info.died_at, now)}")
        if info.first_claimed_at is not None:
            out.print(f"first claimed: {when(info.first_claimed_at, now)}")
        if info.expires_at is not None:
            out.print(f"expires: {when(info.expires_at, now)}")
        options = [f"priority {info.priority}"]
        if info.key is not None:
            options.append(f"key {safe(info.key)}")
        if info.max_attempts is not None:
            options.append(f"max attempts {info.max_attempts}")
        if info.timeout is not None:
            options.append(f"timeout {info.timeout.total_seconds():g} s")
        out.print("options: " + ", ".join(options))
        out.print("payload:")
        payload = json.dumps(info.payload, indent=2, ensure_ascii=False)
        out.print("\n".join(safe_lines(payload)), soft_wrap=True)
        if info.state == "done":
            if info.result_unstored is not None:
                out.print(f"result: not kept ({safe(info.result_unstored)})")
            else:
                out.print("result:")
                result = json.dumps(info.result, indent=2, ensure_ascii=False)
                out.print("\n".join(safe_lines(result)), soft_wrap=True)
        out.print(f"errors ({len(info.errors)}):")
        for e in info.errors:
            out.print("\n".join(error_lines(e)), soft_wrap=True)
        if info.steps:
            out.print(f"steps ({len(info.steps)}):")
            out.print("\n".join(step_lines(info.steps, now)), soft_wrap=True)
        out.print()


def _step_outcome(step: StepInfo, now: datetime) -> str:
    """What a step came to, on one line: its error, a sleep's wake time, a wait that timed
    out, or its result's JSON, shortened as payloads are ("-": none yet)."""
    if step.error is not None:
        return _short(step.error, ERROR_WIDTH)
    if step.timed_out:
        return "timed out"
    if step.result is None:
        return "-"
    if step.kind == "sleep" and isinstance(step.result, int):  # the wake time, epoch ms
        return f"until {when(ms_datetime(step.result), now)}"
    return _short(json.dumps(step.result, ensure_ascii=False), PAYLOAD_WIDTH)


def _step_time(step: StepInfo, now: datetime) -> str:
    if step.state != "waiting":
        return f"ended {when(step.ended_at, now)}"
    return "no deadline" if step.deadline is None else f"deadline {when(step.deadline, now)}"


def step_lines(steps: tuple[StepInfo, ...], now: datetime) -> list[str]:
    """A durable task's steps for people, one line each in a column of their own: position,
    kind, name, state, runs, when it ended (a waiting one: its deadline), its outcome."""
    rows = [
        (
            str(s.position),
            s.kind,
            safe(s.name),
            s.state,
            f"{s.runs} run{'' if s.runs == 1 else 's'}",
            _step_time(s, now),
            _step_outcome(s, now),
        )
        for s in steps
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(6)]
    return [
        "  " + "  ".join(row[i].ljust(widths[i]) for i in range(6)) + "  " + row[6] for row in rows
    ]


@click.command("cancel", cls=TakesIds)
@click.argument("queue")
@click.argument("ids", metavar="ID...", nargs=-1, required=True)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@redis_options
def cancel(queue: str, ids: tuple[str, ...], yes: bool, target: RedisTarget) -> None:
    """Remove tasks of QUEUE in any state (a leased one's lease is revoked: its worker's ack
    or failure is refused)."""
    q = open_queue(target, queue)
    wanted = list(dict.fromkeys(ids))
    if not yes:
        click.confirm(f"Cancel {len(wanted)} task(s) of {queue!r}?", abort=True, err=True)
    cancelled = [i for i in wanted if q.cancel(i)]
    missing = [i for i in wanted if i not in cancelled]
    click.echo(f"cancelled {len(cancelled)} task(s) of {queue!r}")
    if missing:
        raise CliError(f"no task in {queue!r} with id {', '.join(safe(i) for i in missing)}")


@click.command("reschedule", cls=TakesIds)
@click.argument("queue")
@click.argument("task_id", metavar="ID")
@click.option("--at", metavar="ISO", callback=time_option, help="New due time, ISO-8601.")
@click.option("--delay", type=float, metavar="SECONDS", help="Due this many seconds from now.")
@redis_options
def reschedule(
    queue: str, task_id: str, at: datetime | None, delay: float | None, target: RedisTarget
) -> None:
    """Move a scheduled task of QUEUE to a new due time (--at or --delay)."""
    if (at is None) == (delay is None):
        raise click.UsageError("give --at or --delay")
    q = open_queue(target, queue)
    if not q.reschedule(task_id, at=at, delay=delay):
        info = q.get(task_id)
        state = "no such task" if info is None else f"it is {info.state}"
        raise CliError(f"task {safe(task_id)!s} of {queue!r} is not scheduled ({state})")
    info = q.get(task_id)
    click.echo(f"rescheduled {safe(task_id)}: due {iso_ms(info.due_at if info else None)}")


@click.command("run-now", cls=TakesIds)
@click.argument("queue")
@click.argument("ids", metavar="ID...", nargs=-1, required=True)
@redis_options
def run_now(queue: str, ids: tuple[str, ...], target: RedisTarget) -> None:
    """Make tasks of QUEUE due now: scheduled ones move to now, dead ones are replayed
    (attempts and errors reset). A leased task is running already and is left alone."""
    q = open_queue(target, queue)
    refused = [i for i in dict.fromkeys(ids) if not q.run_now(i)]
    done = len(dict.fromkeys(ids)) - len(refused)
    click.echo(f"{done} task(s) of {queue!r} due now")
    if refused:
        raise CliError(
            f"not run now (leased, or no such task): {', '.join(safe(i) for i in refused)}"
        )
