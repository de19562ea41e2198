"""Recurring tasks: cron definitions kept in Redis, each occurrence an ordinary task.

Adding a definition schedules its pending occurrence; claiming that occurrence schedules the
next one (``Queue.claim_batch`` hands every claimed occurrence to ``Crons.on_claim``). An
occurrence's id is ``cron:<name>:<slot in UTC>``, so every process keeping a schedule writes
the same ids, and the ``cron_advance`` script moves a schedule on only from its pending slot
(compare-and-set): no leader, no separate scheduler process, no slot fired twice.

Corrupted data in Redis (a definition or state edited by hand or by a faulty tool) never
holds back anything else, and each case has one defined outcome:

- A **definition** that cannot be read (not JSON, the wrong shape, an unknown zone, a bad
  expression, numbers out of range) is checked here before anything is written: its claimed
  occurrence runs once as an ordinary task, its schedule is not advanced, and the claim logs
  an error. ``list``/``get`` show it with ``problem`` set; adding it again with
  ``replace=True`` (or removing it) repairs it. Stopping is the honest choice: dueq cannot
  know when such a definition means to fire.
- A **state** value that cannot be read (or is missing) is derived data: the script rebuilds
  it from the claimed occurrence, with the next slot after now as the pending one, so no
  slot fires twice and the schedule goes on. Until then ``list`` shows the problem.
- Only Redis refusing the advance (an outage, a permission) holds the claimed occurrences
  back until their leases end, so that a later claim advances the schedule.

Pause, resume and run now (``cron_control`` script):

- A paused definition has a mark in its own hash (``cron_paused``), beside the definition and
  the state rather than inside them, so the mark survives what rewrites them: an unreadable
  state rebuilt by a claim, ``add`` of the same definition (``"unchanged"``, nothing
  restored) and ``add(..., replace=True)`` (the new definition is stored and stays paused).
  Any value counts as paused, so a corrupted mark cannot unpause. ``remove`` drops the mark
  with the definition.
- ``pause`` sets the mark and withdraws the pending occurrence if it still waits in due, in
  one script. An occurrence already claimed runs to its end (also its retries), and
  ``cron_advance`` schedules nothing after it while the mark is there (a claim that raced the
  pause included). ``resume`` clears the mark and schedules the first slot after now: slots
  that fell into the pause are not run, whatever ``missed`` says. The mark is tested and
  cleared in the same script, so of two concurrent resumes one schedules and the other
  returns False.
- ``run_now`` adds one extra occurrence due now, with the definition's payload, as an
  ordinary task (the queue's retry policy), id ``cron:<name>:now:<UTC second>:<8 hex>``. Its
  last segment is never a slot label, so it cannot collide with a slot's id and claiming it
  never moves the schedule (``_parse_occurrence_id`` does not take it for a slot). It works
  while paused, and pause and remove leave it alone: it was asked for explicitly.
- resume and run now plan from the definition they read and send it along: the script acts
  only if the definition is still that one (compare-and-set), else the flow reads again.

The outcome of the last firing (``CronDefinition.last_outcome`` and the fields after it):

- It is written by the scripts that settle deliveries (ack, fail, and claim for expired leases
  and tasks it buries), in the same call as the change it reports, into one HASH beside the
  definitions (``cron_last``, name -> JSON). An ordinary task pays one byte test in those
  scripts (its id does not start with ``c``); only ids that start with ``cron:`` are parsed.
- "Last firing" is the occurrence with the latest slot (a run-now occurrence counts at the
  second it was asked for): a retry or death of an older occurrence that ends after a newer one
  was acked does not hide that ack; an ack of any occurrence moves ``last_success_at``.
- It is kept only while its definition exists (an occurrence running out after ``remove``
  writes nothing), so the hash holds at most one field per definition, and ``remove`` deletes
  it. A value that cannot be read shows as no outcome (never an error), and the next outcome
  overwrites it.
"""

from __future__ import annotations

import builtins
import json
import logging
import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, cast, get_args

import redis

from . import _protocol as protocol
from .checks import checked_name, whole_number
from .clock import clock_ms, ms_datetime
from .cronexpr import CronSchedule, parse_slot_label, schedule_for, slot_label
from .envelope import encode_envelope
from .exceptions import CronConflict, CronError, CronNotFound, PayloadError
from .outage import is_outage
from .snapshot import text

if TYPE_CHECKING:
    from ._async import AsyncQueue
    from ._core import Flow, QueueCore
    from .queue import Queue

logger = logging.getLogger(__name__)

MissedPolicy = Literal["skip", "latest", "all"]
LastOutcome = Literal["acked", "retrying", "dead"]
AddResult = Literal["added", "unchanged", "replaced", "restored"]

