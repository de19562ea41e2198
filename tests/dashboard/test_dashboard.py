"""The dashboard app (``dueq.dashboard``) through Starlette's TestClient against a real Redis:
what every page and JSON endpoint shows, and that it is safe by default (CSRF, read-only,
token, escaping, no Redis password)."""

from __future__ import annotations

import json
import re
import socket
import warnings
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import redis
from click.testing import CliRunner

with warnings.catch_warnings():
    # Starlette 1.x prefers the httpx2 fork and warns once on import when it finds httpx
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from html import escape as e

from conftest import ManualClock
from dashboard_support import XSS, csrf_of, running_worker, seed
from step_runs_support import run_due

from dueq import ConfigurationError, Queue, RetryPolicy, StepContext, Task
from dueq.cli import cli
from dueq.dashboard import DashboardSettings, check_bind, create_app, redis_label
from dueq.server import RedisServer

Client = Callable[..., TestClient]


@pytest.fixture
def dashboard(redis_server: RedisServer, r: redis.Redis) -> Iterator[Client]:
    opened: list[TestClient] = []

    def make(url: str | None = None, **settings: object) -> TestClient:
        app = create_app(url or redis_server.url, DashboardSettings(**settings))  # type: ignore[arg-type]
        client = TestClient(app, base_url="http://127.0.0.1")
        client.__enter__()
        opened.append(client)
        return client

    yield make
    for client in opened:
        client.__exit__(None, None, None)


def confirm(client: TestClient, verb: str, **fields: str) -> tuple[int, str]:
    """Open the confirmation page of ``verb`` and submit it; (status, page) of the POST."""
    page = client.get(f"/action/{verb}", params=fields)
    assert page.status_code == 200, page.text
    done = client.post(f"/action/{verb}", data={**fields, "csrf": csrf_of(page.text)})
    return done.status_code, done.text


def test_overview_json_counts_every_queue_by_state(r: redis.Redis, dashboard: Client) -> None:
    seed(r)
    data = dashboard().get("/api/overview").json()
    assert data["queues"]["emails"] | {"oldest_due_lag_s": 0, "next_due_at": None} == {
        "scheduled": 3,
        "due_now": 0,
        "leased": 1,
        "dead": 3,
        "paused": False,
        "oldest_due_lag_s": 0,
        "next_due_at": None,
        "workers": 0,
        "health": "warn",  # its 3 dead letters came in the last hour
        "health_reason": "3 dead letters in the last 1 h",
    }
    assert data["queues"]["reports"]["scheduled"] == 2
    assert data["live"]["emails.dead"] == 3


def test_overview_page_lists_queues_with_live_cells_and_a_throughput_chart(
    r: redis.Redis, dashboard: Client
) -> None:
    seed(r)
    client = dashboard()
    html = client.get("/").text
    assert 'href="/queue?queue=emails"' in html and 'href="/queue?queue=reports"' in html
    assert 'data-live="emails.dead">3<' in html
    assert 'data-poll="/api/overview"' in html
    svg = client.get("/chart/throughput.svg")
    assert svg.headers["content-type"].startswith("image/svg+xml")
    assert "<polyline" in svg.text and "dead (3 in the hour)" in svg.text


def test_queue_page_shows_leased_holder_scheduled_and_dead_groups(
    r: redis.Redis, dashboard: Client
) -> None:
    seed(r)
    html = dashboard().get("/queue", params={"queue": "emails"}).text
    assert "worker-test" in html  # the holder of the leased task
    assert "fail-3" in html and "welcome:42" in html
    assert "<td>ValueError</td><td class='n'>2</td>" in html
    assert "<td>KeyError</td><td class='n'>1</td>" in html
    assert 'data-action="replay-group"' in html and 'data-action="pause"' in html


def test_due_histogram_buckets_the_next_24_hours(r: redis.Redis, dashboard: Client) -> None:
    seed(r)
    client = dashboard()
    data = client.get("/api/queue", params={"queue": "reports"}).json()
    hist = data["due_histogram"]
    assert hist["bucket_s"] == 1800 and len(hist["counts"]) == 48
    assert hist["counts"][0] == 1 and hist["counts"][3] == 1  # due in 1 min and in ~2 h
    assert "<rect" in client.get("/chart/due.svg", params={"queue": "reports"}).text


