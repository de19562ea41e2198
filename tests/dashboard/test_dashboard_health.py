"""Issue 27, "a dashboard that points at problems": the health rule (a pure function, tested
with an explicit ``now``), the one duration formatter, and over HTTP against a real Redis:
health on the overview rows, the dead-letter page across queues with counted confirmations,
one action per intent on a dead task, time labels on the charts, and no Redis named before
login. docs/dashboard-health.md's Python blocks run here too."""

from __future__ import annotations

import importlib
import re
import warnings
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import redis
from paths_support import DOCS

with warnings.catch_warnings():
    # Starlette 1.x prefers the httpx2 fork and warns once on import when it finds httpx
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from click.testing import CliRunner
from dashboard_support import csrf_of, overdue, running_worker, seed

import dueq.dashboard
from dueq import ConfigurationError, Queue, RetryPolicy
from dueq.cli import cli
from dueq.dashboard import (
    DashboardSettings,
    HealthRules,
    create_app,
    human_duration,
    judge_health,
)
from dueq.model import HistoryPoint, QueueStats
from dueq.server import RedisServer

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
DOC = DOCS / "dashboard-health.md"


# ---- the one duration formatter -------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0, "0 ms"),
        (0.85, "850 ms"),
        (0.9996, "1 s"),
        (1, "1 s"),
        (59.9, "59 s"),
        (60, "1 min"),
        (123, "2 min 3 s"),
        (679, "11 min 19 s"),
        (3600, "1 h"),
        (11 * 3600 + 4 * 60 + 30, "11 h 4 min"),
        (2 * 86400 + 3600, "2 d 1 h"),
        (-3, "0 ms"),
    ],
)
def test_human_duration_names_the_two_largest_units(seconds: float, shown: str) -> None:
    assert human_duration(seconds) == shown


# ---- the health rule, with an explicit now ---------------------------------------------------


def stats(due_now: int = 0, lag_s: float = 0.0) -> QueueStats:
    return QueueStats(
        scheduled=due_now,
        due_now=due_now,
        leased=0,
        dead=0,
        next_due_at=None,
        oldest_due_lag_s=lag_s,
        now=NOW,
    )


def dead_at(*minutes_ago: int) -> list[HistoryPoint]:
    """History with one dead letter in each of the minutes ``minutes_ago`` before NOW."""
    return [HistoryPoint(NOW - timedelta(minutes=m), dead=1) for m in minutes_ago]


def test_an_idle_queue_is_ok() -> None:
    health = judge_health(stats(), live_workers=0)
    assert (health.level, health.reason) == ("ok", "ok")


def test_due_tasks_with_a_live_worker_and_little_lag_are_ok() -> None:
    assert judge_health(stats(40, 12.0), live_workers=2).level == "ok"


def test_due_tasks_and_no_live_worker_warn() -> None:
    health = judge_health(stats(3, 20.0), live_workers=0)
    assert health.level == "warn"
    assert health.reason == "3 due, no live worker (oldest waiting 20 s)"


def test_due_tasks_waiting_over_a_minute_with_no_live_worker_are_bad() -> None:
    health = judge_health(stats(180, 679.0), live_workers=0)
    assert health.level == "bad"
    assert health.reason == "180 due, no live worker (oldest waiting 11 min 19 s)"


def test_a_wait_over_five_minutes_is_bad_even_with_workers() -> None:
    health = judge_health(stats(5, 301.0), live_workers=3)
    assert health.level == "bad"
    assert health.reason == "oldest due task has waited 5 min 1 s (limit 5 min)"
    assert judge_health(stats(5, 299.0), live_workers=3).level == "ok"


def test_dead_letters_in_the_last_hour_warn_older_ones_do_not() -> None:
    recent = judge_health(stats(), live_workers=1, history=dead_at(59, 3, 0))
    assert recent.level == "warn"
    assert recent.reason == "3 dead letters in the last 1 h"
    assert judge_health(stats(), live_workers=1, history=dead_at(61, 90)).level == "ok"


