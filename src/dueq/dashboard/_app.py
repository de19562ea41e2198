"""The dashboard's Starlette app: pages, JSON endpoints, SVG charts, actions and ``/metrics``.

Every view reads through ``AsyncQueue``'s public API and is paged or bucketed (a page of 50
tasks, a histogram of 48 buckets, the per-minute history), so its cost does not grow with
the queue. State changes go through one table (``ACTIONS``): a GET of ``/action/<verb>`` shows
what would happen (the confirmation step, changing nothing); a POST with the CSRF token does
it. ``_Dashboard.endpoint`` wraps every route with the checks (token, read-only, CSRF, Origin)
and the security headers, so no route can forget them; ``_Guard`` wraps the whole app and
refuses, before any route runs, a ``Host`` that is not allowed (DNS rebinding) and a request
body over ``MAX_FORM_BYTES`` (counted while it arrives, never read whole first).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import ipaddress
import logging
import secrets
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal, TypeVar
from urllib.parse import parse_qsl, urlsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import discovery
from .._async import AsyncQueue
from ..clock import Clock
from ..cron import CronDefinition
from ..exceptions import (
    ConfigurationError,
    CorruptQueue,
    CronNotFound,
    DueqError,
    TaskNotFound,
)
from ..keys import validate_queue_name
from ..registry import WorkerInfo, merge_workers
from ..task import HistoryPoint, QueueStats, TaskInfo, TaskPage
from . import _svg
from ._html import CSS, JS, button, chart, e, layout, link, live, pretty_json, table, url, when

Kind = Literal["page", "api", "post", "open"]
Endpoint = Callable[[Request], Awaitable[Response]]

logger = logging.getLogger("dueq.dashboard")
_T = TypeVar("_T")
# Redis itself unreachable: no queue can be read, so the request fails as a whole (503)
REDIS_AWAY = (redis.ConnectionError, redis.TimeoutError)
CSRF_COOKIE = "dueq_csrf"
SESSION_COOKIE = "dueq_session"
PAGE_SIZE = 50
#: Largest request body any route reads (the forms are a few hundred bytes). A longer one is
#: refused with 413 by its Content-Length before it is read, or as soon as it passes this.
MAX_FORM_BYTES = 64 * 1024
#: Names a person on this machine reaches the dashboard by (any port: a Host check is about
#: the name; a POST's Origin must also be at the dashboard's own port, see ``HostRules``).
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
#: How long a login lasts by default (then the login page again).
SESSION_S = 12 * 3600.0
#: Sessions kept at once; past it the oldest is ended (only logins with the token add one).
MAX_SESSIONS = 10_000
#: list_tasks calls one search may make (each looks at up to 1,000 tasks).
SEARCH_CALLS = 10
#: Dead tasks read to group them by error type (replay/purge of a group acts on all of it).
DEAD_GROUP_SCAN = 5_000
HISTOGRAM_BUCKETS = 48
HISTOGRAM_BUCKET = timedelta(minutes=30)
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",  # "no-referrer" makes Chromium send Origin: null
    "Cache-Control": "no-store",
}


@dataclass(frozen=True)
class DashboardSettings:
    """How the dashboard behaves: ``read_only`` hides and refuses every state change;
    ``token`` (when set) is required of every request (``Authorization: Bearer`` or the login
    form's session cookie, which lasts ``session_s`` or until ``/logout``); ``queues`` limits
    it to these queues (default: every queue found); ``poll_s`` is how often pages refresh
    their figures.

    ``allowed_hosts``: the names (``NAME`` at any port, ``NAME:PORT``, ``[v6]``) the dashboard
    answers to besides 127.0.0.1, localhost, ::1 and the address a request arrived on; any
    other ``Host`` gets a plain 400, and a POST's ``Origin`` must be one of them.
    ``behind_tls``: the browser reaches it over https (a TLS proxy in front), so its cookies
    are marked ``Secure`` (they are anyway when the request's scheme is https)."""

    read_only: bool = False
    token: str | None = None
    queues: tuple[str, ...] = ()
    poll_s: float = 2.0
    allowed_hosts: tuple[str, ...] = ()
    session_s: float = SESSION_S
    behind_tls: bool = False


def redis_label(redis_url: str) -> str:
    """What the pages call the Redis: scheme, host, port and database only. User, password
    and query parameters (TLS files, passwords) are left out, so no secret reaches a page."""
    try:
        parts = urlsplit(redis_url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:  # unparsable: name nothing of it
        return "redis"
    if parts.scheme == "unix":
        return f"unix://{parts.path}"
    return f"{parts.scheme}://{host}{port}{parts.path}"


def check_bind(host: str, *, token: str | None, insecure: bool) -> None:
    """ConfigurationError when ``host`` is not a loopback address and neither a token nor
    ``insecure`` was given: a dashboard can replay and purge tasks, so it does not go on the
    network open to anyone by accident."""
    if token or insecure:
        return
    if host == "localhost":
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ConfigurationError(
            f"refusing to serve the dashboard on {host}, which is not a loopback address, "
            "without --token (or --insecure to do it anyway)"
        )


def split_host(value: str) -> tuple[str, int | None]:
    """``(name, port)`` of a ``Host`` value or allow-list entry: ``name``, ``name:port``,
    ``[v6]``, ``[v6]:port`` or a bare IPv6 address; the name lowercased, an IP address in its
    canonical form. ValueError when it is not one of these."""
    text = value.strip().lower()
    port_text: str | None
    if text.startswith("["):
        name, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError(f"not a host: {value!r}")
        port_text = rest[1:] if rest else None
    elif text.count(":") > 1:  # a bare IPv6 address (an allow-list entry such as ::1)
        name, port_text = text, None
    else:
        name, colon, port_text = text.partition(":")
        port_text = port_text if colon else None
    if not name or any(c in name for c in "/@?#\\ []"):
        raise ValueError(f"not a host: {value!r}")
    port = None
    if port_text is not None:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ValueError(f"not a port: {value!r}")
        port = int(port_text)
    with contextlib.suppress(ValueError):  # a name, not an IP address: kept as it is
        name = str(ipaddress.ip_address(name))
    return name, port


def _default_port(scheme: str) -> int:
    return 443 if scheme in ("https", "wss") else 80


@dataclass(frozen=True)
class HostRules:
    """Which ``Host`` and ``Origin`` values the dashboard accepts (DNS rebinding defence).

    ``Host``: a loopback name or the address the connection arrived on (its bound address; for
    0.0.0.0, whichever of the machine's addresses the client used), at any port; or an
    ``allowed`` entry (at any port, or at the port it names). A rebinding page's Host is the
    attacker's name, so it matches none of these. ``Origin`` (of a POST): ``http``/``https``
    with one of the same names, where the loopback names and the arrival address count only
    at the dashboard's own port: another program on another local port is another origin,
    and cookies do not tell ports apart."""

    allowed: tuple[tuple[str, int | None], ...]

    @classmethod
    def of(cls, entries: tuple[str, ...]) -> HostRules:
        parsed = []
        for entry in entries:
            try:
                parsed.append(split_host(entry))
            except ValueError:
                raise ConfigurationError(
                    f"allowed host {entry!r} is not NAME, NAME:PORT or [IPv6]:PORT"
                ) from None
        return cls(tuple(parsed))

    def _local(self, name: str, scope: Scope) -> bool:
        server = scope.get("server")
        if name in LOOPBACK_NAMES:
            return True
        if not server or not isinstance(server[0], str):
            return False
        try:
            return name == str(ipaddress.ip_address(server[0]))
        except ValueError:  # not an IP address (a unix socket path): nothing to match
            return False

    def _listed(self, name: str, port: int) -> bool:
        return any(name == n and (p is None or p == port) for n, p in self.allowed)

    def host_ok(self, host: str | None, scope: Scope) -> bool:
        if not host:
            return False
        try:
            name, port = split_host(host)
        except ValueError:
            return False
        if self._local(name, scope):
            return True
        return self._listed(name, port or _default_port(scope.get("scheme", "http")))

    def origin_ok(self, origin: str, scope: Scope) -> bool:
        try:
            parts = urlsplit(origin)
            if parts.scheme not in ("http", "https") or parts.path or "@" in parts.netloc:
                return False
            name, port = split_host(parts.netloc)
        except ValueError:
            return False
        port = port or _default_port(parts.scheme)
        server = scope.get("server")
        if self._local(name, scope) and server and port == server[1]:
            return True
        return self._listed(name, port)


@dataclass
class Sessions:
    """Logged-in sessions, in the app's memory: a random id per login (the cookie holds it,
    the server only its SHA-256), ended by expiry, ``/logout`` or a restart of the server."""

    lifetime_s: float
    clock: Clock
    expires_at: dict[str, float] = field(default_factory=dict)

    @staticmethod
    def _digest(value: str) -> str:
        return hashlib.sha256(value.encode()).hexdigest()

    def open(self) -> str:
        now = self.clock()
        for key in [k for k, at in self.expires_at.items() if at <= now]:
            del self.expires_at[key]
        while len(self.expires_at) >= MAX_SESSIONS:  # the oldest first (insertion order)
            del self.expires_at[next(iter(self.expires_at))]
        value = secrets.token_urlsafe(32)
        self.expires_at[self._digest(value)] = now + self.lifetime_s
        return value

    def valid(self, value: str | None) -> bool:
        if not value:
            return False
        key = self._digest(value)
        at = self.expires_at.get(key)
        if at is None:
            return False
        if at <= self.clock():
            del self.expires_at[key]
            return False
        return True

    def close(self, value: str | None) -> None:
        if value:
            self.expires_at.pop(self._digest(value), None)


@dataclass(frozen=True)
class Action:
    """A state change: ``needs`` the form fields it reads, ``describe`` says what it will do
    (the confirmation page), ``run`` does it and says what happened."""

    label: str
    needs: tuple[str, ...]
    describe: Callable[[Mapping[str, str]], str]
    run: Callable[[AsyncQueue, Mapping[str, str]], Awaitable[str]]
    back: Literal["queue", "task", "cron"]
    danger: bool = False


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
    return f"task {f['id']} is due in {delay_s:g} s" if done else f"task {f['id']} not scheduled"


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
        lambda f: f"Make task {f['id']} of queue {f['queue']} due now (a dead one is replayed).",
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
    ),
    "purge": Action(
        "Purge",
        ("id",),
        lambda f: f"Delete dead task {f['id']} of queue {f['queue']} for good.",
        _purge,
        "queue",
        danger=True,
    ),
    "replay-group": Action(
        "Replay group",
        ("error_type",),
        lambda f: (
            f"Replay every dead task of queue {f['queue']} whose last error is {f['error_type']}."
        ),
        _replay_group,
        "queue",
    ),
    "purge-group": Action(
        "Purge group",
        ("error_type",),
        lambda f: (
            f"Delete every dead task of queue "
            f"{f['queue']} whose last error is {f['error_type']}, for good."
        ),
        _purge_group,
        "queue",
        danger=True,
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
class Unreadable:
    """A queue the dashboard could not read, and why (shown in its row)."""

    why: str


class HttpProblem(Exception):
    """Answer the request with ``status`` and ``message`` (a page, or JSON for the API)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class BodyTooLarge(HttpProblem):
    """The request body passed ``MAX_FORM_BYTES`` while it was being received."""

    def __init__(self) -> None:
        super().__init__(413, f"request body too large (at most {MAX_FORM_BYTES} bytes)")


#: Answers of the guard itself: no page, no data, and the connection closed (a refused body
#: is not read to its end).
CLOSE = {"Connection": "close", **SECURITY_HEADERS}


class _Guard:
    """ASGI middleware in front of every route: a ``Host`` outside ``HostRules`` gets a plain
    400; a body whose Content-Length is over ``MAX_FORM_BYTES`` gets 413 before a byte of it
    is read, and one that passes it while arriving (chunked, or a lying length) raises
    ``BodyTooLarge`` from ``receive``, which the route answers with 413 (or this does)."""

    def __init__(self, app: ASGIApp, rules: HostRules) -> None:
        self.app = app
        self.rules = rules

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if not self.rules.host_ok(headers.get("host"), scope):
            answer = PlainTextResponse(
                "Bad Request: the dashboard does not answer to this Host (see --allow-host)",
                status_code=400,
                headers=CLOSE,
            )
            await answer(scope, receive, send)
            return
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_FORM_BYTES):
            answer = PlainTextResponse(str(BodyTooLarge()), status_code=413, headers=CLOSE)
            await answer(scope, receive, send)
            return
        received = 0
        started = False
        # a body the route answered without reading to its end (a refused login, an
        # unauthorized POST): close the connection rather than let the server drain it
        body_done = length in (None, "0") and "transfer-encoding" not in headers

        async def counted() -> Message:
            nonlocal received, body_done
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > MAX_FORM_BYTES:
                    raise BodyTooLarge()
                body_done = body_done or not message.get("more_body", False)
            return message

        async def sending(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if not body_done:
                    message = {
                        **message,
                        "headers": [*message.get("headers", []), (b"connection", b"close")],
                    }
            await send(message)

        try:
            await self.app(scope, counted, sending)
        except BodyTooLarge as exc:
            if started:
                raise
            answer = PlainTextResponse(str(exc), status_code=413, headers=CLOSE)
            await answer(scope, receive, send)


async def form_fields(request: Request) -> dict[str, str]:
    """The fields of a URL-encoded form POST (the only kind the pages send), read once and
    counted as it arrives: past ``MAX_FORM_BYTES`` it is refused, never read whole first.
    Parsed here rather than by Starlette, which would need python-multipart for it."""
    if not hasattr(request.state, "form"):
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_FORM_BYTES:
                raise BodyTooLarge()
            chunks.append(chunk)
        body = b"".join(chunks)
        pairs = parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)
        request.state.form = dict(pairs)
    form: dict[str, str] = request.state.form
    return form


def _stats_json(s: QueueStats) -> dict[str, Any]:
    return {
        "scheduled": s.scheduled,
        "due_now": s.due_now,
        "leased": s.leased,
        "dead": s.dead,
        "paused": s.settings.paused,
        "oldest_due_lag_s": round(s.oldest_due_lag_s, 3),
        "next_due_at": s.next_due_at.isoformat() if s.next_due_at else None,
    }


def _last_error(t: TaskInfo) -> str:
    return t.errors[-1].type if t.errors else ""


def _sum_history(histories: list[list[HistoryPoint]]) -> list[HistoryPoint]:
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


def _outcome(d: CronDefinition) -> str:
    """The last firing's outcome (escaped HTML): what became of it, when, and the error."""
    if d.last_outcome is None:
        return "-"
    error = f" ({d.last_error_type})" if d.last_error_type else ""
    return e(f"{d.last_outcome}{error} at {when(d.last_outcome_at)}")


def _lag(seconds: float) -> str:
    return f"{seconds:.1f} s"


@dataclass
class _Dashboard:
    redis_url: str
    settings: DashboardSettings
    where: str
    client: redis.asyncio.Redis | None = None
    sync_client: redis.Redis | None = None
    queues: dict[str, AsyncQueue] = field(default_factory=dict)
    clock: Clock = time.time
    sessions: Sessions = field(init=False)
    rules: HostRules = field(init=False)

    def __post_init__(self) -> None:
        if not self.settings.session_s > 0:
            raise ConfigurationError(
                f"session_s must be a positive number of seconds, got {self.settings.session_s!r}"
            )
        self.sessions = Sessions(self.settings.session_s, self.clock)
        self.rules = HostRules.of(self.settings.allowed_hosts)

    # -- plumbing ----------------------------------------------------------------------------

    async def queue(self, name: str) -> AsyncQueue:
        """Queue ``name`` as stored: sharded with its recorded shard count (read at each
        request, one GET, so a queue sharded after the dashboard started is seen right)."""
        assert self.client is not None, "the app's lifespan opens the client"
        shards = await discovery.async_shard_count(self.client, validate_queue_name(name))
        q = self.queues.get(name)
        if q is None or getattr(q, "shard_count", 1) != shards:
            q = self.queues[name] = AsyncQueue(name, self.client, shards=shards)
        return q

    async def open_queues(self, names: list[str]) -> list[AsyncQueue]:
        return [await self.queue(n) for n in names]

    async def each_queue(
        self, names: list[str], read: Callable[[AsyncQueue], Awaitable[_T]]
    ) -> dict[str, _T | Unreadable]:
        """``read`` of every queue at once; a queue that cannot be read (corrupted data, a
        command the ACL refuses) gives ``Unreadable`` instead of failing the whole page, the way
        ``dueq metrics`` shows it as down. Redis itself being away still fails the request (a
        503 from ``_checked``): then no queue could be read."""

        async def one(name: str) -> _T | Unreadable:
            try:
                return await read(await self.queue(name))
            except REDIS_AWAY:
                raise
            except (redis.RedisError, DueqError, ValueError) as exc:
                # this queue only: the others are still shown, this one says why it is not
                logger.warning("dashboard: cannot read queue %r: %s", name, exc)
                return Unreadable(f"{type(exc).__name__}: {exc}")

        return dict(zip(names, await asyncio.gather(*(one(n) for n in names)), strict=True))

    async def names(self) -> list[str]:
        if self.settings.queues:
            return list(self.settings.queues)
        return await discovery.async_queue_names(self.client)

    async def known_queue(self, name: str | None) -> AsyncQueue:
        if not name:
            raise HttpProblem(400, "which queue? (?queue=NAME)")
        try:
            validate_queue_name(name)
        except ConfigurationError as exc:
            raise HttpProblem(400, str(exc)) from None
        if name not in await self.names():
            raise HttpProblem(404, f"no queue named {name!r}")
        return await self.queue(name)

    def authorized(self, request: Request) -> bool:
        token = self.settings.token
        if not token:
            return True
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.encode(), token.encode()):
            return True
        return self.sessions.valid(request.cookies.get(SESSION_COOKIE))

    def secure(self, request: Request) -> bool:
        """Mark cookies ``Secure``: the browser reaches the dashboard over TLS."""
        return self.settings.behind_tls or request.url.scheme == "https"

    async def csrf_ok(self, request: Request) -> bool:
        form = await form_fields(request)
        cookie = request.cookies.get(CSRF_COOKIE, "")
        given = form.get("csrf", "")
        return bool(cookie) and isinstance(given, str) and hmac.compare_digest(given, cookie)

    def page(self, request: Request, title: str, body: str, poll: str | None = None) -> Response:
        logged_in = bool(self.settings.token) and self.sessions.valid(
            request.cookies.get(SESSION_COOKIE)
        )
        return HTMLResponse(
            layout(
                title,
                body,
                where=self.where,
                poll=poll,
                read_only=self.settings.read_only,
                logout_csrf=request.state.csrf if logged_in else None,
            )
        )

    def problem(self, request: Request, kind: Kind, status: int, message: str) -> Response:
        if kind == "api":
            headers = {"Connection": "close"} if status == 413 else None
            return JSONResponse({"error": message}, status_code=status, headers=headers)
        body = f'<h1>{status}</h1><p class="problem">{e(message)}</p><p>{link("Overview", "/")}</p>'
        response = self.page(request, str(status), body)
        response.status_code = status
        if status == 413:  # the rest of the body is not read: close rather than drain it
            response.headers["Connection"] = "close"
        return response

    def endpoint(self, kind: Kind, handler: Endpoint) -> Endpoint:
        """``handler`` behind the checks: token (unless ``open``), read-only and CSRF for
        POSTs, a same-origin POST; security headers and the CSRF cookie on every answer."""

        async def run(request: Request) -> Response:
            request.state.csrf = request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(32)
            response = await self._checked(kind, handler, request)
            for name, value in SECURITY_HEADERS.items():
                response.headers.setdefault(name, value)
            if CSRF_COOKIE not in request.cookies:
                response.set_cookie(
                    CSRF_COOKIE,
                    request.state.csrf,
                    path="/",
                    httponly=True,
                    samesite="strict",
                    secure=self.secure(request),
                )
            return response

        return run

    async def _checked(self, kind: Kind, handler: Endpoint, request: Request) -> Response:
        if kind != "open" and not self.authorized(request):
            if kind == "page":
                query = request.url.query
                back = request.url.path + (f"?{query}" if query else "")
                return RedirectResponse(url("/login", next=back), status_code=303)
            return self.problem(request, "api", 401, "a token is needed (Authorization: Bearer)")
        try:
            if request.method == "POST":
                self._post_allowed(request)
                if not await self.csrf_ok(request):
                    raise HttpProblem(403, "the CSRF token is missing or wrong: reload the page")
            return await handler(request)
        except HttpProblem as exc:
            return self.problem(request, kind, exc.status, exc.message)
        except (TaskNotFound, CronNotFound) as exc:
            return self.problem(request, kind, 404, str(exc))
        except CorruptQueue as exc:  # a queue key of the wrong type: the data, not the input
            return self.problem(request, kind, 500, f"Redis: {exc}")
        except DueqError as exc:  # bad input from the form or URL: say why, change nothing
            return self.problem(request, kind, 400, str(exc))
        except REDIS_AWAY as exc:  # Redis down: say so, the page retries
            return self.problem(request, kind, 503, f"Redis: {type(exc).__name__}: {exc}")
        except redis.RedisError as exc:  # Redis answered with an error (bad data, ACL): say so
            return self.problem(request, kind, 500, f"Redis: {type(exc).__name__}: {exc}")

    def _post_allowed(self, request: Request) -> None:
        if self.settings.read_only and request.url.path not in ("/login", "/logout"):
            raise HttpProblem(403, "this dashboard is read-only")
        origin = request.headers.get("origin")
        # checked against the allowed names, not the request's Host (which a rebinding page
        # controls); the Host itself was checked by _Guard before any route ran
        if origin is not None and not self.rules.origin_ok(origin, request.scope):
            raise HttpProblem(403, "cross-origin POST refused")

    def buttons(self, *items: str) -> str:
        return "" if self.settings.read_only else " ".join(items)

    # -- data --------------------------------------------------------------------------------

    async def overview_data(self) -> dict[str, Any]:
        names = await self.names()
        stats = await self.each_queue(names, lambda q: q.stats())
        workers = await self.workers(names)
        rows = {
            n: {"error": s.why}
            if isinstance(s, Unreadable)
            else {**_stats_json(s), "workers": len(workers[n])}
            for n, s in stats.items()
        }
        alive = len({w.worker_id for found in workers.values() for w in found})
        live_rows = self._live_rows(rows)
        live_rows["workers_alive"] = alive
        return {"queues": rows, "workers_alive": alive, "live": live_rows}

    async def workers(self, names: list[str]) -> dict[str, list[WorkerInfo]]:
        """The live workers of each queue (a worker serving several is in each list)."""
        found = await self.each_queue(names, lambda q: q.workers())
        return {n: [] if isinstance(w, Unreadable) else w for n, w in found.items()}

    @staticmethod
    def _live_rows(rows: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, row in rows.items():
            for key, value in row.items():
                out[f"{name}.{key}"] = (
                    _lag(value)
                    if key == "oldest_due_lag_s"
                    else ("paused" if value else "running")
                    if key == "paused"
                    else value
                )
        return out

    async def search(
        self, q: AsyncQueue, state: Literal["scheduled", "leased", "dead"], request: Request
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

    async def dead_groups(self, q: AsyncQueue) -> tuple[Counter[str], int]:
        groups: Counter[str] = Counter()
        looked, cursor = 0, None
        while looked < DEAD_GROUP_SCAN:
            page = await q.list_tasks("dead", limit=1000, cursor=cursor)
            groups.update(_last_error(t) for t in page.tasks)
            looked += len(page.tasks)
            cursor = page.cursor
            if cursor is None:
                break
        return groups, looked

    # -- pages -------------------------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        data = await self.overview_data()
        rows = []
        for name, s in data["queues"].items():
            if "error" in s:
                rows.append(
                    f"<tr><td>{link(name, '/queue', queue=name)}</td>"
                    f'<td colspan="7" class="problem">unreadable: {e(s["error"])}</td></tr>'
                )
                continue
            rows.append(
                f"<tr><td>{link(name, '/queue', queue=name)}</td>"
                + live(f"{name}.scheduled", s["scheduled"], "n")
                + live(f"{name}.due_now", s["due_now"], "n")
                + live(f"{name}.leased", s["leased"], "n")
                + live(f"{name}.dead", s["dead"], "n")
                + live(f"{name}.paused", "paused" if s["paused"] else "running")
                + live(f"{name}.oldest_due_lag_s", _lag(s["oldest_due_lag_s"]), "n")
                + live(f"{name}.workers", s["workers"], "n")
                + "</tr>"
            )
        head = [
            "queue",
            "scheduled",
            "due now",
            "leased",
            "dead",
            "state",
            "oldest due lag",
            "workers",
        ]
        body = (
            "<h1>Queues</h1>"
            + table(head, rows, empty="no queue in this Redis yet")
            + f'<p>{link("Workers", "/workers")} alive: <span data-live="workers_alive">'
            f"{e(data['workers_alive'])}</span></p>"
            + "<h2>Throughput, last hour (every queue)</h2>"
            + chart("throughput chart", "/chart/throughput.svg")
        )
        return self.page(request, "Overview", body, poll="/api/overview")

    async def queue_page(self, request: Request) -> Response:
        q = await self.known_queue(request.query_params.get("queue"))
        stats = await q.stats()
        s = _stats_json(stats)
        leased = await self.search(q, "leased", request)
        scheduled = await self.search(q, "scheduled", request)
        dead_page = await self.search(q, "dead", request)
        groups, grouped = await self.dead_groups(q)
        n = q.name
        state = "paused" if s["paused"] else "running"
        toggle = self.buttons(
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
                + live(f"{n}.oldest_due_lag_s", _lag(s["oldest_due_lag_s"]), "n")
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
                self.buttons(
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
            f"<tr><td>{link(t.id, '/task', queue=n, id=t.id)}</td><td>{e(_last_error(t))}</td>"
            f"<td>{e(when(t.died_at))}</td><td class='n'>{t.attempt}</td><td>"
            + self.buttons(
                button("Replay", "replay", {"queue": n, "id": t.id}),
                button("Purge", "purge", {"queue": n, "id": t.id}, danger=True),
            )
            + "</td></tr>"
            for t in dead_page.tasks
        ]
        p = request.query_params
        search = (
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
            f"<h1>Queue {e(n)} {toggle}</h1>{counts}"
            f"<p>{link('Cron definitions of this queue', '/cron', queue=n)}</p>"
            '<div class="charts"><div><h2>Throughput, last hour</h2>'
            + chart("throughput chart", url("/chart/throughput.svg", queue=n))
            + "</div><div><h2>Due in the next 24 hours</h2>"
            + chart("due histogram", url("/chart/due.svg", queue=n))
            + "</div></div>"
            + f"<h2>Leased ({len(leased.tasks)} shown)</h2>"
            + table(["id", "holder", "lease deadline", "attempt"], leased_rows)
            + f"<h2>Scheduled</h2>{search}"
            + table(["id", "due", "attempt", "priority", "payload"], sched_rows, empty="no match")
            + looked
            + more
            + "<h2>Dead, by error type</h2>"
            + table(["error type", "tasks", ""], group_rows)
            + grouped_note
            + "<h2>Dead tasks</h2>"
            + table(["id", "last error", "died", "attempts", ""], dead_rows)
            + dead_more
        )
        return self.page(request, f"Queue {n}", body, poll=url("/api/queue", queue=n))

    async def task_page(self, request: Request) -> Response:
        q = await self.known_queue(request.query_params.get("queue"))
        task_id = request.query_params.get("id", "")
        info = await q.get(task_id) if task_id else None
        if info is None:
            raise HttpProblem(404, f"no task {task_id!r} in queue {q.name!r}")
        n, ids = q.name, {"queue": q.name, "id": info.id}
        actions: list[str] = []
        if info.state in ("scheduled", "leased"):
            actions.append(button("Cancel", "cancel", ids, danger=True))
        if info.state in ("scheduled", "dead"):
            actions.append(button("Run now", "run-now", ids))
        if info.state == "scheduled":
            actions.append(button("Reschedule", "reschedule", ids))
        if info.state == "dead":
            actions.append(button("Replay", "replay", ids))
            actions.append(button("Purge", "purge", ids, danger=True))
        facts = [
            ("queue", link(n, "/queue", queue=n)),
            ("state", e(info.state)),
            ("attempts", e(info.attempt)),
            ("due", e(when(info.due_at))),
            ("lease deadline", e(when(info.lease_deadline))),
            ("holder", e(info.holder or "-")),
            ("died", e(when(info.died_at))),
            ("priority", e(info.priority)),
            ("key", e(info.key or "-")),
        ]
        errors = "".join(
            f"<h3>attempt {r.attempt}: {e(r.type)} at {e(when(r.at))}</h3>"
            f"<p>{e(r.message)}</p><pre>{e(r.traceback or '(no traceback)')}</pre>"
            for r in info.errors
        )
        body = (
            f"<h1>Task {e(info.id)}</h1><p>{self.buttons(*actions)}</p>"
            + table([], (f"<tr><th>{e(k)}</th><td>{v}</td></tr>" for k, v in facts))
            + f'<h2>Payload</h2><pre id="payload">{e(pretty_json(info.payload))}</pre>'
            + f"<h2>Errors ({len(info.errors)})</h2>"
            + (errors or '<p class="muted">none</p>')
        )
        return self.page(request, f"Task {info.id}", body)

    async def workers_page(self, request: Request) -> Response:
        workers = await self.alive()
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
        return self.page(request, "Workers", body, poll="/api/workers")

    async def alive(self) -> list[WorkerInfo]:
        """Every live worker of the shown queues, once each, by id."""
        by_queue = await self.workers(await self.names())
        return merge_workers(by_queue.values())  # the rule discover_workers uses

    async def api_workers(self, request: Request) -> Response:
        workers = await self.alive()
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

    async def cron_page(self, request: Request) -> Response:
        only = request.query_params.get("queue")
        names = [(await self.known_queue(only)).name] if only else await self.names()
        lists = await self.each_queue(names, lambda q: q.cron.list())
        rows = []
        for n, defs in lists.items():
            if isinstance(defs, Unreadable):
                rows.append(
                    f"<tr><td>{link(n, '/queue', queue=n)}</td>"
                    f'<td colspan="8" class="problem">unreadable: {e(defs.why)}</td></tr>'
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
                    f"<td><code>{e(d.expr)}</code> {e(d.tz)}</td>"
                    f"<td>{e(when(d.next_at))}</td><td>{e(when(d.last_fired_at))}</td>"
                    f"<td>{_outcome(d)}</td>"
                    f"<td>{'paused' if d.paused else 'active'}</td>"
                    f"<td>{e(d.problem or '')}</td><td>"
                    + self.buttons(toggle, button("Run now", "cron-run-now", fields))
                    + "</td></tr>"
                )
        head = [
            "queue",
            "name",
            "schedule",
            "next firing",
            "last firing",
            "last outcome",
            "state",
            "problem",
            "",
        ]
        body = "<h1>Cron</h1>" + table(head, rows, empty="no cron definitions")
        return self.page(request, "Cron", body)

    async def action_page(self, request: Request) -> Response:
        verb = request.path_params["verb"]
        action = ACTIONS.get(verb)
        if action is None:
            raise HttpProblem(404, f"no action {verb!r}")
        if self.settings.read_only:
            raise HttpProblem(403, "this dashboard is read-only")
        fields = await self._fields(request, action)
        if request.method == "GET":
            return self._confirm(request, verb, action, fields)
        q = await self.queue(fields["queue"])
        done = await action.run(q, fields)
        back = self._back(action, fields)
        body = f'<h1>Done</h1><p class="notice" id="done">{e(done)}</p><p>{back}</p>'
        return self.page(request, "Done", body)

    async def _fields(self, request: Request, action: Action) -> dict[str, str]:
        source: Mapping[str, Any] = (
            request.query_params if request.method == "GET" else await form_fields(request)
        )
        q = await self.known_queue(source.get("queue"))
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
        return link(f"Back to queue {fields['queue']}", "/queue", queue=fields["queue"])

    def _confirm(
        self, request: Request, verb: str, action: Action, fields: Mapping[str, str]
    ) -> Response:
        inputs = "".join(
            f'<label>{e(k)} <input name="{e(k)}" value="{e(v)}"></label> '
            if k == "delay_s"
            else f'<input type="hidden" name="{e(k)}" value="{e(v)}">'
            for k, v in fields.items()
        )
        cls = ' class="danger"' if action.danger else ""
        body = (
            f"<h1>Confirm: {e(action.label)}</h1><p>{e(action.describe(fields))}</p>"
            f'<form method="post" action="/action/{e(verb)}">{inputs}'
            f'<input type="hidden" name="csrf" value="{e(request.state.csrf)}">'
            f'<button type="submit" id="confirm"{cls}>Yes, {e(action.label.lower())}</button>'
            f"</form><p>{self._back(action, fields)}</p>"
        )
        return self.page(request, f"Confirm {action.label}", body)

    async def login_page(self, request: Request) -> Response:
        nxt = request.query_params.get("next", "/")
        if request.method == "POST":
            form = await form_fields(request)
            given = form.get("token", "")
            nxt = str(form.get("next", "/"))
            token = self.settings.token or ""
            if token and isinstance(given, str) and hmac.compare_digest(given, token):
                safe = nxt if nxt.startswith("/") and not nxt.startswith("//") else "/"
                response = RedirectResponse(safe, status_code=303)
                self.sessions.close(request.cookies.get(SESSION_COOKIE))  # a new id per login
                response.set_cookie(
                    SESSION_COOKIE,
                    self.sessions.open(),
                    max_age=int(self.settings.session_s),
                    path="/",
                    httponly=True,
                    samesite="strict",
                    secure=self.secure(request),
                )
                return response
            raise HttpProblem(401, "wrong token")
        body = (
            '<h1>Log in</h1><form method="post" action="/login">'
            f'<input type="hidden" name="csrf" value="{e(request.state.csrf)}">'
            f'<input type="hidden" name="next" value="{e(nxt)}">'
            '<input type="password" name="token" placeholder="token" autofocus> '
            '<button type="submit">Log in</button></form>'
        )
        return self.page(request, "Log in", body)

    async def logout(self, request: Request) -> Response:
        """End this browser's session on the server (its cookie no longer works) and drop it."""
        self.sessions.close(request.cookies.get(SESSION_COOKIE))
        response = RedirectResponse("/login" if self.settings.token else "/", status_code=303)
        response.delete_cookie(
            SESSION_COOKIE,
            path="/",
            httponly=True,
            samesite="strict",
            secure=self.secure(request),
        )
        return response

    # -- JSON and charts ---------------------------------------------------------------------

    async def api_overview(self, request: Request) -> Response:
        return JSONResponse(await self.overview_data())

    async def api_queue(self, request: Request) -> Response:
        q = await self.known_queue(request.query_params.get("queue"))
        stats = await q.stats()
        hist = await q.due_histogram(HISTOGRAM_BUCKET, HISTOGRAM_BUCKETS)
        row = _stats_json(stats)
        live_row = self._live_rows({q.name: row})
        live_row[f"{q.name}.next_due_at"] = when(stats.next_due_at)
        return JSONResponse(
            {
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
        q = await self.known_queue(request.query_params.get("queue"))
        state = request.query_params.get("state", "scheduled")
        if state not in ("scheduled", "leased", "dead"):
            raise HttpProblem(400, "state must be scheduled, leased or dead")
        page = await self.search(q, state, request)  # type: ignore[arg-type]
        return JSONResponse(
            {
                "tasks": [t.to_json(q.name) for t in page.tasks],
                "cursor": page.cursor,
                "looked_at": page.looked_at,
            }
        )

    async def api_task(self, request: Request) -> Response:
        q = await self.known_queue(request.query_params.get("queue"))
        info = (
            await q.get(request.query_params.get("id", ""))
            if request.query_params.get("id")
            else None
        )
        if info is None:
            raise HttpProblem(404, "no such task")
        return JSONResponse(info.to_json(q.name))

    async def api_dead_groups(self, request: Request) -> Response:
        q = await self.known_queue(request.query_params.get("queue"))
        groups, looked = await self.dead_groups(q)
        return JSONResponse({"groups": dict(groups.most_common()), "looked_at": looked})

    async def api_cron(self, request: Request) -> Response:
        names = await self.names()
        lists = await self.each_queue(names, lambda q: q.cron.list())
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
                    }
                    for d in defs
                ]
                for n, defs in lists.items()
                if defs and not isinstance(defs, Unreadable)
            }
        )

    async def throughput_svg(self, request: Request) -> Response:
        only = request.query_params.get("queue")
        names = [(await self.known_queue(only)).name] if only else await self.names()
        found = await self.each_queue(names, lambda q: q.history(60))
        histories = [h for h in found.values() if not isinstance(h, Unreadable)]
        title = f"queue {only}" if only else f"{len(names)} queues"
        svg = _svg.throughput(_sum_history(histories), f"per minute, {title}")
        return Response(svg, media_type="image/svg+xml")

    async def due_svg(self, request: Request) -> Response:
        q = await self.known_queue(request.query_params.get("queue"))
        hist = await q.due_histogram(HISTOGRAM_BUCKET, HISTOGRAM_BUCKETS)
        return Response(_svg.due_histogram(hist, f"queue {q.name}"), media_type="image/svg+xml")

    async def metrics(self, request: Request) -> Response:
        try:
            from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

            from ..metrics import QueueCollector
        except ImportError as exc:
            raise HttpProblem(501, f"{exc}: pip install 'dueq[metrics]'") from None
        if self.sync_client is None:
            self.sync_client = discovery.client_for_url(self.redis_url)
        registry = CollectorRegistry()
        registry.register(QueueCollector(self.sync_client, list(self.settings.queues) or None))
        text = await run_in_threadpool(generate_latest, registry)
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name == "dashboard.css":
            return Response(CSS, media_type="text/css")
        if name == "dashboard.js":
            return Response(JS, media_type="text/javascript")
        raise HttpProblem(404, "no such file")


def create_app(
    redis_url: str, settings: DashboardSettings | None = None, *, clock: Clock | None = None
) -> Starlette:
    """The dashboard as an ASGI app over the Redis at ``redis_url`` (serve it with uvicorn).

    The Redis client is opened by the app's lifespan (on the server's event loop) and closed
    when it ends. The pages name the Redis by ``redis_label(redis_url)``: never its password.
    ``clock`` (epoch seconds) times the login sessions; default ``time.time``.
    """
    if settings is None:
        settings = DashboardSettings()
    for name in settings.queues:
        validate_queue_name(name)
    dash = _Dashboard(redis_url, settings, redis_label(redis_url), clock=clock or time.time)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        node_url = discovery.cluster_node_url(redis_url)
        client: Any = (
            redis.asyncio.Redis.from_url(redis_url)
            if node_url is None
            else redis.asyncio.cluster.RedisCluster.from_url(node_url)
        )
        dash.client = client
        try:
            yield
        finally:
            await dash.client.aclose()
            if dash.sync_client is not None:
                dash.sync_client.close()

    def route(
        path: str, kind: Kind, handler: Endpoint, methods: tuple[str, ...] = ("GET",)
    ) -> Route:
        return Route(path, dash.endpoint(kind, handler), methods=list(methods))

    routes = [
        route("/", "page", dash.overview),
        route("/queue", "page", dash.queue_page),
        route("/task", "page", dash.task_page),
        route("/workers", "page", dash.workers_page),
        route("/cron", "page", dash.cron_page),
        route("/action/{verb}", "page", dash.action_page, ("GET", "POST")),
        route("/login", "open", dash.login_page, ("GET", "POST")),
        route("/logout", "open", dash.logout, ("POST",)),
        route("/static/{name}", "open", dash.static),
        route("/api/overview", "api", dash.api_overview),
        route("/api/queue", "api", dash.api_queue),
        route("/api/tasks", "api", dash.api_tasks),
        route("/api/task", "api", dash.api_task),
        route("/api/dead-groups", "api", dash.api_dead_groups),
        route("/api/cron", "api", dash.api_cron),
        route("/api/workers", "api", dash.api_workers),
        route("/chart/throughput.svg", "api", dash.throughput_svg),
        route("/chart/due.svg", "api", dash.due_svg),
        route("/metrics", "api", dash.metrics),
    ]
    app = Starlette(
        routes=routes, lifespan=lifespan, middleware=[Middleware(_Guard, rules=dash.rules)]
    )
    app.state.dashboard = dash
    return app


__all__ = [
    "ACTIONS",
    "DashboardSettings",
    "check_bind",
    "create_app",
    "redis_label",
]