def test_search_by_id_prefix_and_payload_text(r: redis.Redis, dashboard: Client) -> None:
    seed(r)
    client = dashboard()
    by_id = client.get("/queue", params={"queue": "emails", "id_prefix": "welcome:"}).text
    assert "welcome:42" in by_id and "xss-1" not in by_id
    by_text = client.get("/queue", params={"queue": "emails", "grep": "ann@example"}).text
    assert "welcome:42" in by_text and "fail-4" not in by_text
    found = client.get(
        "/api/tasks", params={"queue": "emails", "state": "scheduled", "id_prefix": "xss"}
    ).json()
    assert [t["id"] for t in found["tasks"]] == ["xss-1"]


def test_task_page_shows_payload_state_attempts_and_each_traceback(
    r: redis.Redis, dashboard: Client
) -> None:
    seed(r)
    html = dashboard().get("/task", params={"queue": "emails", "id": "fail-1"}).text
    assert "dead" in html and "bad value fail-1" in html
    assert ", in boom" in html and "raise kind(message)" in html  # the traceback
    assert "&quot;n&quot;: 1" in html  # the payload, as escaped JSON
    assert 'data-action="replay"' in html and 'data-action="purge"' in html
    # one name for the attempt count, as TaskInfo, the JSON, the CLI and Spark say it
    assert "<th>attempt</th>" in html and "<th>attempts</th>" not in html
    queue_page = dashboard().get("/queue", params={"queue": "emails"}).text
    assert "<th>attempt</th>" in queue_page and "<th>attempts</th>" not in queue_page


def test_a_script_payload_is_escaped_everywhere(r: redis.Redis, dashboard: Client) -> None:
    seed(r)
    client = dashboard()
    for html in (
        client.get("/task", params={"queue": "emails", "id": "xss-1"}).text,
        client.get("/queue", params={"queue": "emails"}).text,
    ):
        assert "<script>window" not in html
        assert "&lt;script&gt;window.__dueq_xss" in html
    headers = client.get("/").headers
    assert "script-src 'self'" in headers["content-security-policy"]
    assert XSS in str(client.get("/api/task", params={"queue": "emails", "id": "xss-1"}).json())


def _durable_order(r: redis.Redis) -> str:
    """A durable task of queue ``orders``: step ``charge`` done (its result holds ``XSS``),
    step ``notify`` failed once (its error holds ``XSS``) then done, a sleep, and now a wait
    for signal ``shipped`` (a day at most)."""
    q = Queue("orders", r, retry=RetryPolicy(max_attempts=3, wait=lambda s: 0.0))
    runs = {"notify": 0}

    def notify() -> int:
        runs["notify"] += 1
        if runs["notify"] == 1:
            raise RuntimeError(f"mail server said {XSS}")
        return 2

    @q.task(name="order", durable=True)
    def order(ctx: StepContext) -> Any:
        ctx.step("charge", lambda: {"note": XSS})
        ctx.step("notify", notify)
        ctx.sleep(0.001)
        return ctx.wait_for("shipped", timeout=timedelta(days=1))

    tid = order.schedule()
    while (info := q.get(tid)) is not None and info.state != "waiting":
        run_due(q)
    return tid