def test_the_reasons_of_every_rule_that_fires_are_given() -> None:
    health = judge_health(stats(2, 400.0), live_workers=0, history=dead_at(1))
    assert health.level == "bad"
    assert health.reasons == (
        "2 due, no live worker (oldest waiting 6 min 40 s)",  # the wait named once
        "1 dead letter in the last 1 h",
    )
    slow = judge_health(stats(2, 400.0), live_workers=1, history=dead_at(1))
    assert slow.reasons == (
        "oldest due task has waited 6 min 40 s (limit 5 min)",
        "1 dead letter in the last 1 h",
    )


def test_thresholds_are_configurable() -> None:
    rules = HealthRules(no_worker_bad_s=600, lag_bad_s=3600, dead_window_s=300)
    assert judge_health(stats(180, 400.0), live_workers=0, rules=rules).level == "warn"
    assert judge_health(stats(1, 4000.0), live_workers=1, rules=rules).level == "bad"
    assert judge_health(stats(), live_workers=1, history=dead_at(10), rules=rules).level == "ok"


@pytest.mark.parametrize(
    "rules",
    [{"no_worker_bad_s": 0}, {"lag_bad_s": -1}, {"dead_window_s": 0}, {"dead_window_s": 90000}],
)
def test_a_threshold_that_is_not_a_sensible_duration_is_refused(rules: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError):
        HealthRules(**rules)


# ---- over HTTP, on a real Redis -----------------------------------------------------------

Client = Callable[..., TestClient]


@pytest.fixture
def dashboard(redis_server: RedisServer, r: redis.Redis) -> Iterator[Client]:
    opened: list[TestClient] = []

    def make(**settings: object) -> TestClient:
        app = create_app(redis_server.url, DashboardSettings(**settings))  # type: ignore[arg-type]
        client = TestClient(app, base_url="http://127.0.0.1")
        client.__enter__()
        opened.append(client)
        return client

    yield make
    for client in opened:
        client.__exit__(None, None, None)


def health_of_row(html: str, queue: str) -> str:
    found = re.search(rf'<tr data-health="(\w+)" data-queue="{queue}"', html)
    assert found, f"no row with a health state for {queue}"
    return found.group(1)


def test_overview_rows_carry_health_no_worker_is_warn_or_bad_idle_is_ok(
    r: redis.Redis, dashboard: Client
) -> None:
    overdue(Queue("stalled", r), count=180, minutes=11)
    Queue("idle", r).schedule({"n": 1}, delay=3600)
    client = dashboard()
    html = client.get("/").text
    assert health_of_row(html, "stalled") in ("warn", "bad")
    assert health_of_row(html, "stalled") == "bad"  # waited 11 min > 1 min with no worker
    assert "180 due, no live worker (oldest waiting 11 min" in html
    assert health_of_row(html, "idle") == "ok"
    assert 'id="health" data-health="bad"' in html  # the overview: its worst row
    data = client.get("/api/overview").json()
    assert data["queues"]["stalled"]["health"] == "bad"
    assert data["queues"]["idle"]["health"] == "ok"
    assert data["health"] == "bad"


def test_a_live_worker_from_discovery_makes_fresh_due_tasks_ok(
    r: redis.Redis, dashboard: Client
) -> None:
    q = Queue("served", r)
    q.pause()  # the worker announces itself but claims nothing: the due task stays due
    q.schedule({"n": 1}, id="now")
    client = dashboard()
    assert client.get("/api/overview").json()["queues"]["served"]["health"] == "warn"
    with running_worker(q):
        row = client.get("/api/overview").json()["queues"]["served"]
        assert (row["workers"], row["health"]) == (1, "ok")


def test_lag_is_shown_as_a_human_duration(r: redis.Redis, dashboard: Client) -> None:
    overdue(Queue("stalled", r), count=2, minutes=11)
    client = dashboard()
    assert re.search(r'data-live="stalled.oldest_due_lag_s">11 min( \d+ s)?<', client.get("/").text)
    page = client.get("/queue", params={"queue": "stalled"}).text
    assert re.search(r'data-live="stalled.oldest_due_lag_s">11 min( \d+ s)?<', page)
    assert (
        client.get("/api/overview").json()["live"]["stalled.oldest_due_lag_s"].startswith("11 min")
    )


