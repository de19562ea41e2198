"""The consuming flows: claim leases, and settle them (ack, fail, extend, release)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from dueq._flows.base import QueueBase
from dueq._flows.drive import Flow
from dueq._util.checks import MAX_HOLDER_LENGTH, validate_holder, whole_number
from dueq._util.clock import Duration, duration_ms, ms_datetime
from dueq._util.clock import positive_duration_ms as _positive_ms
from dueq._util.identity import worker_id
from dueq._wire import protocol as protocol
from dueq._wire.codec import RESULT_PURPOSE, sealed_error_record
from dueq._wire.envelope import MAX_RESULT_BYTES, decode_named, result_entry
from dueq._wire.failures import error_record, token_holder
from dueq.delivery import DeliveryBase, FailItem, mark_all_acked
from dueq.exceptions import (
    KeyCooldown,
    LeaseLost,
    PayloadError,
    TaskCancelled,
    UndecryptableTask,
    Unrecoverable,
)
from dueq.logs import task_fields
from dueq.model import ClaimBatch, Outcome, OutcomeKind

logger = logging.getLogger("dueq.queue")

#: Most tasks one claim call may lease.
MAX_CLAIM_BATCH = 1000


def default_holder() -> str:
    """This process as a lease holder: its worker id (``dueq._util.identity.worker_id``, the name
    logs and metrics use), cut to MAX_HOLDER_LENGTH from the left when the host name is long;
    made again in a forked child."""
    wid = worker_id().replace("|", "_")
    return wid if len(wid) <= MAX_HOLDER_LENGTH else wid[-MAX_HOLDER_LENGTH:]


def raise_not_held(done: str, refused: list[str], cancelled: list[str]) -> None:
    """TaskCancelled when every refused lease was cancelled, LeaseLost (with ``.cancelled``)
    when some were lost; nothing when none was refused. ``refused`` keeps the caller's order."""
    if refused and len(cancelled) == len(refused):
        raise TaskCancelled(
            f"{len(refused)} task(s) cancelled while leased, not {done}: {refused[:10]}",
            refused,
        )
    if refused:
        raise LeaseLost(
            f"lease lost on {len(refused)} task(s), not {done}: {refused[:10]}",
            refused,
            cancelled,
        )


#: The outcome of a failure, by fail.lua's status (any other: retried).
_FAIL_KINDS: dict[protocol.Status, OutcomeKind] = {
    protocol.Status.DEAD: "dead",
    protocol.Status.EXPIRED: "expired",
}


def fail_item(
    item: FailItem[DeliveryBase],
) -> tuple[DeliveryBase, BaseException | str, Duration | None]:
    """A ``fail_many`` item as (delivery, error, retry_in)."""
    if len(item) == 2:
        return item[0], item[1], None
    if len(item) == 3:
        return item
    raise TypeError(
        f"a fail_many item is (delivery, error) or (delivery, error, retry_in), not {item!r}"
    )


def _fail_outcome(
    delivery: DeliveryBase, error: BaseException | str, reply: protocol.FailReply
) -> Outcome:
    """The outcome of one failure by fail.lua's reply; the delivery marked settled with it."""
    message = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(error)
    if reply.status is protocol.Status.CANCELLED:
        outcome = Outcome(delivery.id, "cancelled", delivery.attempt, None, message)
    elif reply.status is protocol.Status.LEASE_LOST:
        outcome = Outcome(delivery.id, "lost", delivery.attempt, None, message)
    else:
        kind: OutcomeKind = _FAIL_KINDS.get(reply.status, "retried")
        outcome = Outcome(delivery.id, kind, delivery.attempt, ms_datetime(reply.at_ms), message)
    delivery.mark_settled(outcome)
    return outcome


