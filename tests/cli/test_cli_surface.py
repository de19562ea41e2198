"""One command-line surface (issue 27): one JSON form and one order of tasks, ``show`` as full
as ``dead show``, no phantom queues from ``pause``/``resume``/``configure``, the global options
after any command, a grouped top-level help without cut summaries, ``--embedded`` only where it
can find something, ``top`` that fits the terminal, ``dashboard`` on a busy port; and
docs/cli-commands.md (its python blocks run here)."""

from __future__ import annotations

import asyncio
import json
import re
import socket
from collections.abc import Iterator
from typing import Any

import click
import pytest
import redis
import redis.asyncio
from cli_support import UNREACHABLE, bury, one_error_line
from click.testing import CliRunner
from paths_support import DOCS

import dueq
from dueq import discovery
from dueq.cli import cli
from dueq.server import RedisServer

DOC = DOCS / "cli-commands.md"


@pytest.fixture
def q(r: redis.Redis) -> dueq.Queue:
    return dueq.Queue("jobs", r, retry=dueq.RetryPolicy(max_attempts=2))


def _json(result: Any) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _every_command(group: click.Group = cli, path: tuple[str, ...] = ()) -> Iterator[tuple]:
    for name, command in sorted(group.commands.items()):
        yield (*path, name)
        if isinstance(command, click.Group):
            yield from _every_command(command, (*path, name))


# -- 1. one JSON form, one order, show as full as dead show ------------------------------------


def test_show_json_and_dead_show_json_give_the_same_keys_for_one_dead_task(invoke, q):
    bury(q, 1)
    shown = _json(invoke("show", "jobs", "d0", "--json"))
    dead = _json(invoke("dead", "show", "jobs", "d0", "--json"))
    assert list(shown) == list(dead) == ["queue", "tasks"]
    [a], [b] = shown["tasks"], dead["tasks"]
    assert list(a) == list(b) and a == b
    assert [list(e) for e in a["errors"]] == [list(e) for e in b["errors"]]
    assert list(a["errors"][0]) == ["at", "attempt", "type", "message", "traceback", "worker"]
    times = [a["first_claimed_at"], a["died_at"], *(e["at"] for e in a["errors"])]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", t) for t in times), times


def test_show_prints_everything_dead_show_prints(invoke, q):
    bury(q, 1)
    full = invoke("dead", "show", "jobs", "d0")
    shown = invoke("show", "jobs", "d0")
    assert full.exit_code == shown.exit_code == 0, shown.output
    assert "raise ValueError(" in full.stdout and "attempt 1 at " in full.stdout

    def lines(text: str) -> list[str]:  # "(5 ms ago)" differs from one run to the next
        return re.sub(r" \([^()]* ago\)", "", text).splitlines()

    missing = [line for line in lines(full.stdout) if line not in lines(shown.stdout)]
    assert missing == []


def test_list_state_dead_and_dead_list_show_the_same_columns_in_the_same_order(invoke, q):
    bury(q, 3)

    def rows(result: Any) -> list[list[str]]:  # the cells, without the times ("5 ms ago")
        assert result.exit_code == 0, result.output
        lines = [line for line in result.stdout.splitlines() if line.startswith(("┃", "│"))]
        cells = [[c.strip() for c in re.split("[┃│]", line)[1:-1]] for line in lines]
        return [[c for c in row if not c.endswith("ago)")] for row in cells]

    listed = rows(invoke("list", "jobs", "--state", "dead"))
    assert listed == rows(invoke("dead", "list", "jobs"))
    assert listed[0] == ["id", "died", "attempt", "last error"]
    assert [row[0] for row in listed[1:]] == ["d2", "d1", "d0"]  # newest first, as q.dead.list


# -- 2. no phantom queues ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "command", [["pause"], ["resume"], ["configure"], ["configure", "--rate", "5/1"]]
)
def test_settings_of_a_queue_that_does_not_exist_are_refused(invoke, r, command):
    dueq.Queue("shop", r).schedule({})
    result = invoke(command[0], "shpo", *command[1:])
    assert result.exit_code == 1
    line = one_error_line(result)
    assert "no queue named 'shpo'" in line and "--create" in line
    assert r.keys("dueq:{shpo}*") == []
    assert invoke("stats", "shpo").exit_code == 1  # and it still does not exist


def test_create_configures_a_queue_before_anything_was_scheduled(invoke, r):
    result = invoke("pause", "later", "--create")
    assert result.exit_code == 0, result.output
    assert dueq.Queue("later", r).settings().paused
    assert invoke("resume", "later").exit_code == 0  # it exists now


