"""Settings in a queue's config hash that the scripts cannot use (hand-edited, or written by
another tool): every script refuses them before its first write and runs as if they were unset,
Redis logs each refused value once, and ``settings()`` shows exactly what the scripts enforce,
with the refused values in ``settings().rejected``."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from paths_support import DOCS

import dueq
from dueq._wire.scripts import assemble, read_include
from dueq._wire.snapshot import REJECTED, key_limit_text, setting_value

#: Values the scripts cannot use, per setting (each must be refused as a whole).
UNUSABLE = [
    ("rate", "1/99999999999999999999"),  # a window past 2^63 ms: PEXPIRE failed after leasing
    ("rate", "5/1000000000000000"),  # 31,000 years: 5 claims, then none
    ("rate", "0/1000"),
    ("rate", "1e3/1000"),
    ("key_rate", "2/0"),
    ("key_rate", "1000001/1000"),
    ("key_concurrency", "1.5"),
    ("key_concurrency", "0x10"),
    ("key_concurrency", "0"),
    ("paused", "yes"),
    ("remember_done_ms", "1e300"),
    ("remember_done_ms", "-1"),
    ("keep_results_ms", "1e300"),
    ("keep_results_ms", "31622400001"),
    ("concurrency", "0"),
    ("concurrency", "1000001"),
    ("key_limit:tenant", "|"),
    ("key_limit:tenant", "0|"),
    ("key_limit:tenant", "1|0/1000"),
    ("key_limit:tenant", "1"),
]


def _queue_name() -> str:
    return f"cfg-{uuid.uuid4().hex[:10]}"


@pytest.mark.parametrize(("field", "raw"), UNUSABLE)
def test_a_claim_with_an_unusable_setting_delivers_as_if_it_were_unset(make_queue, r, field, raw):
    q = make_queue(_queue_name())
    r.hset(q.keys.config, field, raw)
    ids = [q.schedule({"n": i}, key="tenant") for i in range(3)]
    got = q.claim(limit=10)
    assert sorted(d.id for d in got) == sorted(ids)  # nothing held back, no error
    q.ack_many(got)
    settings = q.settings()
    assert settings.rejected == {field: raw}
    assert settings == dueq.QueueSettings(rejected={field: raw})  # every setting at its default


def test_a_rate_of_thousands_of_years_is_refused_not_enforced(make_queue, r, clock):
    q = make_queue(_queue_name())
    r.hset(q.keys.config, "rate", "5/1000000000000000")
    for _ in range(3):  # before: 5 claims, then none for 31,000 years
        q.schedule_many([dueq.Task({"n": i}) for i in range(4)])
        assert len(q.claim(limit=10)) == 4
        clock.advance(1)
    assert q.settings().rate is None


def test_an_ack_and_a_schedule_with_an_unusable_remember_done_work(make_queue, r):
    q = make_queue(_queue_name())
    r.hset(q.keys.config, "remember_done_ms", "1e300")
    q.schedule({"a": 1}, id="t1")
    (d,) = q.claim()
    d.ack()
    assert q.schedule({"a": 1}, id="t1") == "t1"  # not remembered: the setting is refused
    assert q.get("t1") is not None
    assert q.settings().remember_done is None


def test_an_ack_with_an_unusable_keep_results_keeps_nothing(make_queue, r):
    q = make_queue(_queue_name())
    r.hset(q.keys.config, "keep_results_ms", "-5")
    q.schedule({"a": 1}, id="t1")
    (d,) = q.claim()
    d.ack(result=1)
    assert q.get("t1") is None  # refused: as if unset
    assert q.settings().keep_results is None


def _log_lines(admin: redis.Redis, needle: str) -> list[str]:
    path = Path(admin.config_get("logfile")["logfile"])
    return [line for line in path.read_text(errors="replace").splitlines() if needle in line]


def test_redis_logs_a_refused_value_once_naming_key_field_and_value(make_queue, r, admin):
    q = make_queue(_queue_name())
    r.hset(q.keys.config, "rate", "1/99999999999999999999")
    for _ in range(3):
        q.schedule({"a": 1})
        assert len(q.claim()) == 1
    lines = _log_lines(admin, q.keys.config)
    assert len(lines) == 1, lines
    assert "rate" in lines[0] and "1/99999999999999999999" in lines[0]
    r.hset(q.keys.config, "rate", "1/0")  # another unusable value: logged once more
    q.claim()
    q.claim()
    assert len(_log_lines(admin, q.keys.config)) == 2


def test_configure_clears_a_refusal_so_the_same_bad_value_is_logged_again(make_queue, r, admin):
    q = make_queue(_queue_name())
    r.hset(q.keys.config, "key_concurrency", "1.5")
    q.claim()
    q.configure(key_concurrency=2)
    assert q.settings().rejected == {}
    r.hset(q.keys.config, "key_concurrency", "1.5")
    q.claim()
    assert len(_log_lines(admin, q.keys.config)) == 2


def test_the_refusal_marker_is_not_shown_as_a_counter(make_queue, r):
    q = make_queue(_queue_name())
    r.hset(q.keys.config, "rate", "x")
    q.claim()
    stats = q.stats()
    assert not any(name.startswith("rejected") for name in stats.counters)
    assert stats.settings.rejected == {"rate": "x"}


@pytest.mark.parametrize(
    ("kwargs", "what"),
    [
        ({"rate": dueq.Rate(1, per=1.0)}, None),
        ({"remember_done": timedelta(days=367)}, "remember_done"),
        ({"remember_done": timedelta(days=366)}, None),
        ({"keep_results": timedelta(days=367)}, "keep_results"),
        ({"keep_results": timedelta(days=366)}, None),
    ],
)
def test_configure_refuses_values_the_scripts_would_refuse(make_queue, r, kwargs, what):
    q = make_queue(_queue_name())
    if what is None:
        q.configure(**kwargs)
        assert q.settings().rejected == {}
        return
    with pytest.raises(dueq.ConfigurationError, match=what):
        q.configure(**kwargs)
    assert r.hgetall(q.keys.config) == {}  # nothing written


def test_a_rate_window_longer_than_366_days_is_refused():
    with pytest.raises(dueq.ConfigurationError, match="per"):
        dueq.Rate(1, per=timedelta(days=367).total_seconds())
    assert dueq.Rate(1, per=timedelta(days=366).total_seconds()).per_ms == 366 * 86_400_000


#: Strings fed to both readers of a setting: Lua's (the scripts) and Python's (settings()).
PROBES = [
    "",
    "1",
    "0",
    "01",
    " 1",
    "1 ",
    "1\n",
    "true",
    "yes",
    "-1",
    "+1",
    "1.0",
    "1.5",
    "1e3",
    "0x10",
    "inf",
    "nan",
    "1000000",
    "1000001",
    "999999999999999",
    "9999999999999999",
    "31622400000",
    "31622400001",
    "٣",
    "²",
    "5/1000",
    "0005/0001000",
    "0/1000",
    "1/0",
    "1/",
    "/1",
    "1//1",
    "1/1/1",
    "1000000/31622400000",
    "1000001/1",
    "1/31622400001",
    "1/99999999999999999999",
    "5/1000000000000000",
    "1.5/1000",
    "1/1e3",
    " 1/1",
    "5|",
    "|5/1000",
    "5|5/1000",
    "|",
    "0|",
    "5|0/1000",
    "x|",
    "5|5/1000|",
    "5|5",
    "1000001|",
    "|1000000/31622400000",
    "5||5/1000",
]
FIELDS = [
    "paused",
    "rate",
    "key_rate",
    "key_concurrency",
    "remember_done_ms",
    "concurrency",
    "key_limit:k",
    "key_limits",
    "keep_results_ms",
]

#: Lua's reading of a setting, in the form _python_reading gives it.
_LUA_PROBE = """-- the probe
-- @include clock
-- @include settings

