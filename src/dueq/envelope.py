"""Task ids and the JSON envelope a payload is stored in.

Stored form (written by schedule.lua around the payload JSON given here)::

    {"v":1,"c":<created epoch ms>,"p":<payload>}

Payloads are JSON only (never pickle). Encoding happens before anything is written, so a bad
payload raises PayloadError and leaves Redis untouched.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from .exceptions import InvalidTaskError, PayloadError

ENVELOPE_VERSION = 1
MAX_ID_BYTES = 512
DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024

_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


def new_id() -> str:
    """A random task id: 16 URL-safe characters (96 bits)."""
    return secrets.token_urlsafe(12)


def validate_id(task_id: object) -> str:
    """Return ``task_id`` if it is a usable id, else raise InvalidTaskError."""
    if not isinstance(task_id, str):
        raise InvalidTaskError(f"task id must be a str, got {type(task_id).__name__}")
    if not task_id:
        raise InvalidTaskError("task id must not be empty")
    if len(task_id) * 4 > MAX_ID_BYTES and len(task_id.encode("utf-8")) > MAX_ID_BYTES:
        raise InvalidTaskError(f"task id is longer than {MAX_ID_BYTES} bytes")
    return task_id


def encode_payload(payload: Any, max_bytes: int) -> bytes:
    """Payload as compact UTF-8 JSON, refusing what JSON cannot carry or what is too large."""
    try:
        data = _encode(payload).encode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:
        raise PayloadError(f"payload is not JSON-encodable: {exc}") from exc
    if len(data) > max_bytes:
        raise PayloadError(f"payload is {len(data)} bytes, over the limit of {max_bytes}")
    return data


def decode_envelope(raw: bytes | str) -> tuple[Any, int]:
    """Payload and creation time (epoch ms) from a stored envelope; PayloadError if unreadable."""
    try:
        envelope = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PayloadError(f"stored envelope is not valid JSON: {exc}") from exc
    if (
        not isinstance(envelope, dict)
        or envelope.get("v") != ENVELOPE_VERSION
        or "p" not in envelope
        or not isinstance(envelope.get("c"), int)
    ):
        raise PayloadError(f"stored envelope is not a version-{ENVELOPE_VERSION} dueq envelope")
    return envelope["p"], envelope["c"]
