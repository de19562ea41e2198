"""Task ids, the envelope a payload is stored in, and the packed form of a schedule batch.

Stored form: a format-version prefix, then the payload as compact UTF-8 JSON::

    1:{"to":"a@example.com"}

A task scheduled with options (priority, limit key, timeout, max_attempts) carries them in a
version-2 head before the payload, one line the scripts read with one pattern match::

    2:<priority>|<timeout ms>|<max attempts>|<key>\n{"to":"a@example.com"}

(empty fields are unset; compact JSON never holds a raw newline, and keys may not). Tasks
without options keep the version-1 form, so options cost nothing unless they are used.

A task with an expiry (``expires=``: never started after it) carries a version-3 head, the
version-2 fields with the expiry (epoch ms) before the key::

    3:<priority>|<timeout ms>|<max attempts>|<expires ms>|<key>\n{"to":"a@example.com"}

A new version rather than a fifth version-2 field: a key may hold ``|``, and a reader from
before expiries refuses a ``3:`` envelope (PayloadError) instead of running a task whose
expiry it cannot see. Tasks without an expiry are stored exactly as before. (The schedule
record may carry the expiry as ms from now, FLAG_EXPIRES_RELATIVE: schedule.lua makes it epoch
ms on the queue's clock.)

A task with a ``fair_key`` (the tenant a fair queue shares its claims between, when it is not
the limit key) keeps it in the key field after the unit separator ``\x1f``, the limit key (if
any) before it::

    2:0|||acme/reports\x1facme\n{"to":"a@example.com"}

Keys hold no control characters, so the separator is never part of one; the scripts split the
field where they read the key (include/levels.lua). A reader from before fair keys sees
``acme/reports\x1facme`` as the task's limit key: it runs the task, counting it under that name.

A task scheduled inside a trace (OpenTelemetry, see ``_tracing``) carries the W3C trace
context it was created in as one more head line, after either version's head::

    1:~00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\n{"to":"a@example.com"}
    2:0|||key\n~<traceparent> <tracestate>\n{"to":"a@example.com"}

``~`` cannot start a JSON text, so one byte tells whether a trace line is there; the
traceparent has no spaces, so the first space (if any) ends it and starts the tracestate. The
scripts read only the first line (options), so they need no change for it, and an untraced
task is stored exactly as before. A trace line that is unreadable (corrupted in Redis) reads
as no trace: it never costs the task.

A named task (``@q.task``, ``schedule(..., task="send_welcome")``) carries its name in that same
head line, after ``~@``, followed by the trace context when there is one::

    1:~@send_welcome\n{"to":"a@b.c"}
    2:0|||key\n~@send_welcome 00-4bf9...-01\n{"to":"a@b.c"}

One line, not two, so that readers that know only trace lines still read the payload: to them
the name line is an unreadable trace line (the task loses its trace link there, never its
payload), and list_tasks.lua skips it as it skips a trace line. A task without a name is stored
exactly as before. Names are 1 to MAX_TASK_NAME_CHARS characters of ``[A-Za-z0-9_.:<>/-]``
(no space, so the first space ends the name), starting with a letter, digit or ``_``.

A payload written by a queue with a codec (``Queue(..., codec=, compression=)``) is sealed: after
the head and name/trace lines comes a codec line and the compressed and/or encrypted bytes
(``%z|k2\n...``; ``_wire/codec.py`` has the format and its reasons). Heads and names stay
plaintext, so the scripts read them as before.

A prefix rather than a JSON wrapper keeps every task 12 bytes smaller while still letting a
reader refuse a format it does not know. Payloads are JSON only (never pickle). Encoding happens
before anything is written, so a bad payload raises PayloadError and leaves Redis untouched.

Nesting is limited to MAX_PAYLOAD_DEPTH at schedule time: Python's JSON decoder recurses, and a
payload that encodes fine near the interpreter's recursion limit can fail to decode in a
consumer whose stack is already deeper. Reading never raises anything but PayloadError,
whatever is stored, so one bad value costs only its own task.
"""

from __future__ import annotations

import base64
import functools
import json
import json.scanner
import os
import re
import struct
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

from dueq._wire.codec import NO_CODEC, SEAL_MARK, Encrypted, PayloadCodec, reseal, sealed_info
from dueq.exceptions import InvalidTaskError, PayloadError

