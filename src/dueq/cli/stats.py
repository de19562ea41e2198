"""``dueq stats``: a table of every queue's states and timing, once or refreshed; under it, for
each sharded queue a table of its shards (``shards_table``), and for each fair queue
(docs/fairness.md) its lanes with due tasks, its claims of the last minute and its tenants
(``tenants_table``, which ``dueq keys`` shows alone)."""

from __future__ import annotations

import contextlib
import itertools
import time
from typing import Any

import click
import redis
from rich.console import Group
from rich.live import Live

from dueq.cli.connection import Connection, RedisTarget, queue_names, redis_options, require_queue
from dueq.cli.jsonout import emit, json_option, plain
from dueq.cli.options import seconds_option
from dueq.cli.output import console, safe, seconds, titled_table, when
from dueq.discovery import open_queue
from dueq.exceptions import DueqError
from dueq.model import QueueStats

QueueStatsRow = tuple[str, QueueStats]
Skipped = tuple[str, str]

#: Lifetime counters shown next to the current states.
COUNTERS = ("acked", "retried", "expired")


def read_stats(conn: Connection, names: list[str]) -> tuple[list[QueueStatsRow], list[Skipped]]:
    """Each queue's stats, and the queues left out with why.

    A queue this Redis user may not read, or whose stats cannot be read, is left out, so one
    queue never fails the whole command.
    """
    rows: list[QueueStatsRow] = []
    skipped: list[Skipped] = []
    for name in names:
        try:
            rows.append((name, open_queue(conn.client, name).stats()))
        except redis.exceptions.NoPermissionError:
            skipped.append((name, "this Redis user may not read it"))
        except (redis.ResponseError, DueqError, ValueError) as exc:  # corrupted data
            skipped.append((name, f"cannot read its stats: {exc}"))
    return rows, skipped


def shows_fairness(s: QueueStats) -> bool:
    """Whether the queue is fair, or was until lately: a queue that never was shows nothing
    of tenants."""
    return s.fair


def tenant_name(tenant: str) -> str:
    """A tenant as a table shows it: the tasks without a key as ``(no key)``."""
    return safe(tenant) if tenant else "(no key)"


def fair_line(name: str, s: QueueStats) -> str:
    """One line: the queue's fairness, lanes with due tasks, tasks claimed in the last minute."""
    return (
        f"queue {safe(repr(name))}: fairness {s.settings.fairness or 'off'}; "
        f"{s.fair_lanes} lanes with due tasks, {s.fair_claimed} claimed in the last minute"
    )


def tenants_table(name: str, s: QueueStats) -> Any:
    """The tenants of a fair queue (most due first): due tasks, claimed in the last minute
    (this minute and the one before), their share of those claims."""
    columns = ("tenant", "due", "claimed", "share")
    table = titled_table(f"tenants of {safe(repr(name))}", columns, right=columns[1:])
    for t in s.tenants:
        table.add_row(tenant_name(t.tenant), str(t.due), str(t.claimed), f"{t.share:.1%}")
    return table


def shards_table(name: str, s: QueueStats) -> Any:
    """The shards of a sharded queue, one row each: its counts per state, next due time and
    oldest due lag (where a queue's work lies: an uneven spread, a stuck shard)."""
    counts = ("scheduled", "due now", "waiting", "leased", "dead")
    columns = ("shard", *counts, "next due", "oldest due lag")
    title = f"shards of {safe(repr(name))}"
    if s.resharding is not None:  # both layouts' shards, until the reshard ends
        title += f" (resharding {safe(s.resharding)}: dueq reshard {safe(name)} shows progress)"
    table = titled_table(title, columns, right={*counts})
    for p in s.shards:
        table.add_row(
            safe(p.shard),
            *(str(n) for n in (p.scheduled, p.due_now, p.waiting, p.leased, p.dead)),
            when(p.next_due_at, s.now),
            seconds(p.oldest_due_lag_s) if p.due_now else "-",
        )
    return table


