"""The guard: which requests reach the app at all, and the rules the per-route checks apply.

Pure request rules with no page of their own: the ``Host``/``Origin`` allow-list (``HostRules``,
the DNS-rebinding defence), the request body limit (``Guard``, the ASGI middleware in front of
every route, and ``form_fields``, the one reader of a form body), the login sessions
(``Sessions``), the cookie names and security headers, and ``check_bind`` (no network bind
without a token). ``_auth`` applies these per route; ``_app`` installs ``Guard``.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import secrets
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlsplit

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dueq._util.clock import Clock
from dueq.exceptions import ConfigurationError

CSRF_COOKIE = "dueq_csrf"
SESSION_COOKIE = "dueq_session"
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


def default_port(scheme: str) -> int:
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
        return self._listed(name, port or default_port(scope.get("scheme", "http")))

    def origin_ok(self, origin: str, scope: Scope) -> bool:
        try:
            parts = urlsplit(origin)
            if parts.scheme not in ("http", "https") or parts.path or "@" in parts.netloc:
                return False
            name, port = split_host(parts.netloc)
        except ValueError:
            return False
        port = port or default_port(parts.scheme)
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


class Guard:
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
