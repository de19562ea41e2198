"""Key rotation (``q.rotate_key(to="k2")``, ``dueq rotate-key``): every stored payload sealed
with another key is encrypted again with key ``to``, online, in bounded batches.

Why this shape:

- **Online and resumable.** The tasks hash (every task in every state: scheduled, parked,
  leased, waiting, dead), the results hash (kept records of finished tasks, ``<header
  JSON>\\n<envelope>``: the envelope, the kept result and sealed error messages) and then
  the cron definitions hash (each definition's payload, sealed for its name) are walked with
  HSCAN, ``batch`` fields per step, so no call holds Redis for long and workers keep running.
  The report's ``cursor`` (``tasks:<n>``, ``results:<n>`` or ``cron:<n>``) says where to go
  on after a crash or a stop: HSCAN's guarantee (a field
  present for the whole walk is returned at least once) makes a resumed walk complete. A
  field returned twice is found on ``to`` the second time (``already``).
- **Nothing unreadable, ever.** Readers accept every key their codec lists, so a task is
  readable before its re-seal and after it; a crash between two batches leaves a mix of keys,
  every one readable. Drop the old key only once a walk reports ``done`` with no
  ``undecryptable``.
- **Never clobbers a change.** The re-seal runs here, in Python (Lua has no AES); the write is
  reseal.lua, which replaces a value only if it is still the one read (its SHA-1 compared in
  the script). A task acked, cancelled, replaced or re-scheduled with a new payload between
  the HSCAN and the write is skipped (``skipped``): its value is the newer one, sealed by a
  writer with the active key, or gone. Options, scores, leases and attempts are not touched:
  the head and name/trace line of a re-sealed envelope are the same bytes.
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
    RESULT_PURPOSE,
    TRACEBACK_PURPOSE,
    Encrypted,
    cron_binding,
    reseal_value,
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


def _record(raw: bytes, codec: Encrypted, to: str, queue: str, task_id: str) -> Resealed:
    """A finished record (``<header JSON>\\n<envelope>``) re-sealed: its envelope, and in its
    header the kept result and the sealed messages and tracebacks of its errors."""
    head, newline, envelope = raw.partition(b"\n")
    if not newline:  # no record of ours: nothing sealed to rotate
        return "unsealed", None
    verdicts: list[Verdict] = []
    verdict, body = reseal_envelope(envelope, codec, to, queue, task_id)
    verdicts.append(cast(Verdict, verdict))
    try:
        header = json.loads(head)
    except ValueError:  # not a header of ours: its envelope alone is rotated
        header = None
    if isinstance(header, dict):
        verdict, header["result"] = reseal_value(
            header.get("result"), codec, to, queue, task_id, RESULT_PURPOSE
        )
        verdicts.append(verdict)
        for error in header.get("errors") or ():
            for name, purpose in (("message", ERROR_PURPOSE), ("traceback", TRACEBACK_PURPOSE)):
                if isinstance(error, dict) and name in error:
                    verdict, error[name] = reseal_value(
                        error[name], codec, to, queue, task_id, purpose
                    )
                    verdicts.append(verdict)
    if "resealed" not in verdicts:
        return ("already" if "already" in verdicts else "unsealed"), None
    if isinstance(header, dict) and verdicts[1:].count("resealed"):
        head = json.dumps(header, separators=(",", ":")).encode("ascii")
    return "resealed", head + newline + (envelope if body is None else body)


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
    binding = cron_binding(name)
    verdict, payload = reseal_value(spec.payload, codec, to, queue, binding, CRON_PURPOSE)
    if verdict != "resealed":
        return verdict, None
    return verdict, replace(spec, payload=payload).to_json().encode("ascii")


#: How each hash's values are re-sealed: (value, codec, to, queue, field) -> (verdict, value
#: to write or None).
_RESEALS: dict[str, Callable[[bytes, Encrypted, str, str, str], Resealed]] = {
    "t": _envelope,
    "r": _record,
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
