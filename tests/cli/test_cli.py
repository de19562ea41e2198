"""The ``dueq`` command line against the test redis-server: schedule, stats, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
from cli_support import UNREACHABLE, one_error_line
from click.testing import CliRunner
from paths_support import FIXTURES

import dueq
from dueq.cli import cli

# -- schedule ----------------------------------------------------------------------------------


def test_schedule_prints_the_id_and_stores_the_payload_due_after_the_delay(invoke, r):
    result = invoke("schedule", "emails", '{"to": "a@example.com"}', "--delay", "60", "--id", "w:1")
    assert result.exit_code == 0, result.output
    assert result.stdout == "w:1\n"
    info = dueq.Queue("emails", r).get("w:1")
    assert info is not None and info.payload == {"to": "a@example.com"}
    lead = (info.due_at - datetime.now(timezone.utc)).total_seconds()
    assert 50 < lead <= 60


def test_schedule_at_an_iso_time_with_z_and_a_generated_id(invoke, r):
    result = invoke("schedule", "emails", "[1, 2]", "--at", "2031-02-03T04:05:06Z")
    assert result.exit_code == 0, result.output
    info = dueq.Queue("emails", r).get(result.stdout.strip())
    assert info is not None and info.payload == [1, 2]
    assert info.due_at == datetime(2031, 2, 3, 4, 5, 6, tzinfo=timezone.utc)


def test_an_existing_id_is_left_alone_with_a_note_unless_replace(invoke, r):
    invoke("schedule", "q", '{"v": 1}', "--id", "x")
    again = invoke("schedule", "q", '{"v": 2}', "--id", "x")
    assert again.exit_code == 0
    assert "already exists" in again.stderr
    assert dueq.Queue("q", r).get("x").payload == {"v": 1}
    assert invoke("schedule", "q", '{"v": 3}', "--id", "x", "--replace").exit_code == 0
    assert dueq.Queue("q", r).get("x").payload == {"v": 3}


def write_lines(path: Path, items: list[object]) -> Path:
    path.write_text("".join(json.dumps(item) + "\n" for item in items), encoding="utf-8")
    return path


def test_schedule_a_file_of_2500_tasks_then_again_adds_nothing(invoke, r, tmp_path):
    items = [{"payload": {"n": n}, "id": f"t{n}", "delay": 30} for n in range(2500)]
    items[7] = {"payload": {"n": 7}, "id": "t7", "at": "2031-01-01T00:00:00+02:00"}
    path = write_lines(tmp_path / "tasks.jsonl", items)
    first = invoke("schedule", "bulk", "--file", str(path))
    assert first.exit_code == 0, first.output
    assert "2500 added, 0 already existed" in first.stdout
    q = dueq.Queue("bulk", r)
    assert q.stats().scheduled == 2500
    assert q.get("t7").due_at == datetime(2030, 12, 31, 22, tzinfo=timezone.utc)
    second = invoke("schedule", "bulk", "--file", str(path))
    assert "0 added, 2500 already existed" in second.stdout


def test_file_lines_without_timing_take_the_delay_option_and_stdin_works(invoke, r):
    lines = '{"payload": 1, "id": "a"}\n\n{"payload": 2, "id": "b", "delay": 0}\n'
    result = invoke("schedule", "q", "--file", "-", "--delay", "3600", input=lines)
    assert result.exit_code == 0, result.output
    q = dueq.Queue("q", r)
    assert q.stats().scheduled == 2
    assert q.stats().due_now == 1  # "b" says delay 0; "a" waits an hour


@pytest.mark.parametrize(
    ("bad_line", "reason"),
    [
        ("{not json", "not valid JSON"),
        ('{"payload": NaN}', "NaN is not JSON"),
        ('{"id": "x"}', 'no "payload"'),
        ('{"payload": 1, "dealy": 5}', "unknown key"),
        ('{"payload": 1, "at": "2030-01-01T00:00:00"}', "no time zone"),
        ('{"payload": 1, "delay": -1}', "must not be negative"),
        ('{"payload": 1, "at": "2030-01-01T00:00:00Z", "delay": 1}', "not both"),
        ('{"payload": 1, "id": ""}', "must not be empty"),
        ("[1]", "JSON object"),
        ('{"payload": 1, "id": "\\ud800"}', "not valid Unicode"),
        ('{"payload": "\\udc80"}', "not JSON-encodable"),
        ('{"payload": ' + "[" * 100_000 + "]" * 100_000 + "}", "nests too deep"),
        ('{"payload": ' + "[" * 200 + "]" * 200 + "}", "nests deeper than"),
        ('{"payload": 1, "delay": ' + "9" * 400 + "}", "too large"),
        ('{"payload": 1, "delay": 1e300}', "too large"),
        ('{"payload": 1, "delay": 1e400}', "finite"),
        ('{"payload": 1, "at": "0001-01-01T00:00:00Z"}', "outside 1970"),
        ('{"payload": 1, "at": "1969-12-31T23:59:59Z"}', "outside 1970"),
    ],
    ids=lambda v: v[:40] if isinstance(v, str) else None,
)
def test_a_bad_line_rejects_the_whole_file_with_its_line_number(
    invoke, r, tmp_path, bad_line, reason
):
    good = json.dumps({"payload": {"ok": True}})
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join([good] * 1500 + [bad_line, good]) + "\n", encoding="utf-8")
    result = invoke("schedule", "q", "--file", str(path))
    assert result.exit_code == 1
    line = one_error_line(result)
    assert "line 1501:" in line and reason in line and "nothing was scheduled" in line
    assert r.dbsize() == 0


def test_stdin_that_is_not_utf8_is_one_line_and_writes_nothing(invoke, r):
    good = json.dumps({"payload": 1}).encode() + b"\n"
    result = invoke("schedule", "q", "--file", "-", input=good * 1500 + b'{"payload": "\xff"}\n')
    assert result.exit_code == 1
    line = one_error_line(result)
    assert "stdin is not UTF-8 text" in line and "nothing was scheduled" in line
    assert r.dbsize() == 0


def test_malformed_json_payload_is_one_line_and_exit_2(invoke, r):
    result = invoke("schedule", "q", "{oops")
    assert result.exit_code == 2
    assert "not valid JSON" in one_error_line(result)
    assert r.dbsize() == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["q"], "give a JSON payload or --file"),
        (["q", "1", "--delay", "1", "--at", "2030-01-01T00:00:00Z"], "--at or --delay"),
        (["q", "1", "--at", "tomorrow"], "not an ISO-8601 time"),
        (["q", "1", "--delay", "-5"], "must not be negative"),
        (["q", "1", "--id", ""], "must not be empty"),
    ],
)
def test_schedule_usage_errors_exit_2_and_write_nothing(invoke, r, args, message):
    result = invoke("schedule", *args)
    assert result.exit_code == 2
    assert message in one_error_line(result)
    assert r.dbsize() == 0


def test_a_bad_queue_name_is_one_line_and_exit_1(invoke, r):
    result = invoke("schedule", "a{b}", "1")
    assert result.exit_code == 1
    assert "queue name" in one_error_line(result)


# -- stats -------------------------------------------------------------------------------------


def test_stats_of_one_queue_shows_each_state(invoke, make_queue):
    q = make_queue("orders", clock=None)
    q.schedule_many(dueq.Task({"n": n}, id=f"now{n}") for n in range(4))
    q.schedule({"n": 9}, delay=3600)
    held = q.claim(3)
    held[0].fail(dueq.Unrecoverable("bad"))
    result = invoke("stats", "orders")
    assert result.exit_code == 0, result.output
    row = next(line for line in result.stdout.splitlines() if line.startswith("│ orders"))
    cells = [c.strip() for c in row.split("│")[1:-1]]
    # scheduled, due now, waiting, leased, dead, acked, retried, expired, next due, lag
    assert cells[:9] == ["orders", "2", "1", "0", "2", "1", "0", "0", "0"]
    assert cells[9].endswith("ago)")  # the due one
    assert cells[10].endswith(" ms") or cells[10].endswith(" s")


def test_stats_shows_tasks_waiting_for_their_parents(invoke, make_queue):
    q = make_queue("flow", clock=None)
    q.schedule({}, id="parent")
    q.schedule({}, id="child", after=["parent"])
    q.schedule({}, id="grandchild", after=["child"])
    result = invoke("stats", "flow")
    assert result.exit_code == 0, result.output
    header = next(line for line in result.stdout.splitlines() if line.startswith("┃"))
    assert [c.strip() for c in header.split("┃")[1:5]] == [
        "queue",
        "scheduled",
        "due now",
        "waiting",
    ]
    row = next(line for line in result.stdout.splitlines() if line.startswith("│ flow"))
    assert [c.strip() for c in row.split("│")[1:5]] == ["flow", "1", "1", "2"]
    [doc] = json.loads(invoke("stats", "flow", "--json").stdout)["queues"]
    assert (doc["scheduled"], doc["waiting"]) == (1, 2)


def test_stats_without_a_queue_lists_every_queue(invoke, make_queue):
    for name in ("alpha", "beta", "gamma"):
        make_queue(name).schedule({})
    result = invoke("stats")
    assert result.exit_code == 0
    for name in ("alpha", "beta", "gamma"):
        assert f"│ {name}" in result.stdout


def test_stats_skips_keys_that_no_dueq_queue_has(invoke, make_queue, r):
    make_queue("real").schedule({})
    for key in ("dueq:{}:x", "dueq:{a}b:c", b"dueq:{\xff}:due", "dueq:{bad\x1b}:due"):
        r.set(key, "foreign")
    r.set("dueq:{other}:not-a-dueq-key", "foreign")
    result = invoke("stats")
    assert result.exit_code == 0, result.output
    rows = [line for line in result.stdout.splitlines() if line.startswith("│ ")]
    assert [row.split("│")[1].strip() for row in rows] == ["real"]


def test_stats_of_every_queue_survives_one_queue_with_corrupted_data(invoke, make_queue, r):
    make_queue("healthy").schedule({})
    make_queue("broken").schedule({})
    r.hset("dueq:{broken}:stats", "acked", "not a number")
    r.zadd("dueq:{broken}:due", {"odd": float("-inf")})
    result = invoke("stats")
    assert result.exit_code == 0, result.output
    assert "│ healthy " in result.stdout
    assert "│ broken " in result.stdout or "skipped 'broken'" in result.stdout


def test_stats_with_no_queues_says_so(invoke):
    result = invoke("stats")
    assert result.exit_code == 0
    assert "no dueq queues" in result.stdout


def test_stats_of_an_unknown_queue_is_an_error(invoke, make_queue):
    make_queue("known").schedule({})
    result = invoke("stats", "unknown")
    assert result.exit_code == 1
    assert "no queue named 'unknown'" in one_error_line(result)


def test_stats_watch_refreshes_count_times(invoke, make_queue):
    make_queue("w").schedule({})
    result = invoke("stats", "w", "--watch", "--count", "3", "--interval", "0.01")
    assert result.exit_code == 0
    assert result.stdout.count("dueq queues at") == 3


# -- connections and errors --------------------------------------------------------------------

COMMANDS = [
    ["schedule", "q", "{}"],
    ["stats"],
    ["stats", "q", "--watch", "--count", "1"],
    ["dead", "list", "q"],
    ["dead", "show", "q", "x"],
    ["dead", "replay", "q", "--all", "--yes"],
    ["dead", "purge", "q", "--id", "x", "--yes"],
    ["worker", "cli_handlers:record"],
]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_an_unreachable_redis_is_one_line_and_exit_1_for_every_command(invoke, args, monkeypatch):
    monkeypatch.chdir(FIXTURES)  # so that the worker finds its handler module
    monkeypatch.setattr(sys, "path", list(sys.path))
    if args[0] == "worker":
        args = ["worker", "q", args[1]]
    result = invoke(*args, url=UNREACHABLE)
    assert result.exit_code == 1
    assert one_error_line(result) == (
        "error: cannot reach Redis at redis://127.0.0.1:1/0: Connection refused"
    )


def test_debug_shows_the_traceback(invoke):
    result = invoke("--debug", "stats", url=UNREACHABLE)
    assert result.exit_code == 1
    assert "Traceback (most recent call last)" in result.stderr
    assert result.stderr.rstrip().endswith("Connection refused")


def test_a_password_in_the_url_is_never_shown(invoke):
    result = invoke("stats", url="redis://user:s3cret@127.0.0.1:1/0")
    assert "s3cret" not in result.output
    assert "redis://user:***@127.0.0.1:1/0" in one_error_line(result)


def test_a_wrong_password_is_one_line(invoke, redis_server, r):
    r.config_set("requirepass", "right")
    try:
        result = invoke("stats", url=redis_server.url.replace("//", "//:wrong@"))
    finally:
        r.execute_command("AUTH", "right")
        r.config_set("requirepass", "")
    assert result.exit_code == 1
    assert "refused the credentials" in one_error_line(result)


def test_embedded_is_no_option_of_a_command_that_would_find_an_empty_redis(invoke):
    result = invoke("stats", "--embedded", url=UNREACHABLE)
    assert result.exit_code == 2
    assert "No such option '--embedded'" in one_error_line(result)


def test_redis_url_and_embedded_exclude_each_other(invoke):
    result = CliRunner().invoke(cli, ["dashboard", "--embedded", "--redis-url", UNREACHABLE])
    assert result.exit_code == 2
    assert "exclude each other" in one_error_line(result)


def test_python_dash_m_dueq_and_the_console_script_run(redis_server):
    for command in ([sys.executable, "-m", "dueq"], [str(Path(sys.executable).with_name("dueq"))]):
        done = subprocess.run(
            [*command, "stats", "--redis-url", UNREACHABLE], capture_output=True, text=True
        )
        assert done.returncode == 1
        assert (
            done.stderr
            == "error: cannot reach Redis at redis://127.0.0.1:1/0: Connection refused\n"
        )
