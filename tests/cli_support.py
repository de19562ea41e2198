"""Helpers for the command-line tests (the ``invoke`` fixture is in conftest.py)."""

from __future__ import annotations

from click.testing import Result


def one_error_line(result: Result) -> str:
    """The single stderr line of a failed command (no traceback)."""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]
