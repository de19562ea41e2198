"""Key rotation (``q.rotate_key(to="k2")``, ``dueq rotate-key``): every stored payload sealed
with another key is encrypted again with key ``to``, online, in bounded batches.

Why this shape:

- **Online and resumable.** The tasks hash (every task in every state: scheduled, parked,
  leased, waiting, dead), the results hash (kept records of finished tasks, ``<header
  JSON>\\n<envelope>``: the envelope, the kept result, sealed error messages, the step log),
  the errors hash (error histories: ``Encrypted(errors=True)``), the steps hash (durable
  tasks' step logs and their step results, progress histories and their bodies) and the cron
  definitions hash (each definition's payload, sealed for its name) are walked in that order
  with HSCAN, ``batch`` fields per step, so no call holds Redis for long and workers keep
  running. The report's ``cursor``
  (``<hash>:<n>``: ``tasks:0``, ``steps:96``) says where to go on after a crash or a stop:
  HSCAN's guarantee (a field present for the whole walk is returned at least once) makes a
  resumed walk complete. A field returned twice is found on ``to`` the second time
  (``already``).
- **Nothing unreadable, ever.** Readers accept every key their codec lists, so a task is
  readable before its re-seal and after it; a crash between two batches leaves a mix of keys,
  every one readable. Drop the old key only once a walk reports ``done`` with no
  ``undecryptable``.
- **Never clobbers a change.** The re-seal runs here, in Python (Lua has no AES); the write is
  reseal.lua, which replaces a value only if it is still the one read (its SHA-1 compared in
  the script). A task acked, cancelled, replaced or re-scheduled with a new payload between
  the HSCAN and the write is skipped (``skipped``): its value is the newer one, sealed by a
  writer with the active key, or gone. Options, scores, leases and attempts are not touched:
  the head and name/trace line of a re-sealed envelope are the same bytes, and in an error
  history, a step log or a definition only a sealed value's own bytes change (the scripts
  append to the first two). A durable run whose commit of a step is sent again just as that
  step's line is re-sealed finds the line changed and reads its log again.
- **Compression is kept as it was** (the inner bytes are decrypted and encrypted again, not
  decompressed), so a process without zstd can rotate compressed tasks.
- **An undecryptable value is left as it was** and counted (its id listed), never dropped: it
  may be a key that was dropped too early, to be given back.

A sharded queue rotates each shard in turn (``ShardedCore.rotate_key_flow``), each with this
flow on its own keys.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Literal, cast

from dueq._flows.base import QueueBase
from dueq._flows.drive import Flow
from dueq._util.checks import whole_number
from dueq._wire import protocol as protocol
from dueq._wire.codec import (
    CRON_PURPOSE,
    ERROR_PURPOSE,
    PROGRESS_PURPOSE,
    RESULT_PURPOSE,
    SIGNAL_PURPOSE,
    TRACEBACK_PURPOSE,
    Encrypted,
    cron_binding,
    reseal_value,
    step_purpose,
)
from dueq._wire.envelope import reseal_envelope
from dueq.cron._spec import Spec
from dueq.exceptions import (
    ConfigurationError,
    CronError,
    InvalidTaskError,
    PayloadError,
)
from dueq.model import KeyRotation

#: Most fields one HSCAN step asks for and one reseal.lua call writes.
MAX_ROTATION_BATCH = 10_000
#: The hashes a walk goes through, in order, by their cursor's name.
_WALK: tuple[tuple[str, protocol.RotationHash], ...] = (
    ("tasks", "t"),
    ("results", "r"),
    ("errors", "e"),
    ("steps", "s"),
    ("cron", "c"),
)

Progress = Callable[[KeyRotation], Any]


def parse_rotation_cursor(cursor: object) -> tuple[int, int]:
    """(hash index in _WALK, HSCAN cursor) of a rotation cursor (None: the start);
    InvalidTaskError when it is not one a rotation returned."""
    if cursor is None:
        return 0, 0
    name, _, number = str(cursor).partition(":")
    names = [n for n, _ in _WALK]
    if not isinstance(cursor, str) or name not in names or not number.isdigit():
        raise InvalidTaskError(f"cursor {cursor!r} is not one a key rotation returned")
    return names.index(name), int(number)


def rotation_cursor(index: int, position: int) -> str | None:
    """The cursor of a walk at HSCAN ``position`` of hash ``index`` (None past the last)."""
    return None if index >= len(_WALK) else f"{_WALK[index][0]}:{position}"


Verdict = Literal["resealed", "already", "unsealed"]
Resealed = tuple[Verdict, "bytes | None"]


class _Values:
    """The sealed values (``seal_value``'s) of one stored text, each re-sealed with the same
    task and purpose, and the text with each one swapped where it stands: the rest stays
    byte for byte as it was (the scripts compare and append to some of these texts)."""

    def __init__(self, codec: Encrypted, to: str, queue: str, task_id: str) -> None:
        self.codec, self.to, self.queue, self.task_id = codec, to, queue, task_id
        self.verdicts: list[Verdict] = []
        self._swaps: list[tuple[bytes, bytes]] = []

    def add(self, value: Any, purpose: bytes) -> Any:
        """``value`` (a decoded JSON value) re-sealed when it is sealed with another key, else
        as it is."""
        verdict, resealed = reseal_value(
            value, self.codec, self.to, self.queue, self.task_id, purpose
        )
        self.verdicts.append(verdict)
        if verdict == "resealed":
            self._swaps.append((json.dumps(value).encode(), json.dumps(resealed).encode()))
        return resealed

    def add_errors(self, records: Any) -> None:
        """The sealed messages and tracebacks of a JSON list of error records (re-sealed in
        ``records`` too)."""
        for record in records if isinstance(records, list) else ():
            for name, purpose in (("message", ERROR_PURPOSE), ("traceback", TRACEBACK_PURPOSE)):
                if isinstance(record, dict) and name in record:
                    record[name] = self.add(record[name], purpose)

    def add_step_log(self, log: bytes) -> None:
        """The sealed values of a durable task's step log: one record a line, "D" a committed
        step whose result "r" is sealed for its position, "R" a wait whose signal "r" is."""
        for position, line in enumerate(log.split(b"\n")):
            record = _json(line[1:]) if line[:1] in (b"D", b"R") else None
            if isinstance(record, dict) and "r" in record:
                purpose = step_purpose(position) if line[:1] == b"D" else SIGNAL_PURPOSE
                self.add(record["r"], purpose)

    def add_progress(self, history: bytes) -> None:
        """The bodies of a task's progress history: one entry a line, ``<seq>\\t<ms>\\t<JSON>``,
        the body sealed for the task (``PROGRESS_PURPOSE``)."""
        for line in history.split(b"\n"):
            fields = line.split(b"\t", 2)
            if len(fields) == 3:
                self.add(_json(fields[2]), PROGRESS_PURPOSE)

    def verdict(self) -> Verdict:
        """ "resealed" if any value was, else "already" if any is on ``to``, else "unsealed"."""
        for verdict in ("resealed", "already"):
            if verdict in self.verdicts:
                return cast(Verdict, verdict)
        return "unsealed"

    def swapped(self, text: bytes) -> bytes:
        """``text`` with each re-sealed value in place of the one it was; PayloadError when a
        value is not there as JSON writes it (stored some other way: left, and reported)."""
        for old, new in self._swaps:
            if old not in text:
                raise PayloadError(f"a sealed value of {self.task_id!r} is stored unexpectedly")
            text = text.replace(old, new, 1)
        return text


def _json(raw: bytes) -> Any:
    """Stored JSON, or None when it is none (not ours: nothing in it is rotated)."""
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _record(raw: bytes, codec: Encrypted, to: str, queue: str, task_id: str) -> Resealed:
    """A finished record (``<header JSON>\\n<envelope>``) re-sealed: its envelope, and in its
    header the kept result, the sealed messages and tracebacks of its errors and the step
    results of its step log. A header with a value re-sealed is written anew (no script
    appends to it, and its step log is a JSON string cjson escaped: no place to swap in)."""
    head, newline, envelope = raw.partition(b"\n")
    if not newline:  # no record of ours: nothing sealed to rotate
        return "unsealed", None
    verdict, body = reseal_envelope(envelope, codec, to, queue, task_id)
    values = _Values(codec, to, queue, task_id)
    header = _json(head)
    if isinstance(header, dict):
        header["result"] = values.add(header.get("result"), RESULT_PURPOSE)
        values.add_errors(header.get("errors"))
        log = header.get("steps")
        if isinstance(log, str):
            steps = _Values(codec, to, queue, task_id)
            steps.add_step_log(log.encode("utf-8"))
            header["steps"] = steps.swapped(log.encode("utf-8")).decode("utf-8")
            values.verdicts += steps.verdicts
    if values.verdict() == "resealed":
        head = json.dumps(header, separators=(",", ":")).encode("ascii")
    values.verdicts.append(cast(Verdict, verdict))
    if values.verdict() != "resealed":
        return values.verdict(), None
    return "resealed", head + newline + (envelope if body is None else body)


def _errors(raw: bytes, codec: Encrypted, to: str, queue: str, task_id: str) -> Resealed:
    """A task's error history (a JSON list of records) with its sealed messages and
    tracebacks re-sealed (``Encrypted(errors=True)``)."""
    values = _Values(codec, to, queue, task_id)
    values.add_errors(_json(raw))
    verdict = values.verdict()
    return verdict, values.swapped(raw) if verdict == "resealed" else None


def _steps(raw: bytes, codec: Encrypted, to: str, queue: str, field: str) -> Resealed:
    """A field of the steps hash re-sealed: a durable task's step log (field ``<id>``: its
    step results and the signals its waits took), the signals it holds (``<id>\\0s``) or its
    progress history (``<id>\\0p``)."""
    task_id, _, letter = field.partition("\0")
    values = _Values(codec, to, queue, task_id)
    if letter == "s":  # the signals not taken yet: "<name>\\t<ms>\\t<payload JSON>" a line
        for line in raw.split(b"\n"):
            values.add(_json(line.split(b"\t", 2)[-1]), SIGNAL_PURPOSE)
    elif letter == "p":
        values.add_progress(raw)
    elif not letter:
        values.add_step_log(raw)
    verdict = values.verdict()
    return verdict, values.swapped(raw) if verdict == "resealed" else None


def _envelope(raw: bytes, codec: Encrypted, to: str, queue: str, task_id: str) -> Resealed:
    """A task's envelope re-sealed (``reseal_envelope``)."""
    verdict, body = reseal_envelope(raw, codec, to, queue, task_id)
    return cast(Verdict, verdict), body


