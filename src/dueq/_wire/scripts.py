"""The Lua scripts, loaded from ``dueq/_wire/lua`` and run with EVALSHA (NOSCRIPT falls back
to EVAL).

Includes: a script names the helpers it uses with header lines ``-- @include <name>``, each
one file ``lua/include/<name>.lua`` of one concept (the clock, meta values, settings, key
limits, batches, ...), which names its own includes the same way. ``script_source`` puts the
includes a script needs, each once, in dependency order (an include before every file that
names it) in front of the script's own file, so a script's text holds only what it uses. Why
not one shared prelude: Lua 5.1 allows a function (a script's main chunk is one) 200 active
locals, and every helper is a local of the chunk; a prelude of every helper left the largest
script (claim.lua) no room at all. An include keeps the names only it needs (constants, inner
helpers) inside a ``do`` block, so a script pays a local only for what the include offers.
tests/wire/test_lua_includes.py compiles every script with extra locals in front to prove each has
at least 40 free (``FREE_LOCALS_MIN``). An include name that has no file, or includes that name
each other in a cycle, raise ``LuaIncludeError`` (a RuntimeError: dueq's files are wrong, not
the caller's setup) when the script is first loaded, before anything is sent to Redis. No
script reuses another's text: what two scripts share (schedule.lua and spark_commit.lua
schedule records the same way) is a function of an include both call.

redis-py's ``Script`` computes the SHA locally and reloads the script when the server answers
NOSCRIPT (after a restart or ``SCRIPT FLUSH``), so callers never see that error.

Replication: Redis replicates asynchronously, so a change acknowledged by a primary that dies
before its replicas saw it is lost in a failover. With ``wait_replicas=N`` a script that changes
what must not be lost is sent in one pipeline with ``WAIT N timeout`` (WAIT covers the writes
of its own connection, so both must share one). Producer-side changes (schedule, cancel,
reschedule, dead-letter moves, cron definitions) raise ReplicationTimeout when fewer replicas
confirm; settling a delivery (ack, fail, release) logs a warning instead, since the change is
made and losing it in a failover only means the task runs again (at-least-once). Claims and
lease extensions do not wait: losing one returns the task to due, which leases already allow.

Keys of the wrong type: a script that meets a key holding another type than dueq keeps there
fails with Redis's ``WRONGTYPE``, which names no key. The runner then asks the ``TYPE`` of that
call's KEYS (one round trip, only on this error) and raises ``CorruptQueue`` naming the key, the
type it holds and the type expected (keys.py ``KEY_TYPES``). Statistics keys never get here:
the scripts leave a wrong-typed one alone (see lua/include/counters.lua).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from functools import cache
from importlib import resources
from typing import Any

import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException

from dueq._wire.keys import expected_type
from dueq.exceptions import ConfigurationError, CorruptQueue, ReplicationTimeout

logger = logging.getLogger("dueq.scripts")

SCRIPT_NAMES = (
    "schedule",
    "claim",
    "ack",
    "fail",
    "extend",
    "release",
    "cancel",
    "reschedule",
    "dead",
    "inspect",
    "stats",
    "cron_add",
    "cron_advance",
    "cron_remove",
    "configure",
    "spark_stage",
    "spark_commit",
    "spark_abort",
    "cron_control",
    "cron_backfill",
    "list_tasks",
    "history",
    "heartbeat",
    "doctor",
    "close_batch",
    "events_read",
    "step",
    "park",
    "signal",
    "progress",
    "reseal",
    "batch_gather",
    "reshard",
)

#: Every script's main chunk keeps at least this many of Lua's 200 locals free after its includes
#: (tests/wire/test_lua_includes.py measures it with the real compiler).
FREE_LOCALS_MIN = 40

#: Scripts whose changes a producer or operator relies on: they raise ReplicationTimeout.
PRODUCER_SCRIPTS = frozenset(
    {
        "schedule",
        "cancel",
        "reschedule",
        "dead",
        "cron_add",
        "cron_remove",
        "configure",
        "spark_commit",
        "cron_control",
        "cron_backfill",
        "close_batch",
        "signal",
    }
)
#: Scripts that settle a delivery: a replication shortfall is logged, not raised.
SETTLE_SCRIPTS = frozenset({"ack", "fail", "release", "step", "park"})


class LuaIncludeError(RuntimeError):
    """A script's ``-- @include`` lines name a file that does not exist, name each other in a
    cycle, or stand below the file's header: dueq's own Lua files are broken."""


#: An include line: ``-- @include <name>``, in the leading comment of a script or an include.
_INCLUDE_LINE = re.compile(r"^-- @include\s+(\S*)\s*$")
#: The names an include may have (a file name under lua/include/, never a path).
_INCLUDE_NAME = re.compile(r"[a-z][a-z0-9_]*")


def includes_of(text: str, where: str) -> list[str]:
    """The include names of one Lua file's text, in the order its header lists them. They
    must stand in the file's leading comment (every line up to the first that is neither
    blank nor a comment): a line further down would be read as a plain comment, silently."""
    names: list[str] = []
    in_header = True
    for number, line in enumerate(text.split("\n"), 1):
        if in_header and line.strip() and not line.startswith("--"):
            in_header = False
        found = _INCLUDE_LINE.match(line)
        if found is None:
            continue
        if not in_header:
            raise LuaIncludeError(f"{where}:{number}: @include below the file's header")
        names.append(found.group(1))
    return names


def resolve_includes(text: str, where: str, read: Callable[[str], str | None]) -> list[str]:
    """The includes ``text`` needs, directly or through other includes, each once, in
    dependency order (every include after the ones it names). ``read(name)`` gives an
    include's text, or None when there is no such include."""
    order: list[str] = []
    done: set[str] = set()
    path: list[str] = []  # the includes being resolved, outermost first

    def visit(name: str, by: str) -> None:
        if name in path:
            cycle = " -> ".join([*path[path.index(name) :], name])
            raise LuaIncludeError(f"{where}: the includes name each other in a cycle: {cycle}")
        if name in done:
            return
        found = read(name) if _INCLUDE_NAME.fullmatch(name) else None
        if found is None:
            raise LuaIncludeError(f"{by}: unknown include {name!r} (no lua/include/{name}.lua)")
        path.append(name)
        for inner in includes_of(found, f"include/{name}.lua"):
            visit(inner, f"include/{name}.lua")
        path.pop()
        done.add(name)
        order.append(name)

    for name in includes_of(text, where):
        visit(name, where)
    return order


