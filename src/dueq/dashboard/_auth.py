"""Auth per route: the token, the login session, read-only, CSRF and Origin, and login/logout.

``Auth.endpoint`` wraps every route with these checks and the security headers, so no route
can forget them: a route of kind ``page`` sends an unauthorized browser to ``/login``, an
``api`` one answers 401; every POST must be allowed (not read-only, a same-origin or
allowed ``Origin``) and carry the CSRF token of its cookie (double submit, SameSite=Strict).
Errors a route raises become one answer here (``HttpProblem``, a missing task, Redis away).
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass

import redis
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from dueq.dashboard._context import REDIS_AWAY, Context, Endpoint, Kind
from dueq.dashboard._guard import (
    CSRF_COOKIE,
    SECURITY_HEADERS,
    SESSION_COOKIE,
    HttpProblem,
    form_fields,
)
from dueq.dashboard._html import e, url
from dueq.exceptions import CorruptQueue, CronNotFound, DueqError, TaskNotFound


@dataclass(frozen=True)
class Auth:
    """The checks in front of every route, and the login and logout routes."""

    ctx: Context

    def authorized(self, request: Request) -> bool:
        token = self.ctx.settings.token
        if not token:
            return True
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.encode(), token.encode()):
            return True
        return self.ctx.sessions.valid(request.cookies.get(SESSION_COOKIE))

    async def csrf_ok(self, request: Request) -> bool:
        form = await form_fields(request)
        cookie = request.cookies.get(CSRF_COOKIE, "")
        given = form.get("csrf", "")
        return bool(cookie) and isinstance(given, str) and hmac.compare_digest(given, cookie)

    def endpoint(self, kind: Kind, handler: Endpoint) -> Endpoint:
        """``handler`` behind the checks: token (unless ``open``), read-only and CSRF for
        POSTs, a same-origin POST; security headers and the CSRF cookie on every answer."""

        async def run(request: Request) -> Response:
            request.state.csrf = request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(32)
            # the pages name the Redis only to someone let in (not on the login page)
            request.state.authorized = self.authorized(request)
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
                    secure=self.ctx.secure(request),
                )
            return response

        return run

    async def _checked(self, kind: Kind, handler: Endpoint, request: Request) -> Response:
        if kind != "open" and not self.authorized(request):
            if kind == "page":
                query = request.url.query
                back = request.url.path + (f"?{query}" if query else "")
                return RedirectResponse(url("/login", next=back), status_code=303)
            return self.ctx.problem(
                request, "api", 401, "a token is needed (Authorization: Bearer)"
            )
        try:
            if request.method == "POST":
                self._post_allowed(request)
                if not await self.csrf_ok(request):
                    raise HttpProblem(403, "the CSRF token is missing or wrong: reload the page")
            return await handler(request)
        except HttpProblem as exc:
            return self.ctx.problem(request, kind, exc.status, exc.message)
        except (TaskNotFound, CronNotFound) as exc:
            return self.ctx.problem(request, kind, 404, str(exc))
        except CorruptQueue as exc:  # a queue key of the wrong type: the data, not the input
            return self.ctx.problem(request, kind, 500, f"Redis: {exc}")
        except DueqError as exc:  # bad input from the form or URL: say why, change nothing
            return self.ctx.problem(request, kind, 400, str(exc))
        except REDIS_AWAY as exc:  # Redis down: say so, the page retries
            return self.ctx.problem(request, kind, 503, f"Redis: {type(exc).__name__}: {exc}")
        except redis.RedisError as exc:  # Redis answered with an error (bad data, ACL): say so
            return self.ctx.problem(request, kind, 500, f"Redis: {type(exc).__name__}: {exc}")

    def _post_allowed(self, request: Request) -> None:
        if self.ctx.settings.read_only and request.url.path not in ("/login", "/logout"):
            raise HttpProblem(403, "this dashboard is read-only")
        origin = request.headers.get("origin")
        # checked against the allowed names, not the request's Host (which a rebinding page
        # controls); the Host itself was checked by Guard before any route ran
        if origin is not None and not self.ctx.rules.origin_ok(origin, request.scope):
            raise HttpProblem(403, "cross-origin POST refused")

    async def login_page(self, request: Request) -> Response:
        nxt = request.query_params.get("next", "/")
        if request.method == "POST":
            form = await form_fields(request)
            given = form.get("token", "")
            nxt = str(form.get("next", "/"))
            token = self.ctx.settings.token or ""
            if token and isinstance(given, str) and hmac.compare_digest(given, token):
                safe = nxt if nxt.startswith("/") and not nxt.startswith("//") else "/"
                response = RedirectResponse(safe, status_code=303)
                self.ctx.sessions.close(request.cookies.get(SESSION_COOKIE))  # a new id per login
                response.set_cookie(
                    SESSION_COOKIE,
                    self.ctx.sessions.open(),
                    max_age=int(self.ctx.settings.session_s),
                    path="/",
                    httponly=True,
                    samesite="strict",
                    secure=self.ctx.secure(request),
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
        return self.ctx.page(request, "Log in", body)

    async def logout(self, request: Request) -> Response:
        """End this browser's session on the server (its cookie no longer works) and drop it."""
        self.ctx.sessions.close(request.cookies.get(SESSION_COOKIE))
        response = RedirectResponse("/login" if self.ctx.settings.token else "/", status_code=303)
        response.delete_cookie(
            SESSION_COOKIE,
            path="/",
            httponly=True,
            samesite="strict",
            secure=self.ctx.secure(request),
        )
        return response