ENVELOPE_PREFIX = b"1:"
OPTIONS_PREFIX = b"2:"
#: Priorities run from 0 (the default) to MAX_PRIORITY; among due tasks the higher runs first.
MAX_PRIORITY = 9
MAX_KEY_BYTES = 200
#: The longest per-task timeout (a year): longer is a mistake, not a limit.
MAX_TIMEOUT_MS = 366 * 86_400_000
MAX_TASK_ATTEMPTS = 1_000_000
_OPTIONS_HEAD = re.compile(rb"2:([0-9])\|([0-9]{0,12})\|([0-9]{0,7})\|([^\n]{0,800})\n")
_EXPIRY_HEAD = re.compile(
    rb"3:([0-9])\|([0-9]{0,12})\|([0-9]{0,7})\|([0-9]{1,15})\|([^\n]{0,800})\n"
)
EXPIRY_PREFIX = b"3:"
#: Between a task's limit key and its fair key in the head's key field (keys hold no control
#: characters, so the unit separator cannot be part of either).
FAIR_MARK = b"\x1f"
#: The first byte of a trace line (see the module docstring): no JSON text starts with it.
TRACE_MARK = b"~"
#: The longest a version-2 head may be, with its newline (its key is at most 800 bytes).
_HEAD_MAX_BYTES = 900
#: The longest tracestate kept with a task; a longer one is dropped (the traceparent is kept).
#: 512 characters is what the W3C Trace Context spec asks every vendor to propagate.
MAX_TRACESTATE_CHARS = 512
_TRACE_LINE = re.compile(  # traceparent, then a space and the tracestate if there is one
    r"([0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2})(?: ([\x20-\x7e]{1,512}))?"
)
MAX_ID_BYTES = 512
#: The mark after TRACE_MARK that starts a task name (see the module docstring).
NAME_MARK = b"@"
MAX_TASK_NAME_CHARS = 200
_TASK_NAME = re.compile(rf"[A-Za-z0-9_][A-Za-z0-9_.:<>/-]{{0,{MAX_TASK_NAME_CHARS - 1}}}")
DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
#: Deepest nesting of arrays and objects a payload may have.
MAX_PAYLOAD_DEPTH = 128

#: Generated ids: 12 URL-safe characters (72 random bits), small enough for Redis to store in
#: its 16-byte allocation class. The schedule script reports a generated id that already
#: exists, and the client retries it with a new one, so a collision never drops a task.
GENERATED_ID_CHARS = 12
_ID_BATCH = 1024

#: Flags of a packed task record (see schedule.lua).
FLAG_ABSOLUTE = 1
FLAG_GENERATED_ID = 2
#: Debounced: the due field is the debounce delay, and a max-wait ms follows the envelope.
FLAG_DEBOUNCE = 4
#: The envelope's expiry is ms from now (schedule.lua makes it epoch ms).
FLAG_EXPIRES_RELATIVE = 8
_MAX_WAIT = struct.Struct(">d")
#: The record names a batch: '>Hc0' after the envelope (and the max wait; see docs/batches.md).
FLAG_BATCH = 16
#: The record names parents it waits for: '>I' count, then '>Hc0' per parent id, after the
#: batch; bit FLAG_AFTER_RUN too: it runs whatever its parents end as (docs/dependencies.md).
FLAG_AFTER = 32
FLAG_AFTER_RUN = 64
_RECORD_HEAD = struct.Struct(">BdH")
_PAYLOAD_LENGTH = struct.Struct(">I")

_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode
#: JSON strings (with their escapes) and brackets, for measuring nesting outside strings.
_JSON_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]')


#: The end of an id (or key) that carries a route: ``~k`` and 16 lowercase hex digits, the
#: route of the limit key it was made for (``dueq.keyed_id``). On a sharded queue such an id
#: lies where that key lies, for every shard count (``dueq.sharding.layout``).
ROUTE_MARK = "~k"
ROUTE_CHARS = len(ROUTE_MARK) + 16
_HEX = frozenset("0123456789abcdef")


