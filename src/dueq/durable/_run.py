"""One run of a durable task's function, without I/O: which step comes next, whether the log
holds it committed, and what record to write for it.

A run begins with the task's step log (read once, on the first step) and walks it: the n-th
step the function asks for must be the log's n-th record, by kind and name (Temporal's replay
check, made cheap: no history to replay, only the names to compare); a committed one gives its
stored result and the function goes on without running the body. The first step the log does
not hold committed runs, and its outcome is written by one step.lua call, under the lease:
``StepContext`` and ``AsyncStepContext`` (``dueq.durable._context``) drive those writes with a
blocking or an awaited queue.
"""

from __future__ import annotations

import json
from typing import Any

from dueq._wire.envelope import DEFAULT_MAX_PAYLOAD_BYTES, json_text
from dueq.exceptions import NonDeterministic, PayloadError, Unrecoverable
from dueq.model import StepInfo, StepKind

#: The largest step result kept, as JSON (a step's result is read back on every later run).
MAX_STEP_RESULT_BYTES = DEFAULT_MAX_PAYLOAD_BYTES
#: The most steps (sleeps and waits included) one task may pass: its log is read on every run
#: and each commit rewrites it, so a task of more steps is a loop to split into tasks.
MAX_STEPS = 10_000
#: The most bytes of step results one task may keep (its log is read on every run, and each
#: commit rewrites it): past it a commit ends the task dead; keep big results elsewhere.
MAX_LOG_BYTES = 8 * 1024 * 1024
#: What a record costs in its log beside its result (its name, times, runs), about.
RECORD_BYTES = 48
#: How much of a failed step's error message its record keeps.
MAX_STEP_ERROR_CHARS = 2000


class Suspended(BaseException):
    """Ends a durable function's run once its task was handed back (a sleep, a wait for a
    signal, a step's own retry): no worker holds it until it is due again. A BaseException,
    so that a function's ``except Exception`` does not swallow it; the dispatcher catches it
    (the delivery is settled already, as ``released``)."""


def describe_step(kind: StepKind, name: str) -> str:
    """A step as a message names it: ``step 'charge'``, ``wait 'confirmed'``, ``sleep``."""
    return "sleep" if kind == "sleep" else f"{kind} {name!r}"


