"""The Lua includes: each script is its includes (each once, in dependency order) and its own
file, has room for more locals, and includes only what it uses.

Room: Lua 5.1 allows 200 active locals per function, a script's main chunk included, and every
helper an include offers is a local of that chunk. The free locals are measured with the real
compiler: K ``local`` declarations put in front of the assembled text, and the largest K that
SCRIPT LOAD still compiles found by bisection (one more fails: "main function has more than 200
local variables").
Compiling also proves every function stays under Lua's 60 upvalues.

What a file uses is read from its text (comments and strings left out): the top-level names an
include declares (``local f``, ``local a, b``, ``function links.x``) and the names a file
mentions. The rules: a file's ``-- @include`` lines name exactly the includes whose names it
mentions (none it does not use, none it reaches only through another include), and every
include is used by some script.
"""

from __future__ import annotations

import re
from importlib import resources

import pytest
import redis
from paths_support import ROOT

import dueq._wire.scripts
from dueq._wire.scripts import (
    FREE_LOCALS_MIN,
    SCRIPT_NAMES,
    LuaIncludeError,
    assemble,
    includes_of,
    read_include,
    resolve_includes,
    script_source,
)

LUA = resources.files("dueq._wire").joinpath("lua")
INCLUDES = sorted(
    path.name.removesuffix(".lua")
    for path in LUA.joinpath("include").iterdir()
    if path.name.endswith(".lua")
)
#: Tables that includes fill with functions: ``links.batch_settle`` is a name of its own.
NAMESPACES = ("links", "outcome_events")


def _compiles(client: redis.Redis, text: str) -> str | None:
    """None when SCRIPT LOAD compiles ``text``, else Redis's error."""
    try:
        client.script_load(text)
    except redis.ResponseError as exc:
        return str(exc)
    return None


def _probed(text: str, k: int) -> str:
    return "".join(f"local _probe{i}\n" for i in range(k)) + text


def free_locals(client: redis.Redis, text: str) -> int:
    """How many more locals the main chunk of ``text`` takes (bisection with the compiler)."""
    assert _compiles(client, text) is None, _compiles(client, text)
    low, high = 0, 201  # compiles with `low` more, not with `high` more
    while high - low > 1:
        mid = (low + high) // 2
        if _compiles(client, _probed(text, mid)) is None:
            low = mid
        else:
            high = mid
    return low


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_every_script_has_room_for_more_locals(admin, name):
    text = script_source(name)
    free = free_locals(admin, text)
    error = _compiles(admin, _probed(text, free + 1))
    # Lua 5.1 words it "main function has more than 200 local variables"
    assert error is not None and re.search(r"more than 200 local variables|too many local", error)
    assert free >= FREE_LOCALS_MIN, f"{name}.lua has {free} free locals"


def test_the_probe_counts_locals_as_lua_does(admin):
    assert free_locals(admin, "local a, b, c\nreturn 1\n") == 197
    # a block's locals count while it runs: what counts is the most active at once
    assert free_locals(admin, "do local a, b, c end\nlocal d, e\nreturn 1\n") == 197
    assert free_locals(admin, "local d\ndo local a, b, c end\nreturn 1\n") == 196


def _reader(files: dict[str, str]):
    return files.get


def test_nested_includes_resolve_once_each_in_dependency_order():
    files = {
        "base": "-- base\n\nlocal x = 1\n",
        "mid": "-- mid\n-- @include base\n\nlocal y = x\n",
        "other": "-- other\n-- @include base\n-- @include mid\n\nlocal z = y\n",
    }
    script = "-- a script\n-- @include other\n-- @include mid\n\nreturn z\n"
    assert resolve_includes(script, "s.lua", _reader(files)) == ["base", "mid", "other"]
    text = assemble(script, "s.lua", _reader(files))
    assert text == "\n".join([files["base"], files["mid"], files["other"], script])
    assert text.count("local x = 1") == 1


def test_an_unknown_include_is_refused():
    with pytest.raises(LuaIncludeError, match=r"include/a\.lua: unknown include 'nope'"):
        resolve_includes("-- s\n-- @include a\n", "s.lua", _reader({"a": "-- @include nope\n"}))
    for name in ("../claim", "Clock", ""):  # never a path, nor another spelling
        with pytest.raises(LuaIncludeError, match="unknown include"):
            resolve_includes(f"-- @include {name}\n", "s.lua", _reader({"clock": "-- c\n"}))


