"""The Lua scripts: NOSCRIPT recovery, headers, and keys passed only through KEYS."""

from __future__ import annotations

import re
from importlib import resources

import pytest
from internals_support import protocol, script_runner

import dueq
from dueq._wire.keys import QueueKeys, SparkBatchKeys
from dueq._wire.scripts import SCRIPT_NAMES, read_include, resolve_includes, script_source

LUA = resources.files("dueq._wire").joinpath("lua")


def _own_code(name: str) -> str:
    """A script's own file, and the includes that name KEYS[n] themselves: the body a script
    runs in an include (schedule_records, which schedule.lua and spark_commit.lua call) reads
    the script's KEYS like the script."""
    text = LUA.joinpath(f"{name}.lua").read_text()
    for include in resolve_includes(text, f"{name}.lua", read_include):
        found = read_include(include) or ""
        if re.search(r"KEYS\[\d+\]", found):
            text += "\n" + found.split("\n\n", 1)[1]
    return text


KEY_COMMANDS = (
    "ZADD|ZREM|ZSCORE|ZMSCORE|ZRANGE|ZREVRANGE|ZRANGEBYSCORE|ZREMRANGEBYRANK|ZCARD|ZCOUNT|"
    "HGET|HSET|HSETNX|HDEL|HMGET|HEXISTS|HINCRBY|HGETALL|PUBLISH|RPUSH|LPOP|SADD|DEL|PEXPIRE|PERSIST"
)


def test_scripts_recover_after_script_flush(make_queue, r, admin):
    q = make_queue()
    q.schedule("before")
    admin.script_flush()
    assert r.script_exists(script_runner(q).script("claim").sha) == [False]
    [d] = q.claim()
    d.ack()
    admin.script_flush()
    q.schedule("after")
    assert [d.payload for d in q.claim()] == ["after"]


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_every_script_has_a_keys_argv_returns_header(name):
    text = LUA.joinpath(f"{name}.lua").read_text()
    header = text.split("\n\n")[0]
    assert "KEYS[1]" in header and "ARGV[1]" in header and "Returns" in header


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_every_key_a_script_touches_comes_from_keys(name):
    source = script_source(name)
    assert "dueq:" not in source  # no key names built inside Lua
    for match in re.finditer(rf"redis\.p?call\('({KEY_COMMANDS})',\s*([^,)]+)", source):
        key_arg = match.group(2).strip()
        # levels[p]: a due ZSET of one priority, from the KEYS block that due_levels reads
        assert re.fullmatch(r"KEYS\[\d+\]|k_\w+|key|levels\[\w+\]", key_arg), (
            name,
            match.group(0),
        )


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_every_declared_key_is_used(name):
    text = LUA.joinpath(f"{name}.lua").read_text()
    declared = set(re.findall(r"^-- KEYS\[(\d+)\]", text, flags=re.M))
    body = _own_code(name).split("\n\n", 1)[1]
    used = set(re.findall(r"KEYS\[(\d+)\]", body))
    assert declared == used


def _header_keys(name: str) -> list[str]:
    """The key names of a script's header, in KEYS order (``-- KEYS[3] tasks ...``); a block
    ``-- KEYS[10..18] upper_due: ...`` stands for the nine due ZSETs of priorities 1 to 9."""
    text = LUA.joinpath(f"{name}.lua").read_text()
    found = re.findall(r"^-- KEYS\[(\d+)(?:\.\.(\d+))?\]\s+(\w+)", text, flags=re.M)
    names: list[str] = []
    for first, last, key in found:
        assert int(first) == len(names) + 1, name
        if last:
            assert key == "upper_due" and int(last) - int(first) == 8, name
            assert int(last) == len(names) + 9, name
            names += [f"upper_due[{i}]" for i in range(9)]
        else:
            names.append(key)
    return names


def test_the_header_regexes_read_two_digit_key_numbers():
    assert re.findall(r"KEYS\[(\d+)\]", "KEYS[10] KEYS[2]") == ["10", "2"]


