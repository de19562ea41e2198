"""The options of the ``dueq`` Spark data source: which ones each use takes, checked first.

Spark hands a Python data source every option it was given, whatever its name, and reads none
of them itself, so an option the source never looks at is silently ignored: ``stat=
"scheduled"`` read the dead tasks (the default state), and a write's ``id_coll=`` scheduled
every row under a generated id. So each use (a read of tasks, a batch write, a streaming write,
a read of outcome events) names the options it takes, and ``checked`` refuses any other with
``ConfigurationError``: it names the option and the nearest valid one (``difflib``: the same
use first, then any use, as a misspelt ``event`` is the events read's ``events``), or says
which use an option belongs to (``staging_ttl_s`` is for streaming writes) instead of
ignoring it there.

Names are case-insensitive: Spark lower-cases them (its ``CaseInsensitiveDict``), so
``maxEventsPerTrigger`` arrives as ``maxeventspertrigger``. ``checked`` returns such a mapping
for a plain dict too (direct calls), so every later ``options.get`` finds a name in any case.
Options Spark itself sets on a streaming sink (``checkpointLocation``) are part of the
streaming write's set.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from pyspark.sql.datasource import CaseInsensitiveDict

from dueq.exceptions import ConfigurationError

__all__ = ["EVENTS", "READ", "STREAM_WRITE", "WRITE", "bool_option", "checked"]

_TARGET = ("queue", "redis_url")
#: A batch write (``df.write.format("dueq")``).
WRITE = (
    *_TARGET,
    "id_col",
    "at_col",
    "delay_col",
    "payload_cols",
    "fair_key_col",
    "batch_size",
    "on_bad_row",
    "max_payload_bytes",
    "task",
    "batch",
    "on_complete_payload",
    "on_complete_task",
    "on_complete_id",
    "secretKeys",
    "activeKey",
    "compression",
)
#: A streaming write (``writeStream.format("dueq")``); Spark passes ``checkpointLocation`` on.
STREAM_WRITE = (*WRITE, "staging_ttl_s", "batch_memory_s", "checkpointLocation")
#: A read of tasks (``spark.read.format("dueq")``).
READ = (*_TARGET, "state", "page_size", "partitions", "allow_missing", "decrypt")
#: A read or stream of outcome events (the option ``events``; ``dueq.spark._events``).
EVENTS = (*_TARGET, "events", "maxEventsPerTrigger", "partitions", "page_size", "failOnDataLoss")

_USES = {
    "read": READ,
    "write": WRITE,
    "streaming write": STREAM_WRITE,
    "events read": EVENTS,
}
#: Where an option of one use is given to another, what to call its own use (writes before
#: streaming writes: a read given id_col is told it is for writes).
_BELONGS = (
    ("writes", WRITE),
    ("streaming writes", STREAM_WRITE),
    ("task reads", READ),
    ("events reads", EVENTS),
)


def checked(options: Mapping[str, Any], use: str) -> Mapping[str, Any]:
    """``options`` with case-insensitive names, after refusing (``ConfigurationError``) every
    option that ``use`` (``read``, ``write``, ``streaming write``, ``events read``) does not
    take, naming it with the nearest valid name or the use it is for."""
    given = CaseInsensitiveDict(options)
    valid = _USES[use]
    own = {name.lower() for name in valid}
    unknown = sorted(name for name in given if name not in own)
    if not unknown:
        return given
    for name in unknown:
        for where, names in _BELONGS:
            if name in {n.lower() for n in names}:
                raise ConfigurationError(f"option {name} is for {where}, not a dueq {use}")
    noun = "option" if len(unknown) == 1 else "options"
    message = f"unknown {noun} {', '.join(map(repr, unknown))} of a dueq {use}"
    for name in unknown:
        nearest = _nearest(name, valid)
        if nearest is not None:
            message += f"; did you mean {nearest!r}" + (
                "?" if len(unknown) == 1 else f" for {name!r}?"
            )
    raise ConfigurationError(f"{message} (it takes {', '.join(valid)}; names are case-insensitive)")


def _nearest(name: str, valid: tuple[str, ...]) -> str | None:
    """The valid name closest to ``name``, if one is close: of this use first, else of any
    use (a misspelt ``events`` makes a task read, whose options are not the events read's)."""
    for names in (valid, tuple(n for _, ns in _BELONGS for n in ns)):
        by_lower = {n.lower(): n for n in names}
        close = difflib.get_close_matches(name, list(by_lower), n=1, cutoff=0.6)
        if close:
            return by_lower[close[0]]
    return None


def bool_option(options: Mapping[str, Any], name: str, default: bool) -> bool:
    """A true/false option (any case), or ``default`` when it is not given."""
    raw = options.get(name)
    if raw is None:
        return default
    value = str(raw).strip().lower()
    if value not in ("true", "false"):
        raise ConfigurationError(f"option {name} must be true or false, got {raw!r}")
    return value == "true"
