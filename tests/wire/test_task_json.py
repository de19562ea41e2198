"""One JSON form of a task (``TaskInfo.to_json``): the CLI's ``list``/``show``/``dead list``/
``dead show --json``, the dashboard's ``/api/tasks`` and ``/api/task`` and ``to_json`` itself
give the same document for the same task, on both front ends; docs/json.md's example is
checked here."""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from paths_support import DOCS

import dueq
from dueq.dashboard import DashboardSettings, create_app
from dueq.model import ErrorRecord, TaskInfo
from dueq.server import RedisServer

with warnings.catch_warnings():
    # Starlette 1.x prefers the httpx2 fork and warns once on import when it finds httpx
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

DOC = DOCS / "json.md"


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_the_documented_example_is_what_to_json_gives() -> None:
    info = TaskInfo(
        id="welcome:42",
        state="leased",
        payload={"to": "ann@example.com"},
        attempt=2,
        due_at=_at("2030-01-02T03:04:05.678Z"),
        first_claimed_at=_at("2030-01-02T03:00:00Z"),
        errors=[
            ErrorRecord(
                attempt=1,
                type="SMTPServerDisconnected",
                message="Connection unexpectedly closed",
                traceback=None,
                at=_at("2030-01-02T03:00:01.25Z"),
                worker="mail-1",
            )
        ],
        lease_deadline=_at("2030-01-02T03:05:05.678Z"),
        priority=3,
        key="customer:7",
        timeout=timedelta(seconds=30),
        max_attempts=5,
        holder="mail-2",
    )
    [example] = re.findall(r"```json\n(.*?)```", DOC.read_text(), re.S)
    document = info.to_json("emails")
    assert document == json.loads(example)
    assert list(document) == list(json.loads(example)), "the doc lists the keys in order"
    assert json.loads(json.dumps(document)) == document


@pytest.fixture
def api(redis_server: RedisServer) -> Iterator[TestClient]:
    client = TestClient(
        create_app(redis_server.url, DashboardSettings()), base_url="http://127.0.0.1"
    )
    with client:
        yield client


def _one_of_each_state(q: Any) -> None:
    """dead (a failed attempt, with traceback and worker), held (leased by w1), later."""
    q.schedule({"to": "dead@example.com"}, id="dead", key="k", timeout=2.5, max_attempts=1)
    [d] = q.claim_batch(1, holder="w0").deliveries
    try:
        raise TimeoutError("smtp")
    except TimeoutError as exc:
        d.fail(exc)
    q.schedule({"to": "held@example.com"}, id="held")
    q.claim_batch(1, holder="w1")
    q.schedule({"to": "later@example.com"}, id="later", delay=3600, priority=2)


def _stdout(result: Any) -> Any:
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 1, result.stdout
    return json.loads(lines[0])


def test_cli_dashboard_and_to_json_give_the_same_document(
    make_queue: Any, invoke: Any, api: TestClient
) -> None:
    q = make_queue("jobs", clock=None)
    _one_of_each_state(q)
    expected = {i: q.get(i).to_json("jobs") for i in ("dead", "held", "later")}
    dead, held = expected["dead"], expected["held"]
    assert dead["errors"][0]["worker"] == "w0" and "TimeoutError" in dead["errors"][0]["traceback"]
    assert (dead["key"], dead["timeout_s"], dead["max_attempts"]) == ("k", 2.5, 1)
    # a first lease keeps no due time (claim.lua writes it no meta value): its holder is from
    # its claim's record
    assert held["holder"] == "w1" and held["due_ms"] is None and held["first_claimed_at"]

    shown = _stdout(invoke("show", "jobs", "later", "held", "dead", "--json"))
    assert shown == {"queue": "jobs", "tasks": [expected[i] for i in ("later", "held", "dead")]}
    assert _stdout(invoke("dead", "show", "jobs", "dead", "--json")) == {
        "queue": "jobs",
        "tasks": [dead],
    }
    for state, task_id in (("scheduled", "later"), ("leased", "held"), ("dead", "dead")):
        listed = _stdout(invoke("list", "jobs", "--state", state, "--json"))
        assert listed == {"queue": "jobs", "tasks": [expected[task_id]], "next_cursor": None}
        page = api.get("/api/tasks", params={"queue": "jobs", "state": state}).json()
        assert page["tasks"] == [expected[task_id]]
        one = api.get("/api/task", params={"queue": "jobs", "id": task_id}).json()
        assert one == expected[task_id]
    assert _stdout(invoke("dead", "list", "jobs", "--json")) == {
        "queue": "jobs",
        "total": 1,
        "tasks": [dead],
        "next_cursor": None,
    }