#: Task ids of occurrences start with this.
OCCURRENCE_PREFIX = "cron:"
#: Most missed occurrences ``missed="all"`` runs after downtime, by default and at most.
DEFAULT_MAX_MISSED = 10
MAX_MISSED_LIMIT = 1000
#: The last instant a slot may have (9999-12-31T23:59:59.999Z): Python's datetime ends there.
MAX_SLOT_MS = 253_402_300_799_999
#: A readable cron_state value, "head_ms|last_ms|head_id" (cron_state_read in the scripts).
_STATE = re.compile(r"([0-9]{1,15})\|([0-9]{0,15})\|(.*)", re.DOTALL)
_LABEL = re.compile(r"[0-9]{8}T[0-9]{6}Z")
#: The id of an extra occurrence from ``run_now``: name, the UTC second asked, a random part.
_RUN_NOW = re.compile(r"cron:(.+):now:([0-9]{8}T[0-9]{6}Z):([0-9a-f]{8})")
#: How often resume and run now read a definition again that changed under them.
_CONTROL_TRIES = 5
_SPEC_FIELDS = ("expr", "tz", "missed", "max_missed", "payload")


def occurrence_id(name: str, slot_ms: int) -> str:
    """The task id of one occurrence, e.g. ``cron:nightly-report:20260329T010000Z``."""
    return f"{OCCURRENCE_PREFIX}{name}:{slot_label(slot_ms)}"


def run_now_id(name: str, now_ms: int) -> str:
    """A fresh id for an extra occurrence, e.g. ``cron:nightly:now:20260329T011502Z:3fa2c1d0``."""
    return f"{OCCURRENCE_PREFIX}{name}:now:{slot_label(now_ms)}:{secrets.token_hex(4)}"


@dataclass(frozen=True)
class Occurrence:
    """Which definition and slot a task id belongs to.

    ``run_now`` is True for an extra occurrence made by ``cron.run_now``; its ``slot`` is then
    the second it was asked for.
    """

    name: str
    slot: datetime
    run_now: bool = False

    @classmethod
    def from_id(cls, task_id: str) -> Occurrence | None:
        """The occurrence a task id names, or None for an ordinary task id."""
        parsed = _parse_occurrence_id(task_id)
        if parsed is not None:
            return cls(parsed[0], ms_datetime(parsed[1]))
        extra = _RUN_NOW.fullmatch(task_id)
        asked_ms = None if extra is None else parse_slot_label(extra[2])
        if extra is None or asked_ms is None:
            return None
        return cls(extra[1], ms_datetime(asked_ms), run_now=True)


def _parse_occurrence_id(task_id: str) -> tuple[str, int] | None:
    """(name, slot ms) of a slot's occurrence id, else None: also for a run-now id, whose last
    segment is no slot label (so claiming one never moves a schedule)."""
    if not task_id.startswith(OCCURRENCE_PREFIX):
        return None
    name, _, label = task_id[len(OCCURRENCE_PREFIX) :].rpartition(":")
    slot_ms = parse_slot_label(label)
    return None if not name or slot_ms is None or slot_ms < 0 else (name, slot_ms)


@dataclass(frozen=True)
class CronDefinition:
    """One recurring task as ``Crons.list`` shows it.

    ``paused`` is True after ``pause`` (``next_at`` is then None: nothing is pending).
    ``problem`` says why a definition found in Redis cannot be kept going as it is (None when
    it is healthy). Then the fields show what could be read: ``""`` for unreadable text,
    ``0`` for an unreadable ``max_missed``, None for an unreadable payload or slot.

    ``last_outcome`` is what became of its last firing, ``last_occurrence`` (the task id):
    ``"acked"``, ``"retrying"`` (it failed and runs again) or ``"dead"``, at
    ``last_outcome_at``, with ``last_error_type`` for a failure (``"LeaseExpired"`` when its
    worker died or hung); ``last_success_at`` is its latest ack. All None until an occurrence
    is settled (see the module doc).
    """

    name: str
    expr: str
    tz: str
    missed: MissedPolicy | Literal[""]
    max_missed: int
    payload: Any
    next_at: datetime | None
    last_fired_at: datetime | None
    problem: str | None = None
    paused: bool = False
    last_outcome: LastOutcome | None = None
    last_outcome_at: datetime | None = None
    last_occurrence: str | None = None
    last_error_type: str | None = None
    last_success_at: datetime | None = None


def validate_name(name: object) -> str:
    """Return ``name`` if it can name a cron definition, else raise CronError (the rule of
    queue names, ``dueq.checks.checked_name``)."""
    return checked_name(name, "cron name", CronError)


