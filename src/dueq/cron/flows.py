"""Recurring tasks: cron definitions kept in Redis, each occurrence an ordinary task.

Adding a definition schedules its pending occurrence; claiming that occurrence schedules the
next one (``Queue.claim_batch`` hands every claimed occurrence to ``CronsCore.on_claim_flow``).
This module holds the flows both front ends share (``CronsCore``), the front ends themselves
(``Crons``, ``AsyncCrons``) and what they show (``CronDefinition``, ``Occurrence``). Its parts:

- ``dueq.cron._ids``: occurrence ids, ``cron:<name>:<slot in UTC>``, the same in every process;
- ``dueq.cron._spec``: what a definition stores in Redis, read and checked;
- ``dueq.cron._keeper``: the claim-time keeper that moves schedules on (``cron_advance``), and
  what corrupted data in Redis does to a claim.

Corrupted data never holds back anything else. ``list``/``get`` show a definition that cannot
be read, or whose state cannot be read, with ``problem`` set; adding it again with
``replace=True`` (or removing it) repairs it.

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
  never moves the schedule (``dueq.cron._ids``). It works while paused, and pause and remove
  leave it alone: it was asked for explicitly.
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
import dataclasses
import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, cast, get_args

import redis

from dueq._util.checks import whole_number
from dueq._util.clock import Duration, clock_ms, datetime_ms, duration_ms, ms_datetime
from dueq._wire import protocol as protocol
from dueq._wire.codec import CRON_PURPOSE, cron_binding
from dueq._wire.envelope import json_text
from dueq.cron import _keeper as keeper
from dueq.cron._ids import (
    MAX_SLOT_MS,
    OCCURRENCE_PREFIX,
    occurrence_id,
    parse_occurrence_id,
    parse_run_now_id,
    run_now_id,
)
from dueq.cron._spec import (
    DEFAULT_MAX_MISSED,
    MAX_MISSED_LIMIT,
    SPEC_FIELDS,
    LastOutcome,
    MissedPolicy,
    Overlap,
    Spec,
    json_object,
    missed_policy,
    read_last,
    read_state,
    validate_name,
    wrong_type,
)
from dueq.cron._spec import shown as shown_value
from dueq.cron.expr import CronSchedule
from dueq.exceptions import CronConflict, CronError, CronNotFound, DueqError, PayloadError

if TYPE_CHECKING:
    from dueq._wire.ports import AwaitsFlows, DrivesFlows, QueueFlows
    from dueq._wire.protocol import Flow

#: What other modules import from here: its own names and those of its parts they use.
__all__ = [
    "DEFAULT_MAX_MISSED",
    "MAX_MISSED_LIMIT",
    "MAX_SLOT_MS",
    "OCCURRENCE_PREFIX",
    "AddResult",
    "AsyncCrons",
    "CronDefinition",
    "Crons",
    "CronsCore",
    "LastOutcome",
    "MissedPolicy",
    "Occurrence",
    "Overlap",
    "Policies",
    "occurrence_id",
    "parse_occurrence_id",
    "run_now_id",
    "validate_name",
]

logger = logging.getLogger("dueq.cron")

AddResult = Literal["added", "unchanged", "replaced", "restored"]

#: How often resume and run now read a definition again that changed under them.
_CONTROL_TRIES = 5
#: Most slots one ``backfill`` call schedules.
MAX_BACKFILL = 1000


@dataclass(frozen=True)
class Policies:
    """The policies and task options of ``Crons.add`` beyond the expression (see there)."""

    every: Duration | None = None
    offset: Duration | None = None
    overlap: Overlap = "allow_all"
    start: datetime | None = None
    end: datetime | None = None
    limit: int | None = None
    jitter: Duration | None = None
    catchup_window: Duration | None = None
    pause_after_failures: int | None = None
    task: str | None = None
    priority: int = 0
    key: str | None = None
    timeout: Duration | None = None
    max_attempts: int | None = None
    expires: Duration | None = None

    def spec(
        self, expr: str | None, tz: str, missed: MissedPolicy, max_missed: int, payload: Any
    ) -> Spec:
        """The checked definition; CronError says what is wrong."""
        try:
            return self._spec(expr, tz, missed, max_missed, payload)
        except CronError:
            raise
        except DueqError as exc:  # a bad duration or datetime: one error type for add
            raise CronError(str(exc)) from exc

    def _spec(
        self, expr: str | None, tz: str, missed: MissedPolicy, max_missed: int, payload: Any
    ) -> Spec:
        if (expr is None) == (self.every is None):
            raise CronError("give a cron expression or every=, not both and not neither")
        if self.every is None and self.offset is not None:
            raise CronError("offset= goes with every=")

        def ms(value: Duration | None, what: str) -> int | None:
            return None if value is None else duration_ms(value, what)

        def at(value: datetime | None) -> int | None:
            return None if value is None else datetime_ms(value)

        spec = Spec(
            "" if expr is None else CronSchedule(expr, tz).expr,
            tz,
            missed,
            max_missed,
            payload,
            every_ms=ms(self.every, "every"),
            offset_ms=ms(self.offset, "offset") or 0,
            start_ms=at(self.start),
            end_ms=at(self.end),
            limit=self.limit,
            jitter_ms=ms(self.jitter, "jitter") or 0,
            catchup_ms=ms(self.catchup_window, "catchup_window"),
            pause_after=self.pause_after_failures,
            overlap=self.overlap,
            priority=self.priority,
            key=self.key,
            timeout_ms=ms(self.timeout, "timeout"),
            max_attempts=self.max_attempts,
            task=self.task,
            expires_ms=ms(self.expires, "expires"),
        )
        spec.check()
        return spec


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
        parsed = parse_occurrence_id(task_id)
        if parsed is not None:
            return cls(parsed[0], ms_datetime(parsed[1]))
        extra = parse_run_now_id(task_id)
        if extra is None:
            return None
        return cls(extra[0], ms_datetime(extra[1]), run_now=True)


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

    ``fired`` counts the slot occurrences that started (first deliveries: retries, run-now
    occurrences and slots dropped by a policy do not count), for every definition, with
    policies or without; ``skipped`` the slots that overlap dropped.
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
    every: timedelta | None = None
    offset: timedelta | None = None
    overlap: Overlap = "allow_all"
    start: datetime | None = None
    end: datetime | None = None
    limit: int | None = None
    jitter: timedelta | None = None
    catchup_window: timedelta | None = None
    pause_after_failures: int | None = None
    task: str | None = None
    priority: int = 0
    key: str | None = None
    timeout: timedelta | None = None
    max_attempts: int | None = None
    fired: int = 0
    skipped: int = 0
    failures: int = 0
    finished: str | None = None
    paused_reason: str | None = None
    expires: timedelta | None = None


def _policy_fields(spec: Spec) -> dict[str, Any]:
    """The policy fields of a CronDefinition from its stored definition."""

    def span(ms: int | None) -> timedelta | None:
        return None if ms is None else timedelta(milliseconds=ms)

    return {
        "every": span(spec.every_ms),
        "offset": span(spec.offset_ms) if spec.every_ms is not None else None,
        "overlap": spec.overlap,
        "start": None if spec.start_ms is None else ms_datetime(spec.start_ms),
        "end": None if spec.end_ms is None else ms_datetime(spec.end_ms),
        "limit": spec.limit,
        "jitter": span(spec.jitter_ms or None),
        "catchup_window": span(spec.catchup_ms),
        "pause_after_failures": spec.pause_after,
        "task": spec.task,
        "priority": spec.priority,
        "key": spec.key,
        "timeout": span(spec.timeout_ms),
        "max_attempts": spec.max_attempts,
        "expires": span(spec.expires_ms),
    }


def _runs_fields(raw: bytes | str | None) -> dict[str, Any]:
    """fired, skipped and finished of a cron_runs value (none for a missing or unreadable
    one)."""
    if raw is None:
        return {}
    try:
        data = json_object(raw)
    except CronError:
        return {}
    out: dict[str, Any] = {}
    for field in ("fired", "skipped"):
        value = data.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            out[field] = value
    if data.get("finished") in ("limit", "end"):
        out["finished"] = data["finished"]
    return out


def _definition(
    name: str,
    raw_spec: bytes | str,
    raw_state: bytes | str | None,
    name_problem: str | None = None,
    paused: bool | str = False,
    raw_last: bytes | str | None = None,
    raw_runs: bytes | str | None = None,
) -> CronDefinition:
    """A CronDefinition from its stored JSON and state; what cannot be read is its problem
    (not the state of a paused definition: resume writes it anew)."""
    problems: builtins.list[str] = []
    policies: dict[str, Any] = {}
    if name_problem is not None:
        problems.append(name_problem)
    else:
        try:
            validate_name(name)
        except CronError as exc:
            problems.append(f"{exc}; delete it from Redis by hand")
    try:
        spec = Spec.from_json(raw_spec)
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
        policies = _policy_fields(spec)
    runs = _runs_fields(raw_runs)
    last = _read_last(name, raw_last)
    failures = last.pop("failures", 0)
    reason = None
    if isinstance(paused, str):
        reason = paused
    pause_after = policies.get("pause_after_failures")
    if not paused and pause_after is not None and failures >= pause_after:
        paused, reason = True, f"{failures} consecutive dead occurrences"
    if paused and reason is None:
        reason = "paused"
    finished = runs.get("finished")
    state = read_state(name, raw_state)
    if state is None and not paused and finished is None:
        what = (
            "it has no schedule state in Redis"
            if raw_state is None
            else f"its schedule state in Redis cannot be read ({shown_value(raw_state)})"
        )
        problems.append(
            f"{what}; claiming its pending occurrence rebuilds it, or add it again to schedule it"
        )
    head, fired_ms = state or (None, None)
    return CronDefinition(
        name,
        shown.expr,
        shown.tz,
        shown.missed,
        shown.max_missed,
        shown.payload,
        None if head is None or paused or finished else ms_datetime(head),
        None if fired_ms is None else ms_datetime(fired_ms),
        "; ".join(problems) or None,
        bool(paused),
        **last,
        **policies,
        **runs,
        failures=failures,
        paused_reason=reason,
    )


def _read_last(name: str, raw: bytes | str | None) -> dict[str, Any]:
    """The ``last_*`` fields of a CronDefinition from its cron_last value; none of them for a
    missing value or one that cannot be read (``dueq.cron._spec.read_last``)."""
    if raw is None:
        return {}
    try:
        occurrence, outcome, at_ms, error_type, ok_ms = read_last(raw)
    except CronError as exc:
        logger.debug("cron %r: its last outcome in Redis cannot be read: %s", name, exc)
        return {}
    failures = json_object(raw).get("failures")
    return {
        "last_outcome": outcome,
        "last_outcome_at": ms_datetime(at_ms),
        "last_occurrence": occurrence,
        "last_error_type": error_type,
        "last_success_at": None if ok_ms is None else ms_datetime(ok_ms),
        "failures": failures if isinstance(failures, int) and failures > 0 else 0,
    }


def _paused(raw: bytes | str | None) -> bool | str:
    """A cron_paused value as False (not paused), True, or the reason a script paused it."""
    if raw is None:
        return False
    value = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    return "pause_after_failures reached" if value.endswith("|failures") else True


def _readable_fields(raw_spec: bytes | str) -> CronDefinition:
    """What can be shown of a definition that cannot be used (slots and problem left out)."""
    try:
        data = json_object(raw_spec)
    except CronError:
        data = {}
    expr, tz, missed, max_missed = (data.get(f) for f in SPEC_FIELDS[:4])
    return CronDefinition(
        "",
        expr if isinstance(expr, str) else "",
        tz if isinstance(tz, str) else "",
        missed_policy(missed),
        max_missed if isinstance(max_missed, int) and not isinstance(max_missed, bool) else 0,
        None,
        None,
        None,
    )


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

    def __init__(self, queue: QueueFlows) -> None:
        self._core = queue

    def now_ms_flow(self) -> Flow[int]:
        clock = self._core.clock
        if clock is not None:
            return clock_ms(clock)
        return _server_ms((yield protocol.command("TIME")))

    def add_flow(
        self,
        name: str,
        expr: str | None,
        payload: Any,
        tz: str,
        missed: MissedPolicy,
        max_missed: int,
        replace: bool,
        policies: Policies = Policies(),
    ) -> Flow[AddResult]:
        name = validate_name(name)
        if missed not in get_args(MissedPolicy):
            raise CronError(f"missed must be 'skip', 'latest' or 'all', got {missed!r}")
        whole_number(max_missed, "max_missed", low=1, high=MAX_MISSED_LIMIT)
        spec = policies.spec(expr, tz, missed, max_missed, payload)
        queue = self._core
        spec.envelope(queue.max_payload_bytes)  # the payload checked before it is sealed
        spec = yield from self._stored_form(name, spec)
        envelope = spec.envelope(queue.max_payload_bytes)
        next_ms = spec.slots().next_after((yield from self.now_ms_flow()))
        if next_ms is not None and next_ms > MAX_SLOT_MS:
            raise CronError(f"cron {name!r} has no slot before the year 10000")
        next_id = "" if next_ms is None else occurrence_id(name, next_ms)
        call = protocol.cron_add(
            queue.keys,
            queue.now_arg(),
            name,
            spec.to_json(),
            replace=replace,
            next_ms=next_ms,
            next_id=next_id,
            envelope=envelope,
            next_due_ms=None if next_ms is None else spec.due_ms(next_ms, next_id),
        )
        status = yield from self._typed(call)
        if status is None:
            raise CronConflict(
                f"cron {name!r} is already defined differently in queue {queue.name!r}; "
                "pass replace=True to replace it"
            )
        return cast(AddResult, status)

    def _stored_form(self, name: str, spec: Spec) -> Flow[Spec]:
        """``spec`` as ``add`` stores it: with an encrypting codec, its payload sealed for the
        definition (``CRON_PURPOSE``, bound to ``cron:<name>``), unless the stored definition
        opens to the same one, which is then kept as it is stored: a sealing is never the
        same twice, and a definition added again must stay "unchanged" (under another active
        key too, as in a rolling key change). Without encryption, ``spec`` itself."""
        queue = self._core
        codec = queue.payload_codec
        if codec.codec is None:
            return spec
        binding = cron_binding(name)
        raw = yield protocol.command("HGET", queue.keys.cron, name)
        if raw is not None:
            try:
                stored = Spec.from_json(raw)
                opened = codec.open_value(stored.payload, queue.name, binding, CRON_PURPOSE)
            except (CronError, PayloadError):  # unreadable, or no key of ours: a different one
                pass
            else:
                if dataclasses.replace(stored, payload=opened) == spec:
                    return stored
        text = json_text(spec.payload, "payload", queue.max_payload_bytes)
        sealed = json.loads(codec.seal_value(text, queue.name, binding, CRON_PURPOSE))
        return dataclasses.replace(spec, payload=sealed)

    def _shown(self, definition: CronDefinition) -> CronDefinition:
        """``definition`` with its sealed payload opened for the key's holder, else shown as
        its marker (``<encrypted k1, 60 B>``)."""
        queue = self._core
        payload = queue.payload_codec.shown_value(
            definition.payload, queue.name, cron_binding(definition.name), CRON_PURPOSE
        )
        return dataclasses.replace(definition, payload=payload)

    def backfill_flow(self, name: str, start: datetime, end: datetime) -> Flow[int]:
        """Schedule the slots of ``[start, end)`` not backfilled before; returns how many."""
        name = validate_name(name)
        try:
            start_ms, end_ms = datetime_ms(start), datetime_ms(end)
        except DueqError as exc:
            raise CronError(str(exc)) from exc
        if end_ms <= start_ms:
            raise CronError("backfill needs start before end")
        queue = self._core
        for _ in range(_CONTROL_TRIES):
            raw_spec, _, _ = yield from self._control_read(name)
            spec = self._usable(name, raw_spec)
            slots = spec.slots().between(start_ms - 1, end_ms - 1, MAX_BACKFILL + 1)
            if len(slots) > MAX_BACKFILL:
                raise CronError(
                    f"cron {name!r}: [start, end) holds more than {MAX_BACKFILL} slots; "
                    "backfill it in parts"
                )
            if not slots:
                return 0
            ids = [occurrence_id(name, ms) for ms in slots]
            triples = [(ms, spec.due_ms(ms, i), i) for ms, i in zip(slots, ids, strict=True)]
            envelope = spec.envelope(queue.max_payload_bytes)
            call = protocol.cron_backfill(
                queue.keys, queue.now_arg(), name, raw_spec, envelope, triples
            )
            added: int = yield from self._typed(call)
            if added == -1:
                raise self._not_found(name)
            if added >= 0:
                return added
        raise self._changed(name)

    def remove_flow(self, name: str) -> Flow[bool]:
        name = validate_name(name)
        existed: bool = yield from self._typed(
            protocol.cron_remove(self._core.keys, self._core.now_arg(), name)
        )
        return existed

    def list_flow(self) -> Flow[builtins.list[CronDefinition]]:
        k = self._core.keys
        raw_specs, raw_states, raw_paused, raw_lasts, raw_runs = yield from self._typed(
            protocol.Batch(
                (
                    protocol.command("HGETALL", k.cron),
                    protocol.command("HGETALL", k.cron_state),
                    protocol.command("HGETALL", k.cron_paused),
                    protocol.command("HGETALL", k.cron_last),
                    protocol.command("HGETALL", k.cron_runs),
                )
            )
        )
        found = []
        for raw_name, raw_spec in raw_specs.items():
            name, name_problem = _name(raw_name)
            state, paused = raw_states.get(raw_name), _paused(raw_paused.get(raw_name))
            last, runs = raw_lasts.get(raw_name), raw_runs.get(raw_name)
            found.append(
                self._shown(_definition(name, raw_spec, state, name_problem, paused, last, runs))
            )
        return sorted(found, key=lambda d: d.name)

    def get_flow(self, name: str) -> Flow[CronDefinition | None]:
        name = validate_name(name)
        k = self._core.keys
        raw_spec, raw_state, raw_paused, raw_last, raw_runs = yield from self._typed(
            protocol.Batch(
                (
                    protocol.command("HGET", k.cron, name),
                    protocol.command("HGET", k.cron_state, name),
                    protocol.command("HGET", k.cron_paused, name),
                    protocol.command("HGET", k.cron_last, name),
                    protocol.command("HGET", k.cron_runs, name),
                )
            )
        )
        if raw_spec is None:
            return None
        paused = _paused(raw_paused)
        return self._shown(_definition(name, raw_spec, raw_state, None, paused, raw_last, raw_runs))

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
            spec = self._usable(name, raw_spec)
            if not paused and spec.pause_after is None:
                return False
            next_ms = spec.slots().next_after(now_ms)
            if next_ms is not None and next_ms > MAX_SLOT_MS:
                raise CronError(f"cron {name!r} has no slot before the year 10000 to resume at")
            next_id = "" if next_ms is None else occurrence_id(name, next_ms)
            call = protocol.cron_control(
                queue.keys,
                queue.now_arg(),
                "resume",
                name,
                raw_spec,
                next_ms=next_ms,
                occurrence_id=next_id,
                envelope=spec.envelope(queue.max_payload_bytes),
                next_due_ms=None if next_ms is None else spec.due_ms(next_ms, next_id),
                pause_after=spec.pause_after,
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
                envelope=spec.envelope(queue.max_payload_bytes),
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

    def _usable(self, name: str, raw_spec: bytes | str) -> Spec:
        try:
            return Spec.from_json(raw_spec)
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
            if not wrong_type(exc):
                raise
            raise CronError(
                f"a key of queue {self._core.name!r} holds the wrong type of value in Redis "
                f"({exc}); the cron definitions of this queue cannot be used"
            ) from exc

    # -- called by the claim flow ---------------------------------------------------------------

    def on_claim_flow(
        self, deliveries: builtins.list[Any], now_ms: int
    ) -> Flow[tuple[builtins.list[Any], int | None]]:
        """Advance the schedules of claimed occurrences: the claim-time keeper
        (``dueq.cron._keeper.on_claim_flow``). Returns the deliveries to run and the earliest
        due time of the occurrences it scheduled (None if none)."""
        return keeper.on_claim_flow(self._core, deliveries, now_ms)


def _server_ms(time_reply: Any) -> int:
    """Epoch ms of a TIME reply (seconds, microseconds)."""
    seconds, micros = time_reply
    return int(seconds) * 1000 + int(micros) // 1000


class Crons:
    """The cron definitions of a ``Queue`` (``Queue.cron``)."""

    def __init__(self, queue: DrivesFlows, flows: CronsCore | None = None) -> None:
        self._queue = queue
        #: the flows it drives: the queue's own, or a sharded queue's (``dueq.sharding.flows``)
        self._flows = CronsCore(queue) if flows is None else flows

    def add(
        self,
        name: str,
        expr: str | None = None,
        *,
        every: Duration | None = None,
        offset: Duration | None = None,
        payload: Any = None,
        tz: str = "UTC",
        missed: MissedPolicy = "latest",
        max_missed: int = DEFAULT_MAX_MISSED,
        replace: bool = False,
        overlap: Overlap = "allow_all",
        start: datetime | None = None,
        end: datetime | None = None,
        limit: int | None = None,
        jitter: Duration | None = None,
        catchup_window: Duration | None = None,
        pause_after_failures: int | None = None,
        task: str | None = None,
        priority: int = 0,
        key: str | None = None,
        timeout: Duration | None = None,
        max_attempts: int | None = None,
        expires: Duration | None = None,
    ) -> AddResult:
        """Define a recurring task and schedule its next occurrence.

        ``expr`` is a 5-field cron expression (6 with seconds first) or an alias
        (``@hourly``, ``@daily``, ...) in the IANA zone ``tz``. ``missed`` says what happens
        to slots missed while nothing claimed: ``"skip"`` them, run the ``"latest"`` once, or
        run ``"all"`` (at most ``max_missed``).
        Adding the same definition again changes nothing (and restores its pending occurrence
        if that was cancelled); a different definition under the same name raises
        CronConflict unless ``replace`` (a replaced definition starts its counts anew). Bad
        input raises CronError or PayloadError and writes nothing. Returns "added",
        "unchanged", "replaced" or "restored".

        Instead of ``expr``, ``every`` (whole seconds) fires at every multiple of the interval
        since the Unix epoch plus ``offset``. The policies (docs/cron-policies.md), enforced
        by the scripts for every process: ``overlap`` (what a slot does while the previous
        occurrence still runs or retries: ``"allow_all"``, ``"skip"``, ``"buffer_one"``,
        ``"cancel_other"``), ``start``/``end`` (no slot outside them), ``limit`` (that many
        firings, then finished), ``jitter`` (a fixed per-slot delay in ``[0, jitter)``),
        ``catchup_window`` (missed slots older than it never run), ``pause_after_failures``
        (paused after that many consecutive dead occurrences). ``task``, ``priority``,
        ``key``, ``timeout`` and ``max_attempts`` are the occurrences' task options.
        ``expires`` (longer than ``jitter``, else CronError) makes each occurrence expire that
        long after its slot (before jitter): one not started by then ends ``"expired"``.
        """
        policies = Policies(
            every, offset, overlap, start, end, limit, jitter, catchup_window,
            pause_after_failures, task, priority, key, timeout, max_attempts, expires,
        )  # fmt: skip
        flow = self._flows.add_flow(name, expr, payload, tz, missed, max_missed, replace, policies)
        return self._queue.drive(flow)

    def backfill(self, name: str, *, start: datetime, end: datetime) -> int:
        """Schedule the occurrences of ``name``'s slots in ``[start, end)``, due now (or at
        their slot if later); returns how many were added.

        Idempotent: a slot backfilled before, or whose occurrence exists, is not added again.
        At most 1000 slots per call (CronError beyond). CronNotFound for an unknown name.
        """
        return self._queue.drive(self._flows.backfill_flow(name, start, end))

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

    def __init__(self, queue: AwaitsFlows, flows: CronsCore | None = None) -> None:
        self._queue = queue
        #: the flows it drives: the queue's own, or a sharded queue's (``dueq.sharding.flows``)
        self._flows = CronsCore(queue) if flows is None else flows

    async def add(
        self,
        name: str,
        expr: str | None = None,
        *,
        every: Duration | None = None,
        offset: Duration | None = None,
        payload: Any = None,
        tz: str = "UTC",
        missed: MissedPolicy = "latest",
        max_missed: int = DEFAULT_MAX_MISSED,
        replace: bool = False,
        overlap: Overlap = "allow_all",
        start: datetime | None = None,
        end: datetime | None = None,
        limit: int | None = None,
        jitter: Duration | None = None,
        catchup_window: Duration | None = None,
        pause_after_failures: int | None = None,
        task: str | None = None,
        priority: int = 0,
        key: str | None = None,
        timeout: Duration | None = None,
        max_attempts: int | None = None,
        expires: Duration | None = None,
    ) -> AddResult:
        """As ``Crons.add``."""
        policies = Policies(
            every, offset, overlap, start, end, limit, jitter, catchup_window,
            pause_after_failures, task, priority, key, timeout, max_attempts, expires,
        )  # fmt: skip
        flow = self._flows.add_flow(name, expr, payload, tz, missed, max_missed, replace, policies)
        return await self._queue.drive(flow)

    async def backfill(self, name: str, *, start: datetime, end: datetime) -> int:
        """As ``Crons.backfill``."""
        return await self._queue.drive(self._flows.backfill_flow(name, start, end))

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