def test_dead_letter_page_groups_every_queue_by_error_type(
    r: redis.Redis, dashboard: Client
) -> None:
    seed(r)
    other = Queue("billing", r, retry=RetryPolicy(max_attempts=1))
    other.schedule({"x": 1}, id="b-1")
    for d in other.claim(limit=1):
        d.fail(ValueError("no card"))
    html = dashboard().get("/dead").text
    assert "<h1>Dead letters (4 in 2 queues)</h1>" in html
    assert re.search(r"emails.*ValueError.*>2<", html, re.S)
    assert re.search(r"billing.*ValueError.*>1<", html, re.S)
    assert html.count('data-action="replay-group"') == 3  # emails x2 types, billing x1
    assert 'href="/dead"' in html  # in the header's navigation


def test_group_replay_confirmation_says_how_many_and_replays_them(
    r: redis.Redis, dashboard: Client
) -> None:
    queues = seed(r)
    client = dashboard()
    page = client.get(
        "/action/replay-group", params={"queue": "emails", "error_type": "ValueError"}
    )
    assert "Replay 2 tasks?" in page.text
    assert queues["emails"].dead.count() == 3  # asking changed nothing
    purge = client.get("/action/purge-group", params={"queue": "emails", "error_type": "KeyError"})
    assert "Purge 1 task?" in purge.text
    done = client.post(
        "/action/replay-group",
        data={"queue": "emails", "error_type": "ValueError", "csrf": csrf_of(page.text)},
    )
    assert done.status_code == 200 and "2 dead tasks with error ValueError replayed" in done.text
    assert queues["emails"].dead.count() == 1


def test_a_group_action_without_the_csrf_token_is_refused(
    r: redis.Redis, dashboard: Client
) -> None:
    queues = seed(r)
    client = dashboard()
    client.get("/dead")  # sets the CSRF cookie
    for verb in ("replay-group", "purge-group"):
        refused = client.post(
            f"/action/{verb}", data={"queue": "emails", "error_type": "ValueError"}
        )
        assert refused.status_code == 403 and "CSRF" in refused.text
    assert queues["emails"].dead.count() == 3


def test_a_dead_task_offers_replay_not_run_now_and_the_confirmation_counts(
    r: redis.Redis, dashboard: Client
) -> None:
    seed(r)
    client = dashboard()
    html = client.get("/task", params={"queue": "emails", "id": "fail-1"}).text
    assert 'data-action="replay"' in html and 'data-action="purge"' in html
    assert 'data-action="run-now"' not in html
    scheduled = client.get("/task", params={"queue": "emails", "id": "welcome:42"}).text
    assert 'data-action="run-now"' in scheduled  # a scheduled task still has it
    confirm = client.get("/action/replay", params={"queue": "emails", "id": "fail-1"}).text
    assert "Replay 1 task?" in confirm


def test_the_login_page_names_no_redis_and_the_logged_in_pages_do(
    r: redis.Redis, redis_server: RedisServer, dashboard: Client
) -> None:
    seed(r)
    client = dashboard(token="t0ken")
    where = f"127.0.0.1:{redis_server.port}"
    login = client.get("/login")
    assert where not in login.text and "redis://" not in login.text
    wrong = client.post("/login", data={"token": "nope", "csrf": csrf_of(login.text)})
    assert wrong.status_code == 401 and where not in wrong.text
    client.post("/login", data={"token": "t0ken", "csrf": csrf_of(login.text)})
    page = client.get("/")
    assert where in page.text and 'id="logout"' in page.text


def test_the_due_chart_labels_its_hours_and_the_throughput_chart_its_minutes(
    r: redis.Redis, dashboard: Client
) -> None:
    seed(r)
    client = dashboard()
    due = client.get("/chart/due.svg", params={"queue": "reports"}).text
    hours = re.findall(r'class="tick">\+(\d+) h<', due)
    assert hours == ["3", "6", "9", "12", "15", "18", "21"]
    assert "30 min per bar" in due
    throughput = client.get("/chart/throughput.svg").text
    assert len(re.findall(r'class="tick">\d\d:\d\d<', throughput)) >= 5