def test_a_cycle_of_includes_is_refused():
    files = {"a": "-- a\n-- @include b\n", "b": "-- b\n-- @include c\n", "c": "-- @include a\n"}
    with pytest.raises(LuaIncludeError, match="cycle: a -> b -> c -> a"):
        resolve_includes("-- s\n-- @include a\n", "s.lua", _reader(files))
    with pytest.raises(LuaIncludeError, match="cycle: self -> self"):
        resolve_includes("-- @include self\n", "s.lua", _reader({"self": "-- @include self\n"}))


def test_an_include_line_below_the_header_is_refused():
    with pytest.raises(LuaIncludeError, match=r"s\.lua:4: @include below the file's header"):
        includes_of("-- s\n\nlocal x = 1\n-- @include clock\n", "s.lua")


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_a_script_is_its_includes_then_its_own_file_and_no_other_script(name):
    own = LUA.joinpath(f"{name}.lua").read_text(encoding="utf-8")
    included = resolve_includes(own, f"{name}.lua", read_include)
    assert script_source(name) == "\n".join([*(read_include(i) or "" for i in included), own])
    for other in SCRIPT_NAMES:  # no other script's code is cut out and put in
        body = LUA.joinpath(f"{other}.lua").read_text(encoding="utf-8").split("\n\n", 1)[1]
        assert other == name or body not in script_source(name), (name, other)
    assert not hasattr(dueq._wire.scripts, "CONTINUES_WITH")


def test_schedule_and_spark_commit_share_one_function():
    for name in ("schedule", "spark_commit"):
        own = LUA.joinpath(f"{name}.lua").read_text(encoding="utf-8")
        assert "schedule_records" in includes_of(own, name)
        assert re.search(r"^return schedule_records\(", own, flags=re.M), name


def _code(text: str) -> str:
    """``text`` without comments and string literals (what names it mentions)."""
    lines = []
    for line in text.split("\n"):
        line = re.sub(r"'(\\.|[^'\\])*'", "''", line)
        line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
        lines.append(line.split("--", 1)[0])
    return "\n".join(lines)


def _declared(text: str) -> set[str]:
    """The top-level names a file declares."""
    names: set[str] = set()
    fields = "|".join(NAMESPACES)
    for line in _code(text).split("\n"):
        if found := re.match(r"local function (\w+)", line):
            names.add(found.group(1))
        elif found := re.match(r"local ([\w, ]+?)\s*(=|$)", line):
            names.update(name.strip() for name in found.group(1).split(","))
        elif found := re.match(rf"(?:function )?((?:{fields})\.\w+)", line):
            names.add(found.group(1))
    return names


def _mentioned(text: str) -> set[str]:
    code = _code(text)
    fields = "|".join(NAMESPACES)
    names = set(re.findall(r"(?<![.:\w])([A-Za-z_]\w*)", code))
    return names | set(re.findall(rf"(?<![.:\w])((?:{fields})\.\w+)", code))


def _owners() -> dict[str, str]:
    owner: dict[str, str] = {}
    for include in INCLUDES:
        for name in _declared(read_include(include) or ""):
            assert name not in owner, f"{name} is declared by {owner[name]} and {include}"
            owner[name] = include
    return owner


@pytest.mark.parametrize(
    "path", [f"{name}.lua" for name in SCRIPT_NAMES] + [f"include/{i}.lua" for i in INCLUDES]
)
def test_a_file_includes_exactly_the_includes_it_uses(path):
    text = LUA.joinpath(path).read_text(encoding="utf-8")
    itself = path.removeprefix("include/").removesuffix(".lua")
    mine = _declared(text) if path.startswith("include/") else set()
    owner = _owners()
    uses = {owner[name] for name in _mentioned(text) - mine if name in owner} - {itself}
    assert sorted(includes_of(text, path)) == sorted(uses)


def test_every_include_is_used_by_a_script():
    used = set()
    for name in SCRIPT_NAMES:
        own = LUA.joinpath(f"{name}.lua").read_text(encoding="utf-8")
        used.update(resolve_includes(own, f"{name}.lua", read_include))
    assert used == set(INCLUDES)


def test_the_package_ships_the_includes():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert '"_wire/lua/include/*.lua"' in pyproject
