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

import hashlib
import json
import re
from dataclasses import dataclass, fields
from typing import Any, Literal, cast, get_args

import redis

from dueq._util.checks import checked_name
from dueq._wire.codec import sealed_body
from dueq._wire.envelope import (
    MAX_TIMEOUT_MS,
    TaskOptions,
    encode_envelope,
    envelope_of,
    validate_key,
    validate_priority,
    validate_task_attempts,
    validate_task_name,
)
from dueq._wire.snapshot import text
from dueq.cron._ids import MAX_SLOT_MS, is_slot_id_of
from dueq.cron.expr import CronSchedule, EverySchedule, Window, load_zone, schedule_for
from dueq.exceptions import CronError, InvalidTaskError

MissedPolicy = Literal["skip", "latest", "all"]
LastOutcome = Literal["acked", "retrying", "dead", "cancelled"]
#: What a slot does while the previous occurrence of its definition still runs or retries.
Overlap = Literal["allow_all", "skip", "buffer_one", "cancel_other"]

#: Most missed occurrences ``missed="all"`` runs after downtime, by default and at most.
DEFAULT_MAX_MISSED = 10
MAX_MISSED_LIMIT = 1000
#: The fields of a stored definition, in the order ``Spec`` takes them.
SPEC_FIELDS = ("expr", "tz", "missed", "max_missed", "payload")
#: A week, in ms: the longest jitter.
MAX_JITTER_MS = 7 * 86_400_000
#: Most firings ``limit=`` allows, and most consecutive dead occurrences before a pause.
MAX_LIMIT = 10**12
MAX_PAUSE_AFTER = 1000
#: The policies that are whole numbers, with their bounds.
_INT_FIELDS = (
    ("every_ms", 1000, MAX_SLOT_MS),
    ("offset_ms", 0, MAX_SLOT_MS),
    ("start_ms", 0, MAX_SLOT_MS),
    ("end_ms", 0, MAX_SLOT_MS),
    ("limit", 1, MAX_LIMIT),
    ("jitter_ms", 0, MAX_JITTER_MS),
    ("catchup_ms", 1000, MAX_SLOT_MS),
    ("pause_after", 1, MAX_PAUSE_AFTER),
    ("timeout_ms", 1, MAX_SLOT_MS),
    ("expires_ms", 1, MAX_TIMEOUT_MS),
)
#: A readable cron_state value, "head_ms|last_ms|head_id" (cron_state_read in the scripts).
_STATE = re.compile(r"([0-9]{1,15})\|([0-9]{0,15})\|(.*)", re.DOTALL)


def validate_name(name: object) -> str:
    """Return ``name`` if it can name a cron definition, else raise CronError (the rule of
    queue names, ``dueq._util.checks.checked_name``)."""
    return checked_name(name, "cron name", CronError)


