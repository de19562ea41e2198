"""Turn the replies of inspect.lua and stats.lua into TaskInfo and QueueStats values."""

from __future__ import annotations

from typing import Any

from .clock import ms_datetime
from .envelope import decode_envelope
from .exceptions import PayloadError
from .failures import parse_error_records
from .task import QueueStats, TaskInfo, TaskState

_STATES: dict[str, TaskState] = {"scheduled": "scheduled", "leased": "leased", "dead": "dead"}


def text(value: bytes | str) -> str:
    """A Redis reply value as str, whether or not the client decodes responses."""
    return value.decode("utf-8") if isinstance(value, bytes) else value


def parse_meta(raw: bytes | str | None) -> tuple[int, int | None, int | None]:
    """A meta value "attempt|token|due_ms|first_ms" as (attempt, due ms, first-claim ms)."""
    if not raw:
        return 0, None, None
    attempt, _token, due, first = text(raw).split("|")
    return int(attempt), int(due) if due else None, int(first) if first else None


def task_infos(reply: list[Any]) -> list[TaskInfo]:
    """TaskInfo for each 6-tuple of inspect.lua's reply; missing tasks are left out."""
    infos = []
    for i in range(0, len(reply), 6):
        task_id, state, score, raw, meta_raw, errors_raw = reply[i : i + 6]
        state_name = text(state)
        if state_name in _STATES:
            infos.append(
                _task_info(
                    text(task_id), _STATES[state_name], int(score), raw, meta_raw, errors_raw
                )
            )
    return infos


def _task_info(
    task_id: str,
    state: TaskState,
    score: int,
    raw: bytes | str,
    meta_raw: bytes | str,
    errors_raw: bytes | str,
) -> TaskInfo:
    attempt, leased_due, first_ms = parse_meta(meta_raw)
    try:
        payload = decode_envelope(raw)
    except PayloadError:  # shown as raw text, so operators can see what is stored
        payload = (raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw) or None
    due_ms = {"scheduled": score, "leased": leased_due}.get(state)
    return TaskInfo(
        id=task_id,
        state=state,
        payload=payload,
        attempt=attempt,
        due_at=ms_datetime(due_ms) if due_ms is not None else None,
        first_claimed_at=ms_datetime(first_ms) if first_ms is not None else None,
        errors=parse_error_records(errors_raw),
        lease_deadline=ms_datetime(score) if state == "leased" else None,
        died_at=ms_datetime(score) if state == "dead" else None,
    )


def queue_stats(reply: list[Any]) -> QueueStats:
    """QueueStats from stats.lua's reply."""
    now_ms, scheduled, due_now, leased, dead, head = (int(x) for x in reply[:6])
    counters = {text(reply[i]): int(reply[i + 1]) for i in range(6, len(reply), 2)}
    counters.pop("lease_seq", None)
    return QueueStats(
        scheduled=scheduled,
        due_now=due_now,
        leased=leased,
        dead=dead,
        next_due_at=ms_datetime(head) if head >= 0 else None,
        oldest_due_lag_s=max(now_ms - head, 0) / 1000 if head >= 0 and due_now else 0.0,
        now=ms_datetime(now_ms),
        counters=counters,
    )
