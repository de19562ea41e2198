"""``dueq dead``: list, show, replay and purge the dead-letter queue of a queue."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import click

from dueq.cli.connection import RedisTarget, open_queue, redis_options
from dueq.cli.errors import CliError
from dueq.cli.jsonout import emit, json_option
from dueq.cli.options import TakesIds, decrypt_option
from dueq.cli.output import console, steps
from dueq.cli.tasks import cursor_option, page_of, print_tasks, task_table, tasks_document
from dueq.exceptions import TaskNotFound
from dueq.model import TaskInfo
from dueq.queue import Queue

#: Dead tasks moved per script call by ``replay --all`` / ``purge --all``.
BATCH = 1000
ERROR_WIDTH = 80
PAST = {"replay": "replayed", "purge": "purged"}


def _dead_tasks(q: Queue, ids: Iterable[str]) -> list[TaskInfo]:
    """The dead tasks with these ids; CliError naming those that are not dead."""
    found = {i: q.get(i) for i in ids}
    dead = [info for info in found.values() if info is not None and info.state == "dead"]
    missing = [i for i, info in found.items() if info is None or info.state != "dead"]
    if missing:
        raise CliError(f"not in the dead-letter queue of {q.name!r}: {', '.join(missing)}")
    return dead


@click.group()
def dead() -> None:
    """Inspect, replay and purge tasks that ran out of attempts."""


@dead.command("list")
@click.argument("queue")
@click.option(
    "--limit", type=click.IntRange(1), default=50, show_default=True, help="Most tasks shown."
)
@cursor_option
@decrypt_option
@json_option
@redis_options
def list_dead(
    queue: str, limit: int, cursor: str | None, decrypt: bool, as_json: bool, target: RedisTarget
) -> None:
    """List the dead tasks of QUEUE, newest first, as dueq list --state dead does.

    --json prints {"queue", "total", "tasks": [...], "next_cursor"}, each task in its one
    JSON form (docs/json.md), e.g. for jq to pick ids by error type; pass next_cursor as
    --cursor for the next page. Encrypted payloads show as <encrypted KEY, N B> unless
    --decrypt.
    """
    q = open_queue(target, queue, decrypt=decrypt)
    infos, next_cursor = page_of(q, "dead", limit, cursor)
    total = q.dead.count()
    if as_json:
        emit(tasks_document(queue, infos, total=total, next_cursor=next_cursor))
        return
    out = console()
    if not infos:
        out.print(f"no dead tasks in {queue!r}")
        return
    out.print(task_table(f"dead tasks of {queue!r}: {total}", "dead", infos))
    if next_cursor is not None:
        out.print(f"showing {len(infos)} of {total}; --limit shows more")


def ids_arguments(command: Callable[..., Any]) -> Callable[..., Any]:
    """Task ids as arguments (``ID...``) and as ``--id ID`` (repeatable), either or both; the
    command receives them all, in order, as ``ids``."""

    @functools.wraps(command)
    def wrapper(*args: Any, ids: tuple[str, ...], id_options: tuple[str, ...], **kw: Any) -> Any:
        return command(*args, ids=(*ids, *id_options), **kw)

    wrapper = click.option(
        "--id", "id_options", multiple=True, metavar="ID", help="A task id (repeatable)."
    )(wrapper)
    return click.argument("ids", metavar="[ID]...", nargs=-1)(wrapper)


@dead.command("show", cls=TakesIds)
@click.argument("queue")
@ids_arguments
@decrypt_option
@json_option
@redis_options
def show_dead(
    queue: str, ids: tuple[str, ...], decrypt: bool, as_json: bool, target: RedisTarget
) -> None:
    """Show dead tasks of QUEUE: payload and every attempt's error with its traceback (as
    dueq show, which shows a task in any state). Encrypted payloads show as
    <encrypted KEY, N B> unless --decrypt.

    Ids come as arguments or --id (or both). --json prints {"queue", "tasks": [...]}
    (docs/json.md).
    """
    if not ids:
        raise click.UsageError("give the id of one or more dead tasks")
    q = open_queue(target, queue, decrypt=decrypt)
    infos = _dead_tasks(q, ids)
    if as_json:
        emit(tasks_document(queue, infos))
        return
    print_tasks(infos)


def _move_all(q: Queue, move: Callable[[list[str]], int], total: int, label: str) -> int:
    """Move the ``total`` oldest dead tasks in batches, with a progress bar; the count moved.

    Oldest first, so a task that dies again meanwhile is not moved twice by this command.
    """
    moved = 0
    with steps(console(), total, label) as progress:
        while moved < total:
            dead_now = q.dead.count()
            size = min(BATCH, total - moved, dead_now)
            ids = [info.id for info in q.dead.list(limit=size, offset=dead_now - size)]
            if not ids:
                break
            try:
                count = move(ids)
            except TaskNotFound:  # someone else moved some of these meanwhile: list again
                continue
            moved += count
            progress.advance(count)
    return moved


def _from_start_option(offered: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--from-start`` (the command receives ``from_start``) when ``offered``; else nothing."""
    if not offered:
        return lambda command: command
    return click.option(
        "--from-start",
        is_flag=True,
        help="Durable tasks run from their first step again: their steps and signals are "
        "dropped first (docs/durable.md).",
    )


