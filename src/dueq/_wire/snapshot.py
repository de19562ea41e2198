"""Turn the replies of inspect.lua and stats.lua into TaskInfo and QueueStats values."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from dueq._util.clock import ms_datetime, stored_ms
from dueq._wire.codec import (
    ERROR_PURPOSE,
    NO_CODEC,
    RESULT_PURPOSE,
    SEALED_VALUE_MARK,
    SIGNAL_PURPOSE,
    TRACEBACK_PURPOSE,
    PayloadCodec,
    step_purpose,
)
from dueq._wire.envelope import NO_OPTIONS, decode_named, sealed_marker
from dueq._wire.failures import parse_error_records, token_holder
from dueq.exceptions import PayloadError
from dueq.model import (
    MAX_CONCURRENCY,
    MAX_EVENTS_MS,
    MAX_KEEP_RESULTS_MS,
    MAX_KEY_CONCURRENCY,
    MAX_KEY_LIMITS,
    MAX_RATE_N,
    MAX_RATE_PER_MS,
    MAX_REMEMBER_DONE_MS,
    MAX_WEIGHT,
    BatchInfo,
    ErrorRecord,
    KeyLimit,
    QueueSettings,
    QueueStats,
    Rate,
    StepInfo,
    StepKind,
    StepState,
    TaskInfo,
    TaskState,
    TenantShare,
)

#: Largest count read back from Redis (beyond it a stored number is corrupted).
MAX_COUNT = 2**53

_STATES: dict[str, TaskState] = {
    "scheduled": "scheduled",
    "leased": "leased",
    "waiting": "waiting",
    "dead": "dead",
    "done": "done",
    "cancelled": "cancelled",
    "expired": "expired",
}


def text(value: bytes | str) -> str:
    """A Redis reply value as str, whether or not the client decodes responses."""
    return value.decode("utf-8") if isinstance(value, bytes) else value


def parse_meta(raw: bytes | str | None) -> tuple[int, int | None, int | None]:
    """A meta value "attempt|token|due_ms|first_ms" (a leased task with a limit key has
    "|<key>" after it) as (attempt, due ms, first-claim ms); parts that cannot be read
    (corrupted data) come back as 0 or None, never an error."""
    attempt, _token, due, first = _meta_parts(raw)
    return _count(attempt), stored_ms(due) if due else None, stored_ms(first) if first else None


def _meta_parts(raw: bytes | str | None) -> list[str]:
    """The first four parts of a meta value (empty strings when it cannot be read); a leased
    task with a limit key has a fifth, its key (which may hold "|")."""
    try:
        parts = text(raw).split("|", 4) if raw else []
    except UnicodeDecodeError:
        parts = []
    return parts[:4] if len(parts) >= 4 else ["0", "", "", ""]


def meta_holder(raw: bytes | str | None) -> str | None:
    """The holder named by a meta value's lease token ("<seq>@<holder>"), or None."""
    return token_holder(_meta_parts(raw)[1])


def _count(raw: object) -> int:
    """A stored count (attempts, a counter) as an int from 0 to 2**53; 0 when unreadable."""
    try:
        value = int(text(raw) if isinstance(raw, (bytes, str)) else str(raw))
    except (ValueError, UnicodeDecodeError):
        return 0
    return min(max(value, 0), MAX_COUNT)


def task_infos(reply: list[Any], codec: PayloadCodec = NO_CODEC, queue: str = "") -> list[TaskInfo]:
    """TaskInfo for each 6-tuple of list_tasks.lua's reply; missing tasks are left out. Sealed
    payloads are opened with ``codec`` as tasks of ``queue`` (see ``_task_info``)."""
    infos = []
    for i in range(0, len(reply), 6):
        task_id, state, score, raw, meta_raw, errors_raw = reply[i : i + 6]
        state_name = text(state)
        if state_name in _STATES:
            infos.append(
                _task_info(
                    text(task_id),
                    _STATES[state_name],
                    stored_ms(score),
                    raw,
                    meta_raw,
                    errors_raw,
                    codec=codec,
                    queue=queue,
                )
            )
    return infos


