"""``dueq signal``: send a signal to a durable task (docs/durable.md), as ``Queue.signal``.

The command is thin: the name, the payload and the task are checked by the library; a bad name
or JSON is a usage error (as a bad payload of ``dueq schedule``), a task that is not live or
holds the most signals it may is an error."""

from __future__ import annotations

import click

from dueq.cli.connection import RedisTarget, open_queue, redis_options
from dueq.cli.errors import CliError
from dueq.cli.options import TakesIds
from dueq.cli.output import safe
from dueq.cli.task_input import parse_json
from dueq.exceptions import InvalidTaskError, PayloadError, SignalRefused, TaskNotFound


@click.command("signal", cls=TakesIds)
@click.argument("queue")
@click.argument("task_id", metavar="ID")
@click.argument("name")
@click.argument("payload", metavar="[JSON]", required=False)
@redis_options
def signal(queue: str, task_id: str, name: str, payload: str | None, target: RedisTarget) -> None:
    """Send signal NAME with a JSON payload (default null) to durable task ID of QUEUE.

    The task's ctx.wait_for(NAME) takes it (each signal once, in the order sent); a task
    waiting for NAME is due at once. Prints how many signals the task holds not yet taken.

    \b
    dueq signal orders 5Kq3WvA1 shipped '{"tracking": "1Z999"}'
    """
    try:
        value = None if payload is None else parse_json(payload)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    q = open_queue(target, queue)
    try:
        pending = q.signal(task_id, name, value)
    except (InvalidTaskError, PayloadError) as exc:  # a bad id or name, a payload too big
        raise click.UsageError(f"{exc}; nothing was sent") from None
    except TaskNotFound:
        raise CliError(
            f"no live task {safe(task_id)!r} in {queue!r} to signal "
            "(never scheduled, ended, or dead)"
        ) from None
    except SignalRefused as exc:
        raise CliError(str(exc)) from None
    click.echo(
        f"signalled {safe(task_id)} of {queue!r} with {name!r}: {pending} signal(s) not yet taken"
    )