@dataclass(frozen=True)
class _Spec:
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
    def from_json(cls, raw: bytes | str) -> _Spec:
        """A stored definition, checked as ``add`` checks it; CronError says what is wrong."""
        data = _json_object(raw)
        missing = [f for f in _SPEC_FIELDS if f not in data]
        if missing:
            raise CronError(f"it has no {', '.join(missing)}")
        expr, tz, missed, max_missed = (data[f] for f in _SPEC_FIELDS[:4])
        if not isinstance(expr, str) or not isinstance(tz, str):
            raise CronError(f"expr and tz must be text, got {_shown(expr)} and {_shown(tz)}")
        if missed not in get_args(MissedPolicy):
            raise CronError(f"missed is {_shown(missed)}, not 'skip', 'latest' or 'all'")
        if (
            not isinstance(max_missed, int)
            or isinstance(max_missed, bool)
            or not 1 <= max_missed <= MAX_MISSED_LIMIT
        ):
            raise CronError(f"max_missed is {_shown(max_missed)}, not 1 to {MAX_MISSED_LIMIT}")
        try:
            schedule_for(expr, tz)
        except CronError:
            raise
        except Exception as exc:  # croniter and zoneinfo on hostile text: any error means bad
            raise CronError(f"expression {_shown(expr)} in {_shown(tz)}: {exc!r}") from exc
        spec = cls(expr, tz, missed, max_missed, data["payload"])
        try:
            spec.to_json()
        except (ValueError, RecursionError) as exc:
            raise CronError(f"its payload cannot be JSON again ({exc})") from exc
        return spec


def _json_object(raw: bytes | str) -> dict[str, Any]:
    """A stored JSON object; CronError if it is not UTF-8 JSON of an object."""
    try:
        data = json.loads(text(raw))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise CronError(f"it is not JSON ({_short(str(exc))})") from exc
    if not isinstance(data, dict):
        raise CronError(f"it is a JSON {type(data).__name__}, not an object")
    return data


def _shown(value: object) -> str:
    """A short repr for messages (repr of a huge int can itself raise ValueError)."""
    try:
        return _short(repr(value))
    except ValueError:
        return f"<{type(value).__name__}>"


def _short(message: str, width: int = 80) -> str:
    return message if len(message) <= width else message[: width - 1] + "…"


@dataclass(frozen=True)
class _Plan:
    """What claiming a pending occurrence does: run it or drop it, and what to schedule."""

    run: bool
    missed_now: list[int]
    next_ms: int


def _plan(schedule: CronSchedule, spec: _Spec, slot_ms: int, now_ms: int) -> _Plan:
    """Decide for the pending slot claimed at ``now_ms``.

    A slot is missed when the slot after it has come too; then ``skip`` drops it, ``latest``
    drops it and runs the latest slot instead, and ``all`` runs it and the missed slots after
    it, ``max_missed`` in all.
    """
    following = schedule.next_after(slot_ms)
    if following > now_ms:
        return _Plan(True, [], following)
    next_ms = schedule.next_after(now_ms)
    if spec.missed == "skip":
        return _Plan(False, [], next_ms)
    if spec.missed == "latest":
        return _Plan(False, [schedule.latest_at_or_before(now_ms)], next_ms)
    return _Plan(True, schedule.between(slot_ms, now_ms, spec.max_missed - 1), next_ms)


def _read_state(name: str, raw: bytes | str | None) -> tuple[int, int | None] | None:
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
    prefix = f"{OCCURRENCE_PREFIX}{name}:"
    head_id = match[3]
    if (
        head > MAX_SLOT_MS
        or (last is not None and last > MAX_SLOT_MS)
        or not head_id.startswith(prefix)
        or not _LABEL.fullmatch(head_id[len(prefix) :])
    ):
        return None
    return head, last