# ---- the docs page runs ----------------------------------------------------------------


def test_the_python_blocks_of_the_health_docs_run(
    redis_server: RedisServer, r: redis.Redis
) -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert blocks, "docs/dashboard-health.md has no python block"
    scope: dict[str, object] = {"REDIS_URL": redis_server.url}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), scope)  # the docs page's own examples


# ---- dueq dashboard --health-*: the thresholds from the command line -----------------------


def _served_by_cli(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch, *flags: str
) -> tuple[DashboardSettings, TestClient]:
    """Run ``dueq dashboard FLAGS`` without serving: the settings it built and its app."""
    command = importlib.import_module("dueq.cli.dashboard")  # the module, not the command
    built: list[DashboardSettings] = []
    create = dueq.dashboard.create_app

    def capture(url: str, settings: DashboardSettings) -> object:
        built.append(settings)
        return create(url, settings)

    listen = command.listen
    apps: list[object] = []
    monkeypatch.setattr(command, "listen", lambda host, port: listen(host, 0))
    monkeypatch.setattr(command, "serve", lambda app, sock: apps.append(app))
    monkeypatch.setattr(dueq.dashboard, "create_app", capture)
    result = CliRunner().invoke(cli, ["dashboard", "--redis-url", redis_server.url, *flags])
    assert result.exit_code == 0, result.output
    return built[0], TestClient(apps[0], base_url="http://127.0.0.1")  # type: ignore[arg-type]


def test_cli_health_flags_reach_the_overview_rows(
    r: redis.Redis, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    overdue(Queue("stalled", r), count=3, minutes=11)  # no worker: bad by default (> 1 min)
    settings, app = _served_by_cli(redis_server, monkeypatch)
    assert settings.health == HealthRules()
    with app as client:
        assert client.get("/api/overview").json()["queues"]["stalled"]["health"] == "bad"
    patient = ("--health-no-worker-bad-s", "1200", "--health-lag-bad-s", "3600")
    settings, app = _served_by_cli(
        redis_server, monkeypatch, *patient, "--health-dead-window-s", "600"
    )
    assert settings.health == HealthRules(no_worker_bad_s=1200, lag_bad_s=3600, dead_window_s=600)
    with app as client:  # 11 min with no worker is under 20 min: a warning, not bad
        assert client.get("/api/overview").json()["queues"]["stalled"]["health"] == "warn"
    _, app = _served_by_cli(redis_server, monkeypatch, *patient[:2], "--health-lag-bad-s", "600")
    with app as client:  # 11 min is over the 10 min lag limit: bad again
        assert client.get("/api/overview").json()["queues"]["stalled"]["health"] == "bad"


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--health-no-worker-bad-s", "0"),
        ("--health-lag-bad-s", "-5"),
        ("--health-lag-bad-s", "soon"),
        ("--health-dead-window-s", "90000"),
        ("--health-dead-window-s", "nan"),
    ],
)
def test_cli_health_flags_refuse_values_that_are_not_sensible_durations(
    invoke: Callable[..., object], flag: str, value: str
) -> None:
    result: Any = invoke("dashboard", "--port", "0", flag, value)
    assert result.exit_code == 2, result.output
    assert flag in result.output and "No such option" not in result.output
    assert "Traceback" not in result.output


# ---- issue 37: doctor gives the dashboard's verdict -----------------------------------------


def test_doctor_and_the_overview_agree_on_health_with_and_without_a_live_worker(
    r: redis.Redis, dashboard: Client
) -> None:
    stalled = Queue("stalled", r)
    overdue(stalled, count=402, minutes=11)
    served = Queue("served", r)
    served.pause()  # its worker announces itself but claims nothing: the due task stays due
    served.schedule({"n": 1}, id="now")
    client = dashboard()

    def both(q: Queue) -> tuple[str, str]:
        report = q.doctor()
        assert report.health is not None
        return report.health.level, client.get("/api/overview").json()["queues"][q.name]["health"]

    assert both(stalled) == ("bad", "bad")
    assert both(served) == ("warn", "warn")
    with running_worker(served):
        assert both(served) == ("ok", "ok")
        assert served.doctor().healthy