def test_list_and_dead_list_give_dead_tasks_newest_first_with_a_cursor(
    make_queue: Any, invoke: Any
) -> None:
    q = make_queue("jobs", clock=None, retry=dueq.RetryPolicy(max_attempts=1))
    for n in range(3):
        q.schedule({"n": n}, id=f"d{n}")
        [d] = q.claim(1)
        d.fail(ValueError(f"no {n}"))
    for command in (("list", "jobs", "--state", "dead"), ("dead", "list", "jobs")):
        first = _stdout(invoke(*command, "--json", "--limit", "2"))
        assert [t["id"] for t in first["tasks"]] == ["d2", "d1"], command
        assert first["next_cursor"] is not None
        rest = _stdout(invoke(*command, "--json", "--cursor", first["next_cursor"]))
        assert [t["id"] for t in rest["tasks"]] == ["d0"], command
        assert rest["next_cursor"] is None


def test_times_are_utc_milliseconds_and_due_ms_matches(make_queue: Any) -> None:
    q = make_queue("jobs", clock=None)
    due = datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    q.schedule({}, id="t", at=due)
    document = q.get("t").to_json("jobs")
    assert document["due_at"] == "2031-05-06T07:08:09.123Z"
    assert document["due_ms"] == int(due.timestamp() * 1000)


def test_attempt_is_one_name_in_task_info_json_cli_tables_and_spark_columns(
    r: Any, invoke: Any
) -> None:
    import dataclasses

    q = dueq.Queue("jobs", r, retry=dueq.RetryPolicy(max_attempts=1))
    q.configure(keep_results=60)
    q.schedule({"n": 1}, id="s", delay=3600)
    for tid in ("l", "x", "d"):
        q.schedule({"n": 1}, id=tid)
    held = {d.id: d for d in q.claim(limit=10)}
    held["x"].fail("boom")
    held["d"].ack()
    assert "attempt" in {f.name for f in dataclasses.fields(TaskInfo)}
    assert "attempt" in q.get("l").to_json("jobs") and "attempts" not in q.get("l").to_json("jobs")
    headers = {}
    for state in ("scheduled", "leased", "done", "dead"):
        shown = invoke("list", "jobs", "--state", state)
        assert shown.exit_code == 0, shown.output
        [header] = [line for line in shown.stdout.splitlines() if line.startswith("┃")]
        headers[state] = [c.strip() for c in header.split("┃")[1:-1]]
    assert all("attempt" in cells and "attempts" not in cells for cells in headers.values())
    assert "attempt: 1" in invoke("show", "jobs", "x").stdout


def test_spark_task_rows_name_the_count_attempt_and_keep_attempts_as_a_deprecated_alias() -> None:
    pytest.importorskip("pyspark", reason="pyspark is not installed: pip install 'dueq[spark]'")
    from dueq.spark._batch import _TASK_SCHEMA, _task_row

    names = _TASK_SCHEMA.fieldNames()
    assert names[4] == "attempt" and names[-1] == "attempts"  # the alias last, to be dropped
    info = TaskInfo("t", "dead", {"n": 1}, 3, None, None)
    row = dict(zip(names, _task_row(info), strict=True))
    assert row["attempt"] == row["attempts"] == 3
