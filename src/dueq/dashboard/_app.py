"""The dashboard's Starlette app: its settings, its routes and the lifespan of its Redis clients.

``create_app`` assembles the parts, each a module of one concern over one shared ``Context``
(``_context``): the guard (``_guard``: Host and Origin allow-list, body limit, sessions) and
the per-route auth (``_auth``: token, login, CSRF, read-only), the read views (``_views``),
the JSON API (``_api``), the actions with their confirmation pages (``_actions``) and the SVG
charts and ``/metrics`` (``_charts``). Every route is wrapped by ``Auth.endpoint``, so no
route can forget the checks; ``Guard`` wraps the whole app and refuses, before any route runs,
a ``Host`` that is not allowed (DNS rebinding) and a request body over ``MAX_FORM_BYTES``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import redis.asyncio
import redis.asyncio.cluster
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Route

from dueq import discovery
from dueq._util.clock import Clock
from dueq._wire.keys import validate_queue_name
from dueq.dashboard._actions import ACTIONS, Actions
from dueq.dashboard._api import Api
from dueq.dashboard._auth import Auth
from dueq.dashboard._charts import Charts
from dueq.dashboard._context import Context, DashboardSettings, Endpoint, Kind
from dueq.dashboard._guard import Guard, check_bind
from dueq.dashboard._views import Views


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
    ctx = Context(redis_url, settings, redis_label(redis_url), clock=clock or time.time)
    auth, views, api = Auth(ctx), Views(ctx), Api(ctx)
    actions, charts = Actions(ctx), Charts(ctx)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        node_url = discovery.cluster_node_url(redis_url)
        client: Any = (
            redis.asyncio.Redis.from_url(redis_url)
            if node_url is None
            else redis.asyncio.cluster.RedisCluster.from_url(node_url)
        )
        ctx.client = client
        try:
            yield
        finally:
            await ctx.client.aclose()
            if ctx.sync_client is not None:
                ctx.sync_client.close()

    def route(
        path: str, kind: Kind, handler: Endpoint, methods: tuple[str, ...] = ("GET",)
    ) -> Route:
        return Route(path, auth.endpoint(kind, handler), methods=list(methods))

    routes = [
        route("/", "page", views.overview),
        route("/queue", "page", views.queue_page),
        route("/task", "page", views.task_page),
        route("/workers", "page", views.workers_page),
        route("/cron", "page", views.cron_page),
        route("/batches", "page", views.batches_page),
        route("/dead", "page", views.dead_page),
        route("/action/{verb}", "page", actions.action_page, ("GET", "POST")),
        route("/login", "open", auth.login_page, ("GET", "POST")),
        route("/logout", "open", auth.logout, ("POST",)),
        route("/static/{name}", "open", views.static),
        route("/api/overview", "api", api.api_overview),
        route("/api/queue", "api", api.api_queue),
        route("/api/tasks", "api", api.api_tasks),
        route("/api/task", "api", api.api_task),
        route("/api/dead-groups", "api", api.api_dead_groups),
        route("/api/cron", "api", api.api_cron),
        route("/api/batches", "api", api.api_batches),
        route("/api/workers", "api", api.api_workers),
        route("/chart/throughput.svg", "api", charts.throughput_svg),
        route("/chart/due.svg", "api", charts.due_svg),
        route("/metrics", "api", charts.metrics),
    ]
    app = Starlette(
        routes=routes, lifespan=lifespan, middleware=[Middleware(Guard, rules=ctx.rules)]
    )
    app.state.dashboard = ctx
    return app


__all__ = [
    "ACTIONS",
    "DashboardSettings",
    "check_bind",
    "create_app",
    "redis_label",
]