def inspected(reply: list[Any], codec: PayloadCodec = NO_CODEC, queue: str = "") -> list[TaskInfo]:
    """TaskInfo for each 7-tuple of inspect.lua's reply (list_tasks.lua's six, then the step
    log of a durable task); missing tasks are left out (``codec``: as ``task_infos``)."""
    infos = []
    for i in range(0, len(reply), 7):
        task_id, state, score, raw, meta_raw, errors_raw, log = reply[i : i + 7]
        state_name = text(state)
        if state_name in _STATES:
            infos.append(
                _task_info(
                    text(task_id),
                    _STATES[state_name],
                    stored_ms(score),
                    raw,
                    meta_raw,
                    errors_raw,
                    log,
                    codec=codec,
                    queue=queue,
                )
            )
    return infos


#: The deadline park.lua gives a wait without a timeout (9999-12-31T23:59:59Z).
NEVER_MS = 253402300799000

#: A step log line's letter: the kind and state of its record (lua/include/step_log.lua).
_LETTERS: dict[str, tuple[StepKind, StepState]] = {
    "D": ("step", "done"),
    "F": ("step", "failed"),
    "S": ("sleep", "done"),
    "R": ("wait", "done"),
    "W": ("wait", "waiting"),
}


def step_infos(
    raw: bytes | str | None,
    codec: PayloadCodec = NO_CODEC,
    queue: str = "",
    task_id: str = "",
    *,
    strict: bool = False,
) -> list[StepInfo]:
    """The records of a durable task's step log (lua/include/step_log.lua: one per line, a
    letter and a JSON object), in order. A line that cannot be read (hand-edited) ends the
    list there: what follows it cannot be trusted to line up with the function's steps.
    A step's sealed result is opened with ``codec`` as task ``task_id`` of ``queue`` at its
    position; one that cannot be is its SealedMarker, or with ``strict`` (a run of the task,
    which must not go on with a wrong value) raises UndecryptableTask (or PayloadError)."""
    if not raw:
        return []
    steps: list[StepInfo] = []
    for line in (raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw).split("\n"):
        found = _LETTERS.get(line[:1])
        try:
            record = json.loads(line[1:]) if found else None
        except ValueError:
            record = None
        if not isinstance(record, dict) or found is None:
            break
        kind, state = found
        error = record.get("e")
        started = _ms_or_none(record.get("t0"))
        took = _ms_or_none(record.get("u"))
        ended = _ms_or_none(record.get("t1"))
        if ended is None and started is not None and state != "waiting":
            ended = started + (took or 0)  # ("u" is left out for a body under a ms)
        deadline = _ms_or_none(record.get("d"))
        if deadline == NEVER_MS:  # a wait without a timeout
            deadline = None
        result = record.get("r")
        if kind in ("step", "wait") and result is not None:  # a step's result, a signal taken
            purpose = step_purpose(len(steps)) if kind == "step" else SIGNAL_PURPOSE
            if strict:
                result = codec.open_value(result, queue, task_id, purpose)
            else:
                result = codec.shown_value(result, queue, task_id, purpose)
        steps.append(
            StepInfo(
                position=len(steps),
                kind=kind,
                name="sleep" if kind == "sleep" else str(record.get("n", "")),
                state=state,
                result=result,
                runs=max(_count(record.get("a", 1)), 1),
                started_at=_datetime(started),
                ended_at=_datetime(ended),
                error=error if isinstance(error, str) else None,
                deadline=_datetime(deadline),
                timed_out=record.get("x") == 1,
            )
        )
    return steps


def _kept_log(head: dict[str, Any]) -> str | None:
    """The step log a finished record keeps (results.lua), or None."""
    log = head.get("steps")
    return log if isinstance(log, str) else None


def _ms_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def finished_header(raw: bytes | str) -> dict[str, Any]:
    """The header of a finished record (see lua/include/results.lua): state,
    finished_ms, attempt, result and maybe unstored; {} when it cannot be read."""
    try:
        head = json.loads(raw)
    except ValueError:  # corrupted (hand-edited): shown without its result
        return {}
    return head if isinstance(head, dict) else {}