class StepRun:
    """Where one run of a durable task stands in its step log."""

    __slots__ = ("log_bytes", "open", "position", "records", "running", "suspended", "task_id")

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        #: the log's records, once read (None before the first step)
        self.records: list[StepInfo] | None = None
        #: how many steps this run has passed (the position of the next one)
        self.position = 0
        #: the log's open record at ``position`` (a failed run, an open wait), or None
        self.open: StepInfo | None = None
        #: the idempotency key of the step whose body runs now (``ctx.step_id``)
        self.running: str | None = None
        #: True once the task was handed back: every later step call ends the run again
        self.suspended = False
        #: about how many bytes the log holds (``loaded``, ``committed_now``)
        self.log_bytes = 0

    def loaded(self, records: list[StepInfo]) -> None:
        """Take the log's records, read at the run's first step."""
        self.records = records
        self.log_bytes = sum(len(json.dumps(r.result)) + RECORD_BYTES for r in records)

    def room_for(self, name: str, result_bytes: int) -> None:
        """Unrecoverable when a result of ``result_bytes`` would take the log past
        MAX_LOG_BYTES."""
        if self.log_bytes + result_bytes + RECORD_BYTES > MAX_LOG_BYTES:
            raise Unrecoverable(
                f"task {self.task_id!r}: step {name!r} would take its steps' results past "
                f"{MAX_LOG_BYTES} bytes (each run reads them all); keep big results elsewhere "
                "and return a reference"
            )

    def next(self, kind: StepKind, name: str) -> StepInfo | None:
        """The committed record of the step the function asks for now (the run moves past
        it), or None when it must run (``open`` is then its open record, if any).
        NonDeterministic when the log holds another step at this position."""
        if self.suspended:
            raise Suspended
        if self.position >= MAX_STEPS:
            raise Unrecoverable(
                f"task {self.task_id!r} asked for step {self.position + 1}: a durable task has at "
                f"most {MAX_STEPS} steps (each run reads them all); split the work into tasks "
                "(a batch, or one task per item)"
            )
        assert self.records is not None  # (the context reads the log first)
        record = self.records[self.position] if self.position < len(self.records) else None
        if record is not None and (record.kind != kind or record.name != name):
            expected, found = describe_step(record.kind, record.name), describe_step(kind, name)
            raise NonDeterministic(
                f"task {self.task_id!r}: at position {self.position} this run asked for "
                f"{found}, but the task's step log holds {expected} there: the function's "
                "steps changed since the task began (deploy code whose steps match, or replay "
                "it from the start)",
                self.position,
                f"{record.kind} {record.name}",
                f"{kind} {name}",
            )
        if record is not None and record.state == "done":
            self.position += 1
            self.open = None
            return record
        self.open = record
        return None

    def head(self, kind: StepKind, name: str, now_ms: int, started_ms: int | None = None) -> str:
        """The JSON head (without its closing brace) of the record for the step at
        ``position`` (lua/include/step_log.lua), written at ``now_ms``: its name (none for a
        sleep), its runs when over one (one more than a failed run's), when it first began
        (an open record's start, else ``started_ms``, else now) and how long from then to now
        (``u``, so that its end is its start plus ``u`` however many runs it took)."""
        open_ = self.open
        started = open_.started_at if open_ is not None else None
        if started is not None:
            t0 = round(started.timestamp() * 1000)
        else:
            t0 = now_ms if started_ms is None else started_ms
        record: dict[str, object] = {} if kind == "sleep" else {"n": name}
        runs = self.runs()
        if runs > 1:
            record["a"] = runs
        record["t0"] = t0
        if now_ms > t0:
            record["u"] = now_ms - t0
        return json.dumps(record, separators=(",", ":"))[:-1]

    def runs(self) -> int:
        """The runs of the step at ``position`` counting the one under way."""
        open_ = self.open
        return open_.runs + 1 if open_ is not None and open_.state == "failed" else 1

    def age_s(self, now_ms: int) -> float:
        """Seconds since the step at ``position`` first ran (0 on its first run)."""
        started = self.open.started_at if self.open is not None else None
        return 0.0 if started is None else max(now_ms / 1000 - started.timestamp(), 0.0)

    def step_id(self, name: str) -> str:
        """The idempotency key of the step at ``position``: the same on every run of it."""
        return f"{self.task_id}/{self.position}/{name}"

    def committed_now(self, kind: StepKind, name: str, result: Any) -> None:
        """Record that the step at ``position`` was committed with ``result``; move past it."""
        record = StepInfo(self.position, kind, name, "done", result, self.runs())
        self.log_bytes += len(json.dumps(result)) + RECORD_BYTES
        assert self.records is not None
        if self.position < len(self.records):
            self.records[self.position] = record
        else:
            self.records.append(record)
        self.position += 1
        self.open = None

    def finish(self) -> None:
        """At the function's return: NonDeterministic when it returned before reaching every
        step the log holds committed (a step was taken out of the code)."""
        records = self.records or []
        if self.position < len(records) and records[self.position].state == "done":
            left = records[self.position]
            raise NonDeterministic(
                f"task {self.task_id!r}: this run returned after {self.position} step(s), but "
                f"the task's step log holds {describe_step(left.kind, left.name)} at position "
                f"{self.position}: the function's steps changed since the task began",
                self.position,
                f"{left.kind} {left.name}",
                "return",
            )


def result_json(name: str, value: Any) -> str:
    """A step's result as the JSON its record keeps; Unrecoverable when it is not JSON or too
    big (no retry changes what the body returns)."""
    try:
        return json_text(value, f"step {name!r}'s result", MAX_STEP_RESULT_BYTES)
    except PayloadError as exc:  # what the body returned: no retry changes it
        raise Unrecoverable(f"{exc} (store big results elsewhere and return a reference)") from None


def error_json(exc: BaseException) -> str:
    """A failed run's error as its record keeps it: ``"Type: message"``, shortened."""
    return json.dumps(f"{type(exc).__name__}: {exc}"[:MAX_STEP_ERROR_CHARS])


def duration_arg(ms: int) -> str:
    """A non-negative ms count as a script argument."""
    return str(max(int(ms), 0))