def _definition(raw: bytes, codec: Encrypted, to: str, queue: str, name: str) -> Resealed:
    """A cron definition with its payload re-sealed, for its name (``CRON_PURPOSE``); one
    that cannot be read is left to cron's own checks (``Crons.list`` reports it)."""
    try:
        spec = Spec.from_json(raw)
    except CronError:
        return "unsealed", None
    values = _Values(codec, to, queue, cron_binding(name))
    values.add(spec.payload, CRON_PURPOSE)
    verdict = values.verdict()
    return verdict, values.swapped(raw) if verdict == "resealed" else None


#: How each hash's values are re-sealed: (value, codec, to, queue, field) -> (verdict, value
#: to write or None).
_RESEALS: dict[str, Callable[[bytes, Encrypted, str, str, str], Resealed]] = {
    "t": _envelope,
    "r": _record,
    "e": _errors,
    "s": _steps,
    "c": _definition,
}


class RotateFlows(QueueBase):
    """``rotate_key_flow``: this (plain) queue's stored payloads re-sealed with another key."""

    def rotation_codec(self, to: object) -> Encrypted:
        """The queue's codec, checked to know key ``to``; ConfigurationError otherwise."""
        codec = self.payload_codec.codec
        if codec is None:
            raise ConfigurationError(
                f"queue {self.name!r} has no codec: rotate_key needs "
                "codec=dueq.Encrypted(keys=..., active=...) holding the old keys and the new one"
            )
        if not isinstance(to, str) or not codec.knows(to):
            raise ConfigurationError(f"the queue's codec knows no key {to!r} to rotate to")
        return codec

    def rotate_key_flow(
        self, to: str, batch: int, cursor: str | None, progress: Progress | None
    ) -> Flow[KeyRotation]:
        """Re-seal from ``cursor`` to the end (see the module docstring); ``progress`` is
        called with the report so far after each batch."""
        codec = self.rotation_codec(to)
        whole_number(batch, "batch", low=1, high=MAX_ROTATION_BATCH)
        index, position = parse_rotation_cursor(cursor)
        report = KeyRotation(to, cursor=rotation_cursor(index, position))
        while index < len(_WALK):
            where = _WALK[index][1]
            part, after = yield from self.rotate_batch_flow(codec, to, where, position, batch)
            if after == 0:
                index, position = index + 1, 0
            else:
                position = after
            report = report.plus(replace(part, cursor=rotation_cursor(index, position)))
            if progress is not None:
                progress(report)
        return report

    def rotate_batch_flow(
        self, codec: Encrypted, to: str, where: protocol.RotationHash, position: int, batch: int
    ) -> Flow[tuple[KeyRotation, int]]:
        """One HSCAN step of hash ``where`` from ``position`` and the writes of what it found
        to re-seal: the counts of this step, and the next HSCAN cursor (0: that hash is done)."""
        after, found = yield protocol.rotation_scan(self.keys, where, position, batch)
        counts = {"already": 0, "unsealed": 0}
        bad: list[str] = []
        writes: list[protocol.Reseal] = []
        reseal = _RESEALS[where]
        for field, value in found:
            try:
                verdict, resealed = reseal(value, codec, to, self.name, field)
            except PayloadError:  # left as it is, reported: a key dropped too early (or garbage)
                bad.append(field)
                continue
            if resealed is None:
                counts[verdict] += 1
            else:
                writes.append(protocol.Reseal(where, field, value, resealed))
        verdicts = ""
        for start in range(0, len(writes), batch):
            verdicts += yield protocol.reseal(self.keys, writes[start : start + batch])
        part = KeyRotation(
            to,
            resealed=verdicts.count("w"),
            skipped=verdicts.count("s"),
            already=counts["already"],
            undecryptable=len(bad),
            unsealed=counts["unsealed"],
            undecryptable_ids=tuple(bad[: KeyRotation.MAX_LISTED]),
            batches=1,
        )
        return part, after
