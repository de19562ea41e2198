"""``dueq cron add|list|remove`` against the test redis-server."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from cli_support import one_error_line

import dueq


def test_add_stores_the_definition_and_schedules_its_next_occurrence(invoke, r):
    result = invoke(
        "cron",
        "add",
        "reports",
        "nightly",
        "30 2 * * *",
        "--tz",
        "Europe/Berlin",
        "--payload",
        '{"report": "daily"}',
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("added cron 'nightly' in 'reports'; next occurrence 20")
    (definition,) = dueq.Queue("reports", r).cron.list()
    assert (definition.expr, definition.tz, definition.missed) == (
        "30 2 * * *",
        "Europe/Berlin",
        "latest",
    )
    assert definition.payload == {"report": "daily"}
    assert definition.next_at is not None and definition.next_at > datetime.now(timezone.utc)
    assert dueq.Queue("reports", r).stats().scheduled == 1


def test_adding_again_is_unchanged_and_a_change_needs_the_replace_flag(invoke, r):
    assert invoke("cron", "add", "q", "sync", "*/15 * * * *").exit_code == 0
    again = invoke("cron", "add", "q", "sync", "*/15 * * * *")
    assert again.exit_code == 0 and again.stdout.startswith("unchanged cron 'sync'")
    changed = invoke("cron", "add", "q", "sync", "*/5 * * * *")
    assert changed.exit_code == 1
    line = one_error_line(changed)
    assert "add it with --replace" in line and "replace=True" not in line
    assert dueq.Queue("q", r).cron.list()[0].expr == "*/15 * * * *"
    replaced = invoke("cron", "add", "q", "sync", "*/5 * * * *", "--replace", "--missed", "all")
    assert replaced.exit_code == 0 and replaced.stdout.startswith("replaced cron 'sync'")
    definition = dueq.Queue("q", r).cron.list()[0]
    assert (definition.expr, definition.missed, definition.max_missed) == ("*/5 * * * *", "all", 10)


def test_list_shows_every_definition(invoke, r):
    q = dueq.Queue("q", r)
    q.cron.add("a-hourly", "@hourly", payload={"n": 1})
    q.cron.add("b-daily", "0 3 * * 1-5", tz="America/New_York", missed="all", max_missed=3)
    result = invoke("cron", "list", "q")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    row_a = next(line for line in lines if "a-hourly" in line)
    row_b = next(line for line in lines if "b-daily" in line)
    assert "@hourly" in row_a and '{"n":1}' in row_a and "UTC" in row_a
    assert "America/New_York" in row_b and "all (max 3)" in row_b


def test_list_of_a_queue_without_definitions_says_so(invoke, r):
    dueq.Queue("q", r).schedule({"x": 1})
    result = invoke("cron", "list", "q")
    assert result.exit_code == 0
    assert result.stdout == "no cron definitions in 'q'\n"


def test_remove_asks_first_and_then_drops_the_definition(invoke, r):
    q = dueq.Queue("q", r)
    q.cron.add("sync", "@hourly")
    declined = invoke("cron", "remove", "q", "sync", input="n\n")
    assert declined.exit_code == 1
    assert len(q.cron.list()) == 1
    result = invoke("cron", "remove", "q", "sync", input="y\n")
    assert result.exit_code == 0, result.output
    assert result.stdout == "removed 1 cron definition(s) from 'q'\n"
    assert q.cron.list() == [] and q.stats().scheduled == 0


def test_remove_of_an_unknown_name_is_an_error_and_removes_nothing(invoke, r):
    q = dueq.Queue("q", r)
    q.cron.add("sync", "@hourly")
    result = invoke("cron", "remove", "q", "sync", "nope", "--yes")
    assert result.exit_code == 1
    assert one_error_line(result) == "error: no cron definition in 'q' named 'nope'"
    assert len(q.cron.list()) == 1


def test_bad_input_is_one_line_and_writes_nothing(invoke, r):
    cases = [
        (["cron", "add", "q", "n", "61 * * * *"], 1, "invalid cron expression"),
        (["cron", "add", "q", "n", "@daily", "--tz", "Mars/Olympus"], 1, "unknown time zone"),
        (["cron", "add", "q", "n", "@daily", "--payload", "{bad"], 2, "not valid JSON"),
        (["cron", "add", "q", "n", "@daily", "--payload", "NaN"], 2, "NaN is not JSON"),
        (["cron", "add", "q", "n", "@daily", "--missed", "some"], 2, "'some' is not one of"),
        (["cron", "add", "q", "two words", "@daily"], 1, "without spaces"),
        (["cron", "list", "unknown"], 1, "no queue named 'unknown'"),
        (["cron", "remove", "unknown", "x", "--yes"], 1, "no queue named 'unknown'"),
    ]
    for args, code, message in cases:
        result = invoke(*args)
        assert result.exit_code == code, (args, result.output)
        assert message in one_error_line(result), args
    assert r.dbsize() == 0


def test_unreachable_redis_is_one_line(invoke):
    result = invoke("cron", "list", "q", url="redis://127.0.0.1:1/0")
    assert result.exit_code == 1
    assert "cannot reach Redis at redis://127.0.0.1:1/0" in one_error_line(result)


def test_list_shows_a_corrupted_definition_and_what_is_wrong_with_it(invoke, r):
    q = dueq.Queue("q", r)
    q.cron.add("good", "@hourly")
    q.cron.add("bad", "@hourly")
    r.hset(q.keys.cron, "bad", "{not json")
    r.hset(q.keys.cron_state, "good", "garbage")
    result = invoke("cron", "list", "q")
    assert result.exit_code == 0, result.output
    out = " ".join(result.stdout.split())
    assert "cron 'bad' cannot be kept going: its definition in Redis cannot be used" in out
    assert "cron 'good' cannot be kept going: its schedule state in Redis cannot be read" in out
    removed = invoke("cron", "remove", "q", "bad", "--yes")
    assert removed.exit_code == 0, removed.output
    assert [d.name for d in q.cron.list()] == ["good"]


def test_pause_resume_and_run_now_act_on_the_definition(invoke, r):
    q = dueq.Queue("q", r)
    q.cron.add("sync", "@hourly", payload={"n": 1})
    paused = invoke("cron", "pause", "q", "sync")
    assert paused.exit_code == 0, paused.output
    assert paused.stdout == "paused cron 'sync' in 'q'\n"
    assert invoke("cron", "pause", "q", "sync").stdout == "cron 'sync' in 'q' was already paused\n"
    assert q.stats().scheduled == 0
    row = next(line for line in invoke("cron", "list", "q").stdout.splitlines() if "sync" in line)
    assert "paused" in row

    ran = invoke("cron", "run-now", "q", "sync")
    assert ran.exit_code == 0, ran.output
    assert ran.stdout.startswith("scheduled cron:sync:now:") and ran.stdout.endswith(
        " in 'q', due now\n"
    )
    (d,) = q.claim()
    assert (d.id, d.payload) == (ran.stdout.split()[1], {"n": 1})
    d.ack()

    resumed = invoke("cron", "resume", "q", "sync")
    assert resumed.exit_code == 0, resumed.output
    assert resumed.stdout.startswith("resumed cron 'sync' in 'q'; next occurrence 20")
    assert invoke("cron", "resume", "q", "sync").stdout == "cron 'sync' in 'q' was not paused\n"
    definition = q.cron.get("sync")
    assert definition is not None and not definition.paused and definition.next_at is not None
    assert q.stats().scheduled == 1


def test_pause_resume_and_run_now_of_an_unknown_name_are_one_line_errors(invoke, r):
    dueq.Queue("q", r).cron.add("sync", "@hourly")
    for command in ("pause", "resume", "run-now"):
        result = invoke("cron", command, "q", "nope")
        assert result.exit_code == 1, result.output
        assert one_error_line(result) == "error: no cron definition named 'nope' in queue 'q'"
        unknown_queue = invoke("cron", command, "unknown", "sync")
        assert unknown_queue.exit_code == 1
        assert "no queue named 'unknown'" in one_error_line(unknown_queue)
    assert dueq.Queue("q", r).stats().scheduled == 1


def test_list_shows_the_outcome_of_each_definitions_last_firing(invoke, r):
    q = dueq.Queue("q", r)
    q.cron.add("a-ok", "@hourly")
    q.cron.add("b-bad", "@daily")
    q.cron.add("c-new", "@weekly")
    q.cron.run_now("a-ok")
    q.cron.run_now("b-bad")
    for d in q.claim(10):
        if d.id.startswith("cron:a-ok:"):
            d.ack()
        else:
            q.fail(d, dueq.Unrecoverable("smtp down"))
    result = invoke("cron", "list", "q")
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if "│" in line}
    assert "acked " in rows["a-ok"] and " ago" in rows["a-ok"]
    assert "dead: Unrecoverable " in rows["b-bad"]
    assert "acked" not in rows["c-new"] and "dead" not in rows["c-new"]


def test_add_takes_every_policy_and_list_json_shows_them(invoke, r):
    result = invoke(
        "cron", "add", "q", "poll", "--every", "300", "--offset", "10", "--overlap", "skip",
        "--start", "2026-01-01T00:00:00Z", "--end", "2099-01-01T00:00:00+01:00",
        "--limit", "100", "--jitter", "30", "--catchup-window", "7200",
        "--pause-after-failures", "3", "--task", "send_report", "--priority", "5",
        "--key", "reports", "--timeout", "600", "--max-attempts", "3",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    listed = invoke("cron", "list", "q", "--json")
    assert listed.exit_code == 0, listed.output
    [d] = json.loads(listed.stdout)["definitions"]
    assert (d["every"], d["offset"], d["overlap"], d["limit"]) == (300.0, 10.0, "skip", 100)
    assert (d["jitter"], d["catchup_window"], d["pause_after_failures"]) == (30.0, 7200.0, 3)
    assert (d["task"], d["priority"], d["key"], d["timeout"], d["max_attempts"]) == (
        "send_report",
        5,
        "reports",
        600.0,
        3,
    )
    assert (d["fired"], d["skipped"], d["failures"], d["finished"]) == (0, 0, 0, None)
    assert d["start"].startswith("2026-01-01T00:00:00")
    table = invoke("cron", "list", "q")
    assert "overlap skip" in table.stdout.replace("\n", " ") or "overlap" in table.stdout


def test_add_refuses_a_time_without_offset_and_expr_with_every(invoke):
    naive = invoke("cron", "add", "q", "p", "--every", "60", "--start", "2026-01-01T00:00:00")
    assert naive.exit_code == 2 and "time zone offset" in naive.output
    both = invoke("cron", "add", "q", "p", "* * * * *", "--every", "60")
    assert both.exit_code == 1 and "not both" in one_error_line(both)


def test_backfill_prints_how_many_and_adds_nothing_the_second_time(invoke, r):
    dueq.Queue("q", r).cron.add("h", "0 * * * *")
    args = ("cron", "backfill", "q", "h", "--start", "2026-01-01T00:00:00Z")
    first = invoke(*args, "--end", "2026-01-01T05:00:00Z")
    assert first.exit_code == 0, first.output
    assert first.stdout.strip() == "backfilled 5 occurrence(s) of cron 'h' in 'q'"
    again = invoke(*args, "--end", "2026-01-01T05:00:00Z")
    assert again.stdout.strip() == "backfilled 0 occurrence(s) of cron 'h' in 'q'"


def test_add_expires_and_list_shows_it(invoke, r):
    result = invoke("cron", "add", "q", "fresh", "0 * * * *", "--expires", "600")
    assert result.exit_code == 0, result.output
    assert dueq.Queue("q", r).cron.get("fresh").expires == timedelta(minutes=10)
    [d] = json.loads(invoke("cron", "list", "q", "--json").stdout)["definitions"]
    assert d["expires"] == 600.0
    assert "expires" in invoke("cron", "list", "q").stdout
    bad = invoke("cron", "add", "q", "j", "--every", "60", "--jitter", "60", "--expires", "30")
    assert bad.exit_code == 1 and "jitter must be shorter than expires" in one_error_line(bad)
