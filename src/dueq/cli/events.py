"""``dueq events``: a queue's outcome events, the latest ones or followed as they come."""

from __future__ import annotations

import threading

import click

from dueq.cli.connection import RedisTarget, open_queue, redis_options
from dueq.cli.errors import CliError
from dueq.cli.jsonout import emit, json_option
from dueq.cli.output import console, safe, titled_table
from dueq.events.stream import Event, latest_events


def _line(ev: Event) -> str:
    error = f" {ev.error.type}: {ev.error.message}" if ev.error is not None else ""
    result = f" result={ev.result!r}" if ev.result is not None else ""
    return (
        f"{ev.at.isoformat(timespec='milliseconds')} {ev.kind:<9} {safe(ev.task_id)} "
        f"attempt {ev.attempt}{safe(result)}{safe(error)}"
    )


def _show(ev: Event, as_json: bool) -> None:
    if as_json:
        emit(ev.to_json())
    else:
        console().print(_line(ev), highlight=False)


@click.command()
@click.argument("queue")
@click.option("--group", help="Read as a member of this consumer group (each event acked).")
@click.option("--consumer", help="The member's name in --group (default: this process).")
@click.option("--follow", is_flag=True, help="Print events as they come, until Ctrl-C.")
@click.option(
    "--groups", "show_groups", is_flag=True, help="Show the consumer groups: lag, lost, pending."
)
@click.option(
    "--count", type=click.IntRange(1), default=20, show_default=True, help="Latest events shown."
)
@json_option
@redis_options
def events(
    queue: str,
    group: str | None,
    consumer: str | None,
    follow: bool,
    show_groups: bool,
    count: int,
    as_json: bool,
    target: RedisTarget,
) -> None:
    """Outcome events of QUEUE (configure --events): the latest ones, oldest first, or with
    --follow every new one (with --group: as a member of that group, each acked once printed).
    --json prints one JSON object per event. --groups shows the consumer groups instead: each
    one's lag (events not delivered yet) and lost (events trimmed before it read them, not yet
    reported by a member); --json prints {"queue", "groups": [{"name", "consumers",
    "pending", "last_delivered_id", "lag", "lost"}]}. See docs/events.md."""
    if group is not None and not follow:
        raise CliError("--group reads as a member of a group: add --follow")
    q = open_queue(target, queue)
    if show_groups:
        found = q.event_groups()
        if as_json:
            emit({"queue": queue, "groups": [g.to_json() for g in found]})
            return
        columns = ("consumers", "pending", "lag", "lost")
        table = titled_table(f"event groups of {queue}", ("group", *columns), right=set(columns))
        for g in found:
            shown = ("?" if n is None else str(n) for n in (g.consumers, g.pending, g.lag, g.lost))
            table.add_row(safe(g.name), *shown)
        console().print(table)
        return
    if not follow:
        for ev in reversed(latest_events(q.redis, q, count)):
            _show(ev, as_json)
        return
    stopped = threading.Event()

    def on_next(ev: Event) -> None:
        _show(ev, as_json)
        ev.ack()

    def on_error(exc: Exception) -> None:
        console().print(f"events stopped: {safe(str(exc))}")
        stopped.set()

    subscription = q.events(group, consumer=consumer).subscribe(on_next=on_next, on_error=on_error)
    try:
        while not stopped.wait(0.5):
            pass
    except KeyboardInterrupt:  # Ctrl-C ends --follow
        pass
    finally:
        subscription.dispose()
