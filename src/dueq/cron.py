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
"""

from __future__ import annotations

import builtins
import json
import logging
import re
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, cast, get_args

import redis

from . import _protocol as protocol
from .checks import whole_number
from .clock import clock_ms, ms_datetime
from .cronexpr import CronSchedule, parse_slot_label, schedule_for, slot_label
from .envelope import encode_envelope
from .exceptions import CronConflict, CronError, PayloadError
from .outage import is_outage
from .snapshot import text

if TYPE_CHECKING:
    from ._async import AsyncQueue
    from ._core import Flow, QueueCore
    from .queue import Queue

logger = logging.getLogger(__name__)

MissedPolicy = Literal["skip", "latest", "all"]
AddResult = Literal["added", "unchanged", "replaced", "restored"]

#: Task ids of occurrences start with this.
OCCURRENCE_PREFIX = "cron:"
MAX_NAME_LENGTH = 200
#: Most missed occurrences ``missed="all"`` runs after downtime, by default and at most.
DEFAULT_MAX_MISSED = 10
MAX_MISSED_LIMIT = 1000
#: The last instant a slot may have (9999-12-31T23:59:59.999Z): Python's datetime ends there.
MAX_SLOT_MS = 253_402_300_799_999
#: A readable cron_state value, "head_ms|last_ms|head_id" (cron_state_read in the scripts).
_STATE = re.compile(r"([0-9]{1,15})\|([0-9]{0,15})\|(.*)", re.DOTALL)
_LABEL = re.compile(r"[0-9]{8}T[0-9]{6}Z")
_SPEC_FIELDS = ("expr", "tz", "missed", "max_missed", "payload")


def occurrence_id(name: str, slot_ms: int) -> str:
    """The task id of one occurrence, e.g. ``cron:nightly-report:20260329T010000Z``."""
    return f"{OCCURRENCE_PREFIX}{name}:{slot_label(slot_ms)}"


@dataclass(frozen=True)
class Occurrence:
    """Which definition and slot a task id belongs to."""

    name: str
    slot: datetime

    @classmethod
    def from_id(cls, task_id: str) -> Occurrence | None:
        """The occurrence a task id names, or None for an ordinary task id."""
        parsed = _parse_occurrence_id(task_id)
        return None if parsed is None else cls(parsed[0], ms_datetime(parsed[1]))


def _parse_occurrence_id(task_id: str) -> tuple[str, int] | None:
    if not task_id.startswith(OCCURRENCE_PREFIX):
        return None
    name, _, label = task_id[len(OCCURRENCE_PREFIX) :].rpartition(":")
    slot_ms = parse_slot_label(label)
    return None if not name or slot_ms is None or slot_ms < 0 else (name, slot_ms)


@dataclass(frozen=True)
class CronDefinition:
    """One recurring task as ``Crons.list`` shows it.

    ``problem`` says why a definition found in Redis cannot be kept going as it is (None when
    it is healthy). Then the fields show what could be read: ``""`` for unreadable text,
    ``0`` for an unreadable ``max_missed``, None for an unreadable payload or slot.
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


