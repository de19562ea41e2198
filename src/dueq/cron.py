"""Recurring tasks: cron definitions kept in Redis, each occurrence an ordinary task.

Adding a definition schedules its pending occurrence; claiming that occurrence schedules the
next one (``Queue.claim_batch`` hands every claimed occurrence to ``Crons.on_claim``). An
occurrence's id is ``cron:<name>:<slot in UTC>``, so every process keeping a schedule writes
the same ids, and the ``cron_advance`` script moves a schedule on only from its pending slot
(compare-and-set): no leader, no separate scheduler process, no slot fired twice.
"""

from __future__ import annotations

import builtins
import json
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, get_args

import redis

from .checks import whole_number
from .clock import clock_ms, ms_datetime
from .cronexpr import CronSchedule, parse_slot_label, schedule_for, slot_label
from .envelope import encode_envelope
from .exceptions import CronConflict, CronError
from .snapshot import text

if TYPE_CHECKING:
    from .queue import Queue
    from .task import Delivery

logger = logging.getLogger(__name__)

MissedPolicy = Literal["skip", "latest", "all"]
AddResult = Literal["added", "unchanged", "replaced", "restored"]
_ADD_RESULTS: dict[int, AddResult] = {0: "unchanged", 1: "added", 2: "replaced", 3: "restored"}

#: Task ids of occurrences start with this.
OCCURRENCE_PREFIX = "cron:"
MAX_NAME_LENGTH = 200
#: Most missed occurrences ``missed="all"`` runs after downtime, by default and at most.
DEFAULT_MAX_MISSED = 10
MAX_MISSED_LIMIT = 1000


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
    return None if not name or slot_ms is None else (name, slot_ms)


@dataclass(frozen=True)
class CronDefinition:
    """One recurring task as ``Crons.list`` shows it."""

    name: str
    expr: str
    tz: str
    missed: MissedPolicy
    max_missed: int
    payload: Any
    next_at: datetime | None
    last_fired_at: datetime | None


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
    def from_json(cls, raw: str) -> _Spec:
        data = json.loads(raw)
        return cls(data["expr"], data["tz"], data["missed"], data["max_missed"], data["payload"])


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


def _definition(name: str, raw_spec: Any, raw_state: Any) -> CronDefinition:
    """A CronDefinition from its stored JSON and state; CronError if they cannot be read."""
    try:
        spec = _Spec.from_json(text(raw_spec))
    except (ValueError, KeyError, TypeError) as exc:
        raise CronError(
            f"cron {name!r} has an unreadable definition in Redis ({exc}); "
            "remove it or add it again with replace=True"
        ) from exc
    head, last, _ = (text(raw_state) if raw_state is not None else "||").split("|", 2)
    return CronDefinition(
        name,
        spec.expr,
        spec.tz,
        spec.missed,
        spec.max_missed,
        spec.payload,
        ms_datetime(int(head)) if head else None,
        ms_datetime(int(last)) if last else None,
    )