def route_ending(text: str) -> str:
    """The route ``text`` ends in (``~k`` and 16 lowercase hex digits), or ``""``."""
    marked = len(text) > ROUTE_CHARS and text[-ROUTE_CHARS:-16] == ROUTE_MARK
    return text[-ROUTE_CHARS:] if marked and _HEX.issuperset(text[-16:]) else ""


def generated_ids() -> Iterator[str]:
    """An endless stream of random task ids, drawn from the OS in growing batches.

    Not shared between threads: each caller makes its own stream.
    """
    width = GENERATED_ID_CHARS * 3 // 4
    batch = 8
    while True:
        text = base64.urlsafe_b64encode(os.urandom(width * batch)).decode("ascii")
        for start in range(0, len(text), GENERATED_ID_CHARS):
            yield text[start : start + GENERATED_ID_CHARS]
        batch = _ID_BATCH


def validate_id(task_id: object) -> str:
    """Return ``task_id`` if it is a usable id, else raise InvalidTaskError."""
    if not isinstance(task_id, str):
        raise InvalidTaskError(f"task id must be a str, got {type(task_id).__name__}")
    if not task_id:
        raise InvalidTaskError("task id must not be empty")
    if not task_id.isascii():
        try:
            size = len(task_id.encode("utf-8"))
        except UnicodeEncodeError as exc:  # a lone surrogate: not UTF-8, Redis cannot store it
            raise InvalidTaskError(
                f"task id {task_id[:40]!r} is not valid Unicode text ({exc.reason})"
            ) from None
    else:
        size = len(task_id)
    if size > MAX_ID_BYTES:
        raise InvalidTaskError(f"task id is longer than {MAX_ID_BYTES} bytes")
    return task_id


def validate_task_name(name: object) -> str:
    """``name`` if it can name a task (see the module docstring), else InvalidTaskError."""
    if not isinstance(name, str):
        raise InvalidTaskError(f"task name must be a str, got {type(name).__name__}")
    if _TASK_NAME.fullmatch(name) is None:
        if not name or len(name) > MAX_TASK_NAME_CHARS:
            raise InvalidTaskError(
                f"task name must be 1 to {MAX_TASK_NAME_CHARS} characters, got {len(name)}"
            )
        raise InvalidTaskError(
            f"task name {name[:60]!r} may hold only ASCII letters, digits and _ . : < > / -, "
            "and must start with a letter, digit or _ (pass name= to choose another)"
        )
    return name


def name_line(task_name: str, trace: bytes = b"") -> bytes:
    """The head line that stores a (validated) task name and, if ``trace`` is a trace line
    (``TraceContext.line``), its trace context."""
    if trace:
        return b"~@%s %s" % (task_name.encode("ascii"), trace[1:])
    return b"~@%s\n" % task_name.encode("ascii")


def nests_too_deep(data: bytes) -> bool:
    """True when arrays and objects nest deeper than MAX_PAYLOAD_DEPTH in a JSON text
    (brackets inside strings do not count)."""
    if data.count(b"[") + data.count(b"{") <= MAX_PAYLOAD_DEPTH:  # the usual case, at C speed
        return False
    depth = 0
    for match in _JSON_TOKENS.finditer(data):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
            if depth > MAX_PAYLOAD_DEPTH:
                return True
        elif token in (b"]", b"}"):
            depth -= 1
    return False


class TaskOptions(NamedTuple):
    """What a producer states about one task, kept with it (see the module docstring).

    ``key`` names the limit group the queue's ``key_rate`` and ``key_concurrency`` apply to;
    ``timeout_ms`` and ``max_attempts`` override the consumer's for this task. (A NamedTuple:
    a consumer makes one per delivery, and a frozen dataclass costs three times as much.)
    """

    priority: int = 0
    key: str | None = None
    timeout_ms: int | None = None
    max_attempts: int | None = None
    #: epoch ms after which the task never starts (as stored; ms from now while scheduling
    #: with FLAG_EXPIRES_RELATIVE)
    expires_ms: int | None = None
    #: the tenant the queue's fairness shares claims between (``fair_key=``), when it is not
    #: the limit key; stored after the key as ``<key>\x1f<fair key>`` (see the module docstring)
    fair_key: str | None = None

    def head(self) -> bytes:
        """The envelope prefix that stores these options."""
        if self == NO_OPTIONS:
            return ENVELOPE_PREFIX
        key = b"" if self.key is None else self.key.encode("utf-8")
        if self.fair_key is not None:
            key += FAIR_MARK + self.fair_key.encode("utf-8")
        timeout = b"" if self.timeout_ms is None else b"%d" % self.timeout_ms
        attempts = b"" if self.max_attempts is None else b"%d" % self.max_attempts
        if self.expires_ms is not None:
            return b"3:%d|%s|%s|%d|%s\n" % (self.priority, timeout, attempts, self.expires_ms, key)
        return b"2:%d|%s|%s|%s\n" % (self.priority, timeout, attempts, key)