class LeaseFlows(QueueBase):
    """The flows of consuming: claim, then ack, fail, extend or release each lease."""

    #: seconds a backoff table is reused for (it asks the wait strategy once per attempt)
    BACKOFF_TABLE_S = 1.0

    def backoff_table_ms(self) -> list[int]:
        """The retry policy's delays after attempts 1, 2, ... for the claim's expired leases,
        made at most once a second: asking tenacity for every attempt took about 60 us per
        claim, and a jittered wait still varies from one second to the next."""
        now_s, cached = time.monotonic(), self.backoff_cache
        if (
            cached is None
            or cached[1] is not self.retry
            or now_s - cached[0] >= self.BACKOFF_TABLE_S
        ):
            cached = self.backoff_cache = (now_s, self.retry, self.retry.backoff_table_ms())
        return cached[2]

    def claim_flow(
        self, limit: int, lease: Duration | None, holder: str | None = None
    ) -> Flow[ClaimBatch]:
        whole_number(limit, "limit", low=0, high=MAX_CLAIM_BATCH)
        lease_ms = self.lease_ms if lease is None else _positive_ms(lease, "lease")
        if holder is not None:
            validate_holder(holder)
        else:  # the queue's ("" names no holder: scripts/bench/views.py measures without)
            holder = default_holder() if self.holder is None else self.holder
        yield from self.plain_check_flow()
        reply: protocol.ClaimReply = yield protocol.claim(
            self.keys,
            self.now_arg(),
            limit=limit,
            lease_ms=lease_ms,
            max_attempts=self.retry.max_attempts,
            reclaim_limit=max(limit, 100),
            dead_max_count=self.dead_max_count,
            dead_max_age_ms=self.dead_max_age_ms,
            backoff_ms=self.backoff_table_ms(),
            holder=holder,
        )
        now_ms, next_due = reply.now_ms, reply.next_due_ms
        if reply.dropped:
            logger.error(
                "queue %r: %d due task(s) had no stored data and were dropped: their keys were "
                "evicted or deleted (set maxmemory-policy noeviction)",
                self.name,
                reply.dropped,
            )
        if reply.buried:
            logger.error(
                "queue %r: %d due task(s) moved to dead at claim (unreadable attempt record, "
                "or max_attempts already reached); see their errors",
                self.name,
                reply.buried,
            )
        deliveries: list[Any] = []
        append = deliveries.append
        make: Callable[..., DeliveryBase] = self._delivery_type  # called with this queue
        token, deadline_ms = reply.token, reply.lease_deadline_ms
        for task_id, envelope, attempt, due_ms, first_claimed_ms in reply.rows:
            try:
                payload, options, trace_context, task_name = decode_named(
                    envelope, self.payload_codec, self.name, task_id
                )
            except PayloadError as exc:
                logger.error(
                    "queue %r: task %r attempt %d cannot be decrypted; moved to dead with its "
                    "data kept (replay it once the key is configured): UndecryptableTask: %s"
                    if isinstance(exc, UndecryptableTask)
                    else "queue %r: task %r attempt %d has an undecodable envelope; moved to "
                    "dead: %s",
                    self.name,
                    task_id,
                    attempt,
                    exc,
                    extra=task_fields(self.name, task_id, attempt),
                )
                record = sealed_error_record(
                    self.payload_codec, error_record(exc, attempt), self.name, task_id
                )
                yield self._fail_call(task_id, token, record, True, 0)
                continue
            append(
                make(
                    self,
                    task_id,
                    payload,
                    attempt,
                    due_ms,
                    deadline_ms,
                    token,
                    first_claimed_ms,
                    now_ms,
                    options,
                    trace_context,
                    task_name,
                )
            )
        deliveries, cron_due = yield from self.cron_on_claim_flow(deliveries, now_ms)
        if cron_due is not None and (next_due is None or cron_due < next_due):
            next_due = cron_due
        return ClaimBatch(
            deliveries,
            now_ms,
            next_due,
            reply.next_lease_deadline_ms,
            reply.now_fraction_ms,
            reply.paused,
            reply.fair,
        )

    def ack_flow(self, deliveries: Sequence[DeliveryBase]) -> Flow[int]:
        if not deliveries:
            return 0
        acked, refused, cancelled = 0, [], []  # ids in the caller's order
        for start in range(0, len(deliveries), protocol.LEASE_BATCH):
            chunk = deliveries[start : start + protocol.LEASE_BATCH]
            # results are rare: without one, no entry per delivery is made
            has_result = [d for d in chunk if d.result is not None]
            entries = [self._result_entry(d) for d in chunk] if has_result else []
            reply: protocol.AckReply = yield protocol.ack(
                self.keys,
                self.now_arg(),
                [(d.id, d.token) for d in chunk],
                window_ms=self.remember_done_ms,
                values=[entry for entry, _ in entries],
            )
            if not entries and reply.verdicts.count("h") == len(chunk):  # all acked: settle
                mark_all_acked(chunk)  # (each consumer's hook once for the chunk)
                acked += reply.acked
                continue
            whys = [why for _, why in entries] if entries else [None] * len(chunk)
            for d, verdict, why in zip(chunk, reply.verdicts, whys, strict=True):
                if why is not None and verdict == "h" and reply.kept_ms > 0:
                    logger.warning(
                        "task %r acked; its result was not kept (%s)",
                        d.id,
                        why,
                        extra=task_fields(d.queue_name, d.id, d.attempt),
                    )
                if verdict == "c":
                    d.mark_settled(Outcome(d.id, "cancelled", d.attempt))
                    cancelled.append(d.id)
                elif verdict == "l":
                    d.mark_settled(Outcome(d.id, "lost", d.attempt))
                else:
                    d.mark_settled(None)
                if verdict != "h":
                    refused.append(d.id)
            acked += reply.acked
        raise_not_held("acked", refused, cancelled)
        return acked

    def _result_entry(self, delivery: DeliveryBase) -> tuple[bytes, str | None]:
        """``result_entry`` of the delivery's result, sealed for its task when the queue
        encrypts (``_wire.codec``: ack.lua stores it as it is, in the result record and the
        acked event); a value too big once sealed is reported, not kept."""
        entry, why = result_entry(delivery.result)
        codec = self.payload_codec
        if why is not None or not entry or codec.codec is None:
            return entry, why
        sealed = codec.seal_value(entry[1:].decode("utf-8"), self.name, delivery.id, RESULT_PURPOSE)
        if len(sealed) > MAX_RESULT_BYTES:
            why = f"too big: {len(sealed)} bytes once sealed (at most {MAX_RESULT_BYTES})"
            return b"!" + why.encode(), why
        return b"=" + sealed.encode("ascii"), None

    def _fail_call(
        self, task_id: str, token: str, record: str, dead: bool, delay_ms: int
    ) -> protocol.Call[protocol.FailReply]:
        return protocol.fail(
            self.keys,
            self.now_arg(),
            task_id,
            token,
            record,
            dead=dead,
            delay_ms=delay_ms,
            dead_max_count=self.dead_max_count,
            dead_max_age_ms=self.dead_max_age_ms,
        )

    def _failure(
        self, delivery: DeliveryBase, error: BaseException | str, retry_in: Duration | None
    ) -> protocol.Failure:
        """What fail.lua is told of one failure: dead (``Unrecoverable``, or the retry policy
        gives up at this attempt, age and error, or the delivery's own max_attempts), else
        the delay (``retry_in``, else the policy's), and the error record."""
        exc = error if isinstance(error, BaseException) else None
        age_s = max(delivery.claimed_ms - delivery.first_claimed_ms, 0) / 1000
        delay_ms = 0
        dead = isinstance(error, Unrecoverable) or self.retry.gives_up(
            delivery.attempt, age_s, exc, delivery.max_attempts
        )
        if not dead:
            if retry_in is not None:
                delay_ms = duration_ms(retry_in, "retry_in")
            else:
                delay_ms = round(self.retry.delay_s(delivery.attempt, age_s, exc) * 1000)
        record = error_record(error, delivery.attempt, token_holder(delivery.token))
        record = sealed_error_record(self.payload_codec, record, self.name, delivery.id)
        return protocol.Failure(delivery.id, delivery.token, record, dead, delay_ms)

    def fail_flow(
        self, delivery: DeliveryBase, error: BaseException | str, retry_in: Duration | None
    ) -> Flow[Outcome]:
        if isinstance(error, KeyCooldown):  # back later, no attempt counted, its key held
            return (yield from self._core.release_flow(delivery, error.seconds, hold=True))
        (outcome,) = yield from self._core.fail_many_flow([(delivery, error, retry_in)])
        if outcome.kind == "cancelled":
            protocol.raise_for(
                protocol.Status.CANCELLED,
                f"task {delivery.id!r} was cancelled while leased; failure not recorded",
                [delivery.id],
            )
        if outcome.kind == "lost":
            protocol.raise_for(
                protocol.Status.LEASE_LOST,
                f"lease on task {delivery.id!r} was lost; failure not recorded",
                [delivery.id],
            )
        return outcome

    def fail_many_flow(self, items: Sequence[FailItem[DeliveryBase]]) -> Flow[list[Outcome]]:
        """Record many failures, each as ``fail_flow`` decides it, in one script call per
        LEASE_BATCH (settled in the order given); KeyCooldown items are released with their
        key held (one release call per distinct cooldown). Never raises for a lease not held:
        each outcome says ``cancelled`` or ``lost`` then (with the error's message). Every
        item is judged (retry policy, error record) before anything is sent, so a bad
        ``retry_in`` records none of them."""
        triples = [fail_item(item) for item in items]
        failing = [i for i, t in enumerate(triples) if not isinstance(t[1], KeyCooldown)]
        failures = [self._failure(*triples[i]) for i in failing]
        outcomes: list[Outcome | None] = [None] * len(triples)
        for start in range(0, len(failing), protocol.LEASE_BATCH):
            replies: list[protocol.FailReply] = yield protocol.fail_many(
                self.keys,
                self.now_arg(),
                failures[start : start + protocol.LEASE_BATCH],
                dead_max_count=self.dead_max_count,
                dead_max_age_ms=self.dead_max_age_ms,
            )
            for i, reply in zip(
                failing[start : start + protocol.LEASE_BATCH], replies, strict=True
            ):
                outcomes[i] = _fail_outcome(triples[i][0], triples[i][1], reply)
        cooling: dict[float, list[int]] = {}  # cooldown seconds -> the items
        for i, (_, error, _) in enumerate(triples):
            if isinstance(error, KeyCooldown):
                cooling.setdefault(error.seconds, []).append(i)
        for seconds, group in cooling.items():
            released = yield from self._core.release_many_flow(
                [triples[i][0] for i in group], seconds, hold=True
            )
            for i, outcome in zip(group, released, strict=True):
                outcomes[i] = outcome
        return [o for o in outcomes if o is not None]  # (every item has one)

    def extend_flow(self, delivery: DeliveryBase, seconds: Duration) -> Flow[datetime]:
        try:
            return (yield from self._core.extend_many_flow([delivery], seconds))
        except TaskCancelled:
            raise TaskCancelled(
                f"task {delivery.id!r} was cancelled while leased; not extended", [delivery.id]
            ) from None
        except LeaseLost:
            raise LeaseLost(
                f"lease on task {delivery.id!r} was lost; not extended", [delivery.id]
            ) from None

    def extend_many_flow(
        self, deliveries: Sequence[DeliveryBase], seconds: Duration
    ) -> Flow[datetime]:
        """One script call per LEASE_BATCH leases; each lease judged by its own token."""
        ms = _positive_ms(seconds, "lease extension")
        refused: list[str] = []
        cancelled: list[str] = []
        deadline_ms: int | None = None
        for start in range(0, len(deliveries), protocol.LEASE_BATCH):
            chunk = deliveries[start : start + protocol.LEASE_BATCH]
            reply: protocol.ExtendReply = yield protocol.extend(
                self.keys, self.now_arg(), [(d.id, d.token) for d in chunk], ms
            )
            for d, verdict in zip(chunk, reply.verdicts, strict=True):
                if verdict == "h":
                    d.lease_deadline_ms = reply.deadline_ms
                    continue
                refused.append(d.id)
                if verdict == "c":
                    d.mark_cancelled()
                    cancelled.append(d.id)
            deadline_ms = reply.deadline_ms
        raise_not_held("extended", refused, cancelled)
        return ms_datetime(deadline_ms if deadline_ms is not None else 0)

    def release_many_flow(
        self, deliveries: Sequence[DeliveryBase], delay: Duration, *, hold: bool = False
    ) -> Flow[list[Outcome]]:
        """Give ``deliveries`` back, due after ``delay``, one script call per LEASE_BATCH;
        with ``hold`` each one's limit key is held as long. Never raises for a lease not held:
        each delivery's outcome says what became of it (released, cancelled or lost)."""
        delay_ms = duration_ms(delay, "delay")
        outcomes: list[Outcome] = []
        for start in range(0, len(deliveries), protocol.LEASE_BATCH):
            chunk = deliveries[start : start + protocol.LEASE_BATCH]
            reply: protocol.ExtendReply = yield protocol.release_many(
                self.keys,
                self.now_arg(),
                [(d.id, d.token) for d in chunk],
                delay_ms,
                hold_ms=delay_ms if hold else 0,
            )
            due = ms_datetime(reply.deadline_ms)
            for d, verdict in zip(chunk, reply.verdicts, strict=True):
                if verdict == "h":
                    outcome = Outcome(d.id, "released", d.attempt, due)
                else:
                    outcome = Outcome(d.id, "cancelled" if verdict == "c" else "lost", d.attempt)
                d.mark_settled(outcome)
                outcomes.append(outcome)
        return outcomes

    def release_flow(
        self, delivery: DeliveryBase, delay: Duration, *, hold: bool = False
    ) -> Flow[Outcome]:
        """Give ``delivery`` back, due after ``delay``; with ``hold`` (a KeyCooldown) its limit
        key is held as long."""
        delay_ms = duration_ms(delay, "delay")
        reply: protocol.TimeReply = yield protocol.release(
            self.keys,
            self.now_arg(),
            delivery.id,
            delivery.token,
            delay_ms,
            hold_ms=delay_ms if hold else 0,
        )
        if reply.status is protocol.Status.CANCELLED:
            delivery.mark_settled(Outcome(delivery.id, "cancelled", delivery.attempt))
            protocol.raise_for(
                reply.status,
                f"task {delivery.id!r} was cancelled while leased; not released",
                [delivery.id],
            )
        if reply.status is not protocol.Status.OK:
            delivery.mark_settled(Outcome(delivery.id, "lost", delivery.attempt))
            protocol.raise_for(
                reply.status, f"lease on task {delivery.id!r} was lost; not released", [delivery.id]
            )
        outcome = Outcome(delivery.id, "released", delivery.attempt, ms_datetime(reply.ms))
        delivery.mark_settled(outcome)
        return outcome
