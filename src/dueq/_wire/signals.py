"""What a signal sent to a durable task may be (signal.lua stores it, step.lua's wait takes it):
its name, its payload, and how many a task may hold untaken.

Both sides of a signal check it here: the flows that send one (``dueq._flows.steps``) and the
durable task that waits for one by name (``dueq.durable``). It sits on the wire, below both, so
neither reaches into the other's modules for the rule they share.
"""

from __future__ import annotations

import re

from dueq._wire.envelope import DEFAULT_MAX_PAYLOAD_BYTES, json_text
from dueq.exceptions import InvalidTaskError

__all__ = ["MAX_PENDING_SIGNALS", "signal_payload", "validate_signal_name"]

#: The most signals a task may hold that its wait_for has not taken yet (signal.lua refuses
#: more with SignalRefused): they are kept in Redis until taken or the task ends.
MAX_PENDING_SIGNALS = 1000

#: A signal's name: what signal.lua and step.lua match as written (no JSON escaping to agree
#: on, no tab or newline of the stored line).
_SIGNAL_NAME = re.compile(r"[A-Za-z0-9_.:\-]{1,200}")


def validate_signal_name(name: object) -> str:
    """``name`` if it can name a signal (1-200 of letters, digits, ``_ . : -``), else
    InvalidTaskError."""
    if not isinstance(name, str) or _SIGNAL_NAME.fullmatch(name) is None:
        raise InvalidTaskError(
            f"a signal name is 1 to 200 letters, digits, '_', '.', ':' or '-', got {name!r}"
        )
    return name


def signal_payload(payload: object) -> str:
    """``payload`` as the JSON a signal stores, or PayloadError (not JSON, or too big)."""
    return json_text(payload, "a signal's payload", DEFAULT_MAX_PAYLOAD_BYTES)