NO_OPTIONS = TaskOptions()


class TraceContext(NamedTuple):
    """The W3C trace context a task was scheduled in: ``traceparent`` and, if the trace had
    one, ``tracestate`` (header values; ``headers()`` gives them as a carrier for any W3C
    propagator)."""

    traceparent: str
    tracestate: str | None = None

    def headers(self) -> dict[str, str]:
        """The context as W3C headers: ``{"traceparent": ..., "tracestate": ...}``."""
        if self.tracestate is None:
            return {"traceparent": self.traceparent}
        return {"traceparent": self.traceparent, "tracestate": self.tracestate}

    def line(self) -> bytes:
        """The head line that stores this context (a tracestate too long to keep is left
        out)."""
        state = self.tracestate
        if (
            state
            and len(state) <= MAX_TRACESTATE_CHARS
            and _TRACE_LINE.fullmatch(f"{self.traceparent} {state}")
        ):
            return b"~%s %s\n" % (self.traceparent.encode("ascii"), state.encode("ascii"))
        return b"~%s\n" % self.traceparent.encode("ascii")


def trace_context_of(text: bytes) -> TraceContext | None:
    """The trace context of a stored trace line (without its ``~`` and newline), or None
    when it is unreadable."""
    try:
        found = _TRACE_LINE.fullmatch(text.decode("ascii"))
    except UnicodeDecodeError:
        return None
    if found is None:
        return None
    return TraceContext(found[1], found[2])


def validate_priority(priority: object) -> int:
    if (
        not isinstance(priority, int)
        or isinstance(priority, bool)
        or not 0 <= priority <= MAX_PRIORITY
    ):
        raise InvalidTaskError(
            f"priority must be an int from 0 to {MAX_PRIORITY}, got {priority!r}"
        )
    return priority


def validate_key(key: object) -> str:
    """``key`` if it can name a limit group: 1 to MAX_KEY_BYTES of UTF-8 text without control
    characters."""
    if not isinstance(key, str):
        raise InvalidTaskError(f"key must be a str, got {type(key).__name__}")
    if not key or any(ord(c) < 32 or ord(c) == 127 for c in key):
        raise InvalidTaskError(f"key {key[:40]!r} must be non-empty, without control characters")
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError as exc:  # a lone surrogate
        raise InvalidTaskError(
            f"key {key[:40]!r} is not valid Unicode text ({exc.reason})"
        ) from None
    if size > MAX_KEY_BYTES:
        raise InvalidTaskError(f"key is longer than {MAX_KEY_BYTES} bytes")
    return key


def validate_task_attempts(max_attempts: object) -> int:
    if (
        not isinstance(max_attempts, int)
        or isinstance(max_attempts, bool)
        or not 1 <= max_attempts <= MAX_TASK_ATTEMPTS
    ):
        raise InvalidTaskError(
            f"max_attempts must be an int from 1 to {MAX_TASK_ATTEMPTS}, got {max_attempts!r}"
        )
    return max_attempts


#: Options of the version-2 heads read so far, by head (without its newline): the tasks of one
#: key or priority share a head, so a claim mostly finds it here (a dict lookup; an lru_cache
#: call costs more than the rest of reading the head). Emptied when it reaches _HEADS_KEPT.
_HEADS: dict[bytes, TaskOptions] = {}
_HEADS_KEPT = 16384