def _task_info(
    task_id: str,
    state: TaskState,
    score: int | None,
    raw: bytes | str,
    meta_raw: bytes | str,
    errors_raw: bytes | str,
    log: bytes | str | None = None,
    *,
    codec: PayloadCodec = NO_CODEC,
    queue: str = "",
) -> TaskInfo:
    head: dict[str, Any] = {}
    if state in ("done", "cancelled", "expired"):  # a kept record: its header is in the meta slot
        head, meta_raw = finished_header(meta_raw), b""
    attempt, leased_due, first_ms = parse_meta(meta_raw)
    if head:
        attempt = _count(head.get("attempt", 0))
    unstored = head.get("unstored")
    if isinstance(head.get("errors"), list):  # a kept record's error history
        errors_raw = json.dumps(head["errors"])
    options = NO_OPTIONS
    task_name = None
    try:
        payload, options, _, task_name = decode_named(raw, codec, queue, task_id)
    except PayloadError:  # shown as raw text, so operators can see what is stored
        # (an encrypted payload this codec cannot open as its marker, never its bytes)
        payload = sealed_marker(raw) or (
            (raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw) or None
        )
    due_ms = {"scheduled": score, "leased": leased_due, "waiting": score}.get(state)
    return TaskInfo(
        id=task_id,
        state=state,
        payload=payload,
        attempt=attempt,
        due_at=_datetime(due_ms),
        first_claimed_at=_datetime(first_ms),
        errors=shown_errors(parse_error_records(errors_raw), codec, queue, task_id),
        lease_deadline=_datetime(score) if state == "leased" else None,
        died_at=_datetime(score) if state == "dead" else None,
        priority=options.priority,
        key=options.key,
        fair_key=options.fair_key,
        timeout=None if options.timeout_ms is None else timedelta(milliseconds=options.timeout_ms),
        max_attempts=options.max_attempts,
        expires_at=None if options.expires_ms is None else ms_datetime(options.expires_ms),
        holder=meta_holder(meta_raw) if state == "leased" else None,
        result=codec.shown_value(head.get("result"), queue, task_id, RESULT_PURPOSE),
        finished_at=_datetime(score) if state in ("dead", "done", "cancelled", "expired") else None,
        result_unstored=unstored if isinstance(unstored, str) else None,
        task_name=task_name,
        steps=tuple(step_infos(log or _kept_log(head), codec, queue, task_id)),
    )


def shown_errors(
    records: list[ErrorRecord], codec: PayloadCodec, queue: str, task_id: str
) -> list[ErrorRecord]:
    """Error records with sealed messages and tracebacks (``Encrypted(errors=True)``) opened
    with ``codec``, or shown as their markers when it cannot open them."""
    shown = []
    for record in records:
        if record.message.startswith(SEALED_VALUE_MARK) or (record.traceback or "").startswith(
            SEALED_VALUE_MARK
        ):
            message = codec.shown_value(record.message, queue, task_id, ERROR_PURPOSE)
            trace = record.traceback
            if trace is not None:
                trace = codec.shown_value(trace, queue, task_id, TRACEBACK_PURPOSE)
            record = replace(record, message=str(message), traceback=trace)
        shown.append(record)
    return shown


def _datetime(ms: int | None) -> datetime | None:
    return None if ms is None else ms_datetime(ms)


#: setting_value's answer for a stored value the scripts refuse.
REJECTED: Any = object()

_WHOLE = re.compile(r"[0-9]{1,15}")
_RATE = re.compile(r"([0-9]+)/([0-9]+)")
_KEY_LIMIT = re.compile(r"([0-9]*)\|(.*)", re.DOTALL)

#: The prefix of a config field holding one named key's limits ("key_limit:<key>").
KEY_LIMIT_PREFIX = "key_limit:"
#: Config fields weight:<key>: a tenant's weight on a fair queue (lua/include/fair.lua).
WEIGHT_PREFIX = "weight:"


def _whole(raw: str, low: int, high: int) -> int | None:
    if _WHOLE.fullmatch(raw) is None:
        return None
    n = int(raw)
    return n if low <= n <= high else None