def test_task_page_shows_a_durable_tasks_steps_as_a_timeline_escaped(
    r: redis.Redis, dashboard: Client
) -> None:
    tid = _durable_order(r)
    html = dashboard().get("/task", params={"queue": "orders", "id": tid}).text
    assert "<h2>Steps (4)</h2>" in html
    timeline = html[html.index('<table id="steps">') :]
    timeline = timeline[: timeline.index("</table>")]
    head = ["#", "kind", "name", "state", "runs", "started", "ended", "deadline", "result or error"]
    assert "".join(f"<th>{h}</th>" for h in head) in timeline
    rows = timeline.split("<tr")[2:]
    assert re.findall(r'data-step="(\d+)"', timeline) == ["0", "1", "2", "3"]  # in order
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in rows]
    assert [c[:5] for c in cells] == [
        ["0", "step", "charge", "done", "1"],
        ["1", "step", "notify", "done", "2"],
        ["2", "sleep", "sleep", "done", "1"],
        ["3", "wait", "shipped", "waiting", "1"],
    ]
    assert all(c[5].endswith(" UTC") for c in cells)  # started
    assert cells[3][6] == "-" and cells[3][7].endswith(" UTC")  # waiting: no end, a deadline
    assert cells[0][8] == e(json.dumps({"note": XSS}))  # the result's JSON, escaped
    assert cells[1][8] == "2"
    assert "<script>window" not in html and "&lt;script&gt;window.__dueq_xss" in html
    steps = dashboard().get("/api/task", params={"queue": "orders", "id": tid}).json()["steps"]
    assert [s["name"] for s in steps] == ["charge", "notify", "sleep", "shipped"]


def test_task_page_of_a_failed_step_shows_its_error_escaped(
    r: redis.Redis, dashboard: Client
) -> None:
    q = Queue("orders", r, retry=RetryPolicy(max_attempts=3, wait=lambda s: 3600.0))

    def notify() -> None:
        raise RuntimeError(XSS)

    @q.task(name="fails", durable=True)
    def fails(ctx: StepContext) -> None:
        ctx.step("notify", notify)

    tid = fails.schedule()
    run_due(q)
    html = dashboard().get("/task", params={"queue": "orders", "id": tid}).text
    row = html[html.index('data-step="0"') :].split("</tr>")[0]
    assert "<td>failed</td>" in row
    assert f"RuntimeError: {e(XSS)}" in row and "<script>window" not in html


def test_task_page_of_a_plain_task_has_no_steps(r: redis.Redis, dashboard: Client) -> None:
    seed(r)
    html = dashboard().get("/task", params={"queue": "emails", "id": "welcome:42"}).text
    assert "Steps" not in html and 'id="steps"' not in html


def test_confirmation_page_changes_nothing_and_the_confirmed_post_pauses(
    r: redis.Redis, dashboard: Client
) -> None:
    queues = seed(r)
    client = dashboard()
    page = client.get("/action/pause", params={"queue": "emails"})
    assert "Pause queue emails" in page.text
    assert not queues["emails"].settings().paused
    status, html = confirm(client, "pause", queue="emails")
    assert status == 200 and "queue emails paused" in html
    assert queues["emails"].settings().paused
    assert 'data-action="resume"' in client.get("/queue", params={"queue": "emails"}).text
    confirm(client, "resume", queue="emails")
    assert not queues["emails"].settings().paused


def test_post_without_or_with_a_wrong_csrf_token_is_refused(
    r: redis.Redis, dashboard: Client
) -> None:
    queues = seed(r)
    client = dashboard()
    client.get("/")  # sets the CSRF cookie
    missing = client.post("/action/pause", data={"queue": "emails"})
    wrong = client.post("/action/pause", data={"queue": "emails", "csrf": "guess"})
    assert missing.status_code == wrong.status_code == 403
    assert "CSRF" in missing.text
    assert not queues["emails"].settings().paused


def test_a_cross_origin_post_is_refused_even_with_the_token(
    r: redis.Redis, dashboard: Client
) -> None:
    queues = seed(r)
    client = dashboard()
    token = csrf_of(client.get("/action/pause", params={"queue": "emails"}).text)
    answer = client.post(
        "/action/pause",
        data={"queue": "emails", "csrf": token},
        headers={"Origin": "http://evil.example"},
    )
    assert answer.status_code == 403
    assert not queues["emails"].settings().paused


def test_read_only_shows_no_buttons_and_refuses_every_change(
    r: redis.Redis, dashboard: Client
) -> None:
    queues = seed(r)
    client = dashboard(read_only=True)
    for path, params in (
        ("/queue", {"queue": "emails"}),
        ("/task", {"queue": "emails", "id": "fail-1"}),
        ("/cron", {}),
    ):
        html = client.get(path, params=params).text
        assert "data-action" not in html and 'action="/action/' not in html
    assert client.get("/action/pause", params={"queue": "emails"}).status_code == 403
    token = client.cookies.get("dueq_csrf")
    refused = client.post("/action/pause", data={"queue": "emails", "csrf": token})
    assert refused.status_code == 403 and "read-only" in refused.text
    assert not queues["emails"].settings().paused


