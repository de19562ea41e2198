"""``dueq schedule``: one task from the command line, or many from a JSON Lines file.

The CLI does not have the functions of named tasks (``--task``, a line's ``"task"``), but the
live workers of the queue list theirs with their parameters in their heartbeats
(``dueq.registry``): a task's arguments are bound to those before anything is written, so a
missing argument or a typo'd keyword (named with the nearest parameter) is refused, as
``fn.schedule`` refuses it. Arguments that bind to any live worker's version pass (a rolling
deploy may run two). A name no live worker runs is scheduled unchecked, with a warning.
"""

from __future__ import annotations

import inspect
import itertools
import sys
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timezone
from typing import Any

import click
import redis

from dueq.cli.connection import RedisTarget, payload_settings, redis_options
from dueq.cli.errors import CliError
from dueq.cli.options import compression_option, replication_options, shards_option
from dueq.cli.output import console, safe, steps
from dueq.cli.task_input import (
    BadLine,
    Timing,
    checked_task,
    parse_json,
    tasks_from_lines,
    time_option,
)
from dueq.discovery import open_queue
from dueq.exceptions import InvalidArguments, ReplicationTimeout
from dueq.model import ScheduleResult, Task
from dueq.named import bind_problem, spec_signature
from dueq.queue import SCHEDULE_BATCH, Queue


def _line_source(path: str) -> Callable[[], Iterator[str]]:
    """A way to read the file's lines twice (check, then schedule); stdin is read once."""
    if path == "-":
        lines: list[str] = []

        def read_stdin() -> Iterator[str]:  # once, inside the caller's check of the text
            if not lines:
                lines.extend(sys.stdin.read().splitlines())
            return iter(lines)

        return read_stdin

    def read() -> Iterator[str]:
        with open(path, encoding="utf-8") as f:
            yield from f

    return read


class ArgumentCheck:
    """Binds named tasks' arguments to the functions the queue's live workers run (read once,
    at the first named task); ``unchecked`` collects the names no live worker runs."""

    def __init__(self, q: Queue) -> None:
        self._q = q
        self._signatures: dict[str, list[inspect.Signature]] | None = None
        self.unchecked: set[str] = set()

    def _known(self) -> dict[str, list[inspect.Signature]]:
        if self._signatures is None:
            found: dict[str, list[inspect.Signature]] = {}
            try:
                workers = self._q.workers()
            except redis.exceptions.NoPermissionError:  # a user who may not read the registry
                workers = []
            for w in workers:
                for name, spec in w.tasks.get(self._q.name, {}).items():
                    try:
                        found.setdefault(name, []).append(spec_signature(spec))
                    except ValueError:  # a list no signature fits (written by hand): unused
                        continue
            self._signatures = found
        return self._signatures

    def __call__(self, task: Task) -> None:
        """InvalidArguments unless ``task`` is plain or binds to a live worker's function."""
        if task.task is None:
            return
        signatures = self._known().get(task.task)
        if not signatures:
            self.unchecked.add(task.task)
            return
        problems = [bind_problem(signature, task.payload) for signature in signatures]
        if None not in problems:
            raise InvalidArguments(
                f"task {task.task!r}: {problems[0]} (as the live workers on "
                f"{self._q.name!r} run it)"
            )

    def warn(self) -> None:
        for name in sorted(self.unchecked):
            click.echo(
                f"warning: no live worker on {self._q.name!r} runs task {name!r}; its "
                "arguments were not checked",
                err=True,
            )


def _chunks(tasks: Iterable[Task]) -> Iterator[list[Task]]:
    it = iter(tasks)
    while chunk := list(itertools.islice(it, SCHEDULE_BATCH)):
        yield chunk


def _schedule_file(
    q: Queue,
    path: str,
    default: Timing,
    options: dict[str, Any],
    replace: bool,
    batch: str | None = None,
) -> ScheduleResult:
    name = "stdin" if path == "-" else path
    lines = _line_source(path)
    check = ArgumentCheck(q)
    try:
        total = sum(1 for _ in tasks_from_lines(lines(), default, options, check))
    except BadLine as exc:
        raise CliError(f"{name} {exc}; nothing was scheduled") from None
    except UnicodeDecodeError as exc:
        raise CliError(f"{name} is not UTF-8 text ({exc}); nothing was scheduled") from None
    check.warn()
    added = existing = replaced = 0
    with steps(console(), total, f"scheduling into {q.name}") as progress:
        for chunk in _chunks(tasks_from_lines(lines(), default, options)):
            try:
                result = q.schedule_many(chunk, replace=replace, batch=batch)
            except ReplicationTimeout as exc:
                raise CliError(
                    f"{exc}; the first {added + existing + len(chunk)} of {total} task(s) are "
                    "on the primary; scheduling the file again adds only the missing ones"
                ) from exc
            added, existing = added + result.added, existing + result.existing
            replaced += result.replaced
            progress.advance(len(chunk))
    return ScheduleResult(added, existing, replaced)


