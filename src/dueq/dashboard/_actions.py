"""The actions: every state change (pause, replay, purge ...), its confirmation page and its POST.

State changes go through one table (``ACTIONS``): a GET of ``/action/<verb>`` shows what would
happen (the confirmation step, changing nothing); a POST with the CSRF token (checked by
``_auth``) does it. A read-only dashboard refuses both.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from starlette.requests import Request
from starlette.responses import Response

from dueq.async_queue import AsyncQueue
from dueq.dashboard._context import Context
from dueq.dashboard._guard import HttpProblem, form_fields
from dueq.dashboard._html import e, link
from dueq.dashboard._reads import dead_groups
from dueq.exceptions import ConfigurationError
from dueq.health import human_duration


@dataclass(frozen=True)
class Action:
    """A state change: ``needs`` the form fields it reads, ``describe`` says what it will do
    (the confirmation page), ``run`` does it and says what happened."""

    label: str
    needs: tuple[str, ...]
    describe: Callable[[Mapping[str, str]], str]
    run: Callable[[AsyncQueue, Mapping[str, str]], Awaitable[str]]
    back: Literal["queue", "task", "cron", "dead"]
    danger: bool = False
    #: for the dead-letter actions: how many tasks it acts on (and whether that is exact), so
    #: the confirmation asks "Replay 37 tasks?"
    count: Callable[[AsyncQueue, Mapping[str, str]], Awaitable[tuple[int, bool]]] | None = None


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


async def _pause(q: AsyncQueue, _f: Mapping[str, str]) -> str:
    await q.pause()
    return f"queue {q.name} paused"


async def _resume(q: AsyncQueue, _f: Mapping[str, str]) -> str:
    await q.resume()
    return f"queue {q.name} resumed"


async def _cancel(q: AsyncQueue, f: Mapping[str, str]) -> str:
    done = await q.cancel(f["id"])
    return f"task {f['id']} cancelled" if done else f"task {f['id']} was not there"


async def _run_now(q: AsyncQueue, f: Mapping[str, str]) -> str:
    done = await q.run_now(f["id"])
    return f"task {f['id']} is due now" if done else f"task {f['id']} is running or gone"


async def _reschedule(q: AsyncQueue, f: Mapping[str, str]) -> str:
    try:
        delay_s = float(f["delay_s"])
    except ValueError:
        raise ConfigurationError(
            f"delay_s must be a number of seconds, got {f['delay_s']!r}"
        ) from None
    done = await q.reschedule(f["id"], delay=delay_s)
    due = f"task {f['id']} is due in {human_duration(delay_s)}"
    return due if done else f"task {f['id']} not scheduled"


async def _one(_q: AsyncQueue, _f: Mapping[str, str]) -> tuple[int, bool]:
    return 1, True


async def _group_size(q: AsyncQueue, f: Mapping[str, str]) -> tuple[int, bool]:
    """The dead tasks whose last error is ``f["error_type"]``, as ``dead_groups`` counts them:
    exact when every dead task was looked at, a floor when the scan stopped first."""
    groups, looked = await dead_groups(q)
    return groups[f["error_type"]], looked >= await q.dead.count()


async def _replay(q: AsyncQueue, f: Mapping[str, str]) -> str:
    return f"{_count(await q.dead.replay([f['id']]), 'dead task')} replayed"


async def _purge(q: AsyncQueue, f: Mapping[str, str]) -> str:
    return f"{_count(await q.dead.purge([f['id']]), 'dead task')} purged"


async def _replay_group(q: AsyncQueue, f: Mapping[str, str]) -> str:
    moved = await q.dead.replay(error_type=f["error_type"])
    return f"{_count(moved, 'dead task')} with error {f['error_type']} replayed"


async def _purge_group(q: AsyncQueue, f: Mapping[str, str]) -> str:
    moved = await q.dead.purge(error_type=f["error_type"])
    return f"{_count(moved, 'dead task')} with error {f['error_type']} purged"


async def _cron_pause(q: AsyncQueue, f: Mapping[str, str]) -> str:
    await q.cron.pause(f["name"])
    return f"cron {f['name']} paused"


async def _cron_resume(q: AsyncQueue, f: Mapping[str, str]) -> str:
    await q.cron.resume(f["name"])
    return f"cron {f['name']} resumed"


async def _cron_run_now(q: AsyncQueue, f: Mapping[str, str]) -> str:
    return f"cron {f['name']} fired now: task {await q.cron.run_now(f['name'])}"


ACTIONS: dict[str, Action] = {
    "pause": Action(
        "Pause",
        (),
        lambda f: f"Pause queue {f['queue']}: no consumer leases its tasks until it is resumed.",
        _pause,
        "queue",
        danger=True,
    ),
    "resume": Action("Resume", (), lambda f: f"Resume queue {f['queue']}.", _resume, "queue"),
    "cancel": Action(
        "Cancel",
        ("id",),
        lambda f: f"Cancel task {f['id']} of queue {f['queue']} (a running handler is told).",
        _cancel,
        "task",
        danger=True,
    ),
    "run-now": Action(
        "Run now",
        ("id",),
        lambda f: f"Make task {f['id']} of queue {f['queue']} due now.",
        _run_now,
        "task",
    ),
    "reschedule": Action(
        "Reschedule",
        ("id", "delay_s"),
        lambda f: f"Make task {f['id']} of queue {f['queue']} due in {f['delay_s']} seconds.",
        _reschedule,
        "task",
    ),
    "replay": Action(
        "Replay",
        ("id",),
        lambda f: f"Replay dead task {f['id']} of queue {f['queue']} (attempts reset, due now).",
        _replay,
        "task",
        count=_one,
    ),
    "purge": Action(
        "Purge",
        ("id",),
        lambda f: f"Delete dead task {f['id']} of queue {f['queue']} for good.",
        _purge,
        "queue",
        danger=True,
        count=_one,
    ),
    "replay-group": Action(
        "Replay group",
        ("error_type",),
        lambda f: (
            f"Replay every dead task of queue {f['queue']} whose last error is {f['error_type']}."
        ),
        _replay_group,
        "dead",
        count=_group_size,
    ),
    "purge-group": Action(
        "Purge group",
        ("error_type",),
        lambda f: (
            f"Delete every dead task of queue "
            f"{f['queue']} whose last error is {f['error_type']}, for good."
        ),
        _purge_group,
        "dead",
        danger=True,
        count=_group_size,
    ),
    "cron-pause": Action(
        "Pause",
        ("name",),
        lambda f: f"Pause cron {f['name']} of queue {f['queue']}.",
        _cron_pause,
        "cron",
        danger=True,
    ),
    "cron-resume": Action(
        "Resume",
        ("name",),
        lambda f: f"Resume cron {f['name']} of queue {f['queue']}.",
        _cron_resume,
        "cron",
    ),
    "cron-run-now": Action(
        "Run now",
        ("name",),
        lambda f: f"Fire cron {f['name']} of queue {f['queue']} now (its schedule is unchanged).",
        _cron_run_now,
        "cron",
    ),
}


@dataclass(frozen=True)
class Actions:
    """The action route (confirmation page and POST) over the shared context."""

    ctx: Context

    async def action_page(self, request: Request) -> Response:
        verb = request.path_params["verb"]
        action = ACTIONS.get(verb)
        if action is None:
            raise HttpProblem(404, f"no action {verb!r}")
        if self.ctx.settings.read_only:
            raise HttpProblem(403, "this dashboard is read-only")
        fields = await self._fields(request, action)
        if request.method == "GET":
            counted = None
            if action.count is not None:
                counted = await action.count(await self.ctx.queue(fields["queue"]), fields)
            return self._confirm(request, verb, action, fields, counted)
        q = await self.ctx.queue(fields["queue"])
        done = await action.run(q, fields)
        back = self._back(action, fields)
        body = f'<h1>Done</h1><p class="notice" id="done">{e(done)}</p><p>{back}</p>'
        return self.ctx.page(request, "Done", body)

    async def _fields(self, request: Request, action: Action) -> dict[str, str]:
        source: Mapping[str, Any] = (
            request.query_params if request.method == "GET" else await form_fields(request)
        )
        q = await self.ctx.known_queue(source.get("queue"))
        fields = {"queue": q.name}
        for name in action.needs:
            value = source.get(name)
            if name == "delay_s" and request.method == "GET" and not value:
                value = "60"
            if not isinstance(value, str) or not value:
                raise HttpProblem(400, f"{name} is missing")
            fields[name] = value
        return fields

    def _back(self, action: Action, fields: Mapping[str, str]) -> str:
        if action.back == "task":
            return link(
                f"Back to task {fields['id']}", "/task", queue=fields["queue"], id=fields["id"]
            )
        if action.back == "cron":
            return link("Back to cron", "/cron")
        if action.back == "dead":
            queue = fields["queue"]
            back = link(f"queue {queue}", "/queue", queue=queue)
            return f"{link('Back to dead letters', '/dead')} · {back}"
        return link(f"Back to queue {fields['queue']}", "/queue", queue=fields["queue"])

    def _confirm(
        self,
        request: Request,
        verb: str,
        action: Action,
        fields: Mapping[str, str],
        counted: tuple[int, bool] | None,
    ) -> Response:
        inputs = "".join(
            f'<label>{e(k)} <input name="{e(k)}" value="{e(v)}"></label> '
            if k == "delay_s"
            else f'<input type="hidden" name="{e(k)}" value="{e(v)}">'
            for k, v in fields.items()
        )
        cls = ' class="danger"' if action.danger else ""
        verb_word = action.label.split()[0]  # "Replay group" asks "Replay 37 tasks?"
        if counted is None:
            title, yes = f"Confirm: {action.label}", f"Yes, {action.label.lower()}"
        else:
            n, exact = counted
            tasks = f"{'' if exact else 'at least '}{n} task{'' if n == 1 else 's'}"
            title, yes = f"{verb_word} {tasks}?", f"Yes, {verb_word.lower()} {tasks}"
        body = (
            f"<h1>{e(title)}</h1><p>{e(action.describe(fields))}</p>"
            f'<form method="post" action="/action/{e(verb)}">{inputs}'
            f'<input type="hidden" name="csrf" value="{e(request.state.csrf)}">'
            f'<button type="submit" id="confirm"{cls}>{e(yes)}</button>'
            f"</form><p>{self._back(action, fields)}</p>"
        )
        return self.ctx.page(request, f"Confirm {action.label}", body)
