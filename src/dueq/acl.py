"""Least-privilege Redis ACL rules for the three jobs around a dueq queue.

``acl_rule(role, queue_pattern)`` returns the rule for one role: key patterns
(``~dueq:{PATTERN}:*``), the wake, ended and progress channels (``&dueq:{PATTERN}:wake``, ...)
and the commands the library really sends for that role, ready to follow ``ACL SETUSER <name>
reset on >password``.

Where the command list comes from: Redis 7 checks ACL permissions on every ``redis.call``
inside a script (commands and keys), so a role needs EVALSHA and SCRIPT LOAD (redis-py's
fall-back on NOSCRIPT) plus every command the role's Lua scripts call. Those are read from
the scripts themselves (each script is its includes + its own file), so a script that
starts calling a new command changes the rule with it. The commands sent from Python are
listed by hand below, per role; ``tests/server/test_acl.py`` runs each role's operations as a user
with exactly this rule against a real server, so a missing command fails a test.

What this does and does not separate (docs/deployment.md says it for users):

* Queue from queue, and the server from the queue: a user with the rule for ``emails``
  cannot read or write another queue's keys (also not from inside a script: Redis checks key
  permissions on every ``redis.call``), and cannot FLUSHALL, CONFIG SET, KEYS, DEBUG, ...
* Role from role within one queue: not enforced by Redis. Every role may run EVALSHA and
  SCRIPT LOAD, and every data command its scripts need is allowed directly on the queue's
  keys, so a producer could, with its own Lua or plain ZADD/HDEL, do what a consumer or an
  operator does on the same queue. The roles still keep each job to the commands it needs
  (a producer cannot SUBSCRIBE or SCAN; only the operator may SCAN to discover queues).

Every supported server accepts the rule (Redis 6.2, 7.x, Valkey 8/9; docs/servers.md): it
starts with ``resetchannels`` (Redis 6.2 gives a new user ``allchannels``, after which a
``&pattern`` is refused), and the Pub/Sub commands are written with the ``@pubsub`` category
(``pubsub_tokens``) because 6.2 refuses the names of the sharded ones (SPUBLISH, SSUBSCRIBE,
SUNSUBSCRIBE, Redis 7.0), which the category adds wherever the server has them.

Chosen to leave out: ``CONFIG GET`` (it can read secrets such as ``masterauth``). ``INFO``
(read-only server facts, no secrets) is given to the consumer instead: its start-up check
reads the version from ``INFO server`` and the eviction policy from ``INFO memory``. It could
do without (the version from HELLO, the eviction warning skipped), but every start would then
leave a refusal in ``ACL LOG``, which operators watch for attacks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, get_args

from dueq._wire.keys import PREFIX
from dueq._wire.scripts import script_source
from dueq.exceptions import ConfigurationError

Role = Literal["producer", "consumer", "operator"]
ROLES: tuple[Role, ...] = get_args(Role)

#: The Lua scripts each role runs (see dueq/_wire/lua).
ROLE_SCRIPTS: dict[Role, tuple[str, ...]] = {
    # schedule / schedule_many, cancel, reschedule, get
    # plus the Spark data source's streaming write (stage, commit, abort)
    "producer": (
        "schedule",
        "cancel",
        "reschedule",
        "inspect",
        "spark_stage",
        "spark_commit",
        "spark_abort",
        "close_batch",  # q.close_batch, and the Spark writers' batch= at commit
    ),
    # claim (with cron occurrences), ack, fail, extend, release, get
    "consumer": (
        "claim",
        "cron_advance",
        "ack",
        "fail",
        "extend",
        "release",
        "inspect",
        "heartbeat",  # the worker registry (dueq.registry)
        "events_read",  # q.events(group=...): a member's read, and what its group lost
        "progress",  # d.progress: a leased task's progress entry
    ),
    # stats, get, list_tasks, history, dead list/count/replay/purge,
    # cron add/list/remove/pause/resume/run_now, schedule (CLI), configure / pause / resume
    "operator": (
        "stats",
        "inspect",
        "dead",
        "cron_add",
        "cron_remove",
        "cron_control",
        "schedule",
        "cancel",
        "reschedule",
        "configure",
        "list_tasks",
        "history",
        "doctor",  # q.doctor / dueq doctor: checks and repairs derived state
        "close_batch",
    ),
}

#: Commands sent from Python, per role (lower case, as ACL rules print them).
#: Every role: PING (the CLI checks the connection), SELECT (a URL naming a database other
#: than 0), EVALSHA + SCRIPT LOAD (redis-py's Script reloads on NOSCRIPT), SCRIPT EXISTS
#: (a redis-py pipeline checks its scripts first: Queue(wait_replicas=N)) and WAIT.
# GET: the shard count of a sharded queue (``dueq:{<queue>#}:shards``), read by the first
# schedule or claim of a plain queue object and by every open by name; EXISTS + SETNX: a
# sharded queue object's first use checks for a plain queue of its name and records N.
# TYPE: after a script failed with WRONGTYPE, the runner finds the key to name (scripts.py).
COMMON_COMMANDS = (
    "ping",
    "select",
    "evalsha",
    "script|load",
    "script|exists",
    "wait",
    "get",
    "exists",
    "setnx",
    "type",  # only after a script's WRONGTYPE: which key is of the wrong type (scripts.py)
)
PYTHON_COMMANDS: dict[Role, tuple[str, ...]] = {
    # q.wait: SSUBSCRIBE (Redis >= 7.0) or SUBSCRIBE (6.2) on the ended channel, HGETALL of
    # the queue's settings (keep_results), INFO for the server version check
    # HGET: q.batch(id)
    "producer": (
        "ssubscribe",
        "sunsubscribe",
        "subscribe",
        "unsubscribe",
        "hgetall",
        "info",
        "hget",
    ),
    # HMGET: cron definitions of claimed occurrences; SSUBSCRIBE (Redis >= 7.0) or SUBSCRIBE
    # (6.2): the wake channel;
    # INFO: the server version check at the first claim (INFO server; without it the
    # library falls back to HELLO, and ACL LOG records the refused INFO of every start).
    # XREVRANGE, XREAD, XGROUP CREATE, XREADGROUP, XAUTOCLAIM, XACK: outcome events (q.events)
    "consumer": (
        *("hmget", "ssubscribe", "sunsubscribe", "subscribe", "unsubscribe", "info"),
        *("xrevrange", "xread", "xgroup|create", "xreadgroup", "xautoclaim", "xack"),
    ),
    # SCAN + EXISTS: queue discovery and `dueq ... QUEUE` checks; ZCARD: dead.count();
    # HGET/HGETALL/HMGET: cron list/get; TIME: cron add reads the server clock;
    # ZSCAN: Spark's read of a queue; ZCARD + ZRANGE: the Spark data source's partitioned read;
    # TIME + ZRANGE + HGETALL: the worker registry (Queue.workers, dueq workers);
    # XREVRANGE: the latest outcome events (the dashboard's queue page, dueq events);
    # HSCAN: q.batches / dueq batches;
    # XINFO STREAM + XRANGE (+ HGET, EXISTS): the Spark data source's read of outcome events;
    # XINFO STREAM + XINFO GROUPS: q.event_groups / dueq events --groups.
    "operator": (
        *("scan", "exists", "zcard", "hget", "hgetall", "hmget", "time", "zscan", "zrange"),
        "xrevrange",
        "hscan",
        *("xinfo|stream", "xinfo|groups", "xrange"),
    ),
}

#: Pub/Sub commands of Redis 7.0, unknown to 6.2 (whose ACL SETUSER refuses their names).
SHARDED_PUBSUB = frozenset({"spublish", "ssubscribe", "sunsubscribe"})
#: The Pub/Sub command sets a role (or several) can need, as tokens every server accepts. Only
#: @pubsub commands are set when these run (they come first after the key and channel
#: patterns), so subtracting ``@slow`` takes away SUBSCRIBE, SSUBSCRIBE, PSUBSCRIBE and the
#: PUBSUB introspection and leaves PUBLISH and SPUBLISH (both ``@fast`` on every server).
PUBSUB_TOKENS: dict[frozenset[str], tuple[str, ...]] = {
    frozenset({"publish", "spublish"}): ("+@pubsub", "-@slow"),
    frozenset({"publish", "spublish", "subscribe", "unsubscribe", "ssubscribe", "sunsubscribe"}): (
        "+@pubsub",
        "-psubscribe",
        "-punsubscribe",
        "-pubsub",
    ),
}
_PUBSUB_COMMANDS = frozenset().union(*PUBSUB_TOKENS)


def command_tokens(commands: set[str] | tuple[str, ...]) -> list[str]:
    """``+command`` tokens for ``commands``, the Pub/Sub ones as an @pubsub expression first
    (see PUBSUB_TOKENS), so that Redis 6.2 accepts them too."""
    pubsub = frozenset(commands) & _PUBSUB_COMMANDS
    others = sorted(set(commands) - pubsub)
    if not pubsub & SHARDED_PUBSUB:
        return [f"+{c}" for c in sorted(pubsub)] + [f"+{c}" for c in others]
    if pubsub not in PUBSUB_TOKENS:  # a new combination: add its expression to the table
        raise ConfigurationError(f"no ACL expression for the Pub/Sub commands {sorted(pubsub)}")
    return [*PUBSUB_TOKENS[pubsub], *(f"+{c}" for c in others)]


_CALL = re.compile(r"""(?:redis\.call|redis\.pcall|call_chunked)\(\s*['"]([A-Za-z]+)['"]""")


@dataclass(frozen=True)
class AclRule:
    """The ACL rule of one role over the queues ``queue_pattern`` matches."""

    role: Role
    queue_pattern: str
    keys: tuple[str, ...]
    channels: tuple[str, ...]
    commands: tuple[str, ...]
    description: str

    def tokens(self) -> list[str]:
        """The ACL tokens, in order: ``resetchannels``, key patterns, channel patterns, then
        the commands (``command_tokens``)."""
        return ["resetchannels", *self.keys, *self.channels, *command_tokens(self.commands)]

    def line(self) -> str:
        """The tokens as one line, to append to ``ACL SETUSER <name> reset on >password``."""
        return " ".join(self.tokens())


def script_commands(name: str) -> set[str]:
    """The Redis commands a dueq Lua script (with its includes) can call, lower case."""
    return {command.lower() for command in _CALL.findall(script_source(name))}


def _validate_pattern(pattern: object) -> str:
    if not isinstance(pattern, str) or not pattern:
        raise ConfigurationError(f"queue pattern must be a non-empty string, got {pattern!r}")
    if any(c in pattern for c in "{}") or any(c.isspace() for c in pattern):
        raise ConfigurationError(
            f"queue pattern {pattern!r} must not hold braces or white space "
            "(use ? to match a space)"
        )
    if not pattern.isprintable():
        raise ConfigurationError(f"queue pattern {pattern!r} must be printable")
    return pattern


DESCRIPTIONS: dict[Role, str] = {
    "producer": "schedules, cancels, reschedules and looks up tasks (Queue.schedule*, "
    "cancel, reschedule, get; dueq schedule)",
    "consumer": "claims and settles tasks and hears the wake channel (Queue.claim, observe, "
    "process, Worker; dueq worker)",
    "operator": "reads stats and history, lists and steers tasks, manages dead letters and "
    "cron, finds queues with SCAN (Queue.stats, history, list_tasks, get, run_now, dead.*, "
    "cron.*; dueq stats, list, show, cancel, reschedule, run-now, dead, cron)",
}


def acl_rule(role: str, queue_pattern: str = "*") -> AclRule:
    """The minimal ACL rule for ``role`` (producer, consumer or operator) on the queues whose
    names match the glob ``queue_pattern``; ConfigurationError for an unknown role or a
    pattern an ACL rule cannot hold."""
    if role not in ROLES:
        raise ConfigurationError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    checked: Role = role
    pattern = _validate_pattern(queue_pattern)
    commands = set(COMMON_COMMANDS) | set(PYTHON_COMMANDS[checked])
    for script in ROLE_SCRIPTS[checked]:
        commands |= script_commands(script)
    base = f"{PREFIX}:{{{pattern}}}:"
    keys: tuple[str, ...]
    channels: tuple[str, ...]
    if pattern == "*":  # every tag: plain queues, shards and layout keys alike
        keys, channels = (f"~{base}*",), (f"&{base}wake", f"&{base}ended", f"&{base}progress")
    else:
        # a sharded queue of that name: its shards' tags are ``<name>#<i>[.<k>]`` (a sharded
        # queue's name holds no '#'), its layout key ``dueq:{<name>#}:shards`` (which the first
        # producer writes): ``{<pattern>#*}`` matches both and nothing of another queue
        shards = f"{PREFIX}:{{{pattern}#*}}:"
        keys = (f"~{base}*", f"~{shards}*")
        channels = (f"&{base}wake", f"&{shards}wake", f"&{base}ended", f"&{shards}ended")
        channels += (f"&{base}progress", f"&{shards}progress")
    return AclRule(
        role=checked,
        queue_pattern=pattern,
        keys=keys,
        channels=channels,
        commands=tuple(sorted(commands)),
        description=DESCRIPTIONS[checked],
    )


def acl_rules(role: str, queue_pattern: str = "*") -> list[str]:
    """The ACL tokens of ``acl_rule(role, queue_pattern)``."""
    return acl_rule(role, queue_pattern).tokens()


def combined_rule(roles: tuple[str, ...] = ROLES, queue_pattern: str = "*") -> list[str]:
    """The ACL tokens of one user that holds several roles (the union of their rules)."""
    rules = [acl_rule(role, queue_pattern) for role in roles]
    if not rules:
        raise ConfigurationError("give at least one role")
    commands = {c for rule in rules for c in rule.commands}
    return ["resetchannels", *rules[0].keys, *rules[0].channels, *command_tokens(commands)]