def assemble(text: str, where: str, read: Callable[[str], str | None]) -> str:
    """``text`` with the includes it needs in front (``resolve_includes``), one after another."""
    parts = [_text(read, name) for name in resolve_includes(text, where, read)]
    return "\n".join([*parts, text])


def _text(read: Callable[[str], str | None], name: str) -> str:
    found = read(name)
    assert found is not None  # resolve_includes read it already
    return found


@cache
def read_include(name: str) -> str | None:
    """The text of ``lua/include/<name>.lua``, or None when there is none."""
    found = (
        resources.files("dueq._wire").joinpath("lua").joinpath("include").joinpath(f"{name}.lua")
    )
    return found.read_text(encoding="utf-8") if found.is_file() else None


@cache
def script_source(name: str) -> str:
    """The full source of one script: the includes it needs (each once, in dependency order),
    then the script's own file."""
    body = (
        resources.files("dueq._wire")
        .joinpath("lua")
        .joinpath(f"{name}.lua")
        .read_text(encoding="utf-8")
    )
    return assemble(body, f"{name}.lua", read_include)


def _wrong_type(exc: redis.ResponseError) -> bool:
    """Redis's WRONGTYPE, as Redis raised it (not already a CorruptQueue)."""
    return not isinstance(exc, CorruptQueue) and "WRONGTYPE" in str(exc)


def corrupt_queue(name: str, keys: list[str], types: list[Any]) -> CorruptQueue | None:
    """The CorruptQueue for the keys of a call whose TYPE (``types``, in KEYS order) is not the
    one dueq keeps there, or None when every key is of its type (or missing)."""
    wrong = []
    for key, raw in zip(keys, types, strict=True):
        actual = raw.decode() if isinstance(raw, bytes) else str(raw)
        expected = expected_type(key)
        if expected is not None and actual not in (expected, "none"):
            wrong.append((key, actual, expected))
    if not wrong:
        return None
    named = "; ".join(
        f"{key} holds a {actual}, where dueq keeps a {expected}" for key, actual, expected in wrong
    )
    key, actual, expected = wrong[0]
    return CorruptQueue(
        f"WRONGTYPE: {named}. {name}.lua cannot run until it is fixed: something other than "
        "dueq wrote that key; restore it, or move it away (RENAME) and let dueq start it afresh",
        key,
        actual,
        expected,
    )


def _waits(name: str, wait_replicas: int) -> bool:
    return bool(wait_replicas) and (name in PRODUCER_SCRIPTS or name in SETTLE_SCRIPTS)


def _replicated(name: str, reply: Any, confirmed: Any, wanted: int, timeout_ms: int) -> Any:
    """The script's reply once WAIT confirmed ``confirmed`` replicas of ``wanted``; a
    shortfall raises ReplicationTimeout for producer scripts and is logged for settles."""
    confirmed = int(confirmed)
    if confirmed >= wanted:
        return reply
    message = (
        f"{name}: applied on the primary, but only {confirmed} of {wanted} "
        f"replica(s) confirmed it within {timeout_ms} ms"
    )
    if name in SETTLE_SCRIPTS:
        logger.warning("%s; a failover now would deliver the task again", message)
        return reply
    raise ReplicationTimeout(message, confirmed, wanted)


