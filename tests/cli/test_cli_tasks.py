"""``dueq list|show|cancel|reschedule|run-now`` and ``dead replay|purge --error-type`` against the
test redis-server; ``--json`` output is parsed, never grepped."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import dueq


@pytest.fixture
def q(make_queue: Any) -> Any:
    return make_queue("jobs", clock=None, retry=dueq.RetryPolicy(max_attempts=1))


def _json(result: Any) -> Any:
    """The tasks of a --json document ({"queue", "tasks": [...], ...}, docs/json.md)."""
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["queue"] == "jobs"
    return document["tasks"]


def _one_of_each_state(q: Any) -> None:
    """t-dead (died of TimeoutError), v-dead (ValueError), t-held (leased by w1), t-later."""
    q.schedule_many(dueq.Task({"to": f"{i}@example.com"}, id=i) for i in ("t-dead", "v-dead"))
    for d in q.claim(2):
        d.fail(TimeoutError("smtp") if d.id == "t-dead" else ValueError("bad address"))
    q.schedule({"to": "held@example.com"}, id="t-held")
    q.claim_batch(1, holder="w1")
    q.schedule({"to": "later@example.com"}, id="t-later", delay=3600, priority=2)


def test_list_json_in_every_state(invoke: Any, q: Any) -> None:
    _one_of_each_state(q)
    [later] = _json(invoke("list", "jobs", "--json"))
    assert (later["id"], later["state"], later["priority"]) == ("t-later", "scheduled", 2)
    assert later["payload"] == {"to": "later@example.com"}
    [held] = _json(invoke("list", "jobs", "--state", "leased", "--json"))
    assert (held["id"], held["holder"], held["attempt"]) == ("t-held", "w1", 1)
    dead = _json(invoke("list", "jobs", "--state", "dead", "--json"))
    assert [t["id"] for t in dead] == ["v-dead", "t-dead"]  # newest first (one ms: by id)
    assert dead[1]["errors"][-1]["type"] == "TimeoutError"


def test_list_filters_and_limits(invoke: Any, q: Any) -> None:
    _one_of_each_state(q)
    args = ("list", "jobs", "--state", "dead", "--json")
    assert [t["id"] for t in _json(invoke(*args, "--error-type", "ValueError"))] == ["v-dead"]
    assert [t["id"] for t in _json(invoke(*args, "--grep", "t-dead@"))] == ["t-dead"]
    assert [t["id"] for t in _json(invoke(*args, "--id-prefix", "v"))] == ["v-dead"]
    assert len(_json(invoke(*args, "--limit", "1"))) == 1
    soon = (datetime.now(UTC) + timedelta(minutes=5)).isoformat()
    assert _json(invoke("list", "jobs", "--before", soon, "--json")) == []
    assert [t["id"] for t in _json(invoke("list", "jobs", "--after", soon, "--json"))] == [
        "t-later"
    ]
    table = invoke("list", "jobs", "--state", "leased")
    assert table.exit_code == 0 and "w1" in table.stdout and "t-held" in table.stdout
    more = invoke("list", "jobs", "--state", "dead", "--limit", "1")
    assert "showing the first 1" in more.stdout


def test_show_any_state_as_json_and_an_unknown_id_fails(invoke: Any, q: Any) -> None:
    _one_of_each_state(q)
    shown = _json(invoke("show", "jobs", "t-later", "t-held", "t-dead", "--json"))
    assert [(t["id"], t["state"]) for t in shown] == [
        ("t-later", "scheduled"),
        ("t-held", "leased"),
        ("t-dead", "dead"),
    ]
    assert shown[1]["holder"] == "w1" and shown[2]["died_at"].endswith("Z")
    text = invoke("show", "jobs", "t-held")
    assert text.exit_code == 0 and "held by: w1" in text.stdout
    missing = invoke("show", "jobs", "t-later", "nope")
    assert missing.exit_code != 0 and "nope" in missing.output


def test_cancel_in_every_state_after_confirmation(invoke: Any, q: Any) -> None:
    _one_of_each_state(q)
    declined = invoke("cancel", "jobs", "t-later", input="n\n")
    assert declined.exit_code != 0 and q.get("t-later") is not None
    result = invoke("cancel", "jobs", "t-later", "t-held", "t-dead", "--yes")
    assert result.exit_code == 0, result.output
    assert [q.get(i) for i in ("t-later", "t-held", "t-dead")] == [None, None, None]
    again = invoke("cancel", "jobs", "t-later", "--yes")
    assert again.exit_code != 0 and "t-later" in again.output


def test_reschedule_and_run_now(invoke: Any, q: Any) -> None:
    _one_of_each_state(q)
    at = datetime.now(UTC) + timedelta(days=2)
    result = invoke("reschedule", "jobs", "t-later", "--at", at.isoformat())
    assert result.exit_code == 0, result.output
    assert abs((q.get("t-later").due_at - at).total_seconds()) < 0.01
    leased = invoke("reschedule", "jobs", "t-held", "--delay", "5")
    assert leased.exit_code != 0 and "leased" in leased.output
    assert invoke("reschedule", "jobs", "t-later").exit_code == 2  # neither --at nor --delay
    result = invoke("run-now", "jobs", "t-later", "t-dead")
    assert result.exit_code == 0, result.output
    assert {d.id for d in q.claim(5)} == {"t-later", "t-dead"}
    refused = invoke("run-now", "jobs", "t-held")
    assert refused.exit_code != 0 and "t-held" in refused.output


def test_dead_replay_and_purge_by_error_type(invoke: Any, q: Any) -> None:
    _one_of_each_state(q)
    result = invoke("dead", "replay", "jobs", "--error-type", "TimeoutError", "--yes")
    assert result.exit_code == 0, result.output
    assert "replayed 1" in result.stdout
    assert q.get("t-dead").state == "scheduled" and q.get("v-dead").state == "dead"
    result = invoke("dead", "purge", "jobs", "--error-type", "ValueError", input="y\n")
    assert result.exit_code == 0 and q.get("v-dead") is None
    both = invoke("dead", "purge", "jobs", "--error-type", "X", "--all", "--yes")
    assert both.exit_code == 2
