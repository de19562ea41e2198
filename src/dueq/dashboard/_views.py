"""The read views: the HTML pages (overview, queue, task, workers, cron) and their static files.

Each page reads through ``AsyncQueue``'s public API, paged or bucketed (``_reads``), shows an
action as a button only when the dashboard is not read-only (``Context.buttons``; the button
leads to the confirmation page of ``_actions``), and names the JSON endpoint (``_api``) it
polls to refresh its figures.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta

from starlette.requests import Request
from starlette.responses import Response

from dueq._util.clock import ms_datetime
from dueq.async_queue import AsyncQueue
from dueq.cron.flows import CronDefinition
from dueq.dashboard._context import Context, Unreadable
from dueq.dashboard._guard import HttpProblem
from dueq.dashboard._html import (
    CSS,
    JS,
    button,
    chart,
    e,
    health_row,
    link,
    live,
    live_table,
    pretty_json,
    table,
    url,
    when,
)
from dueq.dashboard._reads import (
    EVENT_COLUMNS,
    alive,
    dead_groups,
    event_cells,
    lag,
    last_error,
    overview_data,
    queue_health,
    recent_events,
    search,
    stats_json,
)
from dueq.model import QueueStats, StepInfo, TaskInfo


def result_section(info: TaskInfo) -> str:
    """A done task's kept result (``keep_results``), or why it was not kept; "" otherwise."""
    if info.state != "done":
        return ""
    if info.result_unstored is not None:
        return (
            f'<h2>Result</h2><p id="result" class="muted">not kept: {e(info.result_unstored)}</p>'
        )
    return f'<h2>Result</h2><pre id="result">{e(pretty_json(info.result))}</pre>'


#: The most characters of a step's result or error the timeline shows (``/api/task`` has them
#: whole): a step's result may be up to 1 MiB of JSON.
STEP_TEXT_CHARS = 200


def _step_text(step: StepInfo) -> str:
    """A step's error, or its result as compact JSON (a sleep's: its wake time), shortened."""
    if step.error is not None:
        text = step.error
    elif step.timed_out:
        text = "timed out"
    elif step.kind == "sleep" and isinstance(step.result, int):  # the wake time, epoch ms
        text = f"until {when(ms_datetime(step.result))}"
    else:
        text = "-" if step.result is None else json.dumps(step.result, ensure_ascii=False)
    return text if len(text) <= STEP_TEXT_CHARS else text[: STEP_TEXT_CHARS - 1] + "…"


def steps_section(info: TaskInfo) -> str:
    """A durable task's steps as a timeline, in order (``TaskInfo.steps``); "" for a task
    without steps. Read-only: a step has no action."""
    if not info.steps:
        return ""
    head = ["#", "kind", "name", "state", "runs", "started", "ended", "deadline"]
    rows = "".join(
        f'<tr data-step="{e(s.position)}" data-state="{e(s.state)}">'
        f"<td>{e(s.position)}</td><td>{e(s.kind)}</td><td>{e(s.name)}</td><td>{e(s.state)}</td>"
        f'<td class="n">{e(s.runs)}</td><td>{e(when(s.started_at))}</td>'
        f"<td>{e(when(s.ended_at))}</td><td>{e(when(s.deadline))}</td>"
        f"<td>{e(_step_text(s))}</td></tr>"
        for s in info.steps
    )
    cells = "".join(f"<th>{e(h)}</th>" for h in [*head, "result or error"])
    return f'<h2>Steps ({len(info.steps)})</h2><table id="steps"><tr>{cells}</tr>{rows}</table>'


def shards_section(stats: QueueStats) -> str:
    """A sharded queue's shards (``stats.shards``, in order): counts per state and the oldest
    due lag of each, where an uneven spread or a stuck shard shows; nothing for a plain
    queue."""
    if not stats.shards:
        return ""
    rows = [
        f"<tr><td>{e(p.shard)}</td><td class='n'>{p.scheduled}</td><td class='n'>{p.due_now}"
        f"</td><td class='n'>{p.leased}</td><td class='n'>{p.dead}</td>"
        f"<td class='n'>{p.oldest_due_lag_s if p.due_now else 0:.1f} s</td></tr>"
        for p in stats.shards
    ]
    return (
        f"<h2>Shards ({len(stats.shards)})</h2>"
        '<div id="shards">'
        + table(["shard", "scheduled", "due now", "leased", "dead", "oldest due lag"], rows)
        + "</div>"
    )


