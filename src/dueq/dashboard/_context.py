"""The context every part of the dashboard is handed: settings, Redis clients and queues.

One ``Context`` per app (``create_app`` makes it; its lifespan opens and closes the clients).
It opens queues as stored (``queue``, ``known_queue``, ``each_queue``, ``names``) and draws a
page in the dashboard's layout (``page``, ``problem``, ``buttons``), so the views, the API, the
actions and the auth routes share these without sharing a class.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, TypeVar

import redis
import redis.asyncio
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from dueq import discovery
from dueq._util.clock import Clock
from dueq._wire.codec import Encrypted, revealing
from dueq._wire.keys import layout_key, validate_queue_name
from dueq.async_queue import AsyncQueue
from dueq.dashboard._guard import SESSION_COOKIE, SESSION_S, HostRules, HttpProblem, Sessions
from dueq.dashboard._html import e, layout, link
from dueq.exceptions import ConfigurationError, DueqError
from dueq.health import HealthRules

#: What a route is: a page (a login redirect when not authorized), JSON or a chart ("api": a
#: 401), or open to anyone (login, logout, static files).
Kind = Literal["page", "api", "post", "open"]
Endpoint = Callable[[Request], Awaitable[Response]]

logger = logging.getLogger("dueq.dashboard")
_T = TypeVar("_T")
# Redis itself unreachable: no queue can be read, so the request fails as a whole (503)
REDIS_AWAY = (redis.ConnectionError, redis.TimeoutError)


# Here, with the Context that holds it, so that the context names no module above it (it was in
# _app, which imports every part: a circle of the whole package); dueq.dashboard exports it.
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
    are marked ``Secure`` (they are anyway when the request's scheme is https).

    ``health``: when a queue's row says ``warn`` or ``bad`` (``HealthRules``: the waits and
    the dead-letter window; see docs/dashboard-health.md).

    ``decrypt``: off by default, so an encrypted payload shows as its marker (``<encrypted k2,
    412 B>``) even when this process holds the key; ``True`` opens payloads with the keys of
    ``DUEQ_KEYS`` (read when the app is made), a ``dueq.Encrypted`` with its own keys (a KMS
    callable). Whoever can load the pages then reads the payloads: give it a token."""

    read_only: bool = False
    token: str | None = None
    queues: tuple[str, ...] = ()
    poll_s: float = 2.0
    allowed_hosts: tuple[str, ...] = ()
    session_s: float = SESSION_S
    behind_tls: bool = False
    health: HealthRules = field(default_factory=HealthRules)
    decrypt: bool | Encrypted = False


@dataclass(frozen=True)
class Unreadable:
    """A queue the dashboard could not read, and why (shown in its row)."""

    why: str


@dataclass
class Context:
    """The dashboard's shared state: ``settings``, the Redis at ``redis_url`` (named ``where``
    on the pages), its clients (set by the app's lifespan), the queues opened so far, the
    login ``sessions`` and the ``rules`` for Host and Origin."""

    redis_url: str
    settings: DashboardSettings
    where: str
    client: redis.asyncio.Redis | None = None
    sync_client: redis.Redis | None = None
    queues: dict[str, AsyncQueue] = field(default_factory=dict)
    clock: Clock = time.time
    sessions: Sessions = field(init=False)
    rules: HostRules = field(init=False)
    #: what payloads are opened with (None: encrypted ones show as their marker)
    codec: Encrypted | None = field(init=False)

    def __post_init__(self) -> None:
        if not self.settings.session_s > 0:
            raise ConfigurationError(
                f"session_s must be a positive number of seconds, got {self.settings.session_s!r}"
            )
        self.sessions = Sessions(self.settings.session_s, self.clock)
        self.rules = HostRules.of(self.settings.allowed_hosts)
        self.codec = revealing(self.settings.decrypt, "the dashboard's decrypt setting")

    async def queue(self, name: str) -> AsyncQueue:
        """Queue ``name`` as stored: sharded with its recorded shard count (read at each
        request, one GET, so a queue sharded after the dashboard started is seen right)."""
        assert self.client is not None, "the app's lifespan opens the client"
        shards = await discovery.async_shard_count(self.client, validate_queue_name(name))
        q = self.queues.get(name)
        if q is None or getattr(q, "shard_count", 1) != shards:
            q = self.queues[name] = AsyncQueue(name, self.client, shards=shards, codec=self.codec)
        return q

    async def each_queue(
        self, names: list[str], read: Callable[[AsyncQueue], Awaitable[_T]]
    ) -> dict[str, _T | Unreadable]:
        """``read`` of every queue at once; a queue that cannot be read (corrupted data, a
        command the ACL refuses) gives ``Unreadable`` instead of failing the whole page, the way
        ``dueq metrics`` shows it as down. Redis itself being away still fails the request (a
        503 from ``Auth.endpoint``): then no queue could be read."""

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
        if not await self.exists(name):
            raise HttpProblem(404, f"no queue named {name!r}")
        return await self.queue(name)

    async def exists(self, name: str) -> bool:
        """Whether ``name`` is one of ``names()``, without walking the keyspace: a configured
        queue, or (none configured) one ``discovery.async_queue_exists`` finds, but not a
        shard of a sharded queue (listed once, under its logical name). Two or three EXISTS."""
        if self.settings.queues:
            return name in self.settings.queues
        assert self.client is not None, "the app's lifespan opens the client"
        if not await discovery.async_queue_exists(self.client, name):
            return False
        logical, shard, _ = name.partition("#")
        return not (shard and logical and await self.client.exists(layout_key(logical)))

    def sync(self) -> redis.Redis:
        """A blocking client to the same Redis (opened on first use, closed by the app's
        lifespan), for the rules written for one: ``discover_workers``, the metrics."""
        if self.sync_client is None:
            self.sync_client = discovery.client_for_url(self.redis_url)
        return self.sync_client

    def secure(self, request: Request) -> bool:
        """Mark cookies ``Secure``: the browser reaches the dashboard over TLS."""
        return self.settings.behind_tls or request.url.scheme == "https"

    def page(self, request: Request, title: str, body: str, poll: str | None = None) -> Response:
        logged_in = bool(self.settings.token) and self.sessions.valid(
            request.cookies.get(SESSION_COOKIE)
        )
        return HTMLResponse(
            layout(
                title,
                body,
                where=self.where if getattr(request.state, "authorized", False) else None,
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

    def buttons(self, *items: str) -> str:
        return "" if self.settings.read_only else " ".join(items)