def _options_of(head_bytes: bytes) -> TaskOptions:
    """The options of one version-2 head, given with its newline (kept in _HEADS)."""
    expires_ms = None
    head = _OPTIONS_HEAD.fullmatch(head_bytes)
    if head is not None:
        priority, timeout, attempts, key = head.groups()
    else:
        head = _EXPIRY_HEAD.fullmatch(head_bytes)
        if head is None:
            raise PayloadError("stored task options are unreadable")
        priority, timeout, attempts, expires, key = head.groups()
        expires_ms = int(expires)
    key, mark, fair = key.partition(FAIR_MARK)
    try:
        key_text = key.decode("utf-8") if key else None
        fair_text = fair.decode("utf-8") if mark and fair else None
    except UnicodeDecodeError as exc:
        raise PayloadError(f"stored task options are not UTF-8: {exc}") from None
    timeout_ms = int(timeout) if timeout else None
    max_attempts = int(attempts) if attempts else None
    if timeout_ms == 0 or max_attempts == 0:
        raise PayloadError("stored task options hold a zero timeout or max_attempts")
    options = TaskOptions(int(priority), key_text, timeout_ms, max_attempts, expires_ms, fair_text)
    if len(_HEADS) >= _HEADS_KEPT:
        _HEADS.clear()
    _HEADS[head_bytes[:-1]] = options
    return options


def encode_envelope(
    payload: Any,
    max_bytes: int,
    options: TaskOptions = NO_OPTIONS,
    trace: bytes = b"",
    task_name: str | None = None,
    codec: PayloadCodec | None = None,
    queue: str = "",
    task_id: str = "",
) -> bytes:
    """The stored form of a payload, refusing what JSON cannot carry or what is too large.
    ``trace`` is a trace line (``TraceContext.line``) or empty; ``task_name`` a validated task
    name or None (see the module docstring). With a ``codec`` that writes, the payload is
    sealed for task ``task_id`` of ``queue`` (``_wire/codec.py``); ``max_bytes`` limits its
    JSON, before compression."""
    try:
        data = _encode(payload).encode("utf-8")
    except RecursionError:
        raise PayloadError(
            f"payload nests deeper than {MAX_PAYLOAD_DEPTH} arrays/objects (or is circular)"
        ) from None
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError
        raise PayloadError(f"payload is not JSON-encodable: {str(exc)[:200]}") from None
    if len(data) > max_bytes:
        raise PayloadError(f"payload is {len(data)} bytes, over the limit of {max_bytes}")
    if nests_too_deep(data):
        raise PayloadError(f"payload nests deeper than {MAX_PAYLOAD_DEPTH} arrays/objects")
    if codec is not None and codec.writes:
        data = codec.seal(data, queue, task_id)
    return envelope_of(data, options, trace, task_name)


def envelope_of(
    body: bytes, options: TaskOptions = NO_OPTIONS, trace: bytes = b"", task_name: str | None = None
) -> bytes:
    """The envelope of a payload's stored ``body`` (JSON, or a sealed body: a cron
    definition's occurrences carry the one sealed when it was added): the head, the name and
    trace line, the body."""
    if task_name is not None:
        trace = name_line(task_name, trace)
    return options.head() + trace + body


@functools.cache
def _record_struct(id_length: int) -> struct.Struct:
    """The fixed part of a record (head, id, envelope length) for ids of one length."""
    return struct.Struct(f">BdH{id_length}sI")


def _short_text(text: str) -> bytes:
    data = text.encode("utf-8")
    return struct.pack(">H", len(data)) + data


def record_extras(batch: str | None, after: Sequence[str], after_run: bool) -> tuple[int, bytes]:
    """The flags and the bytes after the envelope (and max wait) that name a task's batch and
    parents."""
    flags, extra = 0, b""
    if batch is not None:
        flags, extra = FLAG_BATCH, _short_text(batch)
    if after:
        flags |= FLAG_AFTER | (FLAG_AFTER_RUN if after_run else 0)
        extra += struct.pack(">I", len(after)) + b"".join(_short_text(p) for p in after)
    return flags, extra