def _check_wait(client: object, wait_replicas: int) -> None:
    if wait_replicas and isinstance(client, AsyncRedisCluster):
        raise ConfigurationError(
            "wait_replicas is not supported with a redis.asyncio RedisCluster client yet: WAIT "
            "must go to the node that took the write (the blocking RedisCluster supports it)"
        )


def route_options(client: object, route: str | None) -> dict[str, Any]:
    """The keywords of ``execute_command`` that send a command without keys (INFO, CONFIG GET)
    to the node that holds key ``route`` (``protocol.Command.route``): a Redis Cluster client
    (blocking or asyncio) picks a default node for it otherwise. None, or any other client:
    none (one server answers every command)."""
    if route is None or not isinstance(client, (RedisCluster, AsyncRedisCluster)):
        return {}
    return {"target_nodes": client.get_node_from_key(route)}


async def route_options_async(client: object, route: str | None) -> dict[str, Any]:
    """``route_options`` for an asyncio client, whose cluster client reads the slot map at its
    first command (a routed command may be the first)."""
    if route is not None and isinstance(client, AsyncRedisCluster):
        await client.initialize()
    return route_options(client, route)


#: A refusal of the commands every dueq script call needs: an ACL without them (NOPERM, Redis
#: 6.2's and 7's wording) or a server that renamed or disabled them (``rename-command EVALSHA
#: ""``, as some managed services do: "unknown command").
_SCRIPTING_REFUSED = re.compile(
    r"(?:no permissions to run the '(?P<perm>evalsha|eval|script\|load|script)' command)"
    r"|(?:unknown command ['`](?P<unknown>evalsha|eval|script)['`])",  # 6.2 quotes with `
    re.IGNORECASE,
)


def scripting_refused(exc: BaseException) -> ConfigurationError | None:
    """The ConfigurationError to raise instead of ``exc`` when it says this server or user may
    not run Lua scripts (dueq makes every change with one), else None."""
    if not isinstance(exc, redis.ResponseError):
        return None
    found = _SCRIPTING_REFUSED.search(str(exc))
    if found is None:
        return None
    if found.group("perm"):
        command = found.group("perm").upper()
        return ConfigurationError(
            f"this Redis user may not run {command}: dueq makes every change with a Lua "
            "script (EVALSHA, and SCRIPT LOAD after a script cache flush); grant them, e.g. "
            f"with the rule `dueq acl ROLE` prints (the server said: {exc})"
        )
    command = found.group("unknown").upper()
    return ConfigurationError(
        f"this Redis server has no {command} command (renamed or disabled, as some managed "
        "services do): dueq makes every change with a Lua script and needs EVALSHA and "
        f"SCRIPT LOAD (the server said: {exc})"
    )


class _ScriptsBase:
    """The registered scripts of one client, and the replication setting they run with.

    ``wait_replicas`` > 0 makes the changes of PRODUCER_SCRIPTS and SETTLE_SCRIPTS wait until
    that many replicas confirm them, up to ``wait_timeout_ms``.

    Each script is read and registered (its SHA computed) when it is first run: a queue
    object costs nothing for the scripts it never runs, and a worker's first claim does not
    wait for the 25 files to be read and hashed (docs/benchmarks.md, Start-up).
    """

    def __init__(self, client: Any, *, wait_replicas: int = 0, wait_timeout_ms: int = 1000) -> None:
        _check_wait(client, wait_replicas)
        self._client = client
        self._scripts: dict[str, Any] = {}
        self._wait_replicas = wait_replicas
        self._wait_timeout_ms = wait_timeout_ms

    def script(self, name: str) -> Any:
        """redis-py's ``Script`` of ``name`` on this client, registered on first use (two
        threads that race here register the same script; either object serves)."""
        found = self._scripts.get(name)
        if found is None:
            if name not in SCRIPT_NAMES:
                raise KeyError(name)
            found = self._scripts[name] = self._client.register_script(script_source(name))
        return found