def setting_value(field: str, raw: str) -> Any:
    """A stored setting as the scripts read it (setting_parse in lua/include/settings.lua, the same
    rules): paused -> bool, rate and key_rate -> (n, per_ms), key_concurrency and
    remember_done_ms and concurrency -> int, key_limit:<key> -> KeyLimit; REJECTED for a value
    they refuse (they run as if it were unset). A field without a rule comes back as it is."""
    value: Any = None
    if field == "paused":
        if raw in ("0", "1"):
            return raw == "1"
    elif field in ("rate", "key_rate"):
        value = _rate_value(raw)
    elif field == "key_concurrency":
        value = _whole(raw, 1, MAX_KEY_CONCURRENCY)
    elif field == "remember_done_ms":
        value = _whole(raw, 0, MAX_REMEMBER_DONE_MS)
    elif field == "keep_results_ms":
        value = _whole(raw, 0, MAX_KEEP_RESULTS_MS)
    elif field == "events_ms":
        value = _whole(raw, 0, MAX_EVENTS_MS)
    elif field == "concurrency":
        value = _whole(raw, 1, MAX_CONCURRENCY)
    elif field == "key_limits":  # configure.lua's count of key_limit:<key> fields
        value = _whole(raw, 0, MAX_KEY_LIMITS)
    elif field.startswith(KEY_LIMIT_PREFIX):
        value = _key_limit_value(raw)
    elif field == "fairness":  # "off": turned off while lanes remain (read as off)
        value = raw if raw in ("key", "off") else None
    elif field.startswith(WEIGHT_PREFIX):
        value = _whole(raw, 1, MAX_WEIGHT)
    else:
        return raw
    return REJECTED if value is None else value


def _rate_value(raw: str) -> tuple[int, int] | None:
    parts = _RATE.fullmatch(raw)
    if parts is None:
        return None
    n = _whole(parts[1], 1, MAX_RATE_N)
    per_ms = _whole(parts[2], 1, MAX_RATE_PER_MS)
    return None if n is None or per_ms is None else (n, per_ms)


def _key_limit_value(raw: str) -> KeyLimit | None:
    """A key_limit:<key> value "<concurrency>|<n>/<per_ms>" (either part empty, not both)."""
    parts = _KEY_LIMIT.fullmatch(raw)
    if parts is None or (not parts[1] and not parts[2]):
        return None
    concurrency = _whole(parts[1], 1, MAX_KEY_CONCURRENCY) if parts[1] else None
    rate = _rate_value(parts[2]) if parts[2] else None
    if (parts[1] and concurrency is None) or (parts[2] and rate is None):
        return None
    return KeyLimit(concurrency=concurrency, rate=_rate(rate))


def key_limit_text(limit: KeyLimit) -> str:
    """The stored form of a KeyLimit's limits (the config field key_limit:<key>; its weight is
    the field weight:<key>), "" when it has none (the field is removed)."""
    if not limit.limits:
        return ""
    concurrency = "" if limit.concurrency is None else str(limit.concurrency)
    rate = "" if limit.rate is None else f"{limit.rate.n}/{limit.rate.per_ms}"
    return f"{concurrency}|{rate}"


def settings_from_reply(reply: list[Any]) -> QueueSettings:
    """QueueSettings from a config hash's fields and values (HGETALL as a flat list): what the
    scripts enforce, and in ``rejected`` the values they refuse. Fields dueq does not know
    (written by a newer dueq, say) are left out."""
    raw = {text(reply[i]): _setting_text(reply[i + 1]) for i in range(0, len(reply) - 1, 2)}
    values: dict[str, Any] = {}
    rejected: dict[str, str] = {}
    names = ["paused", "rate", "key_rate", "key_concurrency", "remember_done_ms", "concurrency"]
    names += ["keep_results_ms", "events_ms", "fairness"]
    names += sorted(name for name in raw if name.startswith((KEY_LIMIT_PREFIX, WEIGHT_PREFIX)))
    for name in names:
        if name in raw:
            value = setting_value(name, raw[name])
            if value is REJECTED:
                rejected[name] = raw[name]
            else:
                values[name] = value
    key_limits: dict[str, KeyLimit] = {
        name[len(KEY_LIMIT_PREFIX) :]: value
        for name, value in values.items()
        if name.startswith(KEY_LIMIT_PREFIX)
    }
    for name, weight in values.items():
        if name.startswith(WEIGHT_PREFIX):
            key = name[len(WEIGHT_PREFIX) :]
            limit = key_limits.get(key)
            key_limits[key] = (
                KeyLimit(weight=weight)
                if limit is None
                else KeyLimit(limit.concurrency, limit.rate, weight)
            )
    done_ms = values.get("remember_done_ms", 0)
    keep_ms = values.get("keep_results_ms", 0)
    events_ms = values.get("events_ms", 0)
    return QueueSettings(
        paused=values.get("paused", False),
        remember_done=timedelta(milliseconds=done_ms) if done_ms > 0 else None,
        keep_results=timedelta(milliseconds=keep_ms) if keep_ms > 0 else None,
        events=timedelta(milliseconds=events_ms) if events_ms > 0 else None,
        rate=_rate(values.get("rate")),
        key_rate=_rate(values.get("key_rate")),
        key_concurrency=values.get("key_concurrency"),
        concurrency=values.get("concurrency"),
        key_limits=key_limits,
        rejected=rejected,
        fairness="key" if values.get("fairness") == "key" else None,
    )