def pack_task(
    flags: int,
    due_ms: int,
    task_id: str,
    envelope: bytes,
    max_wait_ms: int | None = None,
    extra: bytes = b"",
) -> bytes:
    """One task record of a schedule batch: flags, due (absolute ms or delay ms), id, envelope,
    for a debounced task (FLAG_DEBOUNCE) its max wait ms (None: no bound), then ``extra``
    (``record_extras``: its flags belong in ``flags``)."""
    id_bytes = task_id.encode("utf-8")
    n = len(id_bytes)
    record = _record_struct(n).pack(flags, due_ms, n, id_bytes, len(envelope)) + envelope
    if flags & FLAG_DEBOUNCE:
        record += _MAX_WAIT.pack(-1 if max_wait_ms is None else max_wait_ms)
    return record + extra


def repack_with_id(
    record: bytes, task_id: str, codec: PayloadCodec = NO_CODEC, queue: str = ""
) -> bytes:
    """The same task record under another id (used when a generated id was taken): the rest
    of the record (envelope, max wait, batch, parents) is kept as it is, except that a payload
    encrypted for the old id (``codec``) is sealed again for the new one (its id is in the
    associated data, ``_wire/codec.py``)."""
    flags, due_ms, id_length = _RECORD_HEAD.unpack_from(record)
    id_bytes = task_id.encode("utf-8")
    head = _RECORD_HEAD.pack(flags, due_ms, len(id_bytes)) + id_bytes
    rest = record[_RECORD_HEAD.size + id_length :]
    if codec.codec is None:
        return head + rest
    old_id = record[_RECORD_HEAD.size : _RECORD_HEAD.size + id_length].decode("utf-8")
    (length,) = _PAYLOAD_LENGTH.unpack_from(rest)
    envelope = rest[_PAYLOAD_LENGTH.size : _PAYLOAD_LENGTH.size + length]
    start = _body_start(envelope)
    if start < 0 or envelope[start : start + 1] != SEAL_MARK:
        return head + rest
    data = codec.open(envelope[start:], queue, old_id)
    resealed = envelope[:start] + codec.seal(data, queue, task_id)
    tail = rest[_PAYLOAD_LENGTH.size + length :]
    return head + _PAYLOAD_LENGTH.pack(len(resealed)) + resealed + tail


def decode_envelope(raw: bytes | str) -> Any:
    """The payload of a stored envelope; PayloadError if it cannot be read."""
    return decode_task(raw)[0]


def decode_task(raw: bytes | str) -> tuple[Any, TaskOptions]:
    """The payload and options of a stored envelope; PayloadError if it cannot be read."""
    payload, options, _ = decode_delivery(raw)
    return payload, options


def decode_delivery(raw: bytes | str) -> tuple[Any, TaskOptions, TraceContext | None]:
    """The payload, options and trace context (None if it has none, or an unreadable one) of
    a stored envelope; PayloadError if the payload cannot be read."""
    payload, options, trace, _ = decode_named(raw)
    return payload, options, trace


#: Shorter envelopes cannot nest deeper than MAX_PAYLOAD_DEPTH: that takes more opening and as
#: many closing brackets (an unbalanced text fails the scan, and the general path checks it).
_SHALLOW_BYTES = len(ENVELOPE_PREFIX) + 2 * (MAX_PAYLOAD_DEPTH + 1)
#: What follows ``1:`` in a named task's envelope (its head line: ``~@name``).
_NAMED_MARK = TRACE_MARK + NAME_MARK