class Scripts(_ScriptsBase):
    """The scripts of a blocking client (``redis.Redis`` or ``RedisCluster``), by name."""

    def run(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """Run script ``name`` with KEYS and ARGV. A key of the wrong type raises CorruptQueue;
        a server or user that refuses scripts, ConfigurationError (``scripting_refused``)."""
        try:
            return self._run(name, keys, args)
        except redis.ResponseError as exc:
            refused = scripting_refused(exc)
            if refused is not None:
                raise refused from None  # one clear error; it quotes the server's reply
            if not _wrong_type(exc):
                raise
            corrupt = self._look(name, keys)
            if corrupt is None:
                raise
            raise corrupt from exc

    def _look(self, name: str, keys: list[str]) -> CorruptQueue | None:
        """TYPE of each of ``keys`` (one round trip), as corrupt_queue reads them."""
        try:
            pipe = self._client.pipeline(transaction=False)
            for key in keys:
                pipe.type(key)
            types = pipe.execute()
        except redis.RedisError as exc:  # cannot look (no +type, connection lost): Redis's error
            logger.debug("cannot read the key types of %s: %s", name, exc)
            return None
        return corrupt_queue(name, keys, types)

    def _run(self, name: str, keys: list[str], args: list[Any]) -> Any:
        if not _waits(name, self._wait_replicas):
            return self.script(name)(keys=keys, args=args)
        if isinstance(self._client, RedisCluster):
            return self._run_on_node(name, keys, args)
        assert isinstance(self._client, redis.Redis)
        pipe = self._client.pipeline(transaction=False)
        self.script(name)(keys=keys, args=args, client=pipe)
        pipe.execute_command(  # type: ignore[no-untyped-call]
            "WAIT", self._wait_replicas, self._wait_timeout_ms
        )
        reply, confirmed = pipe.execute()
        return _replicated(name, reply, confirmed, self._wait_replicas, self._wait_timeout_ms)

    def _run_on_node(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """On a Redis Cluster: the script and its WAIT in one pipeline on the connection of
        the primary that holds the keys' slot (WAIT counts the replicas of the node it is sent
        to, so it must follow the write there). Routing that a failover made stale (MOVED from
        a primary turned replica, or the node gone) refreshes the cluster's slot map and raises
        ConnectionError: the script did not run on a primary (MOVED) or may have (a lost
        connection, as on one server), and callers retry it as after any lost connection."""
        cluster: RedisCluster = self._client
        node = cluster.get_node_from_key(keys[0])  # type: ignore[no-untyped-call]
        pipe = cluster.get_redis_connection(node).pipeline(transaction=False)
        self.script(name)(keys=keys, args=args, client=pipe)
        pipe.execute_command(  # type: ignore[no-untyped-call]
            "WAIT", self._wait_replicas, self._wait_timeout_ms
        )
        try:
            reply, confirmed = pipe.execute()
        except (
            redis.exceptions.MovedError,
            redis.exceptions.ClusterDownError,
            redis.ConnectionError,
            redis.TimeoutError,
        ) as exc:
            try:
                cluster.nodes_manager.initialize()
            except (redis.RedisError, RedisClusterException) as again:  # mid-failover: later
                logger.debug("cannot refresh the cluster's slot map yet: %s", again)
            raise redis.ConnectionError(f"{name}: the shard's primary moved ({exc})") from exc
        return _replicated(name, reply, confirmed, self._wait_replicas, self._wait_timeout_ms)


class AsyncScripts(_ScriptsBase):
    """The scripts of a ``redis.asyncio`` client, awaited by name (as ``Scripts``)."""

    async def run(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """Run script ``name`` with KEYS and ARGV (as ``Scripts.run``)."""
        try:
            return await self._run(name, keys, args)
        except redis.ResponseError as exc:
            refused = scripting_refused(exc)
            if refused is not None:
                raise refused from None  # one clear error; it quotes the server's reply
            if not _wrong_type(exc):
                raise
            corrupt = await self._look(name, keys)
            if corrupt is None:
                raise
            raise corrupt from exc

    async def _look(self, name: str, keys: list[str]) -> CorruptQueue | None:
        """TYPE of each of ``keys`` (one round trip), as corrupt_queue reads them."""
        try:
            pipe = self._client.pipeline(transaction=False)
            for key in keys:
                pipe.type(key)
            types = await pipe.execute()
        except redis.RedisError as exc:  # cannot look (no +type, connection lost): Redis's error
            logger.debug("cannot read the key types of %s: %s", name, exc)
            return None
        return corrupt_queue(name, keys, types)

    async def _run(self, name: str, keys: list[str], args: list[Any]) -> Any:
        if not _waits(name, self._wait_replicas):
            return await self.script(name)(keys=keys, args=args)
        assert isinstance(self._client, redis.asyncio.Redis)
        pipe = self._client.pipeline(transaction=False)
        await self.script(name)(keys=keys, args=args, client=pipe)
        pipe.execute_command("WAIT", self._wait_replicas, self._wait_timeout_ms)
        reply, confirmed = await pipe.execute()
        return _replicated(name, reply, confirmed, self._wait_replicas, self._wait_timeout_ms)