@pytest.mark.parametrize("front_end", ["sync", "async"])
def test_queue_exists_is_true_once_any_key_of_the_queue_is(r, redis_server, front_end):
    def exists(name: str) -> bool:
        if front_end == "sync":
            return discovery.queue_exists(r, name)

        async def check() -> bool:
            client = redis.asyncio.Redis.from_url(redis_server.url)
            try:
                return await discovery.async_queue_exists(client, name)
            finally:
                await client.aclose()

        return asyncio.run(check())

    assert not exists("fresh")
    dueq.Queue("fresh", r).configure(rate=dueq.Rate(5))
    assert exists("fresh")
    q = dueq.Queue("dead-only", r, retry=dueq.RetryPolicy(max_attempts=1))
    q.schedule({}, id="x")
    q.claim(1)[0].fail("no")
    r.delete(q.keys.stats, q.keys.history)
    assert exists("dead-only")
    assert all(exists(name) for name in discovery.queue_names(r))


# -- 3. global options after any command -------------------------------------------------------


@pytest.mark.parametrize("path", list(_every_command()), ids=" ".join)
def test_every_command_takes_debug_and_says_so_in_its_help(path):
    result = CliRunner().invoke(cli, [*path, "--help"], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    assert "--debug" in result.stdout


@pytest.mark.parametrize("command", ["show", "list", "cancel", "reschedule", "run-now"])
def test_debug_after_a_task_command_shows_the_traceback(command):
    args = {"show": ["q", "x"], "list": ["q"], "cancel": ["q", "x", "-y"]}
    args |= {"reschedule": ["q", "x", "--delay", "1"], "run-now": ["q", "x"]}
    result = CliRunner().invoke(
        cli, [command, *args[command], "--debug", "--redis-url", UNREACHABLE]
    )
    assert result.exit_code == 1, result.output
    assert "Traceback (most recent call last)" in result.stderr


@pytest.mark.parametrize("where", ["before", "after"])
def test_redis_url_goes_before_or_after_a_task_command(redis_server, r, where):
    dueq.Queue("jobs", r).schedule({}, id="a")
    url = ["--redis-url", redis_server.url]
    args = [*url, "show", "jobs", "a"] if where == "before" else ["show", "jobs", "a", *url]
    result = CliRunner().invoke(cli, args, env={"DUEQ_REDIS_URL": UNREACHABLE})
    assert result.exit_code == 0, result.output


# -- 4. help -----------------------------------------------------------------------------------


def test_top_level_help_groups_every_command_with_one_line_summaries():
    result = CliRunner().invoke(cli, ["--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0
    out = result.stdout
    headings = [line for line in out.splitlines() if line.endswith("commands:")]
    assert headings == [
        f"{g} commands:" for g in ("Produce", "Work", "Inspect", "Operate", "Serve")
    ]
    listed = [
        line.split()[0]
        for line in out.split(headings[0])[1].splitlines()
        if line.startswith("  ") and line.strip()
    ]
    assert sorted(listed) == sorted(cli.commands)
    assert "..." not in out.split("Options:")[1]
    assert max(len(line) for line in out.splitlines()) <= 80


def test_cron_add_help_keeps_the_example_on_one_line():
    result = CliRunner().invoke(cli, ["cron", "add", "--help"], env={"COLUMNS": "80"})
    assert 'dueq cron add reports nightly "30 2 * * *" --tz Europe/Berlin' in result.stdout


def test_embedded_is_offered_only_where_it_can_find_something():
    offered = [
        " ".join(path)
        for path in _every_command()
        if "--embedded" in CliRunner().invoke(cli, [*path, "--help"]).stdout
    ]
    assert offered == ["dashboard", "demo"]


def test_embedded_before_a_command_that_cannot_use_it_is_a_usage_error():
    result = CliRunner().invoke(cli, ["--embedded", "stats"])
    assert result.exit_code == 2
    assert "--embedded" in one_error_line(result)


# -- 5. top fits the terminal ------------------------------------------------------------------


def test_top_without_queues_shows_the_busiest_that_fit_and_counts_the_rest(invoke, r, monkeypatch):
    for n in range(1, 13):
        q = dueq.Queue(f"q{n:02d}", r)
        q.schedule_many(dueq.Task({}) for _ in range(n))
    monkeypatch.setenv("LINES", "60")
    result = invoke("top", "--once")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) <= 60, len(lines)
    shown = re.findall(r"^queue (q\d\d) ", result.stdout, re.M)
    assert shown and shown == [f"q{n:02d}" for n in range(12, 12 - len(shown), -1)]
    assert f"{12 - len(shown)} more queues not shown" in lines[-1]


# -- 6. dashboard on a busy port ---------------------------------------------------------------


def test_dashboard_on_a_busy_port_says_so_in_one_line_before_any_url(invoke):
    busy = socket.socket()
    busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    try:
        result = invoke("dashboard", "--port", str(port))
    finally:
        busy.close()
    assert result.exit_code == 1, result.output
    line = one_error_line(result)
    assert f"127.0.0.1:{port}" in line and "in use" in line
    assert result.stdout == ""


# -- docs/cli-commands.md ----------------------------------------------------------------------


def test_the_command_page_names_every_command_and_its_python_runs(redis_server: RedisServer):
    text = DOC.read_text()
    for name in cli.commands:
        assert f"`{name}`" in text, name
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks
    for block in blocks:
        exec(block, {"REDIS_URL": redis_server.url})