def _move_command(action: str, doc: str, question: str, restart: str = "") -> click.Command:
    """``dead replay`` or ``dead purge``: ids (as arguments or --id), --error-type NAME or
    --all, confirmed unless --yes. With ``restart`` (the question then) the command has
    ``--from-start``: ``q.dead.replay(..., from_start=True)``."""

    @click.command(action, help=doc, cls=TakesIds)
    @click.argument("queue")
    @ids_arguments
    @click.option("--all", "everything", is_flag=True, help="Every task dead now.")
    @click.option("--error-type", metavar="NAME", help="The dead tasks whose last error is NAME.")
    @click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
    @_from_start_option(bool(restart))
    @redis_options
    def command(
        queue: str,
        ids: tuple[str, ...],
        everything: bool,
        error_type: str | None,
        yes: bool,
        target: RedisTarget,
        from_start: bool = False,
    ) -> None:
        if bool(ids) + everything + (error_type is not None) != 1:
            raise click.UsageError("give the ids (ID... or --id ID), --error-type NAME or --all")
        q = open_queue(target, queue)
        ask = restart if from_start else question
        options = {"from_start": True} if from_start else {}
        if error_type is not None:
            if not yes:
                click.confirm(ask.format(n=f"the {error_type}", queue=queue), abort=True, err=True)
            moved = getattr(q.dead, action)(error_type=error_type, **options)
            click.echo(f"{PAST[action]} {moved} dead task(s) of {queue!r}")
            return
        move: Callable[[Iterable[str]], int] = functools.partial(getattr(q.dead, action), **options)
        _dead_tasks(q, ids)
        total = len(set(ids)) if ids else q.dead.count()
        if total == 0:
            click.echo(f"no dead tasks in {queue!r}")
            return
        if not yes:
            click.confirm(ask.format(n=total, queue=queue), abort=True, err=True)
        if ids:
            moved = move(list(dict.fromkeys(ids)))
        else:
            moved = _move_all(q, move, total, f"{action} {queue}")
        click.echo(f"{PAST[action]} {moved} dead task(s) of {queue!r}")

    return command


dead.add_command(
    _move_command(
        "replay",
        "Put dead tasks of QUEUE back in the queue, due now, with attempts and errors reset. "
        "A durable task goes on from its first unfinished step (from its first step with "
        "--from-start).",
        "Replay {n} dead task(s) of {queue!r}? They run again from attempt 1.",
        "Replay {n} dead task(s) of {queue!r} from their first step? They run again from "
        "attempt 1, and their durable steps run again.",
    )
)
dead.add_command(
    _move_command(
        "purge",
        "Delete dead tasks of QUEUE for good.",
        "Delete {n} dead task(s) of {queue!r} for good?",
    )
)