def _definition(
    name: str,
    raw_spec: bytes | str,
    raw_state: bytes | str | None,
    name_problem: str | None = None,
    paused: bool = False,
    raw_last: bytes | str | None = None,
) -> CronDefinition:
    """A CronDefinition from its stored JSON and state; what cannot be read is its problem
    (not the state of a paused definition: resume writes it anew)."""
    problems: builtins.list[str] = []
    if name_problem is not None:
        problems.append(name_problem)
    else:
        try:
            validate_name(name)
        except CronError as exc:
            problems.append(f"{exc}; delete it from Redis by hand")
    try:
        spec = _Spec.from_json(raw_spec)
    except CronError as exc:
        problems.append(
            f"its definition in Redis cannot be used: {exc}; its occurrences run without "
            "scheduling the next: add it again with replace=True, or remove it"
        )
        shown = _readable_fields(raw_spec)
    else:
        shown = CronDefinition(
            name, spec.expr, spec.tz, spec.missed, spec.max_missed, spec.payload, None, None
        )
    state = _read_state(name, raw_state)
    if state is None and not paused:
        what = (
            "it has no schedule state in Redis"
            if raw_state is None
            else f"its schedule state in Redis cannot be read ({_shown(raw_state)})"
        )
        problems.append(
            f"{what}; claiming its pending occurrence rebuilds it, or add it again to schedule it"
        )
    head, last = state or (None, None)
    return CronDefinition(
        name,
        shown.expr,
        shown.tz,
        shown.missed,
        shown.max_missed,
        shown.payload,
        None if head is None or paused else ms_datetime(head),
        None if last is None else ms_datetime(last),
        "; ".join(problems) or None,
        paused,
        **_read_last(name, raw_last),
    )


def _read_last(name: str, raw: bytes | str | None) -> dict[str, Any]:
    """The ``last_*`` fields of a CronDefinition from its cron_last value (JSON written by
    the scripts' cron_note); none of them for a missing value or one that cannot be read."""
    if raw is None:
        return {}
    try:
        data = _json_object(raw)
        occurrence, outcome, at_ms = data["id"], data["outcome"], data["at"]
        error_type, ok_ms = data.get("error_type"), data.get("ok_at")
        if (
            not isinstance(occurrence, str)
            or outcome not in get_args(LastOutcome)
            or not _slot_ms_ok(at_ms)
            or not (error_type is None or isinstance(error_type, str))
            or not (ok_ms is None or _slot_ms_ok(ok_ms))
        ):
            raise CronError(f"unexpected fields {_shown(data)}")
    except (CronError, KeyError) as exc:
        logger.debug("cron %r: its last outcome in Redis cannot be read: %s", name, exc)
        return {}
    return {
        "last_outcome": outcome,
        "last_outcome_at": ms_datetime(at_ms),
        "last_occurrence": occurrence,
        "last_error_type": error_type,
        "last_success_at": None if ok_ms is None else ms_datetime(ok_ms),
    }