def tenants_section(stats: QueueStats) -> str:
    """A fair queue's tenants (``stats.tenants``, most due first): due tasks, claimed in the
    last minute, share of those claims; nothing for a queue that never was fair."""
    fair = stats.settings.fairness
    if not stats.fair:
        return ""
    rows = [
        f"<tr><td>{e(t.tenant) if t.tenant else '(no key)'}</td><td class='n'>{t.due}</td>"
        f"<td class='n'>{t.claimed}</td><td class='n'>{t.share:.1%}</td></tr>"
        for t in stats.tenants
    ]
    return (
        "<h2>Tenants</h2>"
        f'<p class="muted">fairness {e(fair or "off")}: {stats.fair_lanes} lanes with due tasks, '
        f"{stats.fair_claimed} claimed in the last minute</p>"
        '<div id="tenants">'
        + table(
            ["tenant", "due", "claimed (last minute)", "share"],
            rows,
            empty="no tenant with due or claimed tasks",
        )
        + "</div>"
    )


def _outcome(d: CronDefinition) -> str:
    """The last firing's outcome (escaped HTML): what became of it, when, and the error."""
    if d.last_outcome is None:
        return "-"
    error = f" ({d.last_error_type})" if d.last_error_type else ""
    return e(f"{d.last_outcome}{error} at {when(d.last_outcome_at)}")


def _span(span: timedelta | None) -> str:
    return "-" if span is None else f"{span.total_seconds():g}s"


def _schedule(d: CronDefinition) -> str:
    """Its expression (or interval) and zone (escaped HTML)."""
    if d.every is None:
        return f"<code>{e(d.expr)}</code> {e(d.tz)}"
    offset = f" +{_span(d.offset)}" if d.offset else ""
    return f"every {e(_span(d.every))}{e(offset)}"


def _policies(d: CronDefinition) -> str:
    """Its policies and their counts (escaped HTML; ``-`` for none): overlap, window, fired of
    limit, consecutive failures of pause_after_failures, skipped slots, jitter, catch-up,
    expires."""
    parts = []
    if d.overlap != "allow_all":
        parts.append(f"overlap {d.overlap}")
    if d.start or d.end:
        parts.append(
            f"window {when(d.start) if d.start else '…'} to {when(d.end) if d.end else '…'}"
        )
    if d.limit is not None:
        parts.append(f"limit {d.fired}/{d.limit}")
    if d.pause_after_failures is not None:
        parts.append(f"failures {d.failures}/{d.pause_after_failures}")
    elif d.failures:
        parts.append(f"failures {d.failures}")
    if d.skipped:
        parts.append(f"skipped {d.skipped}")
    if d.jitter is not None:
        parts.append(f"jitter {_span(d.jitter)}")
    if d.catchup_window is not None:
        parts.append(f"catch-up {_span(d.catchup_window)}")
    if d.expires is not None:
        parts.append(f"expires {_span(d.expires)}")
    return e(", ".join(parts) or "-")


def _state(d: CronDefinition) -> str:
    """active, paused (with why, when pause_after_failures paused it) or finished (limit or
    end), as escaped HTML."""
    if d.paused:
        reason = d.paused_reason
        return e("paused" if reason in (None, "paused") else f"paused ({reason})")
    if d.finished:
        return e(f"finished ({d.finished})")
    return "active"