def _setting_text(value: bytes | str) -> str:
    """A stored setting as text; bytes that are not UTF-8 are replaced (no rule accepts them)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _rate(value: tuple[int, int] | None) -> Rate | None:
    return None if value is None else Rate(value[0], per=value[1] / 1000)


def settings_from_hash(reply: Any) -> QueueSettings:
    """QueueSettings from HGETALL as redis-py returns it (a dict, or a flat list)."""
    if isinstance(reply, dict):
        return settings_from_reply([x for pair in reply.items() for x in pair])
    return settings_from_reply(list(reply))


def queue_stats(reply: list[Any]) -> QueueStats:
    """QueueStats from stats.lua's reply (a corrupted counter reads as 0)."""
    now_ms, scheduled, due_now, leased, dead, head, stored = (int(x) for x in reply[:7])
    settings = settings_from_reply(reply[7])
    waiting = int(reply[8])
    fair_lanes, fair_claimed, tenants = _tenant_shares(reply[9])
    counters = {text(reply[i]): _count(reply[i + 1]) for i in range(10, len(reply), 2)}
    counters.pop("lease_seq", None)
    counters.pop("rate_in_window", None)  # claim.lua's running sum of the rate window
    for name in [name for name in counters if name.startswith("rejected:")]:
        del counters[name]  # the last refused setting logged (lua/include/settings.lua)
    return QueueStats(
        scheduled=scheduled,
        due_now=due_now,
        leased=leased,
        dead=dead,
        next_due_at=ms_datetime(head) if head >= 0 else None,
        oldest_due_lag_s=max(now_ms - head, 0) / 1000 if head >= 0 and due_now else 0.0,
        now=ms_datetime(now_ms),
        counters=counters,
        missing=max(scheduled + leased + dead + waiting - stored, 0),
        settings=settings,
        waiting=waiting,
        fair_lanes=fair_lanes,
        fair_claimed=fair_claimed,
        tenants=tenants,
    )


def _tenant_shares(part: list[Any]) -> tuple[int, int, tuple[TenantShare, ...]]:
    """stats.lua's tenants: {tenants with due tasks, all claimed, tenant, due, claimed, ...}."""
    lanes, total = int(part[0]), int(part[1])
    shares = [
        TenantShare(
            text(part[i]),
            int(part[i + 1]),
            int(part[i + 2]),
            round(int(part[i + 2]) / total, 4) if total else 0.0,
        )
        for i in range(2, len(part) - 2, 3)
    ]
    shares.sort(key=lambda t: (-t.due, -t.claimed, t.tenant))
    return lanes, total, tuple(shares)


def batch_info(batch_id: bytes | str, raw: bytes | str | None) -> BatchInfo | None:
    """A batch record of the batches hash (lua/include/batches.lua), or None for none:
    "total|acked|dead|cancelled|expired|created_ms|closed_ms|completed_ms", then "|1" when its
    completion task's id was taken when it completed."""
    if raw is None:
        return None
    parts = (text(raw).split("|") + [""] * 9)[:9]
    counts = [_count(p) for p in parts[:5]]
    times = [_datetime(int(p)) if p.isdigit() else None for p in parts[5:8]]
    total, acked, dead, cancelled, expired = counts
    return BatchInfo(
        id=text(batch_id),
        total=total,
        acked=acked,
        dead=dead,
        cancelled=cancelled,
        expired=expired,
        pending=max(0, total - acked - dead - cancelled - expired),
        complete=times[2] is not None,
        created_at=times[0],
        closed_at=times[1],
        completed_at=times[2],
        completion_taken=parts[8] == "1",
    )