@click.command()
@click.argument("queue")
@click.argument("payload", metavar="[JSON]", required=False)
@click.option(
    "--at",
    metavar="ISO",
    callback=time_option,
    help="Due time, ISO-8601 with an offset, e.g. 2030-01-02T09:00:00Z.",
)
@click.option("--delay", type=float, metavar="SECONDS", help="Due this many seconds from now.")
@click.option("--id", "task_id", metavar="ID", help="Task id (default: a generated one).")
@click.option(
    "--file",
    "path",
    type=click.Path(exists=True, dir_okay=False, allow_dash=True),
    help="Schedule every task of a JSON Lines file ('-' for stdin).",
)
@click.option("--replace", is_flag=True, help="Overwrite tasks whose id already exists.")
@click.option(
    "--priority", type=int, metavar="0-9", help="Among due tasks the higher runs first (0)."
)
@click.option("--key", metavar="KEY", help="Limit key: the queue's key_rate/key_concurrency.")
@click.option("--timeout", type=float, metavar="SECONDS", help="Each attempt's time limit.")
@click.option("--max-attempts", type=int, metavar="N", help="Deliveries at most (this task).")
@click.option(
    "--task",
    "task_name",
    metavar="NAME",
    help="Run it by a named task (@q.task): the JSON is an object of the function's arguments.",
)
@click.option(
    "--expires", type=float, metavar="SECONDS", help="Never started later than this from now."
)
@click.option(
    "--debounce",
    type=float,
    metavar="SECONDS",
    help="With --id: a repeat within this moves the task to the repeat + SECONDS.",
)
@click.option(
    "--max-wait", type=float, metavar="SECONDS", help="With --debounce: due at most this late."
)
@click.option(
    "--batch",
    metavar="BATCH",
    help="Make the task(s) members of this batch (see dueq batches, docs/batches.md).",
)
@click.option(
    "--after",
    multiple=True,
    metavar="ID",
    help="Wait until the task ID is acked (repeat for several parents).",
)
@click.option(
    "--after-policy",
    type=click.Choice(["fail", "run"]),
    help="A parent that ends dead, cancelled or expired: end this task dead (fail, the "
    "default) or run it anyway (run).",
)
@compression_option
@shards_option
@replication_options
@redis_options
def schedule(
    queue: str,
    payload: str | None,
    at: datetime | None,
    delay: float | None,
    task_id: str | None,
    path: str | None,
    replace: bool,
    priority: int | None,
    key: str | None,
    timeout: float | None,
    max_attempts: int | None,
    task_name: str | None,
    expires: float | None,
    debounce: float | None,
    max_wait: float | None,
    batch: str | None,
    after: tuple[str, ...],
    after_policy: str | None,
    compression: str | None,
    shards: int | None,
    wait_replicas: int,
    wait_timeout: float,
    target: RedisTarget,
) -> None:
    """Schedule a task with a JSON payload, or the tasks of a file.

    \b
    dueq schedule emails '{"to": "a@example.com"}' --delay 60 --id welcome:42
    dueq schedule emails --task send_welcome '{"to": "a@example.com"}'
    dueq schedule emails --file tasks.jsonl
    A file line is {"payload": ..., "id": "...", "at": "ISO time"} or "delay": seconds
    instead of "at", and may give "priority", "key", "timeout", "max_attempts", "task"; only
    "payload" is required. --at/--delay and the option flags apply to lines without
    their own. A bad line rejects the whole file before anything is written. An id that
    already exists is left alone unless --replace. With DUEQ_KEYS set
    ("k1=<base64 of 32 bytes>,k2=..."), payloads are sealed with DUEQ_ACTIVE_KEY (default:
    the last listed): see --compression.
    """
    if (payload is None) == (path is None):
        raise click.UsageError("give a JSON payload or --file, not both and not neither")
    if at is not None and delay is not None:
        raise click.UsageError("give --at or --delay, not both")
    if path is not None and task_id is not None:
        raise click.UsageError('--id names one task; in a file give each line an "id"')
    if at is not None and at < datetime.now(timezone.utc):
        click.echo(f"warning: --at {at.isoformat()} is in the past; the task is due now", err=True)
    timing = Timing(at, delay)
    given = {
        "priority": priority,
        "key": key,
        "timeout": timeout,
        "max_attempts": max_attempts,
        "task": task_name,
        "expires": expires,
        "debounce": debounce,
        "max_wait": max_wait,
        "after": after or None,
        "after_policy": after_policy,
    }
    options = {name: value for name, value in given.items() if value is not None}
    if payload is not None:
        try:
            task = checked_task(parse_json(payload), task_id, timing, options)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
    payloads = payload_settings(compression)  # DUEQ_KEYS, checked before connecting
    client = target.open().client
    q = open_queue(
        client,
        queue,
        shards=shards,
        wait_replicas=wait_replicas,
        wait_timeout=wait_timeout,
        **payloads,
    )
    if path is not None:
        result = _schedule_file(q, path, timing, options, replace, batch)
        click.echo(
            f"scheduled into {queue!r}: {result.added} added, {result.existing} already "
            f"existed, {result.replaced} replaced"
        )
        return
    check = ArgumentCheck(q)
    try:
        check(task)
    except InvalidArguments as exc:
        raise click.UsageError(f"{exc}; nothing was scheduled") from None
    check.warn()
    result = q.schedule_many([task], replace=replace, batch=batch)
    if result.existing:
        click.echo(f"task {result.ids[0]!r} already exists in {queue!r}; left unchanged", err=True)
    click.echo(safe(result.ids[0]))