@pytest.mark.parametrize("name", sorted(protocol.SAMPLES))
def test_each_protocol_counterpart_sends_keys_in_its_scripts_header_order(name):
    keys = QueueKeys.for_queue("q")
    spark = SparkBatchKeys.for_batch("q", "query", 0)  # the Spark writer's, as the samples use
    field_of = {
        getattr(group, field): field
        for group in (keys, spark)
        for field in group.__dataclass_fields__
        if field != "due_levels"
    }
    field_of.update({key: f"upper_due[{i}]" for i, key in enumerate(keys.upper_due)})
    call = protocol.SAMPLES[name](keys)
    assert call.script == name
    assert [field_of[key] for key in call.keys] == _header_keys(name)


def test_lua_status_codes_map_to_dueq_errors(make_queue, clock):
    q = make_queue(lease=1)
    q.schedule("x")
    [d] = q.claim()
    clock.advance(2)
    for call in (d.ack, lambda: d.fail("late"), lambda: d.extend(5), d.release):
        with pytest.raises(dueq.LeaseLost):
            call()


_HISTORY_COUNTED = ("scheduled", "claimed", "acked", "retried", "dead", "expired")


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_every_script_that_counts_a_history_counter_writes_the_history(name):
    """stat_incr adds to the minute's bucket only after history_use: a script that counts one
    of the history's counters (add_task counts "scheduled") must call it with its history key."""
    text = _own_code(name)
    counted = re.findall(r"stat_incr\([^,]+,\s*'(\w+)'", text)
    # add_task counts "scheduled", and so do batch_settle and batch_finish (a completion task),
    # and tasks_ended (a child released, or buried: "dead")
    scheduling = ("add_task(", "batch_settle(", "batch_finish(", "tasks_ended(")
    counts = any(f in text for f in scheduling) or any(c in _HISTORY_COUNTED for c in counted)
    uses = re.search(r"history_use\((KEYS\[\d+\]), ARGV\[1\]\)", text)
    assert bool(uses) == counts, name
    if uses:
        header = dict(re.findall(r"^-- (KEYS\[\d+\])\s+(\w+)", text, flags=re.M))
        assert header[uses.group(1)] == "history", name


def _struct_pairs(pairs: list[tuple[str, str]]) -> bytes:
    """ack.lua's runs of pairs under one token, packed the plain way: each run is its token
    ('>Hc0') and count ('>I4'), then its ids ('>Hc0' each)."""
    out = b""
    runs: list[tuple[str, list[str]]] = []
    for task_id, token in pairs:
        if not runs or runs[-1][0] != token:
            runs.append((token, []))
        runs[-1][1].append(task_id)
    for token, ids in runs:
        raw = token.encode("utf-8")
        out += len(raw).to_bytes(2, "big") + raw + len(ids).to_bytes(4, "big")
        for task_id in ids:
            raw = task_id.encode("utf-8")
            out += len(raw).to_bytes(2, "big") + raw
    return out


@pytest.mark.parametrize(
    "pairs",
    [
        [],
        [("a", "1@w")],
        [(f"t{i}", "42@host:1") for i in range(1000)],  # one claim: the joined fast path
        [("x" * 512, "7"), ("y" * 300, "7"), ("z", "7")],  # lengths past one byte
        [("a", "1@w"), ("b", "2@w")],  # two claims' tokens
        [("a", "1@w"), ("b", "2@w"), ("c", "1@w"), ("d", "1@w")],  # interleaved runs
        [("é-id", "3@w"), ("b", "3@w")],  # a non-ASCII id
        [("a", "3@wé"), ("b", "3@wé")],  # a non-ASCII token
    ],
    ids=[
        "none",
        "one",
        "one-claim",
        "long-ids",
        "two-tokens",
        "interleaved",
        "non-ascii-id",
        "non-ascii-token",
    ],
)
def test_lease_pairs_pack_as_ack_lua_reads_them(pairs):
    assert protocol.pack_pairs(pairs) == _struct_pairs(pairs)
