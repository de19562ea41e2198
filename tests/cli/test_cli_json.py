"""``--json`` on the read commands: parsed, never grepped."""

from __future__ import annotations

import json
from datetime import datetime

import pytest
from cli_support import bury

import dueq


def parsed(result) -> dict:
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 1, result.stdout
    document = json.loads(lines[0])
    assert isinstance(document, dict)
    return document


def test_stats_json_gives_every_state_counter_and_time_of_each_queue(invoke, make_queue, r):
    q = make_queue("orders", clock=None)
    q.schedule_many(dueq.Task({"n": n}, id=f"now{n}") for n in range(4))
    q.schedule({"n": 9}, delay=3600)
    held = q.claim(3)
    held[0].fail(dueq.Unrecoverable("bad"))
    held[1].ack()
    make_queue("other", clock=None).schedule({})
    dueq.Queue("other", r).pause()
    doc = parsed(invoke("stats", "--json"))
    by_name = {row["queue"]: row for row in doc["queues"]}
    assert set(by_name) == {"orders", "other"} and doc["skipped"] == []
    orders = by_name["orders"]
    assert (orders["scheduled"], orders["due_now"], orders["leased"], orders["dead"]) == (
        2,
        1,
        1,
        1,
    )
    assert orders["counters"]["acked"] == 1 and orders["counters"]["dead"] == 1
    assert orders["paused"] is False and by_name["other"]["paused"] is True
    assert datetime.fromisoformat(orders["next_due_at"].replace("Z", "+00:00")) is not None
    assert orders["oldest_due_lag_s"] >= 0
    assert orders["settings"]["paused"] is False


def test_stats_json_of_one_queue_and_watch_print_one_object_per_refresh(invoke, make_queue):
    make_queue("w", clock=None).schedule({})
    doc = parsed(invoke("stats", "w", "--json"))
    assert [row["queue"] for row in doc["queues"]] == ["w"]
    result = invoke("stats", "w", "--json", "--watch", "--count", "3", "--interval", "0.01")
    assert result.exit_code == 0
    docs = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(docs) == 3 and all(d["queues"][0]["scheduled"] == 1 for d in docs)


def test_stats_json_names_a_queue_it_could_not_read(invoke, make_queue, admin):
    make_queue("healthy", clock=None).schedule({})
    make_queue("broken", clock=None).schedule({})
    admin.delete("dueq:{broken}:config")
    admin.set("dueq:{broken}:config", "not a hash")
    doc = parsed(invoke("stats", "--json"))
    assert [row["queue"] for row in doc["queues"]] == ["healthy"]
    assert [s["queue"] for s in doc["skipped"]] == ["broken"]


@pytest.fixture
def q(make_queue) -> dueq.Queue:
    return make_queue("jobs", clock=None, retry=dueq.RetryPolicy(max_attempts=2))


def test_dead_list_json_lets_a_script_pick_ids_by_error_type(invoke, q):
    bury(q, 3)
    q.schedule({"smtp": True}, id="smtp")
    for _ in range(2):
        (d,) = q.claim(1, lease=60)
        try:
            raise TimeoutError("smtp timed out")
        except TimeoutError as exc:
            d.fail(exc, retry_in=0)
    doc = parsed(invoke("dead", "list", "jobs", "--json"))
    assert doc["queue"] == "jobs" and doc["total"] == 4 and doc["next_cursor"] is None
    timeouts = [t["id"] for t in doc["tasks"] if t["errors"][-1]["type"] == "TimeoutError"]
    assert timeouts == ["smtp"]
    last = doc["tasks"][0]  # newest first: smtp died last
    assert last["state"] == "dead" and last["attempt"] == 2 and last["payload"] == {"smtp": True}
    assert last["died_at"].endswith("Z") and last["queue"] == "jobs"
    assert "in test_dead_list_json" in last["errors"][0]["traceback"]


def test_dead_show_json_has_every_error_with_its_traceback(invoke, q):
    bury(q, 2)
    doc = parsed(invoke("dead", "show", "jobs", "d1", "--id", "d0", "--json"))
    assert [t["id"] for t in doc["tasks"]] == ["d1", "d0"]
    errors = doc["tasks"][0]["errors"]
    assert [e["message"] for e in errors] == ["first try of d1", "second try of d1"]
    assert "in bury" in errors[0]["traceback"]


def test_json_output_escapes_terminal_controls_in_ids(invoke, q):
    bury(q, 1, prefix="\x1b]0;x\x07")
    result = invoke("dead", "list", "jobs", "--json")
    assert "\x1b" not in result.stdout
    assert parsed(result)["tasks"][0]["id"] == "\x1b]0;x\x070"


def test_cron_list_json_gives_each_definition(invoke, r):
    q = dueq.Queue("c", r)
    q.cron.add("nightly", "30 2 * * *", payload={"k": 1}, tz="Europe/Berlin")
    q.cron.add("hourly", "@hourly")
    q.cron.pause("hourly")
    doc = parsed(invoke("cron", "list", "c", "--json"))
    by_name = {d["name"]: d for d in doc["definitions"]}
    nightly = by_name["nightly"]
    assert (nightly["expr"], nightly["tz"], nightly["payload"]) == (
        "30 2 * * *",
        "Europe/Berlin",
        {"k": 1},
    )
    assert nightly["paused"] is False and nightly["problem"] is None
    assert nightly["next_at"].endswith("Z")
    assert by_name["hourly"]["paused"] is True and by_name["hourly"]["next_at"] is None


def test_cron_list_json_gives_the_last_outcome_of_each_definition(invoke, r):
    q = dueq.Queue("c", r)
    q.cron.add("nightly", "30 2 * * *")
    q.cron.add("hourly", "@hourly")
    fired = q.cron.run_now("nightly")
    [d] = q.claim(10)
    d.fail(TimeoutError("slow"))
    by_name = {d["name"]: d for d in parsed(invoke("cron", "list", "c", "--json"))["definitions"]}
    nightly = by_name["nightly"]
    assert (nightly["last_outcome"], nightly["last_occurrence"]) == ("retrying", fired)
    assert nightly["last_error_type"] == "TimeoutError" and nightly["last_success_at"] is None
    assert datetime.fromisoformat(nightly["last_outcome_at"]).tzinfo is not None
    assert by_name["hourly"]["last_outcome"] is None
