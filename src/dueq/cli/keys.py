"""``dueq keys``: the tenants of a fair queue (docs/fairness.md), as ``q.stats()`` reads them.

The tenants table of ``dueq stats`` alone: each tenant with its due tasks, the tasks claimed
from it in the last minute and their share of all claimed then, the most due first (at most
ten with the most due and ten with the most claimed). The tasks without a key are the tenant
``(no key)`` (``""`` in ``--json``).
"""

from __future__ import annotations

import click

from dueq.cli.connection import RedisTarget, redis_options, require_queue
from dueq.cli.jsonout import emit, json_option
from dueq.cli.output import console, safe
from dueq.cli.stats import fair_line, shows_fairness, tenants_table
from dueq.discovery import open_queue


@click.command()
@click.argument("queue")
@json_option
@redis_options
def keys(queue: str, as_json: bool, target: RedisTarget) -> None:
    """Show the tenants of fair QUEUE: due tasks, claimed in the last minute, share.

    A tenant is a task's fair_key, else its key; "(no key)" the tasks without one. --json
    prints {"queue", "fairness", "fair_lanes", "fair_claimed", "tenants": [{"tenant", "due",
    "claimed", "share"}]}.
    """
    conn = target.open()
    require_queue(conn, queue)
    s = open_queue(conn.client, queue).stats()
    if as_json:
        emit(
            {
                "redis": conn.shown,
                "queue": queue,
                "fairness": s.settings.fairness,
                "fair_lanes": s.fair_lanes,
                "fair_claimed": s.fair_claimed,
                "tenants": [t.to_json() for t in s.tenants],
            }
        )
        return
    out = console()
    if not shows_fairness(s):
        out.print(
            f"queue {safe(repr(queue))} is not fair: no tenants "
            f"(dueq configure {safe(queue)} --fairness key)"
        )
        return
    out.print(fair_line(queue, s))
    out.print(tenants_table(queue, s) if s.tenants else "no tenants with due or claimed tasks")