def validate_name(name: object) -> str:
    """Return ``name`` if it can name a cron definition, else raise CronError."""
    if not isinstance(name, str) or not name:
        raise CronError(f"cron name must be a non-empty string, got {name!r}")
    if len(name) > MAX_NAME_LENGTH:
        raise CronError(f"cron name is longer than {MAX_NAME_LENGTH} characters")
    if not name.isprintable() or any(c.isspace() for c in name):
        raise CronError(f"cron name {name!r} must be printable, without spaces")
    return name


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
) -> CronDefinition:
    """A CronDefinition from its stored JSON and state; what cannot be read is its problem."""
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
    if state is None:
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
        None if head is None else ms_datetime(head),
        None if last is None else ms_datetime(last),
        "; ".join(problems) or None,
    )


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

    def _now_ms_flow(self) -> Flow[int]:
        clock = self._core.clock
        if clock is not None:
            return clock_ms(clock)
        seconds, micros = yield protocol.command("TIME")
        return int(seconds) * 1000 + int(micros) // 1000

    def _add_flow(
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
        next_ms = schedule.next_after((yield from self._now_ms_flow()))
        call = protocol.cron_add(
            queue.keys,
            queue._now_arg(),
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

    def _remove_flow(self, name: str) -> Flow[bool]:
        name = validate_name(name)
        existed: bool = yield from self._typed(
            protocol.cron_remove(self._core.keys, self._core._now_arg(), name)
        )
        return existed

    def _list_flow(self) -> Flow[builtins.list[CronDefinition]]:
        k = self._core.keys
        raw_specs, raw_states = yield from self._typed(
            protocol.Batch(
                (protocol.command("HGETALL", k.cron), protocol.command("HGETALL", k.cron_state))
            )
        )
        found = []
        for raw_name, raw_spec in raw_specs.items():
            name, name_problem = _name(raw_name)
            found.append(_definition(name, raw_spec, raw_states.get(raw_name), name_problem))
        return sorted(found, key=lambda d: d.name)

    def _get_flow(self, name: str) -> Flow[CronDefinition | None]:
        name = validate_name(name)
        k = self._core.keys
        raw_spec, raw_state = yield from self._typed(
            protocol.Batch(
                (
                    protocol.command("HGET", k.cron, name),
                    protocol.command("HGET", k.cron_state, name),
                )
            )
        )
        return None if raw_spec is None else _definition(name, raw_spec, raw_state)

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

    def _on_claim_flow(
        self, deliveries: builtins.list[Any], now_ms: int
    ) -> Flow[tuple[builtins.list[Any], int | None]]:
        """Advance the schedules of claimed occurrences (two round trips for any number).

        Returns the deliveries to run and the earliest due time of the occurrences it
        scheduled (None if none), so a consumer does not oversleep missed slots it must run now.
        A pending occurrence whose slot was missed is dropped under ``skip`` and ``latest``.
        If Redis refuses (an outage, a permission), the claimed occurrences are held back:
        their leases run out, and the next claim of them tries again, so no schedule stops.
        Corrupted data never raises here: see the module docstring.
        """
        claimed = [(d, *parsed) for d in deliveries if (parsed := _parse_occurrence_id(d.id))]
        if not claimed:
            return deliveries, None
        try:
            results = yield from self._advance_flow(claimed, now_ms)
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
        kept = [d for d in deliveries if d.id not in dropped] if dropped else deliveries
        return kept, min(due, default=None)

    def _advance_flow(
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
        statuses = yield protocol.cron_advance(k, queue._now_arg(), entries)
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


_REFUSED, _ADVANCED, _REBUILT = (
    protocol.CronAdvance.REFUSED,
    protocol.CronAdvance.ADVANCED,
    protocol.CronAdvance.REBUILT,
)


def _wrong_type(exc: redis.RedisError) -> bool:
    return isinstance(exc, redis.ResponseError) and "WRONGTYPE" in str(exc)


class Crons(CronsCore):
    """The cron definitions of a ``Queue`` (``Queue.cron``)."""

    def __init__(self, queue: Queue) -> None:
        super().__init__(queue)
        self._queue = queue

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
        flow = self._add_flow(name, expr, payload, tz, missed, max_missed, replace)
        return self._queue._drive(flow)

    def remove(self, name: str) -> bool:
        """Delete a definition and its pending occurrence; False if there was none.

        An occurrence already leased or waiting for a retry still runs to its end.
        """
        return self._queue._drive(self._remove_flow(name))

    def list(self) -> builtins.list[CronDefinition]:
        """Every definition of the queue, by name, with its next and last fired slot.

        A definition whose data in Redis cannot be read is listed with ``problem`` set.
        CronError if the queue's cron keys are not hashes at all.
        """
        return self._queue._drive(self._list_flow())

    def get(self, name: str) -> CronDefinition | None:
        """One definition by name (``problem`` set if it cannot be read), or None."""
        return self._queue._drive(self._get_flow(name))


class AsyncCrons(CronsCore):
    """The cron definitions of an ``AsyncQueue``; the methods of ``Crons``, awaited."""

    def __init__(self, queue: AsyncQueue) -> None:
        super().__init__(queue)
        self._queue = queue

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
        flow = self._add_flow(name, expr, payload, tz, missed, max_missed, replace)
        return await self._queue._drive(flow)

    async def remove(self, name: str) -> bool:
        """As ``Crons.remove``."""
        return await self._queue._drive(self._remove_flow(name))

    async def list(self) -> builtins.list[CronDefinition]:
        """As ``Crons.list``."""
        return await self._queue._drive(self._list_flow())

    async def get(self, name: str) -> CronDefinition | None:
        """As ``Crons.get``."""
        return await self._queue._drive(self._get_flow(name))