def _slot_ms_ok(value: object) -> bool:
    """An epoch ms that a datetime can hold (0 to the end of the year 9999)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_SLOT_MS


def _readable_fields(raw_spec: bytes | str) -> CronDefinition:
    """What can be shown of a definition that cannot be used (slots and problem left out)."""
    try:
        data = _json_object(raw_spec)
    except CronError:
        data = {}
    expr, tz, missed, max_missed = (data.get(f) for f in _SPEC_FIELDS[:4])
    return CronDefinition(
        "",
        expr if isinstance(expr, str) else "",
        tz if isinstance(tz, str) else "",
        _missed_policy(missed),
        max_missed if isinstance(max_missed, int) and not isinstance(max_missed, bool) else 0,
        None,
        None,
        None,
    )


def _missed_policy(value: object) -> MissedPolicy | Literal[""]:
    for policy in get_args(MissedPolicy):
        if value == policy:
            return cast(MissedPolicy, policy)
    return ""


def _name(raw: bytes | str) -> tuple[str, str | None]:
    """A stored definition name as text, and a problem if it is not UTF-8."""
    if isinstance(raw, str):
        return raw, None
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError:
        shown = raw.decode("utf-8", "backslashreplace")
        return shown, f"its name {shown!r} is not UTF-8; delete it from Redis by hand"


class CronsCore:
    """The cron definitions of one queue: the flows both front ends share."""

    def __init__(self, queue: QueueCore) -> None:
        self._core = queue

    def now_ms_flow(self) -> Flow[int]:
        clock = self._core.clock
        if clock is not None:
            return clock_ms(clock)
        return _server_ms((yield protocol.command("TIME")))

    def add_flow(
        self,
        name: str,
        expr: str,
        payload: Any,
        tz: str,
        missed: MissedPolicy,
        max_missed: int,
        replace: bool,
    ) -> Flow[AddResult]:
        name = validate_name(name)
        if missed not in get_args(MissedPolicy):
            raise CronError(f"missed must be 'skip', 'latest' or 'all', got {missed!r}")
        whole_number(max_missed, "max_missed", low=1, high=MAX_MISSED_LIMIT)
        schedule = CronSchedule(expr, tz)
        queue = self._core
        envelope = encode_envelope(payload, queue.max_payload_bytes)
        spec = _Spec(schedule.expr, tz, missed, max_missed, payload)
        next_ms = schedule.next_after((yield from self.now_ms_flow()))
        call = protocol.cron_add(
            queue.keys,
            queue.now_arg(),
            name,
            spec.to_json(),
            replace=replace,
            next_ms=next_ms,
            next_id=occurrence_id(name, next_ms),
            envelope=envelope,
        )
        status = yield from self._typed(call)
        if status is None:
            raise CronConflict(
                f"cron {name!r} is already defined differently in queue {queue.name!r}; "
                "pass replace=True to replace it"
            )
        return cast(AddResult, status)

    def remove_flow(self, name: str) -> Flow[bool]:
        name = validate_name(name)
        existed: bool = yield from self._typed(
            protocol.cron_remove(self._core.keys, self._core.now_arg(), name)
        )
        return existed

    def list_flow(self) -> Flow[builtins.list[CronDefinition]]:
        k = self._core.keys
        raw_specs, raw_states, raw_paused, raw_lasts = yield from self._typed(
            protocol.Batch(
                (
                    protocol.command("HGETALL", k.cron),
                    protocol.command("HGETALL", k.cron_state),
                    protocol.command("HGETALL", k.cron_paused),
                    protocol.command("HGETALL", k.cron_last),
                )
            )
        )
        found = []
        for raw_name, raw_spec in raw_specs.items():
            name, name_problem = _name(raw_name)
            state, paused = raw_states.get(raw_name), raw_name in raw_paused
            last = raw_lasts.get(raw_name)
            found.append(_definition(name, raw_spec, state, name_problem, paused, last))
        return sorted(found, key=lambda d: d.name)

    def get_flow(self, name: str) -> Flow[CronDefinition | None]:
        name = validate_name(name)
        k = self._core.keys
        raw_spec, raw_state, raw_paused, raw_last = yield from self._typed(
            protocol.Batch(
                (
                    protocol.command("HGET", k.cron, name),
                    protocol.command("HGET", k.cron_state, name),
                    protocol.command("HGET", k.cron_paused, name),
                    protocol.command("HGET", k.cron_last, name),
                )
            )
        )
        if raw_spec is None:
            return None
        paused = raw_paused is not None
        return _definition(name, raw_spec, raw_state, paused=paused, raw_last=raw_last)

    def pause_flow(self, name: str) -> Flow[bool]:
        name = validate_name(name)
        queue = self._core
        call = protocol.cron_control(queue.keys, queue.now_arg(), "pause", name)
        return self._controlled(name, (yield from self._typed(call)))

    def resume_flow(self, name: str) -> Flow[bool]:
        name = validate_name(name)
        queue = self._core
        for _ in range(_CONTROL_TRIES):
            raw_spec, paused, now_ms = yield from self._control_read(name)
            if not paused:
                return False
            spec = self._usable(name, raw_spec)
            next_ms = schedule_for(spec.expr, spec.tz).next_after(now_ms)
            if next_ms > MAX_SLOT_MS:
                raise CronError(f"cron {name!r} has no slot before the year 10000 to resume at")
            call = protocol.cron_control(
                queue.keys,
                queue.now_arg(),
                "resume",
                name,
                raw_spec,
                next_ms=next_ms,
                occurrence_id=occurrence_id(name, next_ms),
                envelope=encode_envelope(spec.payload, queue.max_payload_bytes),
            )
            reply = yield from self._typed(call)
            if reply is not protocol.CronControl.CHANGED:
                return self._controlled(name, reply)
        raise self._changed(name)

    def run_now_flow(self, name: str) -> Flow[str]:
        name = validate_name(name)
        queue = self._core
        for _ in range(_CONTROL_TRIES):
            raw_spec, _, now_ms = yield from self._control_read(name)
            spec = self._usable(name, raw_spec)
            task_id = run_now_id(name, now_ms)
            call = protocol.cron_control(
                queue.keys,
                queue.now_arg(),
                "run_now",
                name,
                raw_spec,
                occurrence_id=task_id,
                envelope=encode_envelope(spec.payload, queue.max_payload_bytes),
            )
            reply = yield from self._typed(call)
            if reply is protocol.CronControl.DONE:
                return task_id
            self._controlled(name, reply)  # raises for an unknown name
        raise self._changed(name)

    def _control_read(self, name: str) -> Flow[tuple[bytes | str, bool, int]]:
        """The stored definition, whether it is paused, and now (one round trip)."""
        k = self._core.keys
        reads = [
            protocol.command("HGET", k.cron, name),
            protocol.command("HGET", k.cron_paused, name),
        ]
        clock = self._core.clock
        if clock is None:
            reads.append(protocol.command("TIME"))
        raw_spec, raw_paused, *server_time = yield from self._typed(protocol.Batch(tuple(reads)))
        if raw_spec is None:
            raise self._not_found(name)
        if clock is not None:
            return raw_spec, raw_paused is not None, clock_ms(clock)
        return raw_spec, raw_paused is not None, _server_ms(server_time[0])

    def _usable(self, name: str, raw_spec: bytes | str) -> _Spec:
        try:
            return _Spec.from_json(raw_spec)
        except CronError as exc:
            raise CronError(
                f"cron {name!r} of queue {self._core.name!r}: its definition in Redis cannot be "
                f"used: {exc}; add it again with replace=True, or remove it"
            ) from exc

    def _controlled(self, name: str, reply: protocol.CronControl) -> bool:
        """True if cron_control did it, False if there was nothing to do; CronNotFound."""
        if reply is protocol.CronControl.UNKNOWN:
            raise self._not_found(name)
        return reply is protocol.CronControl.DONE

    def _not_found(self, name: str) -> CronNotFound:
        return CronNotFound(f"no cron definition named {name!r} in queue {self._core.name!r}")

    def _changed(self, name: str) -> CronConflict:
        return CronConflict(
            f"cron {name!r} of queue {self._core.name!r} changed {_CONTROL_TRIES} times while "
            "this call read it; try again"
        )

    def _typed(self, step: protocol.Step) -> Flow[Any]:
        """Send ``step``, with a key of the wrong type (corrupted by hand) as a CronError."""
        try:
            return (yield step)
        except redis.ResponseError as exc:
            if not _wrong_type(exc):
                raise
            raise CronError(
                f"a key of queue {self._core.name!r} holds the wrong type of value in Redis "
                f"({exc}); the cron definitions of this queue cannot be used"
            ) from exc

    # -- called by the claim flow ---------------------------------------------------------------

    def on_claim_flow(
        self, deliveries: builtins.list[Any], now_ms: int
    ) -> Flow[tuple[builtins.list[Any], int | None]]:
        """Advance the schedules of claimed occurrences (two round trips for any number).

        Returns the deliveries to run and the earliest due time of the occurrences it
        scheduled (None if none), so a consumer does not oversleep missed slots it must run now.
        A pending occurrence whose slot was missed is dropped under ``skip`` and ``latest``.
        The occurrence of a paused definition runs (a missed slot too) and schedules nothing.
        If Redis refuses (an outage, a permission), the claimed occurrences are held back:
        their leases run out, and the next claim of them tries again, so no schedule stops.
        Corrupted data never raises here: see the module docstring.
        """
        claimed = [(d, *parsed) for d in deliveries if (parsed := _parse_occurrence_id(d.id))]
        if not claimed:
            return deliveries, None
        try:
            results = yield from self.advance_flow(claimed, now_ms)
        except redis.RedisError as exc:
            if _wrong_type(exc):  # a cron key of another type: corrupted data, not an outage
                logger.error(
                    "queue %r: %d cron occurrence(s) run without advancing their schedules: %s",
                    self._core.name,
                    len(claimed),
                    exc,
                )
                return deliveries, None
            logger.log(
                logging.WARNING if is_outage(exc) else logging.ERROR,
                "queue %r: %d cron occurrence(s) held back until their leases end: %s",
                self._core.name,
                len(claimed),
                exc,
            )
            held = {d.id for d, _, _ in claimed}
            return [d for d in deliveries if d.id not in held], None
        except Exception:  # a defect here must not cost the claim its other tasks
            logger.exception(
                "queue %r: %d cron occurrence(s) run without advancing their schedules",
                self._core.name,
                len(claimed),
            )
            return deliveries, None
        dropped: set[str] = set()
        due: builtins.list[int] = []
        for delivery, plan, status in results:
            if status == _ADVANCED:
                due += plan.missed_now
                if not plan.run:
                    dropped.add(delivery.id)
            if status in (_ADVANCED, _REBUILT):
                due.append(plan.next_ms)
            elif status == _PAUSED:
                logger.info(
                    "queue %r: %r runs, but its cron definition is paused: nothing is "
                    "scheduled after it",
                    self._core.name,
                    delivery.id,
                )
        kept = [d for d in deliveries if d.id not in dropped] if dropped else deliveries
        return kept, min(due, default=None)

    def advance_flow(
        self, claimed: builtins.list[tuple[Any, str, int]], now_ms: int
    ) -> Flow[builtins.list[tuple[Any, _Plan, int]]]:
        """Plan each claimed occurrence and carry the plans out in one script call; returns
        each plan sent with the script's status for it (an occurrence that is not sent, or
        not advanced, just runs)."""
        queue = self._core
        k = queue.keys
        names = sorted({name for _, name, _ in claimed})
        raw_specs = yield protocol.command("HMGET", k.cron, *names)
        specs = dict(zip(names, raw_specs, strict=True))
        planned: builtins.list[tuple[Any, str, _Plan]] = []
        entries: builtins.list[protocol.CronEntry] = []
        for delivery, name, slot_ms in claimed:
            raw = specs[name]
            if raw is None:
                continue  # the definition was removed: the occurrence still runs
            planning = self._planned(name, raw, delivery.id, slot_ms, now_ms)
            if planning is None:
                continue
            plan, envelope = planning
            planned.append((delivery, name, plan))
            entries.append(
                protocol.CronEntry(
                    name=name,
                    slot_ms=slot_ms,
                    occurrence_id=delivery.id,
                    token=delivery.token,
                    drop=not plan.run,
                    envelope=envelope,
                    next_ms=plan.next_ms,
                    next_id=occurrence_id(name, plan.next_ms),
                    missed_now=[(ms, occurrence_id(name, ms)) for ms in plan.missed_now],
                )
            )
        if not planned:
            return []
        statuses = yield protocol.cron_advance(k, queue.now_arg(), entries)
        results = []
        for (delivery, name, plan), status in zip(planned, statuses, strict=True):
            if status == _REBUILT:
                logger.warning(
                    "queue %r: cron %r had no readable schedule state in Redis; rebuilt it "
                    "from %r, next occurrence %s",
                    queue.name,
                    name,
                    delivery.id,
                    slot_label(plan.next_ms),
                )
            elif status == _REFUSED:
                logger.error(
                    "queue %r: cron %r: %r runs without advancing its schedule "
                    "(its slots are out of range)",
                    queue.name,
                    name,
                    delivery.id,
                )
            results.append((delivery, plan, int(status)))
        return results

    def _planned(
        self, name: str, raw_spec: bytes | str, task_id: str, slot_ms: int, now_ms: int
    ) -> tuple[_Plan, bytes] | None:
        """The plan for one claimed occurrence and the envelope of those it adds; None (and
        an error logged) if its definition cannot be used: the occurrence then just runs."""
        queue = self._core
        try:
            spec = _Spec.from_json(raw_spec)
            plan = _plan(schedule_for(spec.expr, spec.tz), spec, slot_ms, now_ms)
            envelope = encode_envelope(spec.payload, queue.max_payload_bytes)
        except (CronError, PayloadError) as exc:
            logger.error(
                "queue %r: cron %r: its definition in Redis cannot be used (%s); %r runs as an "
                "ordinary task and its schedule stops: add it again with replace=True, or "
                "remove it",
                queue.name,
                name,
                exc,
                task_id,
            )
            return None
        except Exception:  # croniter/zoneinfo on a slot a task id names: run it, do not stop
            logger.exception(
                "queue %r: cron %r: %r runs without advancing its schedule",
                queue.name,
                name,
                task_id,
            )
            return None
        if not all(0 <= ms <= MAX_SLOT_MS for ms in (plan.next_ms, *plan.missed_now)):
            logger.error(
                "queue %r: cron %r: %r runs without advancing its schedule (no slot before "
                "the year 10000)",
                queue.name,
                name,
                task_id,
            )
            return None
        return plan, envelope


_REFUSED, _ADVANCED, _REBUILT, _PAUSED = (
    protocol.CronAdvance.REFUSED,
    protocol.CronAdvance.ADVANCED,
    protocol.CronAdvance.REBUILT,
    protocol.CronAdvance.PAUSED,
)


def _server_ms(time_reply: Any) -> int:
    """Epoch ms of a TIME reply (seconds, microseconds)."""
    seconds, micros = time_reply
    return int(seconds) * 1000 + int(micros) // 1000


def _wrong_type(exc: redis.RedisError) -> bool:
    return isinstance(exc, redis.ResponseError) and "WRONGTYPE" in str(exc)


class Crons:
    """The cron definitions of a ``Queue`` (``Queue.cron``)."""

    def __init__(self, queue: Queue, flows: CronsCore | None = None) -> None:
        self._queue = queue
        #: the flows it drives: the queue's own, or a sharded queue's (``dueq._shards``)
        self._flows = CronsCore(queue) if flows is None else flows

    def add(
        self,
        name: str,
        expr: str,
        *,
        payload: Any = None,
        tz: str = "UTC",
        missed: MissedPolicy = "latest",
        max_missed: int = DEFAULT_MAX_MISSED,
        replace: bool = False,
    ) -> AddResult:
        """Define a recurring task and schedule its next occurrence.

        ``expr`` is a 5-field cron expression (6 with seconds first) or an alias
        (``@hourly``, ``@daily``, ...) in the IANA zone ``tz``. ``missed`` says what happens
        to slots missed while nothing claimed: ``"skip"`` them, run the ``"latest"`` once, or
        run ``"all"`` (at most ``max_missed``).
        Adding the same definition again changes nothing (and restores its pending occurrence
        if that was cancelled); a different definition under the same name raises
        CronConflict unless ``replace``. Bad input raises CronError or PayloadError and
        writes nothing. Returns "added", "unchanged", "replaced" or "restored".
        """
        flow = self._flows.add_flow(name, expr, payload, tz, missed, max_missed, replace)
        return self._queue.drive(flow)

    def remove(self, name: str) -> bool:
        """Delete a definition and its pending occurrence; False if there was none.

        An occurrence already leased or waiting for a retry still runs to its end.
        """
        return self._queue.drive(self._flows.remove_flow(name))

    def list(self) -> builtins.list[CronDefinition]:
        """Every definition of the queue, by name, with its next and last fired slot.

        A definition whose data in Redis cannot be read is listed with ``problem`` set.
        CronError if the queue's cron keys are not hashes at all.
        """
        return self._queue.drive(self._flows.list_flow())

    def get(self, name: str) -> CronDefinition | None:
        """One definition by name (``problem`` set if it cannot be read), or None."""
        return self._queue.drive(self._flows.get_flow(name))

    def pause(self, name: str) -> bool:
        """Stop scheduling ``name``'s occurrences; False if it was already paused.

        Its pending occurrence is withdrawn if it still waits (it counts as cancelled); one
        already running (or waiting for a retry) finishes, and nothing is scheduled after it.
        The mark lives in Redis: every process sees it, and ``add`` of the same definition or
        with ``replace=True`` keeps it paused. ``run_now`` still works. CronNotFound for an
        unknown name.
        """
        return self._queue.drive(self._flows.pause_flow(name))

    def resume(self, name: str) -> bool:
        """Schedule ``name`` again from its next slot after now; False if it was not paused.

        Slots that fell into the pause are not run, whatever its ``missed`` policy says.
        CronNotFound for an unknown name; CronError if its definition in Redis cannot be used.
        """
        return self._queue.drive(self._flows.resume_flow(name))

    def run_now(self, name: str) -> str:
        """Schedule one extra occurrence of ``name``, due now; returns its task id.

        It carries the definition's payload and runs as an ordinary task (the queue's retry
        policy); its id, ``cron:<name>:now:<UTC second>:<random>``, never collides with a
        slot's, and it does not move the schedule. Works while paused; ``pause`` and
        ``remove`` do not withdraw it. CronNotFound for an unknown name; CronError if its
        definition in Redis cannot be used.
        """
        return self._queue.drive(self._flows.run_now_flow(name))


class AsyncCrons:
    """The cron definitions of an ``AsyncQueue``; the methods of ``Crons``, awaited."""

    def __init__(self, queue: AsyncQueue, flows: CronsCore | None = None) -> None:
        self._queue = queue
        #: the flows it drives: the queue's own, or a sharded queue's (``dueq._shards``)
        self._flows = CronsCore(queue) if flows is None else flows

    async def add(
        self,
        name: str,
        expr: str,
        *,
        payload: Any = None,
        tz: str = "UTC",
        missed: MissedPolicy = "latest",
        max_missed: int = DEFAULT_MAX_MISSED,
        replace: bool = False,
    ) -> AddResult:
        """As ``Crons.add``."""
        flow = self._flows.add_flow(name, expr, payload, tz, missed, max_missed, replace)
        return await self._queue.drive(flow)

    async def remove(self, name: str) -> bool:
        """As ``Crons.remove``."""
        return await self._queue.drive(self._flows.remove_flow(name))

    async def list(self) -> builtins.list[CronDefinition]:
        """As ``Crons.list``."""
        return await self._queue.drive(self._flows.list_flow())

    async def get(self, name: str) -> CronDefinition | None:
        """As ``Crons.get``."""
        return await self._queue.drive(self._flows.get_flow(name))

    async def pause(self, name: str) -> bool:
        """As ``Crons.pause``."""
        return await self._queue.drive(self._flows.pause_flow(name))

    async def resume(self, name: str) -> bool:
        """As ``Crons.resume``."""
        return await self._queue.drive(self._flows.resume_flow(name))

    async def run_now(self, name: str) -> str:
        """As ``Crons.run_now``."""
        return await self._queue.drive(self._flows.run_now_flow(name))
