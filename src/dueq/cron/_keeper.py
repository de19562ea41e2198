"""The claim-time keeper: claiming a cron occurrence moves its definition's schedule on.

``Queue.claim_batch`` (through the claim flow in ``_core``) hands every claimed delivery to
``on_claim_flow``. For each claimed slot occurrence (``cron:<name>:<slot>``; run-now
occurrences never move a schedule) it reads the definition, plans what the slot's claim does
under the definition's ``missed`` policy, and carries all plans out in one ``cron_advance``
call, which moves a schedule on only from its pending slot (compare-and-set): no leader, no
separate scheduler process, no slot fired twice.

Corrupted data in Redis never holds back anything else, and each case has one defined outcome:

- A **definition** that cannot be read (``dueq.cron._spec``): its claimed occurrence runs once
  as an ordinary task, its schedule is not advanced, and the claim logs an error. Stopping is
  the honest choice: dueq cannot know when such a definition means to fire.
- A **state** value that cannot be read (or is missing) is derived data: the script rebuilds
  it from the claimed occurrence, with the next slot after now as the pending one, so no
  slot fires twice and the schedule goes on.
- A cron key of the wrong type: the occurrences run without advancing, and an error is logged.
- Only Redis refusing the advance (an outage, a permission) holds the claimed occurrences
  back until their leases end, so that a later claim advances the schedule.

The occurrence of a paused definition runs (a missed slot too) and ``cron_advance`` schedules
nothing after it. It logs on the ``dueq.cron.flows`` logger, as the rest of the cron definitions do.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any, NamedTuple

import redis

from dueq._util.outage import is_outage
from dueq._wire import protocol as protocol
from dueq.cron._ids import MAX_SLOT_MS, OCCURRENCE_PREFIX, occurrence_id, parse_occurrence_id
from dueq.cron._spec import Spec, wrong_type
from dueq.cron.expr import Window, slot_label
from dueq.exceptions import CronError, PayloadError

if TYPE_CHECKING:
    from dueq._wire.ports import QueueFlows
    from dueq._wire.protocol import Flow

#: The cron definitions' one logger (``dueq.cron.flows``): users configure it by that name.
logger = logging.getLogger("dueq.cron")


class Plan(NamedTuple):
    """What claiming a pending occurrence does: run it or drop it, and what to schedule
    (``next_ms`` None: the definition's window has no slot after now)."""

    run: bool
    missed_now: list[int]
    next_ms: int | None


def plan_claim(slots: Window, spec: Spec, slot_ms: int, now_ms: int) -> Plan:
    """Decide for the pending slot claimed at ``now_ms``.

    A slot is missed when the slot after it has come too, or (with a ``catchup_window``) when
    it is older than the window; then ``skip`` drops it, ``latest`` drops it and runs the
    latest slot instead, and ``all`` runs it and the missed slots after it, ``max_missed`` in
    all. Slots older than the catch-up window never run, and (with ``expires``) missed slots
    already past their expiry are not added: ``max_missed`` counts only slots that can still
    run. (The claimed slot itself past its expiry ends "expired": cron_advance decides that.)
    """
    cutoff = None if spec.catchup_ms is None else now_ms - spec.catchup_ms
    # the oldest slot that has not expired yet (slot + expires > now)
    fresh = None if spec.expires_ms is None else now_ms - spec.expires_ms + 1
    added_cutoff = cutoff if fresh is None else fresh if cutoff is None else max(cutoff, fresh)
    late = cutoff is not None and slot_ms < cutoff
    following = slots.next_after(slot_ms)
    if (following is None or following > now_ms) and not late:
        return Plan(True, [], following)
    next_ms = slots.next_after(now_ms)
    if spec.missed == "skip":
        return Plan(False, [], next_ms)
    if spec.missed == "latest":
        latest = slots.latest_at_or_before(now_ms)
        keep = (
            latest is not None
            and latest > slot_ms
            and (added_cutoff is None or latest >= added_cutoff)
        )
        return Plan(False, [latest] if keep and latest is not None else [], next_ms)
    run = not late
    after = slot_ms if added_cutoff is None else max(slot_ms, added_cutoff - 1)
    return Plan(run, slots.between(after, now_ms, spec.max_missed - (1 if run else 0)), next_ms)


_REFUSED, _ADVANCED, _REBUILT, _PAUSED, _FAILED_PAUSE, _EXPIRED = (
    protocol.CronAdvance.REFUSED,
    protocol.CronAdvance.ADVANCED,
    protocol.CronAdvance.REBUILT,
    protocol.CronAdvance.PAUSED,
    protocol.CronAdvance.FAILED_PAUSE,
    protocol.CronAdvance.EXPIRED,
)


def on_claim_flow(
    queue: QueueFlows, deliveries: list[Any], now_ms: int
) -> Flow[tuple[list[Any], int | None]]:
    """Advance the schedules of claimed occurrences (two round trips for any number).

    Returns the deliveries to run and the earliest due time of the occurrences it
    scheduled (None if none), so a consumer does not oversleep missed slots it must run now.
    A pending occurrence whose slot was missed is dropped under ``skip`` and ``latest``.
    The occurrence of a paused definition runs (a missed slot too) and schedules nothing.
    If Redis refuses (an outage, a permission), the claimed occurrences are held back:
    their leases run out, and the next claim of them tries again, so no schedule stops.
    Corrupted data never raises here: see the module docstring.
    """
    claimed = [
        (d, *parsed)
        for d in deliveries  # the prefix first: no call per plain task
        if d.id.startswith(OCCURRENCE_PREFIX) and (parsed := parse_occurrence_id(d.id))
    ]
    if not claimed:
        return deliveries, None
    try:
        advanced = yield from advance_flow(queue, claimed, now_ms)
    except redis.RedisError as exc:
        if wrong_type(exc):  # a cron key of another type: corrupted data, not an outage
            logger.error(
                "queue %r: %d cron occurrence(s) run without advancing their schedules: %s",
                queue.name,
                len(claimed),
                exc,
            )
            return deliveries, None
        logger.log(
            logging.WARNING if is_outage(exc) else logging.ERROR,
            "queue %r: %d cron occurrence(s) held back until their leases end: %s",
            queue.name,
            len(claimed),
            exc,
        )
        held = {d.id for d, _, _ in claimed}
        return [d for d in deliveries if d.id not in held], None
    except Exception:  # a defect here must not cost the claim its other tasks
        logger.exception(
            "queue %r: %d cron occurrence(s) run without advancing their schedules",
            queue.name,
            len(claimed),
        )
        return deliveries, None
    earliest, results = advanced
    dropped: set[str] = set()
    for delivery, plan, status in results:
        if not status.runs or (status == _ADVANCED and not plan.run):
            dropped.add(delivery.id)
        if status == _PAUSED:
            logger.info(
                "queue %r: %r runs, but its cron definition is paused: nothing is "
                "scheduled after it",
                queue.name,
                delivery.id,
            )
        elif status == _EXPIRED:
            logger.info(
                "queue %r: %r does not run: it is past its expiry (its slot + expires=); "
                "it ends expired",
                queue.name,
                delivery.id,
            )
        elif status == _FAILED_PAUSE:
            logger.warning(
                "queue %r: %r does not run: its cron definition reached its "
                "pause_after_failures count and is paused (resume it to go on)",
                queue.name,
                delivery.id,
            )
    kept = [d for d in deliveries if d.id not in dropped] if dropped else deliveries
    return kept, earliest


def advance_flow(
    queue: QueueFlows, claimed: list[tuple[Any, str, int]], now_ms: int
) -> Flow[tuple[int | None, list[tuple[Any, Plan, protocol.CronAdvance]]]]:
    """Plan each claimed occurrence and carry the plans out in one script call; returns the
    earliest due time the script added (None: none) and each plan sent with the script's
    status for it (an occurrence that is not sent, or not advanced, just runs)."""
    k = queue.keys
    names = sorted({name for _, name, _ in claimed})
    raw_specs = yield protocol.command("HMGET", k.cron, *names)
    specs = dict(zip(names, raw_specs, strict=True))
    planned: list[tuple[Any, str, Plan]] = []
    entries: list[protocol.CronEntry] = []
    for delivery, name, slot_ms in claimed:
        raw = specs[name]
        if raw is None:
            continue  # the definition was removed: the occurrence still runs
        planning = _planned(queue, name, raw, delivery.id, slot_ms, now_ms)
        if planning is None:
            continue
        spec, plan, envelope = planning
        planned.append((delivery, name, plan))
        next_id = "" if plan.next_ms is None else occurrence_id(name, plan.next_ms)
        missed = [(ms, occurrence_id(name, ms)) for ms in plan.missed_now]
        entries.append(
            protocol.CronEntry(
                name=name,
                slot_ms=slot_ms,
                occurrence_id=delivery.id,
                token=delivery.token,
                drop=not plan.run,
                envelope=envelope,
                next_ms=plan.next_ms,
                next_due_ms=None if plan.next_ms is None else spec.due_ms(plan.next_ms, next_id),
                next_id=next_id,
                missed_now=[(spec.due_ms(ms, task_id), task_id) for ms, task_id in missed],
                overlap=spec.overlap,
                limit=spec.limit,
                pause_after=spec.pause_after,
            )
        )
    if not planned:
        return None, []
    reply = yield protocol.cron_advance(k, queue.now_arg(), entries)
    results = []
    for (delivery, name, plan), status in zip(planned, reply.statuses, strict=True):
        if status == _REBUILT:
            logger.warning(
                "queue %r: cron %r had no readable schedule state in Redis; rebuilt it "
                "from %r, next occurrence %s",
                queue.name,
                name,
                delivery.id,
                "none" if plan.next_ms is None else slot_label(plan.next_ms),
            )
        elif status == _REFUSED:
            logger.error(
                "queue %r: cron %r: %r runs without advancing its schedule "
                "(its slots are out of range)",
                queue.name,
                name,
                delivery.id,
            )
        results.append((delivery, plan, status))
    return reply.earliest_ms, results


@functools.lru_cache(maxsize=4096)
def _spec(raw_spec: bytes | str) -> Spec:
    """A stored definition, read once per distinct value (a claim of many occurrences of one
    definition, and every later claim, reads the same bytes); CronError is not kept."""
    return Spec.from_json(raw_spec)


def _planned(
    queue: QueueFlows, name: str, raw_spec: bytes | str, task_id: str, slot_ms: int, now_ms: int
) -> tuple[Spec, Plan, bytes] | None:
    """The definition, the plan for one claimed occurrence and the envelope of those it adds;
    None (and an error logged) if its definition cannot be used: the occurrence then just
    runs."""
    try:
        spec = _spec(raw_spec)
        plan = plan_claim(spec.slots(), spec, slot_ms, now_ms)
        envelope = spec.envelope(queue.max_payload_bytes)
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
    slots = [*plan.missed_now] if plan.next_ms is None else [plan.next_ms, *plan.missed_now]
    if not all(0 <= ms <= MAX_SLOT_MS for ms in slots):
        logger.error(
            "queue %r: cron %r: %r runs without advancing its schedule (no slot before "
            "the year 10000)",
            queue.name,
            name,
            task_id,
        )
        return None
    return spec, plan, envelope