def test_replay_of_an_error_group_moves_only_that_group(r: redis.Redis, dashboard: Client) -> None:
    queues = seed(r)
    status, html = confirm(dashboard(), "replay-group", queue="emails", error_type="ValueError")
    assert status == 200 and "2 dead tasks with error ValueError replayed" in html
    assert queues["emails"].dead.count() == 1
    assert queues["emails"].get("fail-1").state == "scheduled"  # type: ignore[union-attr]


def test_purge_of_an_error_group_and_of_one_task(r: redis.Redis, dashboard: Client) -> None:
    queues = seed(r)
    client = dashboard()
    confirm(client, "purge-group", queue="emails", error_type="KeyError")
    assert queues["emails"].get("fail-0") is None
    confirm(client, "purge", queue="emails", id="fail-1")
    assert queues["emails"].dead.count() == 1


def test_task_actions_cancel_run_now_reschedule_replay(r: redis.Redis, dashboard: Client) -> None:
    queues = seed(r)
    q = queues["emails"]
    client = dashboard()
    confirm(client, "run-now", queue="emails", id="welcome:42")
    assert q.stats().due_now == 1
    _, html = confirm(client, "reschedule", queue="emails", id="welcome:42", delay_s="120")
    assert "due in 2 min" in html and q.stats().due_now == 0
    confirm(client, "replay", queue="emails", id="fail-2")
    assert q.get("fail-2").state == "scheduled"  # type: ignore[union-attr]
    confirm(client, "cancel", queue="emails", id="xss-1")
    assert q.get("xss-1") is None


def test_bad_action_input_is_a_clear_error_and_changes_nothing(
    r: redis.Redis, dashboard: Client
) -> None:
    queues = seed(r)
    client = dashboard()
    status, html = confirm(client, "reschedule", queue="emails", id="welcome:42", delay_s="soon")
    assert status == 400 and "delay_s must be a number" in html
    assert client.get("/action/replay", params={"queue": "nope", "id": "x"}).status_code == 404
    status, html = confirm(client, "replay", queue="emails", id="welcome:42")
    assert status == 404 and "not in the dead-letter queue" in html
    assert queues["emails"].get("welcome:42").state == "scheduled"  # type: ignore[union-attr]
    assert client.get("/task", params={"queue": "emails", "id": "none"}).status_code == 404


def test_cron_page_pause_resume_and_run_now(r: redis.Redis, dashboard: Client) -> None:
    q = Queue("nightly", r)
    q.cron.add("report", "0 3 * * *", payload={"x": 1})
    client = dashboard()
    html = client.get("/cron").text
    assert "report" in html and "0 3 * * *" in html and 'data-action="cron-pause"' in html
    confirm(client, "cron-pause", queue="nightly", name="report")
    assert q.cron.get("report").paused  # type: ignore[union-attr]
    confirm(client, "cron-resume", queue="nightly", name="report")
    assert not q.cron.get("report").paused  # type: ignore[union-attr]
    before = q.stats().scheduled
    _, html = confirm(client, "cron-run-now", queue="nightly", name="report")
    assert "fired now" in html and q.stats().due_now >= 1 and q.stats().scheduled >= before
    assert client.get("/api/cron").json()["nightly"][0]["name"] == "report"


def test_workers_page_and_overview_show_the_live_workers(r: redis.Redis, dashboard: Client) -> None:
    queues = seed(r)
    client = dashboard()
    assert client.get("/api/overview").json()["workers_alive"] == 0
    with running_worker(queues["emails"], queues["reports"]) as worker:
        overview = client.get("/api/overview").json()
        assert overview["workers_alive"] == 1  # one worker on two queues counts once
        assert overview["queues"]["reports"]["workers"] == 1
        [listed] = client.get("/api/workers").json()["workers"]
        assert listed["queues"] == ["emails", "reports"] and listed["pid"] > 0
        html = client.get("/workers").text
        assert "Workers (1 alive)" in html and e(listed["worker_id"]) in html
        del worker
    assert "no worker is alive" in client.get("/workers").text


