"""The JSON API: the figures and tasks the pages poll, for scripts too (``/api/...``).

Every answer is the JSON form of what a page shows (``_reads``), with a ``live`` map of the
figures a page refreshes (keyed as its ``data-live`` cells).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from dueq.cron.flows import CronDefinition
from dueq.dashboard._context import Context, Unreadable
from dueq.dashboard._guard import HttpProblem
from dueq.dashboard._html import when
from dueq.dashboard._reads import (
    HISTOGRAM_BUCKET,
    HISTOGRAM_BUCKETS,
    alive,
    dead_groups,
    event_cells,
    health_json,
    live_rows,
    overview_data,
    queue_health,
    recent_events,
    search,
    stats_json,
)


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at else None


def _seconds(span: timedelta | None) -> float | None:
    return None if span is None else span.total_seconds()


def _policies(d: CronDefinition) -> dict[str, Any]:
    """A definition's policies and their counts, as ``/api/cron`` shows them (the field names
    of ``CronDefinition``; times ISO 8601, durations in seconds, None for a policy not set)."""
    return {
        "every": _seconds(d.every),
        "offset": _seconds(d.offset),
        "overlap": d.overlap,
        "start": _iso(d.start),
        "end": _iso(d.end),
        "limit": d.limit,
        "fired": d.fired,
        "jitter": _seconds(d.jitter),
        "catchup_window": _seconds(d.catchup_window),
        "expires": _seconds(d.expires),
        "pause_after_failures": d.pause_after_failures,
        "failures": d.failures,
        "skipped": d.skipped,
        "paused_reason": d.paused_reason,
        "finished": d.finished,
    }


@dataclass(frozen=True)
class Api:
    """The JSON endpoints, each a route handler over the shared context."""

    ctx: Context

    async def api_overview(self, request: Request) -> Response:
        return JSONResponse(await overview_data(self.ctx))

    async def api_queue(self, request: Request) -> Response:
        q = await self.ctx.known_queue(request.query_params.get("queue"))
        stats = await q.stats()
        hist = await q.due_histogram(HISTOGRAM_BUCKET, HISTOGRAM_BUCKETS)
        row = {**stats_json(stats), **health_json(await queue_health(self.ctx, q, stats))}
        live_row = live_rows({q.name: row})
        live_row[f"{q.name}.next_due_at"] = when(stats.next_due_at)
        events = await recent_events(self.ctx, q, stats)
        # the tables the queue page refreshes (its live_table rows), and their data as JSON
        tables: dict[str, Any] = (
            {}
            if events is None
            else {
                "events": [ev.to_json() for ev in events],
                "rows": {"events": [event_cells(ev, q.name) for ev in events]},
            }
        )
        return JSONResponse(
            {
                **tables,
                "queue": q.name,
                "stats": row,
                "counters": stats.counters,
                "due_histogram": {
                    "bucket_s": hist.bucket.total_seconds(),
                    "overdue": hist.overdue,
                    "counts": hist.counts,
                    "later": hist.later,
                },
                "live": live_row,
            }
        )

    async def api_tasks(self, request: Request) -> Response:
        q = await self.ctx.known_queue(request.query_params.get("queue"))
        state = request.query_params.get("state", "scheduled")
        if state not in ("scheduled", "leased", "dead", "done", "cancelled", "expired"):
            raise HttpProblem(
                400, "state must be scheduled, leased, dead, done, cancelled or expired"
            )
        page = await search(q, state, request)  # type: ignore[arg-type]
        return JSONResponse(
            {
                "tasks": [t.to_json(q.name) for t in page.tasks],
                "cursor": page.cursor,
                "looked_at": page.looked_at,
            }
        )

    async def api_task(self, request: Request) -> Response:
        q = await self.ctx.known_queue(request.query_params.get("queue"))
        info = (
            await q.get(request.query_params.get("id", ""))
            if request.query_params.get("id")
            else None
        )
        if info is None:
            raise HttpProblem(404, "no such task")
        return JSONResponse(info.to_json(q.name))

    async def api_dead_groups(self, request: Request) -> Response:
        q = await self.ctx.known_queue(request.query_params.get("queue"))
        groups, looked = await dead_groups(q)
        return JSONResponse({"groups": dict(groups.most_common()), "looked_at": looked})

    async def api_batches(self, request: Request) -> Response:
        """Every queue's batches (``BatchInfo.to_json``), open ones first."""
        names = await self.ctx.names()
        lists = await self.ctx.each_queue(names, lambda q: q.batches())
        return JSONResponse(
            {
                n: [b.to_json() for b in found]
                for n, found in lists.items()
                if found and not isinstance(found, Unreadable)
            }
        )

    async def api_cron(self, request: Request) -> Response:
        names = await self.ctx.names()
        lists = await self.ctx.each_queue(names, lambda q: q.cron.list())
        return JSONResponse(
            {
                n: [
                    {
                        "name": d.name,
                        "expr": d.expr,
                        "tz": d.tz,
                        "paused": d.paused,
                        "next_at": d.next_at.isoformat() if d.next_at else None,
                        "last_fired_at": d.last_fired_at.isoformat() if d.last_fired_at else None,
                        "problem": d.problem,
                        "last_outcome": d.last_outcome,
                        "last_outcome_at": d.last_outcome_at.isoformat()
                        if d.last_outcome_at
                        else None,
                        "last_error_type": d.last_error_type,
                        **_policies(d),
                    }
                    for d in defs
                ]
                for n, defs in lists.items()
                if defs and not isinstance(defs, Unreadable)
            }
        )

    async def api_workers(self, request: Request) -> Response:
        workers = await alive(self.ctx)
        live_rows: dict[str, Any] = {}
        for w in workers:
            live_rows[f"{w.worker_id}.last_seen_at"] = when(w.last_seen_at)
            live_rows[f"{w.worker_id}.in_flight"] = w.in_flight
            live_rows[f"{w.worker_id}.processed"] = w.processed
            live_rows[f"{w.worker_id}.failed"] = w.failed
        rows = [
            {
                "worker_id": w.worker_id,
                "host": w.host,
                "pid": w.pid,
                "queues": list(w.queues),
                "started_at": w.started_at.isoformat(),
                "last_seen_at": w.last_seen_at.isoformat(),
                "in_flight": w.in_flight,
                "processed": w.processed,
                "failed": w.failed,
            }
            for w in workers
        ]
        return JSONResponse({"workers": rows, "live": live_rows})
