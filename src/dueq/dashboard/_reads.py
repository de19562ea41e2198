"""The bounded reads the pages and the JSON API share: stats rows, live figures, task search.

Each costs the same for a queue of millions as for one of ten: a search makes at most
``SEARCH_CALLS`` listing calls for a page of ``PAGE_SIZE`` tasks, dead tasks are grouped by
error type from the first ``DEAD_GROUP_SCAN``, the due histogram has ``HISTOGRAM_BUCKETS``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, Literal

from starlette.requests import Request

from .._async import AsyncQueue
from ..registry import WorkerInfo, merge_workers
from ..task import HistoryPoint, QueueStats, TaskInfo, TaskPage
from ._context import Context, Unreadable

PAGE_SIZE = 50
#: list_tasks calls one search may make (each looks at up to 1,000 tasks).
SEARCH_CALLS = 10
#: Dead tasks read to group them by error type (replay/purge of a group acts on all of it).
DEAD_GROUP_SCAN = 5_000
HISTOGRAM_BUCKETS = 48
HISTOGRAM_BUCKET = timedelta(minutes=30)


def stats_json(s: QueueStats) -> dict[str, Any]:
    return {
        "scheduled": s.scheduled,
        "due_now": s.due_now,
        "leased": s.leased,
        "dead": s.dead,
        "paused": s.settings.paused,
        "oldest_due_lag_s": round(s.oldest_due_lag_s, 3),
        "next_due_at": s.next_due_at.isoformat() if s.next_due_at else None,
    }


def last_error(t: TaskInfo) -> str:
    return t.errors[-1].type if t.errors else ""


def sum_history(histories: list[list[HistoryPoint]]) -> list[HistoryPoint]:
    if not histories:
        return []
    out = []
    for points in zip(*histories, strict=False):
        out.append(
            HistoryPoint(
                points[0].minute,
                *(
                    sum(getattr(p, name) for p in points)
                    for name in ("scheduled", "claimed", "acked", "retried", "dead", "expired")
                ),
            )
        )
    return out


def lag(seconds: float) -> str:
    return f"{seconds:.1f} s"


async def overview_data(ctx: Context) -> dict[str, Any]:
    """Every shown queue's stats row and live workers (the overview page and its JSON)."""
    names = await ctx.names()
    stats = await ctx.each_queue(names, lambda q: q.stats())
    by_queue = await workers(ctx, names)
    rows = {
        n: {"error": s.why}
        if isinstance(s, Unreadable)
        else {**stats_json(s), "workers": len(by_queue[n])}
        for n, s in stats.items()
    }
    alive_n = len({w.worker_id for found in by_queue.values() for w in found})
    live = live_rows(rows)
    live["workers_alive"] = alive_n
    return {"queues": rows, "workers_alive": alive_n, "live": live}


async def workers(ctx: Context, names: list[str]) -> dict[str, list[WorkerInfo]]:
    """The live workers of each queue (a worker serving several is in each list)."""
    found = await ctx.each_queue(names, lambda q: q.workers())
    return {n: [] if isinstance(w, Unreadable) else w for n, w in found.items()}


async def alive(ctx: Context) -> list[WorkerInfo]:
    """Every live worker of the shown queues, once each, by id."""
    by_queue = await workers(ctx, await ctx.names())
    return merge_workers(by_queue.values())  # the rule discover_workers uses


def live_rows(rows: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The figures a page refreshes by polling, keyed ``QUEUE.FIELD`` as its ``data-live``."""
    out: dict[str, Any] = {}
    for name, row in rows.items():
        for key, value in row.items():
            out[f"{name}.{key}"] = (
                lag(value)
                if key == "oldest_due_lag_s"
                else ("paused" if value else "running")
                if key == "paused"
                else value
            )
    return out


async def search(
    q: AsyncQueue, state: Literal["scheduled", "leased", "dead"], request: Request
) -> TaskPage:
    """A page of up to ``PAGE_SIZE`` tasks matching the query's filters, looking at no
    more than ``SEARCH_CALLS`` listing calls' worth of tasks."""
    p = request.query_params
    cursor = p.get(f"{state}_cursor") or None
    filters: dict[str, Any] = {}
    if state == "scheduled":
        filters = {"id_prefix": p.get("id_prefix") or None, "grep": p.get("grep") or None}
    found: list[TaskInfo] = []
    looked = 0
    for _ in range(SEARCH_CALLS):
        page = await q.list_tasks(state, limit=PAGE_SIZE - len(found), cursor=cursor, **filters)
        found += page.tasks
        looked += page.looked_at
        cursor = page.cursor
        if cursor is None or len(found) >= PAGE_SIZE:
            break
    return TaskPage(found, cursor, looked)


async def dead_groups(q: AsyncQueue) -> tuple[Counter[str], int]:
    groups: Counter[str] = Counter()
    looked, cursor = 0, None
    while looked < DEAD_GROUP_SCAN:
        page = await q.list_tasks("dead", limit=1000, cursor=cursor)
        groups.update(last_error(t) for t in page.tasks)
        looked += len(page.tasks)
        cursor = page.cursor
        if cursor is None:
            break
    return groups, looked