def test_metrics_endpoint_serves_queue_gauges(r: redis.Redis, dashboard: Client) -> None:
    seed(r)
    text = dashboard().get("/metrics").text
    assert 'dueq_tasks{queue="emails",state="dead"} 3.0' in text


def test_token_is_required_by_bearer_header_or_login_cookie(
    r: redis.Redis, dashboard: Client
) -> None:
    seed(r)
    client = dashboard(token="s3cret-token")
    assert client.get("/api/overview").status_code == 401
    assert client.get("/metrics").status_code == 401
    redirect = client.get("/", follow_redirects=False)
    assert redirect.status_code == 303 and redirect.headers["location"].startswith("/login")
    bearer = {"Authorization": "Bearer s3cret-token"}
    assert client.get("/api/overview", headers=bearer).status_code == 200
    login = client.get("/login")
    wrong = client.post("/login", data={"token": "nope", "csrf": csrf_of(login.text)})
    assert wrong.status_code == 401
    ok = client.post(
        "/login",
        data={"token": "s3cret-token", "csrf": csrf_of(login.text), "next": "/"},
        follow_redirects=False,
    )
    assert ok.status_code == 303
    assert "HttpOnly" in ok.headers["set-cookie"] and "s3cret-token" not in ok.headers["set-cookie"]
    assert client.get("/api/overview").status_code == 200  # the cookie now


def test_the_redis_password_never_reaches_a_page(
    r: redis.Redis, redis_server: RedisServer, dashboard: Client
) -> None:
    if redis_server.tls or type(redis_server) is not RedisServer:
        pytest.skip("plain server only: the default user takes any password there")
    seed(r)
    url = f"redis://default:hunter2-pw@127.0.0.1:{redis_server.port}/0"
    client = dashboard(url)
    for path in ("/", "/queue?queue=emails", "/task?queue=emails&id=fail-1", "/cron", "/nope"):
        assert "hunter2" not in client.get(path).text
    assert redis_label(url) == f"redis://127.0.0.1:{redis_server.port}/0"
    assert "secret" not in redis_label("rediss://h:6380/0?ssl_password=secret")


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.5", "example.com", "::"])
def test_a_non_loopback_bind_needs_a_token_or_insecure(host: str) -> None:
    with pytest.raises(ConfigurationError, match="not a loopback address"):
        check_bind(host, token=None, insecure=False)
    check_bind(host, token="t", insecure=False)
    check_bind(host, token=None, insecure=True)


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.0.0.2"])
def test_a_loopback_bind_needs_nothing(host: str) -> None:
    check_bind(host, token=None, insecure=False)


def test_cli_refuses_a_public_bind_without_a_token(redis_server: RedisServer) -> None:
    result = CliRunner().invoke(
        cli, ["dashboard", "--host", "0.0.0.0", "--redis-url", redis_server.url]
    )
    assert result.exit_code == 2
    assert "not a loopback address" in result.output


def test_cron_page_shows_the_last_firing_and_its_outcome(r: redis.Redis, dashboard: Client) -> None:
    q = Queue("nightly", r)
    q.cron.add("report", "0 3 * * *", payload={"x": 1})
    q.cron.run_now("report")
    for d in q.claim(limit=10):
        d.fail(ValueError("no data"), retry_in=60)
    html = dashboard().get("/cron").text
    assert "retrying (ValueError) at 20" in html
    assert dashboard().get("/api/cron").json()["nightly"][0]["last_outcome"] == "retrying"


def test_an_unreachable_redis_is_a_503_that_names_no_password(dashboard: Client) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    client = dashboard(f"redis://default:hunter2-pw@127.0.0.1:{port}/0")
    page = client.get("/")
    assert page.status_code == 503 and "Redis: ConnectionError" in page.text
    assert "hunter2" not in page.text
    assert client.get("/api/overview").json()["error"].startswith("Redis: ConnectionError")


