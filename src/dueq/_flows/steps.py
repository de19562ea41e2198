"""The flows of durable tasks (issue 39; docs/durable.md): a delivery's step log read and
written under its lease (step.lua), and signals sent to a task (signal.lua).

``dueq.durable`` holds the logic of a run (which step comes next, whether it is committed,
what record to write) without I/O; it asks for these flows through its queue, which drives
them like any other. A write that hands the task back (a sleep, a wait, a step's own retry)
settles the delivery here: its outcome is ``released``, with the time it is due again.
"""

from __future__ import annotations

import json

from dueq._flows.base import QueueBase
from dueq._flows.drive import Flow
from dueq._util.clock import ms_datetime
from dueq._wire import protocol
from dueq._wire.codec import SEALED_VALUE_JSON, SIGNAL_PURPOSE, step_purpose
from dueq._wire.envelope import validate_id
from dueq._wire.signals import MAX_PENDING_SIGNALS, signal_payload, validate_signal_name
from dueq._wire.snapshot import step_infos
from dueq.delivery import DeliveryBase
from dueq.exceptions import (
    LeaseLost,
    NonDeterministic,
    SignalRefused,
    TaskCancelled,
    TaskNotFound,
)
from dueq.model import Outcome, StepInfo


class StepFlows(QueueBase):
    """Durable tasks' flows: the step log of a delivery, its writes, and signals."""

    def step_log_flow(self, delivery: DeliveryBase) -> Flow[list[StepInfo]]:
        """The records of ``delivery``'s step log, read under its lease (LeaseLost, or
        TaskCancelled, when it is not held: see ``step_flow``)."""
        reply: protocol.StepReply = yield from self._core.step_flow(delivery, "read", 0, "", "")
        return step_infos(reply.value, self.payload_codec, self.name, delivery.id, strict=True)

    def step_flow(
        self,
        delivery: DeliveryBase,
        op: protocol.DurableOp,
        position: int,
        head: str,
        value: str,
        extra: str = "",
    ) -> Flow[protocol.StepReply]:
        """One write of ``delivery``'s step log under its lease: step.lua for a commit and a
        failed run the attempt fails on, park.lua for what hands the task back. A lease
        not held raises LeaseLost (TaskCancelled when cancelled) and settles the delivery; a
        log that holds another count of committed steps than ``position`` (two runs of one
        delivery at once) raises NonDeterministic; a write that handed the task back settles
        the delivery as ``released``."""
        k, now, task_id, token = self.keys, self.now_arg(), delivery.id, delivery.token
        if op == "commit":  # the result sealed for its task and position (``_wire.codec``)
            value = self.payload_codec.seal_value(value, self.name, task_id, step_purpose(position))
        reply: protocol.StepReply
        if op in ("read", "commit") or (op == "fail" and extra == ""):
            reply = yield protocol.step(k, now, task_id, token, op, position, head, value)
        else:
            assert op != "read" and op != "commit"  # (for mypy: those are step.lua's)
            reply = yield protocol.park(k, now, task_id, token, op, position, head, value, extra)
            if op in ("sleep", "wait") and reply.status in _MAYBE_SENT_AGAIN:
                log = yield protocol.command("HMGET", k.steps, task_id, parse=_first)
                answered = _answered_before(op, reply.status, log, position, head)
                if answered is not None:
                    reply = protocol.StepReply(protocol.Status.OK, answered)
        if reply.status is protocol.Status.CANCELLED:
            delivery.mark_settled(Outcome(delivery.id, "cancelled", delivery.attempt))
            raise TaskCancelled(
                f"task {delivery.id!r} was cancelled while leased; step not written", [delivery.id]
            )
        if reply.status is protocol.Status.LEASE_LOST:
            delivery.mark_settled(Outcome(delivery.id, "lost", delivery.attempt))
            raise LeaseLost(
                f"lease on task {delivery.id!r} was lost; step {position} not written "
                "(its result is discarded)",
                [delivery.id],
            )
        if reply.status is protocol.Status.STEP_POSITION:
            raise NonDeterministic(
                f"task {delivery.id!r}: its step log holds {reply.value} committed step(s) "
                f"where this run counted {position}: two runs of one delivery wrote steps at "
                "once (steps must run one after another)",
                position,
                f"{reply.value} committed",
                f"{position} committed",
            )
        due_ms = _handed_back(op, reply.value, extra)
        if due_ms is not None:
            at = ms_datetime(due_ms)
            delivery.mark_settled(Outcome(delivery.id, "released", delivery.attempt, at))
        if op == "wait" and reply.value[1:].startswith(SEALED_VALUE_JSON):  # a signal taken
            opened = self.payload_codec.open_value(
                json.loads(reply.value[1:]), self.name, task_id, SIGNAL_PURPOSE
            )
            reply = protocol.StepReply(reply.status, reply.value[:1] + json.dumps(opened))
        return reply

    def signal_flow(self, task_id: str, name: str, payload: object) -> Flow[int]:
        """Send signal ``name`` to task ``task_id``: the count of its signals not yet taken.
        TaskNotFound when no live task has that id, SignalRefused when it holds
        MAX_PENDING_SIGNALS already (nothing written either way)."""
        task_id = validate_id(task_id)
        name = validate_signal_name(name)
        body = self.payload_codec.seal_value(
            signal_payload(payload), self.name, task_id, SIGNAL_PURPOSE
        )
        reply: protocol.SignalReply = yield protocol.signal(
            self.keys, self.now_arg(), task_id, name, body, max_pending=MAX_PENDING_SIGNALS
        )
        if reply.status is protocol.SignalStatus.GONE:
            raise TaskNotFound(
                f"no live task {task_id!r} to signal on queue {self.name!r}: never scheduled, "
                "ended, or dead",
                [task_id],
            )
        if reply.status is protocol.SignalStatus.FULL:
            raise SignalRefused(
                f"task {task_id!r} holds {reply.pending} signals not yet taken (the most a task "
                f"may hold is {MAX_PENDING_SIGNALS}); signal {name!r} not kept"
            )
        return reply.pending


