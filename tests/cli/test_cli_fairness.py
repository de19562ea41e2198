"""dueq configure --fairness / --key-limit KEY=weight:N, and the tenants of a fair queue as
dueq stats and dueq keys show them (docs/fairness.md, "Seeing it")."""

from __future__ import annotations

import json

import pytest
from cli_support import UNREACHABLE, one_error_line

import dueq


@pytest.fixture(autouse=True)
def jobs(r):
    """Queue "jobs" exists (a task is scheduled), and is not fair."""
    dueq.Queue("jobs", r).schedule({}, id="first", delay=3600)


def test_configure_turns_fairness_on_and_off_and_shows_it(invoke, r):
    q = dueq.Queue("jobs", r)
    assert "fairness off" in invoke("configure", "jobs").output
    result = invoke("configure", "jobs", "--fairness", "key")
    assert result.exit_code == 0, result.output
    assert "fairness key" in result.output
    assert q.settings().fairness == "key"
    result = invoke("configure", "jobs", "--fairness", "off")
    assert result.exit_code == 0 and "fairness off" in result.output
    assert q.settings().fairness is None


def test_configure_refuses_a_bad_fairness_before_writing(invoke, r):
    result = invoke("configure", "jobs", "--fairness", "tenant")
    assert result.exit_code == 2
    assert "--fairness" in result.output
    assert dueq.Queue("jobs", r).settings().fairness is None


def test_a_key_limit_takes_a_weight_alone_or_with_limits_and_configure_shows_it(invoke, r):
    q = dueq.Queue("jobs", r)
    result = invoke(
        "configure",
        "jobs",
        "--key-limit",
        "acme=weight:5,concurrency:20",
        "--key-limit",
        "tenant:small=weight:2",
        "--key-limit",
        "old=concurrency:3,rate:5/1",
    )
    assert result.exit_code == 0, result.output
    assert q.settings().key_limits == {
        "acme": dueq.KeyLimit(concurrency=20, weight=5),
        "tenant:small": dueq.KeyLimit(weight=2),
        "old": dueq.KeyLimit(concurrency=3, rate=dueq.Rate(5, per=1)),
    }
    assert "key 'acme': concurrency 20, weight 5" in result.output
    assert "key 'tenant:small': weight 2" in result.output
    shown = invoke("configure", "jobs").output
    assert "key 'tenant:small': weight 2" in shown


@pytest.mark.parametrize("bad", ["acme=weight:0", "acme=weight:1001", "acme=weight:x", "a=weight:"])
def test_a_bad_weight_is_refused_before_writing(invoke, r, bad):
    result = invoke("configure", "jobs", "--key-limit", bad)
    assert result.exit_code == 2, result.output
    assert "--key-limit" in result.output
    assert dueq.Queue("jobs", r).settings().key_limits == {}


def table_rows(output: str) -> dict[str, list[str]]:
    """A table's rows by their first cell: the other cells."""
    rows = {}
    for line in output.splitlines():
        if line.startswith("│"):
            cells = [c.strip() for c in line.split("│")[1:-1]]
            rows[cells[0]] = cells[1:]
    return rows


def fair_queue(r) -> dueq.Queue:
    """ "jobs" made fair: acme 3 due and 2 claimed, globex 1 due, 2 tasks without a key."""
    q = dueq.Queue("jobs", r)
    q.configure(fairness="key")
    q.schedule_many(dueq.Task({"i": i}, id=f"acme-{i}", key="acme") for i in range(5))
    held = q.claim(2)  # the first claim of a fair queue: one per tenant
    assert [d.key for d in held] == ["acme", "acme"]
    q.schedule({}, id="globex-0", key="globex")
    q.schedule_many(dueq.Task({}, id=f"plain-{i}") for i in range(2))
    return q


def test_stats_of_a_fair_queue_shows_its_lanes_claims_and_tenants(invoke, r):
    fair_queue(r)
    result = invoke("stats", "jobs")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "3 lanes with due tasks" in out and "2 claimed in the last minute" in out
    rows = table_rows(out)
    assert rows["acme"] == ["3", "2", "100.0%"]
    assert rows["globex"] == ["1", "0", "0.0%"]
    assert rows["(no key)"] == ["2", "0", "0.0%"]


def test_stats_of_a_queue_that_never_was_fair_shows_nothing_of_tenants(invoke, r):
    q = dueq.Queue("jobs", r)
    q.schedule({}, id="k", key="acme")
    out = invoke("stats", "jobs").output
    assert "lanes" not in out and "tenant" not in out and "acme" not in out


def test_stats_json_gives_the_tenants_in_their_one_json_form(invoke, r):
    q = fair_queue(r)
    document = json.loads(invoke("stats", "jobs", "--json").output)
    [shown] = document["queues"]
    stats = q.stats()
    assert (shown["fair_lanes"], shown["fair_claimed"]) == (3, 2)
    assert shown["tenants"] == [t.to_json() for t in stats.tenants]
    assert {t["tenant"] for t in shown["tenants"]} == {"acme", "globex", ""}


def test_keys_shows_the_tenants_table_alone(invoke, r):
    fair_queue(r)
    result = invoke("keys", "jobs")
    assert result.exit_code == 0, result.output
    rows = table_rows(result.output)
    assert list(rows) == ["acme", "(no key)", "globex"]  # the most due first
    assert rows["acme"] == ["3", "2", "100.0%"] and rows["(no key)"] == ["2", "0", "0.0%"]
    assert "scheduled" not in result.output


def test_keys_json_is_the_queue_and_its_tenants(invoke, r):
    q = fair_queue(r)
    result = invoke("keys", "jobs", "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["queue"] == "jobs" and document["fairness"] == "key"
    assert (document["fair_lanes"], document["fair_claimed"]) == (3, 2)
    assert document["tenants"] == [t.to_json() for t in q.stats().tenants]


def test_keys_of_a_queue_that_never_was_fair_says_so(invoke, r):
    result = invoke("keys", "jobs")
    assert result.exit_code == 0, result.output
    assert "not fair" in result.output and "--fairness key" in result.output
    assert json.loads(invoke("keys", "jobs", "--json").output)["tenants"] == []


def test_keys_escapes_a_tenant_with_terminal_escapes(invoke, r):
    q = dueq.Queue("jobs", r)
    q.configure(fairness="key")
    q.schedule({}, id="x", key="evil\x9b2J\u202e")
    out = invoke("keys", "jobs").output
    assert "\x9b" not in out and "\u202e" not in out
    assert "\\x9b2J" in out


def test_keys_of_a_missing_queue_or_an_unreachable_redis_is_one_error_line(invoke, r):
    result = invoke("keys", "shpo")
    assert result.exit_code == 1
    assert "no queue named 'shpo'" in one_error_line(result)
    result = invoke("keys", "jobs", url=UNREACHABLE)
    assert result.exit_code == 1
    assert "cannot reach Redis" in one_error_line(result)


def test_keys_of_a_sharded_fair_queue_sums_each_tenant_over_the_shards(invoke, r):
    q = dueq.Queue("wide", r, shards=3)
    q.configure(fairness="key")
    q.schedule_many(
        dueq.Task({"i": i}, id=dueq.keyed_id("acme", f"acme-{i}", 3), key="acme") for i in range(12)
    )
    q.schedule_many(dueq.Task({"i": i}, key="stark") for i in range(5))  # on another shard
    result = invoke("keys", "wide", "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert [(t["tenant"], t["due"]) for t in document["tenants"]] == [("acme", 12), ("stark", 5)]
    assert table_rows(invoke("keys", "wide").output)["acme"] == ["12", "0", "0.0%"]