@dataclass(frozen=True)
class Views:
    """The pages, each a route handler over the shared context."""

    ctx: Context

    async def overview(self, request: Request) -> Response:
        data = await overview_data(self.ctx)
        rows = []
        for name, s in data["queues"].items():
            start = health_row(name, s["health"]) + f"<td>{link(name, '/queue', queue=name)}</td>"
            badge = live(f"{name}.health", s["health"], "badge")
            why = live(f"{name}.health_reason", s["health_reason"], "why")
            if "error" in s:
                rows.append(f'{start}{badge}<td colspan="7"></td>{why}</tr>')
                continue
            rows.append(
                start
                + badge
                + live(f"{name}.scheduled", s["scheduled"], "n")
                + live(f"{name}.due_now", s["due_now"], "n")
                + live(f"{name}.leased", s["leased"], "n")
                + live(f"{name}.dead", s["dead"], "n")
                + live(f"{name}.paused", "paused" if s["paused"] else "running")
                + live(f"{name}.oldest_due_lag_s", lag(s["oldest_due_lag_s"], s["due_now"]), "n")
                + live(f"{name}.workers", s["workers"], "n")
                + why
                + "</tr>"
            )
        head = [
            "queue",
            "health",
            "scheduled",
            "due now",
            "leased",
            "dead",
            "state",
            "oldest due lag",
            "workers",
            "why",
        ]
        body = (
            "<h1>Queues</h1>"
            + f'<p id="health" data-health="{e(data["health"])}" data-health-of="health">'
            f'<span data-live="health_summary">{e(data["health_summary"])}</span></p>'
            + table(head, rows, empty="no queue in this Redis yet")
            + f'<p>{link("Workers", "/workers")} alive: <span data-live="workers_alive">'
            f"{e(data['workers_alive'])}</span> · {link('Dead letters', '/dead')}</p>"
            + "<h2>Throughput, last hour (every queue)</h2>"
            + chart("throughput chart", "/chart/throughput.svg")
        )
        return self.ctx.page(request, "Overview", body, poll="/api/overview")

    async def queue_page(self, request: Request) -> Response:
        q = await self.ctx.known_queue(request.query_params.get("queue"))
        stats = await q.stats()
        s = stats_json(stats)
        health = await queue_health(self.ctx, q, stats)
        leased = await search(q, "leased", request)
        scheduled = await search(q, "scheduled", request)
        dead_page = await search(q, "dead", request)
        groups, grouped = await dead_groups(q)
        events = await recent_events(self.ctx, q, stats)
        n = q.name
        state = "paused" if s["paused"] else "running"
        toggle = self.ctx.buttons(
            button("Resume", "resume", {"queue": n})
            if s["paused"]
            else button("Pause", "pause", {"queue": n}, danger=True)
        )
        counts = table(
            ["scheduled", "due now", "leased", "dead", "state", "oldest due lag", "next due"],
            [
                "<tr>"
                + live(f"{n}.scheduled", s["scheduled"], "n")
                + live(f"{n}.due_now", s["due_now"], "n")
                + live(f"{n}.leased", s["leased"], "n")
                + live(f"{n}.dead", s["dead"], "n")
                + live(f"{n}.paused", state, "paused" if s["paused"] else "")
                + live(f"{n}.oldest_due_lag_s", lag(s["oldest_due_lag_s"], s["due_now"]), "n")
                + live(f"{n}.next_due_at", when(stats.next_due_at))
                + "</tr>"
            ],
        )
        leased_rows = [
            f"<tr><td>{link(t.id, '/task', queue=n, id=t.id)}</td><td>{e(t.holder or '-')}</td>"
            f"<td>{e(when(t.lease_deadline))}</td><td class='n'>{t.attempt}</td></tr>"
            for t in leased.tasks
        ]
        sched_rows = [
            f"<tr><td>{link(t.id, '/task', queue=n, id=t.id)}</td><td>{e(when(t.due_at))}</td>"
            f"<td class='n'>{t.attempt}</td><td class='n'>{t.priority}</td>"
            f"<td><code>{e(pretty_json(t.payload)[:120])}</code></td></tr>"
            for t in scheduled.tasks
        ]
        group_rows = [
            f"<tr><td>{e(kind or '(no error record)')}</td><td class='n'>{count}</td><td>"
            + (
                self.ctx.buttons(
                    button("Replay group", "replay-group", {"queue": n, "error_type": kind}),
                    button(
                        "Purge group",
                        "purge-group",
                        {"queue": n, "error_type": kind},
                        danger=True,
                    ),
                )
                if kind
                else ""
            )
            + "</td></tr>"
            for kind, count in groups.most_common()
        ]
        dead_rows = [
            f"<tr><td>{link(t.id, '/task', queue=n, id=t.id)}</td><td>{e(last_error(t))}</td>"
            f"<td>{e(when(t.died_at))}</td><td class='n'>{t.attempt}</td><td>"
            + self.ctx.buttons(
                button("Replay", "replay", {"queue": n, "id": t.id}),
                button("Purge", "purge", {"queue": n, "id": t.id}, danger=True),
            )
            + "</td></tr>"
            for t in dead_page.tasks
        ]
        events_section = (
            ""
            if events is None
            else "<h2>Latest events</h2>"
            + live_table(
                "events",
                EVENT_COLUMNS,
                [event_cells(ev, n) for ev in events],
                empty="no events yet",
            )
        )
        p = request.query_params
        search_form = (
            '<form method="get" action="/queue" class="search">'
            f'<input type="hidden" name="queue" value="{e(n)}">'
            f'<input name="id_prefix" placeholder="id prefix" value="{e(p.get("id_prefix", ""))}">'
            f' <input name="grep" placeholder="payload text" value="{e(p.get("grep", ""))}">'
            ' <button type="submit" id="search">Search</button></form>'
        )
        looked = (
            f'<p class="muted">looked at {scheduled.looked_at} tasks for this page</p>'
            if p.get("id_prefix") or p.get("grep")
            else ""
        )
        more = (
            f"<p>{link('next page', '/queue', queue=n, id_prefix=p.get('id_prefix'), grep=p.get('grep'), scheduled_cursor=scheduled.cursor)}</p>"  # noqa: E501
            if scheduled.cursor
            else ""
        )
        dead_more = (
            f"<p>{link('next dead page', '/queue', queue=n, dead_cursor=dead_page.cursor)}</p>"
            if dead_page.cursor
            else ""
        )
        grouped_note = (
            f'<p class="muted">grouped from the first {grouped} of {s["dead"]} dead tasks; '
            "a group's replay or purge acts on every dead task of that error type</p>"
            if grouped < s["dead"]
            else ""
        )
        body = (
            f"<h1>Queue {e(n)} {toggle}</h1>"
            f'<p class="health" data-health="{e(health.level)}" data-health-of="{e(n)}.health">'
            f'<span data-live="{e(n)}.health_reason">{e(health.reason)}</span></p>{counts}'
            + shards_section(stats)
            + tenants_section(stats)
            + f"<p>{link('Dead letters of every queue', '/dead')}</p>"
            f"<p>{link('Cron definitions of this queue', '/cron', queue=n)}</p>"
            '<div class="charts"><div><h2>Throughput, last hour</h2>'
            + chart("throughput chart", url("/chart/throughput.svg", queue=n))
            + "</div><div><h2>Due in the next 24 hours</h2>"
            + chart("due histogram", url("/chart/due.svg", queue=n))
            + "</div></div>"
            + f"<h2>Leased ({len(leased.tasks)} shown)</h2>"
            + table(["id", "holder", "lease deadline", "attempt"], leased_rows)
            + events_section
            + f"<h2>Scheduled</h2>{search_form}"
            + table(["id", "due", "attempt", "priority", "payload"], sched_rows, empty="no match")
            + looked
            + more
            + "<h2>Dead, by error type</h2>"
            + table(["error type", "tasks", ""], group_rows)
            + grouped_note
            + "<h2>Dead tasks</h2>"
            + table(["id", "last error", "died", "attempt", ""], dead_rows)
            + dead_more
        )
        return self.ctx.page(request, f"Queue {n}", body, poll=url("/api/queue", queue=n))

    async def dead_page(self, request: Request) -> Response:
        """Every shown queue's dead letters, grouped by the type of their last error, with a
        replay and a purge per group (each confirmed with its count)."""

        async def read(q: AsyncQueue) -> tuple[Counter[str], int, int]:
            groups, looked = await dead_groups(q)
            return groups, looked, await q.dead.count()

        found = await self.ctx.each_queue(await self.ctx.names(), read)
        rows: list[str] = []
        total = queues = 0
        notes: list[str] = []
        for n, got in found.items():
            if isinstance(got, Unreadable):
                rows.append(
                    f"<tr><td>{link(n, '/queue', queue=n)}</td>"
                    f'<td colspan="3" class="problem">unreadable: {e(got.why)}</td></tr>'
                )
                continue
            groups, looked, count = got
            if not count:
                continue
            total, queues = total + count, queues + 1
            if looked < count:
                notes.append(f"{n}: grouped from the first {looked} of {count}")
            for kind, size in groups.most_common():
                fields = {"queue": n, "error_type": kind}
                acts = (
                    self.ctx.buttons(
                        button("Replay group", "replay-group", fields),
                        button("Purge group", "purge-group", fields, danger=True),
                    )
                    if kind
                    else '<span class="muted">no error record: act per task</span>'
                )
                rows.append(
                    f'<tr data-queue="{e(n)}"><td>{link(n, "/queue", queue=n)}</td>'
                    f"<td>{e(kind or '(no error record)')}</td>"
                    f"<td class='n'>{size}</td><td>{acts}</td></tr>"
                )
        note = (
            f'<p class="muted">{e("; ".join(notes))}; a group\'s replay or purge acts on every '
            "dead task of that error type</p>"
            if notes
            else ""
        )
        head = f"Dead letters ({total} in {queues} queue{'' if queues == 1 else 's'})"
        body = (
            f"<h1>{e(head)}</h1>"
            + table(["queue", "error type", "tasks", ""], rows, empty="no dead letters")
            + note
        )
        return self.ctx.page(request, "Dead letters", body)

    async def task_page(self, request: Request) -> Response:
        q = await self.ctx.known_queue(request.query_params.get("queue"))
        task_id = request.query_params.get("id", "")
        info = await q.get(task_id) if task_id else None
        if info is None:
            raise HttpProblem(404, f"no task {task_id!r} in queue {q.name!r}")
        n, ids = q.name, {"queue": q.name, "id": info.id}
        actions: list[str] = []
        if info.state in ("scheduled", "leased"):
            actions.append(button("Cancel", "cancel", ids, danger=True))
        if info.state == "scheduled":  # a dead task's one way back is Replay
            actions.append(button("Run now", "run-now", ids))
            actions.append(button("Reschedule", "reschedule", ids))
        if info.state == "dead":
            actions.append(button("Replay", "replay", ids))
            actions.append(button("Purge", "purge", ids, danger=True))
        facts = [
            ("queue", link(n, "/queue", queue=n)),
            ("state", e(info.state)),
            ("attempt", e(info.attempt)),
            ("due", e(when(info.due_at))),
            ("lease deadline", e(when(info.lease_deadline))),
            ("holder", e(info.holder or "-")),
            ("died", e(when(info.died_at))),
            ("finished", e(when(info.finished_at))),
            ("priority", e(info.priority)),
            ("key", e(info.key or "-")),
        ]
        errors = "".join(
            f"<h3>attempt {r.attempt}: {e(r.type)} at {e(when(r.at))}</h3>"
            f"<p>{e(r.message)}</p><pre>{e(r.traceback or '(no traceback)')}</pre>"
            for r in info.errors
        )
        body = (
            f"<h1>Task {e(info.id)}</h1><p>{self.ctx.buttons(*actions)}</p>"
            + table([], (f"<tr><th>{e(k)}</th><td>{v}</td></tr>" for k, v in facts))
            + f'<h2>Payload</h2><pre id="payload">{e(pretty_json(info.payload))}</pre>'
            + result_section(info)
            + steps_section(info)
            + f"<h2>Errors ({len(info.errors)})</h2>"
            + (errors or '<p class="muted">none</p>')
        )
        return self.ctx.page(request, f"Task {info.id}", body)

    async def workers_page(self, request: Request) -> Response:
        workers = await alive(self.ctx)
        rows = [
            f"<tr><td>{e(w.worker_id)}</td><td>{e(w.host)}</td><td class='n'>{w.pid}</td>"
            f"<td>{' '.join(link(n, '/queue', queue=n) for n in w.queues)}</td>"
            f"<td>{e(when(w.started_at))}</td>"
            + live(f"{w.worker_id}.last_seen_at", when(w.last_seen_at))
            + live(f"{w.worker_id}.in_flight", w.in_flight, "n")
            + live(f"{w.worker_id}.processed", w.processed, "n")
            + live(f"{w.worker_id}.failed", w.failed, "n")
            + "</tr>"
            for w in workers
        ]
        head = ["worker", "host", "pid", "queues", "started", "last seen", "in flight"]
        body = f"<h1>Workers ({len(rows)} alive)</h1>" + table(
            [*head, "processed", "failed"], rows, empty="no worker is alive"
        )
        return self.ctx.page(request, "Workers", body, poll="/api/workers")

    async def batches_page(self, request: Request) -> Response:
        """Every batch of the queues (or of ?queue=), open ones first, with their counts."""
        only = request.query_params.get("queue")
        names = [(await self.ctx.known_queue(only)).name] if only else await self.ctx.names()
        lists = await self.ctx.each_queue(names, lambda q: q.batches())
        counts = ("total", "acked", "dead", "cancelled", "expired", "pending")
        rows = []
        for n, found in lists.items():
            if isinstance(found, Unreadable):
                rows.append(
                    f"<tr><td>{link(n, '/queue', queue=n)}</td>"
                    f'<td colspan="10" class="problem">unreadable: {e(found.why)}</td></tr>'
                )
                continue
            for b in found:
                rows.append(
                    f"<tr><td>{link(n, '/queue', queue=n)}</td><td>{e(b.id)}</td>"
                    f"<td>{e(b.state)}</td>"
                    + "".join(f"<td class='n'>{getattr(b, c)}</td>" for c in counts)
                    + f"<td>{e(when(b.created_at))}</td><td>{e(when(b.completed_at))}</td></tr>"
                )
        head = ["queue", "batch", "state", *counts, "created", "completed"]
        body = "<h1>Batches</h1>" + table(head, rows, empty="no batches")
        return self.ctx.page(request, "Batches", body)

    async def cron_page(self, request: Request) -> Response:
        only = request.query_params.get("queue")
        names = [(await self.ctx.known_queue(only)).name] if only else await self.ctx.names()
        lists = await self.ctx.each_queue(names, lambda q: q.cron.list())
        rows = []
        for n, defs in lists.items():
            if isinstance(defs, Unreadable):
                rows.append(
                    f"<tr><td>{link(n, '/queue', queue=n)}</td>"
                    f'<td colspan="9" class="problem">unreadable: {e(defs.why)}</td></tr>'
                )
                continue
            for d in defs:
                fields = {"queue": n, "name": d.name}
                toggle = (
                    button("Resume", "cron-resume", fields)
                    if d.paused
                    else button("Pause", "cron-pause", fields, danger=True)
                )
                rows.append(
                    f"<tr><td>{link(n, '/queue', queue=n)}</td><td>{e(d.name)}</td>"
                    f"<td>{_schedule(d)}</td>"
                    f"<td>{e(when(d.next_at))}</td><td>{e(when(d.last_fired_at))}</td>"
                    f"<td>{_outcome(d)}</td><td>{_policies(d)}</td><td>{_state(d)}</td>"
                    f"<td>{e(d.problem or '')}</td><td>"
                    + self.ctx.buttons(toggle, button("Run now", "cron-run-now", fields))
                    + "</td></tr>"
                )
        head = [
            "queue",
            "name",
            "schedule",
            "next firing",
            "last firing",
            "last outcome",
            "policies",
            "state",
            "problem",
            "",
        ]
        body = "<h1>Cron</h1>" + table(head, rows, empty="no cron definitions")
        return self.ctx.page(request, "Cron", body)

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name == "dashboard.css":
            return Response(CSS, media_type="text/css")
        if name == "dashboard.js":
            return Response(JS, media_type="text/javascript")
        raise HttpProblem(404, "no such file")
