"""Bounded polling for tests: wait for something that takes milliseconds when all is well."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

WAIT_S = 30  # an upper bound, never a measurement


def wait_for(condition: Callable[[], Any], what: str, wait_s: float = WAIT_S) -> Any:
    """The first truthy value of ``condition()``, polled every 20 ms; AssertionError naming
    ``what`` after ``wait_s`` seconds."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")