#: What park.lua answers to a sleep or a wait that Redis applied once already (the reply lost
#: with a dropped connection, the call sent again): LEASE_LOST when the first call handed the
#: task back (no lease is left to check), STEP_POSITION for a sleep that was over at once (the
#: lease is still held, and the log holds the sleep one position further).
_MAYBE_SENT_AGAIN = (protocol.Status.LEASE_LOST, protocol.Status.STEP_POSITION)


def _first(reply: list[bytes | None]) -> bytes | None:
    return reply[0]


def _answered_before(
    op: protocol.DurableOp,
    status: protocol.Status,
    log: bytes | None,
    position: int,
    head: str,
) -> str | None:
    """What park.lua answered to this very ``op`` when it was applied before, read from the
    task's step log (``log``: lua/include/step_log.lua, a record a line), or None when the
    record at ``position`` is not the one this call writes (another run wrote it, or none did:
    the lease was lost indeed). The record's head (its start ms, and a wait's name) tells this
    call's from another run's: a sleep's record keeps its wake ms, a parked wait's its
    deadline, which is what the first reply said.

    A sleep whose lease is still held (STEP_POSITION) was over at once ("-1": go on); one
    whose lease is gone was handed back until its wake ms. A wait answers only when it
    parked (its open record is the log's last); one that took a signal or timed out while
    leased is park.lua's own answer to the repeat."""
    lines = log.decode("utf-8", "replace").split("\n") if log else []
    line = lines[position] if position < len(lines) else ""
    letter, tail = ("S", ',"r":') if op == "sleep" else ("W", ',"d":')
    prefix = letter + head + tail
    due = line[len(prefix) : -1]
    if not line.startswith(prefix) or not line.endswith("}") or not due.isdigit():
        return None
    if op == "sleep":
        return "-1" if status is protocol.Status.STEP_POSITION else due
    if status is protocol.Status.LEASE_LOST and position == len(lines) - 1:
        return "P" + due
    return None


def _handed_back(op: protocol.DurableOp, value: str, extra: str) -> int | None:
    """The due ms of a task that step.lua's ``op`` handed back, or None when it kept it."""
    if op == "wait":
        return int(value[1:]) if value.startswith("P") else None
    if op == "fail":
        return int(value) if extra != "" else None
    if op in ("sleep", "again"):
        due_ms = int(value)
        return due_ms if due_ms >= 0 else None
    return None