class Crons:
    """The cron definitions of one queue (``Queue.cron``)."""

    def __init__(self, queue: Queue) -> None:
        self._queue = queue

    def _now_ms(self) -> int:
        clock = self._queue.clock
        if clock is not None:
            return clock_ms(clock)
        seconds, micros = self._queue.redis.time()
        return int(seconds) * 1000 + int(micros) // 1000

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
        name = validate_name(name)
        if missed not in get_args(MissedPolicy):
            raise CronError(f"missed must be 'skip', 'latest' or 'all', got {missed!r}")
        whole_number(max_missed, "max_missed", low=1, high=MAX_MISSED_LIMIT)
        schedule = CronSchedule(expr, tz)
        queue = self._queue
        envelope = encode_envelope(payload, queue.max_payload_bytes)
        spec = _Spec(schedule.expr, tz, missed, max_missed, payload)
        next_ms = schedule.next_after(self._now_ms())
        k = queue.keys
        status = int(
            queue._run(
                "cron_add",
                [k.cron, k.cron_state, k.due, k.tasks, k.meta, k.errors, k.stats, k.wake],
                name,
                spec.to_json(),
                "1" if replace else "0",
                next_ms,
                occurrence_id(name, next_ms),
                envelope,
            )
        )
        if status < 0:
            raise CronConflict(
                f"cron {name!r} is already defined differently in queue {queue.name!r}; "
                "pass replace=True to replace it"
            )
        return _ADD_RESULTS[status]

    def remove(self, name: str) -> bool:
        """Delete a definition and its pending occurrence; False if there was none.

        An occurrence already leased or waiting for a retry still runs to its end.
        """
        k = self._queue.keys
        keys = [k.cron, k.cron_state, k.due, k.tasks, k.meta, k.errors, k.stats]
        return bool(self._queue._run("cron_remove", keys, validate_name(name)))

    def list(self) -> builtins.list[CronDefinition]:
        """Every definition of the queue, by name, with its next and last fired slot."""
        k = self._queue.keys
        pipe = self._queue.redis.pipeline(transaction=False)
        pipe.hgetall(k.cron)
        pipe.hgetall(k.cron_state)
        raw_specs, raw_states = pipe.execute()
        states = {text(name): value for name, value in raw_states.items()}
        found = [
            _definition(text(name), raw_spec, states.get(text(name)))
            for name, raw_spec in raw_specs.items()
        ]
        return sorted(found, key=lambda d: d.name)

    def get(self, name: str) -> CronDefinition | None:
        """One definition by name, or None."""
        name = validate_name(name)
        k = self._queue.keys
        pipe = self._queue.redis.pipeline(transaction=False)
        pipe.hget(k.cron, name)
        pipe.hget(k.cron_state, name)
        raw_spec, raw_state = pipe.execute()
        return None if raw_spec is None else _definition(name, raw_spec, raw_state)

    # -- called by Queue.claim_batch ------------------------------------------------------------

    def on_claim(
        self, deliveries: builtins.list[Delivery], now_ms: int
    ) -> tuple[builtins.list[Delivery], int | None]:
        """Advance the schedules of claimed occurrences (two round trips for any number).

        Returns the deliveries to run and the earliest due time of the occurrences it
        scheduled (None if none), so a consumer does not oversleep missed slots it must run now.
        A pending occurrence whose slot was missed is dropped under ``skip`` and ``latest``.
        If Redis fails, the claimed occurrences are held back: their leases run out, and the
        next claim of them tries again, so no schedule stops.
        """
        claimed = [(d, *parsed) for d in deliveries if (parsed := _parse_occurrence_id(d.id))]
        if not claimed:
            return deliveries, None
        try:
            plans = self._advance(claimed, now_ms)
        except redis.RedisError as exc:
            logger.warning(
                "%d cron occurrence(s) held back until their leases end: %s", len(claimed), exc
            )
            held = {d.id for d, _, _ in claimed}
            return [d for d in deliveries if d.id not in held], None
        dropped = {d.id for d, plan in plans if not plan.run}
        due = [ms for _, plan in plans for ms in (*plan.missed_now, plan.next_ms)]
        kept = [d for d in deliveries if d.id not in dropped] if dropped else deliveries
        return kept, min(due, default=None)

    def _advance(
        self, claimed: builtins.list[tuple[Delivery, str, int]], now_ms: int
    ) -> builtins.list[tuple[Delivery, _Plan]]:
        """Plan each claimed occurrence and carry the plans out in one script call; returns
        the plans that advanced a schedule (the others were not pending: they just run)."""
        queue = self._queue
        k = queue.keys
        names = sorted({name for _, name, _ in claimed})
        specs = dict(zip(names, queue.redis.hmget(k.cron, names), strict=True))
        planned: builtins.list[tuple[Delivery, _Plan]] = []
        args: builtins.list[str | int | bytes] = []
        for delivery, name, slot_ms in claimed:
            raw = specs[name]
            if raw is None:
                continue  # the definition was removed: the occurrence still runs
            try:
                spec = _Spec.from_json(text(raw))
                plan = _plan(schedule_for(spec.expr, spec.tz), spec, slot_ms, now_ms)
                envelope = encode_envelope(spec.payload, queue.max_payload_bytes)
            except Exception:  # a poison definition must not stop the claim
                logger.exception(
                    "cron %r: %r runs without advancing its schedule", name, delivery.id
                )
                continue
            planned.append((delivery, plan))
            args += (name, slot_ms, delivery.id, delivery.token, "0" if plan.run else "1")
            args += (
                envelope,
                plan.next_ms,
                occurrence_id(name, plan.next_ms),
                len(plan.missed_now),
            )
            for ms in plan.missed_now:
                args += (ms, occurrence_id(name, ms))
        if not planned:
            return []
        advanced = queue._run(
            "cron_advance",
            [k.cron_state, k.due, k.tasks, k.meta, k.errors, k.leased, k.stats, k.wake],
            *args,
        )
        return [entry for entry, status in zip(planned, advanced, strict=True) if int(status)]
