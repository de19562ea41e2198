"""Occurrence ids: the task id of each firing of a cron definition, made and read back.

A slot's occurrence is the task ``cron:<name>:<slot in UTC>``, so every process keeping a
schedule writes the same id for the same slot; that shared id is what lets the ``cron_advance``
script move a schedule on by compare-and-set with no leader and no slot fired twice.

``run_now`` adds an extra occurrence, ``cron:<name>:now:<UTC second>:<8 hex>``. Its last
segment is never a slot label, so it cannot collide with a slot's id and claiming it never
moves the schedule (``parse_occurrence_id`` does not take it for a slot).

Pure functions of text and epoch ms: nothing here talks to Redis.
"""

from __future__ import annotations

import re
import secrets

from dueq._wire.codec import CRON_ID_PREFIX
from dueq.cron.expr import parse_slot_label, slot_label

#: Task ids of occurrences start with this (a codec reads occurrence ids too: ``_wire.codec``).
OCCURRENCE_PREFIX = CRON_ID_PREFIX
#: The last instant a slot may have (9999-12-31T23:59:59.999Z): Python's datetime ends there.
MAX_SLOT_MS = 253_402_300_799_999
_LABEL = re.compile(r"[0-9]{8}T[0-9]{6}Z")
#: The id of an extra occurrence from ``run_now``: name, the UTC second asked, a random part.
_RUN_NOW = re.compile(r"cron:(.+):now:([0-9]{8}T[0-9]{6}Z):([0-9a-f]{8})")


def occurrence_id(name: str, slot_ms: int) -> str:
    """The task id of one occurrence, e.g. ``cron:nightly-report:20260329T010000Z``."""
    return f"{OCCURRENCE_PREFIX}{name}:{slot_label(slot_ms)}"


def run_now_id(name: str, now_ms: int) -> str:
    """A fresh id for an extra occurrence, e.g. ``cron:nightly:now:20260329T011502Z:3fa2c1d0``."""
    return f"{OCCURRENCE_PREFIX}{name}:now:{slot_label(now_ms)}:{secrets.token_hex(4)}"


def parse_occurrence_id(task_id: str) -> tuple[str, int] | None:
    """(name, slot ms) of a slot's occurrence id, else None: also for a run-now id, whose last
    segment is no slot label (so claiming one never moves a schedule)."""
    if not task_id.startswith(OCCURRENCE_PREFIX):
        return None
    name, _, label = task_id[len(OCCURRENCE_PREFIX) :].rpartition(":")
    slot_ms = parse_slot_label(label)
    return None if not name or slot_ms is None or slot_ms < 0 else (name, slot_ms)


def parse_run_now_id(task_id: str) -> tuple[str, int] | None:
    """(name, ms of the second it was asked for) of a run-now occurrence id, else None."""
    extra = _RUN_NOW.fullmatch(task_id)
    asked_ms = None if extra is None else parse_slot_label(extra[2])
    if extra is None or asked_ms is None:
        return None
    return extra[1], asked_ms


def is_slot_id_of(name: str, task_id: str) -> bool:
    """True if ``task_id`` has the shape of a slot's occurrence id of definition ``name``
    (what the scripts' cron_state_read accepts as the pending occurrence)."""
    prefix = f"{OCCURRENCE_PREFIX}{name}:"
    return task_id.startswith(prefix) and _LABEL.fullmatch(task_id[len(prefix) :]) is not None