def decode_named(
    raw: bytes | str,
    codec: PayloadCodec = NO_CODEC,
    queue: str = "",
    task_id: str | None = None,
) -> tuple[Any, TaskOptions, TraceContext | None, str | None]:
    """``decode_delivery``, and the task's name (None for a plain payload task); a name that
    is stored but unreadable is a PayloadError (the task could not be dispatched). A sealed
    payload is opened with ``codec`` as task ``task_id`` of ``queue`` (UndecryptableTask when it
    cannot be; without a task id an encrypted payload never opens)."""
    if type(raw) is bytes and raw.startswith(ENVELOPE_PREFIX):
        # A plain task (no options, trace or name), as a claim mostly reads, or a named one
        # without a trace whose name was read before (in _NAMES: checked, ASCII, so its bytes
        # and characters line up): its JSON read in place, without copying the body out.
        # Anything unusual (a new name, a trace, not UTF-8, deep nesting, white space around
        # the value, not JSON) takes the general path below, which reports it.
        start, task_name = 2, None
        if raw.startswith(_NAMED_MARK, 2):
            line_end = raw.find(b"\n", 4)
            task_name = _NAMES.get(raw[4:line_end]) if line_end > 0 else None
            start = -1 if task_name is None else line_end + 1
        elif raw.startswith(TRACE_MARK, 2):
            start = -1
        if start > 0 and raw.startswith(SEAL_MARK, start):
            # A sealed one: opened where it lies (the codec reads its line and decrypts from
            # the envelope itself), then read as the general path reads a body.
            return (
                _payload_of(codec.open(raw, queue, task_id, start=start)),
                NO_OPTIONS,
                None,
                task_name,
            )
        if start > 0:
            try:
                whole = raw.decode("utf-8")
            except UnicodeDecodeError:  # reported below
                whole = ""
            if whole and (
                len(raw) < _SHALLOW_BYTES or raw.count(b"[") + raw.count(b"{") <= MAX_PAYLOAD_DEPTH
            ):
                try:
                    payload, end = _scan_json(whole, start)
                except (StopIteration, ValueError, RecursionError):  # reported below
                    end = -1
                if end == len(whole):
                    return payload, NO_OPTIONS, None, task_name
    try:
        data = raw.encode("utf-8") if isinstance(raw, str) else bytes(raw)
    except (UnicodeEncodeError, TypeError) as exc:
        raise PayloadError(f"stored value is not text: {exc}") from None
    options = NO_OPTIONS
    prefix = data[:2]
    if prefix == ENVELOPE_PREFIX:
        body = data[2:]
    elif prefix in (OPTIONS_PREFIX, EXPIRY_PREFIX):
        head, newline, body = data.partition(b"\n")
        if not newline or len(head) >= _HEAD_MAX_BYTES:
            raise PayloadError("stored task options have no end (no newline in 900 bytes)")
        options = _HEADS.get(head) or _options_of(head + newline)
    else:
        raise PayloadError("stored value is not a dueq envelope (no 1:, 2: or 3: prefix)")
    trace = None
    task_name = None
    if body.startswith(TRACE_MARK):
        end = body.find(b"\n")
        if end < 0:
            raise PayloadError("stored trace line has no end (no payload follows it)")
        line = body[1:end]
        if line.startswith(NAME_MARK):
            name, space, line = line[1:].partition(b" ")
            task_name = _NAMES.get(name) or _stored_name(name)
            trace = trace_context_of(line) if space else None
        else:
            trace = trace_context_of(line)
        body = body[end + 1 :]
    if body.startswith(SEAL_MARK):
        body = codec.open(body, queue, task_id)
    return _payload_of(body), options, trace, task_name


def _payload_of(body: bytes) -> Any:
    """The payload of an envelope's (opened) body: its JSON, read as json.loads reads it, at
    about half its cost; PayloadError when it is not JSON or nests too deep."""
    # fewer brackets than bytes: a payload of MAX_PAYLOAD_DEPTH bytes cannot nest too deep
    if (
        len(body) > MAX_PAYLOAD_DEPTH
        and body.count(b"[") + body.count(b"{") > MAX_PAYLOAD_DEPTH  # nests_too_deep's test
        and nests_too_deep(body)
    ):
        raise PayloadError(f"stored payload nests deeper than {MAX_PAYLOAD_DEPTH} arrays/objects")
    try:
        payload_text = body.decode("utf-8")  # str: no detect_encoding
        try:  # one JSON value filling the text: what json.loads reads, at half its cost
            payload, end = _scan_json(payload_text, 0)
        except (StopIteration, ValueError, RecursionError):  # json.loads reports it below
            end = -1
        if end != len(payload_text):  # white space around it, or not JSON: json.loads decides
            payload = json.loads(payload_text)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise PayloadError(f"stored payload is not valid JSON: {str(exc)[:200]}") from None
    return payload


def _body_start(data: bytes) -> int:
    """Where an envelope's payload starts (after its head and name/trace line), or -1."""
    if data[:2] == ENVELOPE_PREFIX:
        start = 2
    elif data[:2] in (OPTIONS_PREFIX, EXPIRY_PREFIX):
        start = data.find(b"\n") + 1
    else:
        return -1
    if start > 0 and data[start : start + 1] == TRACE_MARK:
        start = data.find(b"\n", start) + 1
    return start if start > 0 else -1