def corrupt_reports(r: redis.Redis) -> None:
    """Make ``reports`` unreadable: its due set becomes a string (WRONGTYPE)."""
    due = next(k for k in r.scan_iter("dueq:{reports}:*") if k.endswith(b":due"))
    r.delete(due)
    r.set(due, "not a sorted set")


def test_one_unreadable_queue_does_not_hide_the_others(r: redis.Redis, dashboard: Client) -> None:
    seed(r)
    corrupt_reports(r)
    client = dashboard()
    data = client.get("/api/overview").json()
    assert data["queues"]["emails"]["scheduled"] == 3
    # named by dueq: which key, what it holds (it is also a redis ResponseError)
    assert data["queues"]["reports"]["error"].startswith("CorruptQueue")
    assert "dueq:{reports}:due holds a string" in data["queues"]["reports"]["error"]
    assert "WRONGTYPE" in data["live"]["reports.error"]
    page = client.get("/")
    assert page.status_code == 200
    assert "unreadable" in page.text and "WRONGTYPE" in page.text
    assert ">emails<" in page.text
    for path in ("/workers", "/api/workers", "/cron", "/api/cron", "/chart/throughput.svg"):
        assert client.get(path).status_code == 200, path
    # the queue's own page says why it cannot be shown: an error, not "Redis is down"
    own = client.get("/queue", params={"queue": "reports"})
    assert own.status_code == 500 and "WRONGTYPE" in own.text


def test_a_queue_is_known_by_its_keys_without_a_scan_per_request(
    r: redis.Redis, dashboard: Client
) -> None:
    seed(r)
    split = Queue("split", r, shards=2)
    split.schedule({"n": 1})
    split.schedule({"n": 2})

    def scans() -> int:
        return int(r.info("commandstats").get("cmdstat_scan", {}).get("calls", 0))

    client = dashboard()
    before = scans()
    assert client.get("/api/queue", params={"queue": "emails"}).status_code == 200
    assert client.get("/api/queue", params={"queue": "split"}).status_code == 200
    assert client.get("/api/queue", params={"queue": "nope"}).status_code == 404
    # a shard of a sharded queue is not a queue of its own (the overview lists "split" once)
    assert client.get("/api/queue", params={"queue": "split#0"}).status_code == 404
    assert client.get("/api/tasks", params={"queue": "reports"}).status_code == 200
    assert scans() == before  # EXISTS, not a walk of the keyspace, per request
    only = dashboard(queues=("reports",))  # --queue: only those are known
    assert only.get("/api/queue", params={"queue": "emails"}).status_code == 404
    assert only.get("/api/queue", params={"queue": "reports"}).status_code == 200


def test_cron_page_and_api_show_each_definitions_policies_and_counts(
    r: redis.Redis, dashboard: Client, clock: ManualClock
) -> None:
    q = Queue("policed", r, clock=clock, lease=600, retry=RetryPolicy(max_attempts=1))
    start, end = clock.now, clock.now + 86_400
    window = {"start": datetime.fromtimestamp(start, timezone.utc)}
    window["end"] = datetime.fromtimestamp(end, timezone.utc)
    q.cron.add("skipper", every=60, overlap="skip", limit=10, **window)
    q.cron.add("fragile", every=60, pause_after_failures=1)
    q.cron.add("once", every=60, limit=1)
    q.cron.add("plain", "0 3 * * *")
    clock.advance(60)
    for d in q.claim(limit=10):
        if d.id.startswith("cron:skipper:"):
            continue  # still running when the next slot comes: that slot is skipped
        if d.id.startswith("cron:fragile:"):
            d.fail(RuntimeError("down"))  # dead: pause_after_failures=1 pauses it
        else:
            d.ack()
    clock.advance(60)
    q.claim(limit=10)

    html = dashboard().get("/cron").text
    skipper = html[html.index("skipper") : html.index("</tr>", html.index("skipper"))]
    assert "overlap skip" in skipper
    assert "window 2027-01-15 08:00:00 UTC to 2027-01-16 08:00:00 UTC" in skipper
    assert "limit 1/10" in skipper and "skipped 1" in skipper
    fragile = html[html.index("fragile") : html.index("</tr>", html.index("fragile"))]
    assert "failures 1/1" in fragile and "paused (" in fragile
    once = html[html.index(">once<") : html.index("</tr>", html.index(">once<"))]
    assert "finished (limit)" in once and "limit 1/1" in once

    api = {d["name"]: d for d in dashboard().get("/api/cron").json()["policed"]}
    assert api["skipper"] | {"start": None, "end": None} == api["skipper"] | {
        "overlap": "skip",
        "limit": 10,
        "fired": 1,
        "skipped": 1,
        "finished": None,
        "failures": 0,
        "pause_after_failures": None,
        "paused_reason": None,
        "start": None,
        "end": None,
    }
    assert api["skipper"]["start"].startswith("2027-01-15T08:00:00")
    assert api["skipper"]["end"].startswith("2027-01-16T08:00:00")
    assert (api["fragile"]["failures"], api["fragile"]["pause_after_failures"]) == (1, 1)
    assert api["fragile"]["paused"] and api["fragile"]["paused_reason"]
    assert (api["once"]["finished"], api["once"]["fired"], api["once"]["limit"]) == ("limit", 1, 1)
    assert api["plain"]["overlap"] == "allow_all" and api["plain"]["limit"] is None


