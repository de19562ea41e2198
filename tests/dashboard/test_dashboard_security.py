"""The red-team scenarios against ``dueq dashboard``, each a regression test against a real
uvicorn (or Starlette's TestClient) and a real Redis: DNS rebinding (a foreign ``Host``), request
bodies read whole into memory, and a session cookie that never expired nor could be ended."""

from __future__ import annotations

import importlib
import re
import shlex
import socket
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import redis
from click.testing import CliRunner
from paths_support import DOCS

with warnings.catch_warnings():
    # Starlette 1.x prefers the httpx2 fork and warns once on import when it finds httpx
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from dashboard_support import Served, csrf_of, seed

from dueq.cli import cli
from dueq.dashboard import DashboardSettings, create_app
from dueq.server import RedisServer

TOKEN = "s3cret-token"
MiB = 1024 * 1024


class FakeClock:
    """Epoch seconds that move only when the test says so (session expiry)."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def served(redis_server: RedisServer) -> Iterator[Callable[..., Served]]:
    running: list[Served] = []

    def start(**settings: object) -> Served:
        app = create_app(redis_server.url, DashboardSettings(**settings))  # type: ignore[arg-type]
        site = Served(app).__enter__()
        running.append(site)
        return site

    yield start
    for site in running:
        site.__exit__()


@pytest.fixture
def testclient(redis_server: RedisServer) -> Iterator[Callable[..., TestClient]]:
    opened: list[TestClient] = []

    def make(
        base_url: str = "http://127.0.0.1", clock: FakeClock | None = None, **settings: object
    ) -> TestClient:
        extra = {} if clock is None else {"clock": clock}
        app = create_app(redis_server.url, DashboardSettings(**settings), **extra)  # type: ignore[arg-type]
        client = TestClient(app, base_url=base_url)
        client.__enter__()
        opened.append(client)
        return client

    yield make
    for client in opened:
        client.__exit__(None, None, None)


# -- DNS rebinding -------------------------------------------------------------------------


def test_a_rebound_name_cannot_read_a_task(r: redis.Redis, served: Callable[..., Served]) -> None:
    seed(r)
    site = served()
    params = {"queue": "emails", "id": "welcome:42"}
    foreign = {"Host": f"rebind.example:{site.port}"}
    answer = httpx.get(site.url("/api/task"), params=params, headers=foreign)
    assert answer.status_code == 400
    assert "ann@example.com" not in answer.text and "welcome" not in answer.text
    for path in ("/", "/login", "/static/dashboard.js", "/metrics", "/nope"):
        assert httpx.get(site.url(path), headers=foreign).status_code == 400, path
    # the names a person on this machine uses still work, with or without the port
    for host in (f"127.0.0.1:{site.port}", f"localhost:{site.port}", "localhost", "127.0.0.1"):
        assert httpx.get(site.url("/api/task"), params=params, headers={"Host": host}).json()[
            "payload"
        ] == {"to": "ann@example.com"}, host


def test_a_rebound_name_cannot_purge_a_dead_task(
    r: redis.Redis, served: Callable[..., Served]
) -> None:
    queues = seed(r)
    site = served()
    foreign = f"rebind.example:{site.port}"
    with httpx.Client(base_url=site.url()) as client:
        # the attacker's page reads the confirm page (and its CSRF field) through its own name;
        # to test the POST on its own, the field is taken from a real page when that is refused
        page = client.get("/action/purge", params={"queue": "emails", "id": "fail-1"})
        answer = client.post(
            "/action/purge",
            data={"queue": "emails", "id": "fail-1", "csrf": csrf_of(page.text)},
            headers={"Host": foreign, "Origin": f"http://{foreign}"},
        )
        assert queues["emails"].get("fail-1").state == "dead"  # type: ignore[union-attr]
        assert answer.status_code == 400
        rebound = client.get(
            "/action/purge", params={"queue": "emails", "id": "fail-1"}, headers={"Host": foreign}
        )
        assert rebound.status_code == 400 and "csrf" not in rebound.text


def test_a_post_is_accepted_only_from_an_allowed_origin(
    r: redis.Redis, testclient: Callable[..., TestClient]
) -> None:
    queues = seed(r)
    client = testclient(allowed_hosts=("dash.example.com",))
    token = csrf_of(client.get("/action/pause", params={"queue": "emails"}).text)
    fields = {"queue": "emails", "csrf": token}
    for origin in ("http://evil.example", "http://localhost:3000", "null", "ftp://127.0.0.1"):
        refused = client.post("/action/pause", data=fields, headers={"Origin": origin})
        assert refused.status_code == 403, origin
    assert not queues["emails"].settings().paused
    # an allowed name: the POST goes through even though it names another host than Host
    ok = client.post("/action/pause", data=fields, headers={"Origin": "https://dash.example.com"})
    assert ok.status_code == 200 and queues["emails"].settings().paused
    assert client.get("/", headers={"Host": "dash.example.com"}).status_code == 200
    assert client.get("/", headers={"Host": "dash.example.com:8443"}).status_code == 200
    assert client.get("/", headers={"Host": "other.example.com"}).status_code == 400


def test_an_allowed_host_with_a_port_allows_only_that_port(
    testclient: Callable[..., TestClient],
) -> None:
    client = testclient(allowed_hosts=("dash.example.com:8443", "[fd00::5]"))
    assert client.get("/", headers={"Host": "dash.example.com:8443"}).status_code == 200
    assert client.get("/", headers={"Host": "dash.example.com:9999"}).status_code == 400
    assert client.get("/", headers={"Host": "dash.example.com"}).status_code == 400
    assert client.get("/", headers={"Host": "[fd00::5]:8080"}).status_code == 200
    assert client.get("/", headers={"Host": "[::1]:8080"}).status_code == 200
    assert client.get("/", headers={"Host": "[fd00::6]"}).status_code == 400


def _any_free_port(command: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``dueq dashboard`` binds its port first (``listen``): any free one here, not 8080."""
    listen = command.listen
    monkeypatch.setattr(command, "listen", lambda host, port: listen(host, 0))