def sealed_marker(raw: bytes | str) -> str | None:
    """How an envelope's sealed payload shows where it is not opened (``<encrypted k2, 412
    B>``), or None when its payload is not sealed or the envelope is unreadable."""
    data = raw.encode("utf-8", "surrogateescape") if isinstance(raw, str) else raw
    start = _body_start(data)
    if start < 0 or data[start : start + 1] != SEAL_MARK:
        return None
    info = sealed_info(data[start:])
    return None if info is None else info.marker()


def reseal_envelope(
    raw: bytes, codec: Encrypted, to: str, queue: str, task_id: str
) -> tuple[str, bytes | None]:
    """What key rotation (``_flows.rotate``) does with a stored envelope: ``("resealed",
    <the envelope with its payload encrypted with key to>)`` (its head and name/trace line
    byte for byte as they were, so the scripts read the same options), ``("already", None)``
    when its payload is encrypted with ``to``, or ``("unsealed", None)`` when it is not
    encrypted (plain JSON, compressed only, or not an envelope). UndecryptableTask when no key
    of ``codec`` opens it."""
    start = _body_start(raw)
    if start < 0 or raw[start : start + 1] != SEAL_MARK:
        return "unsealed", None
    info = sealed_info(raw[start:])
    if info is None or info.key_id is None:
        return "unsealed", None
    if info.key_id == to:
        return "already", None
    body = reseal(raw[start:], codec, to, queue, task_id)
    assert body is not None  # encrypted with another key: re-sealed or raised
    return "resealed", raw[:start] + body


#: The JSON scanner under ``json.loads`` (the C one where there is one): reads one value at
#: an index and says where it ends; json.loads adds two Python calls and the white space
#: checks around it, which a claim pays per task. (typeshed types the argument as the scanner
#: class itself; it is the decoder whose settings the scanner reads.)
_scan_json = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]


#: Task names read so far, by their stored bytes (a claim mostly finds them here, as _HEADS).
_NAMES: dict[bytes, str] = {}


def _stored_name(name: bytes) -> str:
    """A stored task name (see ``decode_named``), checked once and kept in _NAMES."""
    text = name.decode("ascii", "replace")
    if _TASK_NAME.fullmatch(text) is None:
        raise PayloadError(f"stored task name {text[:60]!r} is unreadable")
    if len(_NAMES) >= _HEADS_KEPT:
        _NAMES.clear()
    _NAMES[name] = text
    return text


def json_text(value: Any, what: str, max_bytes: int) -> str:
    """``value`` as compact JSON text for a script to store (a signal's payload, a progress
    entry, a step's result); PayloadError naming ``what`` when it is not JSON (NaN, a lone
    surrogate, nesting too deep) or its JSON is over ``max_bytes``."""
    try:
        data = _encode(value)
        size = len(data.encode("utf-8"))  # a lone surrogate is no text Redis can store
    except (TypeError, ValueError, RecursionError) as exc:
        raise PayloadError(f"{what} must be a JSON value: {type(exc).__name__}: {exc}") from None
    if size > max_bytes:
        raise PayloadError(f"{what} is {size} bytes of JSON, more than the {max_bytes} allowed")
    return data


#: Largest result kept (JSON bytes, ``keep_results``): a bigger value is reported, not kept.
MAX_RESULT_BYTES = 65_000


def result_entry(value: Any) -> tuple[bytes, str | None]:
    """A handler's return value as ack.lua's entry: b"" for None, b"=" + its JSON, or, for a
    value that cannot be kept (not JSON, bigger than MAX_RESULT_BYTES), b"!" + why; the why
    is also returned (None when the value can be kept)."""
    if value is None:
        return b"", None
    try:
        data = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        raw = data.encode("utf-8")  # a lone surrogate is no text Redis can store
    except (TypeError, ValueError, RecursionError) as exc:
        why = f"not JSON: {type(exc).__name__}: {exc}"[:200]
        return b"!" + why.encode("utf-8", "replace"), why
    if len(raw) > MAX_RESULT_BYTES:
        why = f"too big: {len(raw)} bytes of JSON (at most {MAX_RESULT_BYTES})"
        return b"!" + why.encode(), why
    return b"=" + raw, None
