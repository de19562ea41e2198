"""Exact call counts for tests that pin a hot path's cost (no wall-clock time)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


def calls(fn: Callable[[], Any]) -> int:
    """Python and C function calls made inside ``fn()`` (exact: a profile hook counts them;
    ``fn`` itself and the hook's removal are not counted)."""
    count = -2

    def hook(_frame: Any, event: str, _arg: Any) -> None:
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count


def script_calls(admin: Any) -> int:
    """How many scripts the server has run (INFO commandstats: EVALSHA and EVAL calls), for
    tests that pin how many script calls an operation makes."""
    stats = admin.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))