def stats_table(conn: Connection, names: list[str]) -> Group:
    """One row per queue: counts per state, next due time, lag of the oldest due task; the
    queues that could not be read in a note under the table."""
    counts = ("scheduled", "due now", "waiting", "leased", "dead", *COUNTERS)
    columns = ("queue", *counts, "next due", "oldest due lag")
    table = titled_table(f"dueq queues at {conn.shown}", columns, right={*counts, "oldest due lag"})
    rows, skipped = read_stats(conn, names)
    for name, s in rows:
        table.add_row(
            safe(name) + (" (paused)" if s.paused else ""),
            str(s.scheduled),
            str(s.due_now),
            str(s.waiting),
            # against the concurrency cap, when the queue has one
            str(s.leased)
            if s.settings.concurrency is None
            else f"{s.leased}/{s.settings.concurrency}",
            str(s.dead),
            *(str(s.counters.get(c, 0)) for c in COUNTERS),
            when(s.next_due_at, s.now),
            seconds(s.oldest_due_lag_s) if s.due_now else "-",
        )
    notes = [f"skipped {safe(repr(name))}: {safe(reason)}" for name, reason in skipped]
    fair: list[Any] = [shards_table(name, s) for name, s in rows if s.shards]
    for name, s in rows:
        if shows_fairness(s):
            fair += (
                [fair_line(name, s), tenants_table(name, s)] if s.tenants else [fair_line(name, s)]
            )
    return Group(table, *notes, *fair)


def stats_document(conn: Connection, names: list[str]) -> dict[str, Any]:
    """``stats --json``: {"redis": URL, "queues": [{"queue": name, "paused": bool, ...the
    QueueStats fields}], "skipped": [{"queue": name, "reason": text}]}."""
    rows, skipped = read_stats(conn, names)
    return {
        "redis": conn.shown,
        "queues": [
            {
                "queue": name,
                "paused": s.paused,
                **plain(s),
                "tenants": [t.to_json() for t in s.tenants],
            }
            for name, s in rows
        ],
        "skipped": [{"queue": name, "reason": reason} for name, reason in skipped],
    }


def _queues(conn: Connection, queue: str | None) -> list[str]:
    if queue is not None:
        require_queue(conn, queue)
        return [queue]
    return queue_names(conn.client)


@click.command()
@click.argument("queue", required=False)
@click.option("--watch", is_flag=True, help="Refresh the table until Ctrl-C.")
@seconds_option("--interval", 1.0, "Time between refreshes with --watch.", low=0.01)
@click.option(
    "--count", type=click.IntRange(1), metavar="N", help="With --watch: stop after N refreshes."
)
@json_option
@redis_options
def stats(
    queue: str | None,
    watch: bool,
    interval: float,
    count: int | None,
    as_json: bool,
    target: RedisTarget,
) -> None:
    """Show scheduled, due, waiting, leased and dead tasks of QUEUE (default: every queue
    found).

    "waiting" counts tasks waiting for their parents (scheduled with after=) to be acked.

    "oldest due lag" is how long the oldest due task has waited past its due time: it
    grows when workers are missing or too few. acked/retried/expired count since the queue
    was created. --json prints one JSON object (one per refresh with --watch).
    """
    ctx = click.get_current_context()
    if not watch:
        for name in ("count", "interval"):
            if ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE:
                raise click.UsageError(f"--{name} applies only with --watch")
    conn = target.open()
    out = console()

    def render() -> Group | str:
        names = _queues(conn, queue)
        return stats_table(conn, names) if names else f"no dueq queues at {safe(conn.shown)}"

    # On a terminal the table is redrawn in place; elsewhere (a log, --json) printed each time.
    live = (
        Live(console=out, auto_refresh=False) if watch and out.is_terminal and not as_json else None
    )

    def show() -> None:
        if as_json:
            emit(stats_document(conn, _queues(conn, queue)))
        elif live is not None:
            live.update(render(), refresh=True)
        else:
            out.print(render())

    if not watch:
        show()
        return
    refreshes = range(count) if count is not None else itertools.count()
    try:
        with live or contextlib.nullcontext():
            for i in refreshes:
                if i:
                    time.sleep(interval)
                show()
    except KeyboardInterrupt:  # Ctrl-C is how --watch ends
        pass