def test_cli_allow_host_reaches_the_app(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    command = importlib.import_module("dueq.cli.dashboard")  # the module, not the command

    started: list[object] = []
    _any_free_port(command, monkeypatch)
    monkeypatch.setattr(command, "serve", lambda app, sock: started.append(app))
    args = ["dashboard", "--redis-url", redis_server.url, "--allow-host", "dash.example.com"]
    result = CliRunner().invoke(cli, [*args, "--allow-host", "box:8080", "--behind-tls"])
    assert result.exit_code == 0, result.output
    with TestClient(started[0], base_url="http://127.0.0.1") as client:  # type: ignore[arg-type]
        assert client.get("/", headers={"Host": "dash.example.com"}).status_code == 200
        assert client.get("/", headers={"Host": "box:8080"}).status_code == 200
        assert client.get("/", headers={"Host": "box:8081"}).status_code == 400


# -- request bodies ------------------------------------------------------------------------


def _raw_post(port: int, head: str, timeout_s: float = 20) -> str:
    """Send ``head`` (request line and headers, no body) and read what comes back."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.sendall(head.encode())
        return s.recv(4096).decode("latin-1")


@pytest.mark.parametrize("token", [None, TOKEN])
def test_a_body_announced_too_large_is_refused_before_it_is_sent(
    served: Callable[..., Served], token: str | None
) -> None:
    site = served(token=token)
    head = (
        f"POST /login HTTP/1.1\r\nHost: 127.0.0.1:{site.port}\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\n"
        f"Content-Length: {200 * MiB}\r\n\r\n"
    )
    answer = _raw_post(site.port, head)  # no body sent: the old server waited for it
    assert answer.startswith("HTTP/1.1 413"), answer


@pytest.mark.parametrize(
    ("path", "token"), [("/login", None), ("/login", TOKEN), ("/action/pause", None)]
)
def test_a_streamed_body_is_refused_without_being_read_whole(
    served: Callable[..., Served], path: str, token: str | None
) -> None:
    site = served(token=token)
    chunk = b"a" * (64 * 1024)
    total_chunks = 128 * MiB // len(chunk)
    sent = [0]

    def body() -> Iterator[bytes]:
        for _ in range(total_chunks):
            sent[0] += len(chunk)
            yield chunk

    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    answer = httpx.post(site.url(path), content=body(), headers=headers, timeout=60)
    assert answer.status_code == 413
    # the server answered and closed after a little over the 64 KiB limit; what the client had
    # written by then is what the sockets' buffers hold, far below the 128 MiB it would send
    print(f"{path}: {sent[0] / MiB:.1f} MiB of 128 MiB consumed before the 413")
    assert sent[0] < 32 * MiB, f"{sent[0] / MiB:.1f} MiB consumed"


def test_an_unread_body_of_a_refused_post_is_not_drained(
    r: redis.Redis, served: Callable[..., Served]
) -> None:
    queues = seed(r)
    site = served(token=TOKEN)
    sent = [0]

    def body() -> Iterator[bytes]:
        for _ in range(2048):  # 128 MiB
            sent[0] += 64 * 1024
            yield b"a" * (64 * 1024)

    answer = httpx.post(site.url("/action/pause"), content=body(), timeout=60)
    assert answer.status_code == 303  # to the login page, without reading the body
    assert answer.headers["connection"] == "close"
    assert sent[0] < 32 * MiB, f"{sent[0] / MiB:.1f} MiB consumed"
    assert not queues["emails"].settings().paused


def test_a_form_just_under_the_limit_is_still_read(
    r: redis.Redis, testclient: Callable[..., TestClient]
) -> None:
    queues = seed(r)
    client = testclient()
    token = csrf_of(client.get("/action/pause", params={"queue": "emails"}).text)
    padding = "x" * (60 * 1024)
    answer = client.post("/action/pause", data={"queue": "emails", "csrf": token, "pad": padding})
    assert answer.status_code == 200 and queues["emails"].settings().paused


# -- sessions ------------------------------------------------------------------------------


def login(client: TestClient) -> httpx.Response:
    page = client.get("/login")
    answer = client.post(
        "/login",
        data={"token": TOKEN, "csrf": csrf_of(page.text), "next": "/"},
        follow_redirects=False,
    )
    assert answer.status_code == 303, answer.text
    return answer


def session_cookie(answer: httpx.Response) -> str:
    (line,) = [c for c in answer.headers.get_list("set-cookie") if c.startswith("dueq_session=")]
    return line


def test_the_session_cookie_is_random_expires_and_has_strict_flags(
    testclient: Callable[..., TestClient],
) -> None:
    clock = FakeClock()
    client = testclient(token=TOKEN, clock=clock)
    first = session_cookie(login(client))
    flags = [f.strip().lower() for f in first.split(";")]
    assert {"httponly", "samesite=strict", "path=/"} <= set(flags)
    assert "secure" not in flags  # plain http: a Secure cookie would never come back
    assert f"max-age={12 * 3600}" in flags
    second = session_cookie(login(testclient(token=TOKEN, clock=clock)))
    assert first.split(";")[0] != second.split(";")[0]  # not derived from the token alone
    assert client.get("/api/overview").status_code == 200
    clock.now += 12 * 3600 - 1
    assert client.get("/api/overview").status_code == 200
    clock.now += 2  # past 12 h: log in again
    assert client.get("/api/overview").status_code == 401
    assert client.get("/", follow_redirects=False).headers["location"].startswith("/login")
    login(client)
    assert client.get("/api/overview").status_code == 200


def test_the_session_lasts_as_long_as_session_s(testclient: Callable[..., TestClient]) -> None:
    clock = FakeClock()
    client = testclient(token=TOKEN, clock=clock, session_s=60)
    assert "max-age=60" in session_cookie(login(client)).lower()
    clock.now += 61
    assert client.get("/api/overview").status_code == 401


@pytest.mark.parametrize(
    ("base_url", "behind_tls"),
    [("https://127.0.0.1", False), ("http://127.0.0.1", True)],
)
def test_the_cookies_are_secure_behind_tls(
    testclient: Callable[..., TestClient], base_url: str, behind_tls: bool
) -> None:
    client = testclient(base_url=base_url, token=TOKEN, behind_tls=behind_tls)
    page = client.get("/login")
    csrf = csrf_of(page.text)
    # over plain http (the proxy's side) the client would not send a Secure cookie back: the
    # test sends it itself, as the browser does over https
    answer = client.post(
        "/login",
        data={"token": TOKEN, "csrf": csrf, "next": "/"},
        headers={"Cookie": f"dueq_csrf={csrf}"},
        follow_redirects=False,
    )
    assert answer.status_code == 303
    for line in [*page.headers.get_list("set-cookie"), *answer.headers.get_list("set-cookie")]:
        assert "secure" in [f.strip().lower() for f in line.split(";")], line


def test_logout_ends_the_session_on_the_server(testclient: Callable[..., TestClient]) -> None:
    client = testclient(token=TOKEN)
    cookie = session_cookie(login(client)).split(";")[0].split("=", 1)[1]
    assert client.get("/api/overview").status_code == 200
    refused = client.post("/logout", data={})  # no CSRF field: refused, session still good
    assert refused.status_code == 403
    assert client.get("/api/overview").status_code == 200
    page = client.get("/")
    assert 'action="/logout"' in page.text
    out = client.post("/logout", data={"csrf": csrf_of(page.text)}, follow_redirects=False)
    assert out.status_code == 303 and out.headers["location"] == "/login"
    assert client.get("/api/overview").status_code == 401
    client.cookies.set("dueq_session", cookie)  # the old cookie, kept by an attacker
    assert client.get("/api/overview").status_code == 401
    assert client.get("/api/overview", headers={"Authorization": f"Bearer {TOKEN}"}).is_success


def test_logout_works_on_a_read_only_dashboard(testclient: Callable[..., TestClient]) -> None:
    client = testclient(token=TOKEN, read_only=True)
    login(client)
    page = client.get("/")
    out = client.post("/logout", data={"csrf": csrf_of(page.text)}, follow_redirects=False)
    assert out.status_code == 303
    assert client.get("/api/overview").status_code == 401


# -- the docs page -------------------------------------------------------------------------

DOC = DOCS / "dashboard-security.md"


def doc_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_docs_python_block_allows_exactly_its_names(redis_server: RedisServer) -> None:
    (code,) = doc_blocks("python")
    scope: dict[str, object] = {"redis_url": redis_server.url}
    exec(code, scope)
    with TestClient(scope["app"], base_url="https://127.0.0.1") as client:  # type: ignore[arg-type]
        bearer = {"Authorization": "Bearer a-long-random-token"}
        for host, status in (
            ("dash.example.com", 200),
            ("ops-box:8080", 200),
            ("ops-box:8081", 400),
            ("rebind.example", 400),
        ):
            assert client.get("/api/overview", headers={**bearer, "Host": host}).status_code == (
                status
            ), host


def test_the_docs_command_line_runs_and_allows_its_names(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    (command_line,) = doc_blocks("sh")
    argv = shlex.split(command_line.replace("\\\n", " "))
    assert argv[:2] == ["dueq", "dashboard"]
    command = importlib.import_module("dueq.cli.dashboard")
    started: list[tuple[object, str]] = []
    _any_free_port(command, monkeypatch)
    monkeypatch.setattr(
        command, "serve", lambda app, sock: started.append((app, sock.getsockname()[0]))
    )
    result = CliRunner().invoke(cli, [*argv[1:], "--redis-url", redis_server.url])
    assert result.exit_code == 0, result.output
    [(app, host)] = started
    assert host == "0.0.0.0"
    with TestClient(app, base_url="http://127.0.0.1") as client:  # type: ignore[arg-type]
        assert client.get("/login", headers={"Host": "dash.example.com"}).status_code == 200
        assert client.get("/login", headers={"Host": "rebind.example"}).status_code == 400