local v, ok = setting_parse(ARGV[1], ARGV[2])
if not ok then return 'rejected' end
if string.sub(ARGV[1], 1, 10) == 'key_limit:' then  -- {concurrency or false, rate or false}
  local rate = v[2] and ms(v[2][1]) .. '/' .. ms(v[2][2]) or ''
  return (v[1] and ms(v[1]) or '') .. '|' .. rate
end
if type(v) == 'table' then return ms(v[1]) .. '/' .. ms(v[2]) end
if type(v) == 'boolean' then return v and 'true' or 'false' end
return ms(v)
"""


def _python_reading(field: str, raw: str) -> str:
    value = setting_value(field, raw)
    if value is REJECTED:
        return "rejected"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return f"{value[0]}/{value[1]}"
    if isinstance(value, dueq.KeyLimit):
        return key_limit_text(value)
    return str(value)


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("raw", PROBES)
def test_lua_and_python_read_a_setting_the_same_way(admin, field, raw):
    lua = admin.eval(assemble(_LUA_PROBE, "probe", read_include), 0, field, raw)
    assert (lua.decode() if isinstance(lua, bytes) else lua) == _python_reading(field, raw)


def test_dueq_configure_shows_a_refused_value(invoke, r):
    q = dueq.Queue("shown", r)
    r.hset(q.keys.config, "rate", "1/99999999999999999999")
    result = invoke("configure", "shown")
    assert result.exit_code == 0, result.output
    assert "rate off" in result.output
    assert "1/99999999999999999999" in result.output and "ignored" in result.output


def test_the_python_example_of_the_docs_page_runs(r):
    page = DOCS / "settings-validation.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, str(page), "exec"), {"r": r})
