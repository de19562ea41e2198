"""What a cron definition stores in Redis, and how each stored value is read and checked.

Per definition name, beside the queue's keys: the definition itself (``cron``, canonical JSON
of a ``Spec``), its schedule state (``cron_state``, ``head_ms|last_ms|head_id``, written by the
scripts) and the outcome of its last firing (``cron_last``, JSON written by the scripts that
settle deliveries). This module turns each into checked values, or says why it cannot.

A **definition** that cannot be read (not JSON, the wrong shape, an unknown zone, a bad
expression, numbers out of range) is caught by ``Spec.from_json`` before anything is written:
``add`` checks its input the same way, so what one process stores every other can schedule
from. A state or last outcome that cannot be read is derived data: ``read_state`` and
``read_last`` return nothing for it, and the claim-time keeper or the next outcome rewrites it.

Nothing here talks to Redis.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal, cast, get_args

import redis

from ._cron_ids import MAX_SLOT_MS, is_slot_id_of
from .checks import checked_name
from .cronexpr import schedule_for
from .exceptions import CronError
from .snapshot import text

MissedPolicy = Literal["skip", "latest", "all"]
LastOutcome = Literal["acked", "retrying", "dead"]

#: Most missed occurrences ``missed="all"`` runs after downtime, by default and at most.
DEFAULT_MAX_MISSED = 10
MAX_MISSED_LIMIT = 1000
#: The fields of a stored definition, in the order ``Spec`` takes them.
SPEC_FIELDS = ("expr", "tz", "missed", "max_missed", "payload")
#: A readable cron_state value, "head_ms|last_ms|head_id" (cron_state_read in the scripts).
_STATE = re.compile(r"([0-9]{1,15})\|([0-9]{0,15})\|(.*)", re.DOTALL)


def validate_name(name: object) -> str:
    """Return ``name`` if it can name a cron definition, else raise CronError (the rule of
    queue names, ``dueq.checks.checked_name``)."""
    return checked_name(name, "cron name", CronError)


@dataclass(frozen=True)
class Spec:
    """A validated definition: what is stored, compared and scheduled from."""

    expr: str
    tz: str
    missed: MissedPolicy
    max_missed: int
    payload: Any

    def to_json(self) -> str:
        """Canonical JSON: equal definitions give equal strings."""
        return json.dumps(self.__dict__, sort_keys=True, separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_json(cls, raw: bytes | str) -> Spec:
        """A stored definition, checked as ``add`` checks it; CronError says what is wrong."""
        data = json_object(raw)
        missing = [f for f in SPEC_FIELDS if f not in data]
        if missing:
            raise CronError(f"it has no {', '.join(missing)}")
        expr, tz, missed, max_missed = (data[f] for f in SPEC_FIELDS[:4])
        if not isinstance(expr, str) or not isinstance(tz, str):
            raise CronError(f"expr and tz must be text, got {shown(expr)} and {shown(tz)}")
        if missed not in get_args(MissedPolicy):
            raise CronError(f"missed is {shown(missed)}, not 'skip', 'latest' or 'all'")
        if (
            not isinstance(max_missed, int)
            or isinstance(max_missed, bool)
            or not 1 <= max_missed <= MAX_MISSED_LIMIT
        ):
            raise CronError(f"max_missed is {shown(max_missed)}, not 1 to {MAX_MISSED_LIMIT}")
        try:
            schedule_for(expr, tz)
        except CronError:
            raise
        except Exception as exc:  # croniter and zoneinfo on hostile text: any error means bad
            raise CronError(f"expression {shown(expr)} in {shown(tz)}: {exc!r}") from exc
        spec = cls(expr, tz, missed, max_missed, data["payload"])
        try:
            spec.to_json()
        except (ValueError, RecursionError) as exc:
            raise CronError(f"its payload cannot be JSON again ({exc})") from exc
        return spec


def json_object(raw: bytes | str) -> dict[str, Any]:
    """A stored JSON object; CronError if it is not UTF-8 JSON of an object."""
    try:
        data = json.loads(text(raw))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise CronError(f"it is not JSON ({_short(str(exc))})") from exc
    if not isinstance(data, dict):
        raise CronError(f"it is a JSON {type(data).__name__}, not an object")
    return data


def shown(value: object) -> str:
    """A short repr for messages (repr of a huge int can itself raise ValueError)."""
    try:
        return _short(repr(value))
    except ValueError:
        return f"<{type(value).__name__}>"


def _short(message: str, width: int = 80) -> str:
    return message if len(message) <= width else message[: width - 1] + "…"


def missed_policy(value: object) -> MissedPolicy | Literal[""]:
    """``value`` as a missed policy, or ``""`` if it is none."""
    for policy in get_args(MissedPolicy):
        if value == policy:
            return cast(MissedPolicy, policy)
    return ""


def read_state(name: str, raw: bytes | str | None) -> tuple[int, int | None] | None:
    """(pending slot ms, last fired ms) of a cron_state value; None if it is missing or cannot
    be read. Accepts exactly what the scripts' cron_state_read accepts."""
    if raw is None:
        return None
    try:
        value = text(raw)
    except UnicodeDecodeError:
        return None
    match = _STATE.fullmatch(value)
    if match is None:
        return None
    head, last = int(match[1]), int(match[2]) if match[2] else None
    if (
        head > MAX_SLOT_MS
        or (last is not None and last > MAX_SLOT_MS)
        or not is_slot_id_of(name, match[3])
    ):
        return None
    return head, last


def read_last(raw: bytes | str) -> tuple[str, LastOutcome, int, str | None, int | None]:
    """(occurrence id, outcome, at ms, error type, last ack ms) of a cron_last value (JSON
    written by the scripts' cron_note); CronError if it cannot be read."""
    data = json_object(raw)
    try:
        occurrence, outcome, at_ms = data["id"], data["outcome"], data["at"]
    except KeyError as exc:
        raise CronError(f"it has no {exc}") from exc
    error_type, ok_ms = data.get("error_type"), data.get("ok_at")
    if (
        not isinstance(occurrence, str)
        or outcome not in get_args(LastOutcome)
        or not _slot_ms_ok(at_ms)
        or not (error_type is None or isinstance(error_type, str))
        or not (ok_ms is None or _slot_ms_ok(ok_ms))
    ):
        raise CronError(f"unexpected fields {shown(data)}")
    return occurrence, outcome, at_ms, error_type, ok_ms


def _slot_ms_ok(value: object) -> bool:
    """An epoch ms that a datetime can hold (0 to the end of the year 9999)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_SLOT_MS


def wrong_type(exc: redis.RedisError) -> bool:
    """True if Redis refused a command because a key holds another type (corrupted data)."""
    return isinstance(exc, redis.ResponseError) and "WRONGTYPE" in str(exc)
