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

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from dueq import discovery
from dueq.async_queue import AsyncQueue
from dueq.dashboard._context import Context, Unreadable
from dueq.dashboard._html import Cell, cell, url, when
from dueq.events.stream import Event, latest_events
from dueq.health import Health, human_duration, judge_health, worst
from dueq.model import HistoryPoint, QueueStats, TaskInfo, TaskPage
from dueq.registry import WorkerInfo

PAGE_SIZE = 50
#: list_tasks calls one search may make (each looks at up to 1,000 tasks).
SEARCH_CALLS = 10
#: Dead tasks read to group them by error type (replay/purge of a group acts on all of it).
DEAD_GROUP_SCAN = 5_000
HISTOGRAM_BUCKETS = 48
HISTOGRAM_BUCKET = timedelta(minutes=30)
#: Outcome events the queue page shows, newest first (one XREVRANGE).
EVENTS_SHOWN = 20


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


def lag(seconds: float, due_now: int = 1) -> str:
    """How long the oldest due task has waited, or ``-`` when none is due."""
    return human_duration(seconds) if due_now else "-"


def health_json(health: Health) -> dict[str, str]:
    return {"health": health.level, "health_reason": health.reason}


async def stats_and_history(ctx: Context, q: AsyncQueue) -> tuple[QueueStats, list[HistoryPoint]]:
    """What the health rule reads of a queue: its stats and the history of its dead window."""
    return await q.stats(), await q.history(ctx.settings.health.history_minutes)


async def queue_health(ctx: Context, q: AsyncQueue, stats: QueueStats) -> Health:
    """``q``'s health now (one queue's page): its live workers and recent history."""
    live = (await workers(ctx, [q.name]))[q.name]
    history = await q.history(ctx.settings.health.history_minutes)
    return judge_health(stats, live_workers=len(live), history=history, rules=ctx.settings.health)


async def overview_data(ctx: Context) -> dict[str, Any]:
    """Every shown queue's stats row, health and live workers (the overview page and its
    JSON); ``health`` is the worst row's (an unreadable queue is ``bad``)."""
    names = await ctx.names()
    read = await ctx.each_queue(names, lambda q: stats_and_history(ctx, q))
    by_queue = await workers(ctx, names)
    rows: dict[str, dict[str, Any]] = {}
    healths: dict[str, Health] = {}
    for n, found in read.items():
        if isinstance(found, Unreadable):
            healths[n] = Health("bad", (f"unreadable: {found.why}",))
            rows[n] = {"error": found.why, **health_json(healths[n])}
            continue
        stats, history = found
        healths[n] = judge_health(
            stats, live_workers=len(by_queue[n]), history=history, rules=ctx.settings.health
        )
        rows[n] = {**stats_json(stats), "workers": len(by_queue[n]), **health_json(healths[n])}
    alive_n = len({w.worker_id for found in by_queue.values() for w in found})
    level = worst(healths.values())
    summary = health_summary(healths)
    live = live_rows(rows)
    live |= {"workers_alive": alive_n, "health": level, "health_summary": summary}
    return {
        "queues": rows,
        "workers_alive": alive_n,
        "health": level,
        "health_summary": summary,
        "live": live,
    }


def health_summary(healths: Mapping[str, Health]) -> str:
    """The overview's line: how many queues are bad and how many warn, or that all are ok."""
    bad = sum(h.level == "bad" for h in healths.values())
    warn = sum(h.level == "warn" for h in healths.values())
    if not bad and not warn:
        return f"all {len(healths)} queues ok" if len(healths) != 1 else "the queue is ok"
    parts = [f"{bad} bad" if bad else "", f"{warn} warn" if warn else ""]
    return f"{' and '.join(p for p in parts if p)} of {len(healths)} queues: see the rows"


async def live_workers(ctx: Context, names: list[str]) -> list[WorkerInfo]:
    """The live workers of ``names``, once each: ``dueq.discovery.discover_workers``, the one
    rule the CLI and the metrics use too (a blocking read, so in a thread)."""
    if not names:  # discover_workers would walk the keyspace for every queue
        return []
    return await run_in_threadpool(discovery.discover_workers, ctx.sync(), names)


async def workers(ctx: Context, names: list[str]) -> dict[str, list[WorkerInfo]]:
    """The live workers of each queue (a worker serving several is in each list)."""
    found = await live_workers(ctx, names)
    return {n: [w for w in found if n in w.queues] for n in names}


async def alive(ctx: Context) -> list[WorkerInfo]:
    """Every live worker of the shown queues, once each, by id."""
    return await live_workers(ctx, await ctx.names())


def live_rows(rows: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The figures a page refreshes by polling, keyed ``QUEUE.FIELD`` as its ``data-live``."""
    out: dict[str, Any] = {}
    for name, row in rows.items():
        for key, value in row.items():
            out[f"{name}.{key}"] = (
                lag(value, row.get("due_now", 1))
                if key == "oldest_due_lag_s"
                else ("paused" if value else "running")
                if key == "paused"
                else value
            )
    return out


#: The columns of the queue page's events table (``event_cells`` gives a row).
EVENT_COLUMNS = ("kind", "task", "attempt", "at", "error type")


def event_cells(ev: Event, queue: str) -> list[Cell]:
    """One row of the queue page's events table: the page renders it, ``/api/queue`` gives it
    to the page's poller (``live_table``)."""
    return [
        cell(ev.kind),
        cell(ev.task_id, href=url("/task", queue=queue, id=ev.task_id)),
        cell(ev.attempt, css="n"),
        cell(when(ev.at)),
        cell(ev.error.type if ev.error else ""),
    ]


async def recent_events(ctx: Context, q: AsyncQueue, stats: QueueStats) -> list[Event] | None:
    """The newest ``EVENTS_SHOWN`` outcome events of ``q``, newest first; None when the queue
    writes no events (``configure(events=...)`` off: nothing to show, even if old entries are
    left); a sharded queue's, merged from every shard's stream. ``events.latest_events``, the
    rule ``dueq events`` uses, is a blocking read: in a thread."""
    if stats.settings.events is None:
        return None
    return await run_in_threadpool(latest_events, ctx.sync(), q, EVENTS_SHOWN)


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