def test_cron_page_and_api_show_an_expiry(r: redis.Redis, dashboard: Client) -> None:
    Queue("fresh", r).cron.add("hourly", "0 * * * *", expires=timedelta(minutes=10))
    html = dashboard().get("/cron").text
    row = html[html.index("hourly") : html.index("</tr>", html.index("hourly"))]
    assert "expires 600s" in row
    [api] = dashboard().get("/api/cron").json()["fresh"]
    assert api["expires"] == 600.0


def test_queue_page_shows_the_latest_events_when_events_are_on(
    r: redis.Redis, dashboard: Client, clock: ManualClock
) -> None:
    q = Queue("evq", r, clock=clock, retry=RetryPolicy(max_attempts=3, wait=lambda s: 60))
    q.configure(events=3600)
    for tid in ("ok-1", "bad-1", "gone-1", "tag<b>"):
        q.schedule({}, id=tid)
    by_id = {d.id: d for d in q.claim(limit=4)}
    by_id["ok-1"].ack()
    clock.advance(2)
    by_id["bad-1"].fail(ValueError("nope"))
    q.cancel("gone-1")
    by_id["tag<b>"].fail(KeyError("k"))
    at = datetime.fromtimestamp(clock.now, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    html = dashboard().get("/queue", params={"queue": "evq"}).text
    assert "<h2>Latest events</h2>" in html
    section = html.split("<h2>Latest events</h2>", 1)[1]
    rows = section.split("</table>", 1)[0].split("<tr>")[2:]  # after the header row
    assert len(rows) == 4
    newest, cancelled, retried, acked = rows  # newest first
    assert "<td>retried</td>" in newest and "tag&lt;b&gt;" in newest and "<b>" not in newest
    assert "<td>KeyError</td>" in newest and f"<td>{at}</td>" in newest
    assert "<td>cancelled</td>" in cancelled and 'href="/task?queue=evq&amp;id=gone-1"' in cancelled
    assert "<td>ValueError</td>" in retried and '<td class="n">1</td>' in retried
    assert "<td>acked</td>" in acked and "ok-1" in acked


def test_queue_api_gives_the_events_table_rows_the_page_refreshes(
    r: redis.Redis, dashboard: Client, clock: ManualClock
) -> None:
    """The events table is refreshed by the page's poller like the figures: the page marks its
    rows (``data-rows="events"``, there even while empty) and ``/api/queue`` gives them."""
    q = Queue("evq", r, clock=clock)
    q.configure(events=3600)
    client = dashboard()
    html = client.get("/queue", params={"queue": "evq"}).text
    section = html.split("<h2>Latest events</h2>", 1)[1].split("</table>", 1)[0]
    assert 'data-rows="events"' in section and "no events yet" in section
    assert client.get("/api/queue", params={"queue": "evq"}).json()["rows"] == {"events": []}
    q.schedule({}, id="a<b")
    (d,) = q.claim()
    d.ack()
    at = datetime.fromtimestamp(clock.now, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    api = client.get("/api/queue", params={"queue": "evq"}).json()
    assert api["rows"]["events"] == [
        [
            {"text": "acked"},
            {"text": "a<b", "href": "/task?queue=evq&id=a%3Cb"},
            {"text": "1", "css": "n"},
            {"text": at},
            {"text": ""},
        ]
    ]
    assert [ev["task_id"] for ev in api["events"]] == ["a<b"]  # the events' JSON form too
    html = client.get("/queue", params={"queue": "evq"}).text  # the same cells, as HTML
    section = html.split("<h2>Latest events</h2>", 1)[1].split("</table>", 1)[0]
    assert '<td><a href="/task?queue=evq&amp;id=a%3Cb">a&lt;b</a></td>' in section
    assert Queue("quiet", r).stats().settings.events is None
    Queue("quiet", r).schedule({})
    assert "rows" not in client.get("/api/queue", params={"queue": "quiet"}).json()


def test_queue_page_shows_no_events_when_events_are_off(
    r: redis.Redis, dashboard: Client, clock: ManualClock
) -> None:
    never = Queue("never", r, clock=clock)
    never.schedule({}, id="a")
    was_on = Queue("was-on", r, clock=clock)
    was_on.configure(events=3600)
    was_on.schedule({}, id="b")
    (d,) = was_on.claim()
    d.ack()
    was_on.configure(events=False)
    client = dashboard()
    for name in ("never", "was-on"):
        html = client.get("/queue", params={"queue": name}).text
        assert "Queue " + name in html and "events" not in html.lower(), name


def test_batches_page_and_api_show_each_batch_with_its_counts(
    r: redis.Redis, dashboard: Client
) -> None:
    q = Queue("imports", r)
    q.schedule_many([Task(n, id=f"row-{n}") for n in range(3)], batch="nov-26")
    (d, *_) = q.claim(limit=1)
    d.ack()
    q.close_batch("nov-26")
    html = dashboard().get("/batches").text
    assert "nov-26" in html and "closed" in html
    assert "Batches</a>" in dashboard().get("/").text
    (b,) = dashboard().get("/api/batches").json()["imports"]
    assert (b["id"], b["total"], b["acked"], b["pending"], b["complete"]) == (
        "nov-26",
        3,
        1,
        2,
        False,
    )
    assert "nov-26" in dashboard().get("/batches", params={"queue": "imports"}).text


def _fair_shop(r: redis.Redis) -> Queue:
    """Queue ``shop`` made fair: acme 3 due and 2 claimed, a tenant named ``XSS`` 1 due, 1
    task without a key."""
    q = Queue("shop", r)
    q.configure(fairness="key")
    q.schedule_many(Task({"i": i}, id=f"acme-{i}", key="acme") for i in range(5))
    assert [d.key for d in q.claim(2)] == ["acme", "acme"]
    q.schedule({}, id="evil", key=XSS)
    q.schedule({}, id="plain")
    return q


def test_queue_page_of_a_fair_queue_shows_its_tenants_escaped(
    r: redis.Redis, dashboard: Client
) -> None:
    _fair_shop(r)
    html = dashboard().get("/queue", params={"queue": "shop"}).text
    assert "<h2>Tenants</h2>" in html
    assert "3 lanes with due tasks, 2 claimed in the last minute" in html
    assert "<td>acme</td><td class='n'>3</td><td class='n'>2</td><td class='n'>100.0%</td>" in html
    assert "<td>(no key)</td><td class='n'>1</td><td class='n'>0</td>" in html
    assert "<script>window" not in html
    assert f"<td>{e(XSS)}</td><td class='n'>1</td>" in html


def test_queue_page_of_a_queue_that_never_was_fair_shows_no_tenants(
    r: redis.Redis, dashboard: Client
) -> None:
    Queue("plain", r).schedule({}, id="k", key="acme")
    html = dashboard().get("/queue", params={"queue": "plain"}).text
    assert "Queue plain" in html and "tenant" not in html.lower()