@dataclass(frozen=True)
class Spec:
    """A validated definition: what is stored, compared and scheduled from.

    The policies (``every_ms`` and the fields after it) are stored only when they differ from
    their defaults, so a definition without policies keeps the JSON it always had. ``expr`` is
    ``""`` for an ``every=`` definition.
    """

    expr: str
    tz: str
    missed: MissedPolicy
    max_missed: int
    payload: Any
    every_ms: int | None = None
    offset_ms: int = 0
    start_ms: int | None = None
    end_ms: int | None = None
    limit: int | None = None
    jitter_ms: int = 0
    catchup_ms: int | None = None
    pause_after: int | None = None
    overlap: Overlap = "allow_all"
    priority: int = 0
    key: str | None = None
    timeout_ms: int | None = None
    max_attempts: int | None = None
    task: str | None = None
    #: each occurrence expires this long after its nominal slot (before jitter): never started
    #: after it, it ends "expired" (None: occurrences never expire)
    expires_ms: int | None = None

    def to_json(self) -> str:
        """Canonical JSON: equal definitions give equal strings."""
        values = self.__dict__
        data = {name: values[name] for name in SPEC_FIELDS}
        for name, default in _POLICY_DEFAULTS:
            if values[name] != default:
                data[name] = values[name]
        return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)

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
        if not _int_ok(max_missed, 1, MAX_MISSED_LIMIT):
            raise CronError(f"max_missed is {shown(max_missed)}, not 1 to {MAX_MISSED_LIMIT}")
        policies = {k: v for k, v in data.items() if k not in SPEC_FIELDS}
        unknown = policies.keys() - _POLICY_NAMES
        if unknown:
            raise CronError(f"it has unknown fields {shown(sorted(unknown))}")
        spec = cls(expr, tz, missed, max_missed, data["payload"], **policies)
        if policies:
            spec.check()
        else:  # every policy has its default, which is valid: only the schedule is checked
            spec.check_slots()
        try:
            spec.to_json()
        except (ValueError, RecursionError) as exc:
            raise CronError(f"its payload cannot be JSON again ({exc})") from exc
        return spec

    def check(self) -> None:
        """CronError if a field is out of range or of the wrong type."""
        for name, low, high in _INT_FIELDS:
            value = getattr(self, name)
            if value is not None and not _int_ok(value, low, high):
                raise CronError(f"{name} is {shown(value)}, not {low} to {high}")
        if self.overlap not in get_args(Overlap):
            raise CronError(
                f"overlap is {shown(self.overlap)}, not one of {', '.join(get_args(Overlap))}"
            )
        if self.start_ms is not None and self.end_ms is not None and self.end_ms < self.start_ms:
            raise CronError("end is before start")
        if self.expires_ms is not None and self.jitter_ms >= self.expires_ms:
            raise CronError(
                "jitter must be shorter than expires (an occurrence expires that long after "
                "its slot, so one due later than that could never run)"
            )
        try:
            validate_priority(self.priority)
            if self.max_attempts is not None:
                validate_task_attempts(self.max_attempts)
            if self.key is not None:
                validate_key(self.key)
            if self.task is not None:
                validate_task_name(self.task)
        except InvalidTaskError as exc:
            raise CronError(str(exc)) from exc
        self.check_slots()

    def check_slots(self) -> None:
        """CronError if its expression, zone or interval cannot give slots."""
        try:
            self.base_slots()
        except CronError:
            raise
        except Exception as exc:  # croniter and zoneinfo on hostile text: any error means bad
            raise CronError(f"expression {shown(self.expr)} in {shown(self.tz)}: {exc!r}") from exc

    def base_slots(self) -> CronSchedule | EverySchedule:
        """The slots of its expression or interval, before its window."""
        if self.every_ms is not None:
            if self.expr:
                raise CronError("a definition has an expression or every=, not both")
            load_zone(self.tz)
            return EverySchedule(self.every_ms, self.offset_ms)
        if self.offset_ms:
            raise CronError("offset= goes with every=")
        return schedule_for(self.expr, self.tz)

    def slots(self) -> Window:
        """Its slots within ``[start, end]``."""
        return Window(self.base_slots(), self.start_ms, self.end_ms)

    def options(self) -> TaskOptions:
        """The task options its occurrences carry."""
        return TaskOptions(
            self.priority, self.key, self.timeout_ms, self.max_attempts, self.expires_ms
        )

    def envelope(self, max_bytes: int) -> bytes:
        """The stored form of its occurrences (payload, options, task name). With
        ``expires_ms`` it has a version-3 head holding the expiry as ms after the slot: the
        scripts store each occurrence with it made absolute (``cron_expiring`` in
        lua/include/cron_expiry.lua), and the pending occurrence without it (``cron_pending``).
        A payload sealed when the definition was added goes in as its sealed body."""
        sealed = sealed_body(self.payload)
        if sealed is not None:  # sealed when added (``CronFlows.add_flow``), checked then
            return envelope_of(sealed, self.options(), task_name=self.task)
        return encode_envelope(self.payload, max_bytes, self.options(), task_name=self.task)

    def due_ms(self, slot_ms: int, task_id: str) -> int:
        """When the occurrence of ``slot_ms`` (id ``task_id``) is due: the slot plus its jitter,
        a fixed offset in ``[0, jitter)`` derived from the id, so every process agrees."""
        if not self.jitter_ms:
            return slot_ms
        digest = hashlib.sha256(task_id.encode("utf-8")).digest()
        return slot_ms + int.from_bytes(digest[:8], "big") % self.jitter_ms


#: The policy fields (all but SPEC_FIELDS) with their defaults, as ``to_json`` compares them.
_POLICY_DEFAULTS = tuple((f.name, f.default) for f in fields(Spec) if f.name not in SPEC_FIELDS)
_POLICY_NAMES = frozenset(name for name, _ in _POLICY_DEFAULTS)


def _int_ok(value: object, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


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
