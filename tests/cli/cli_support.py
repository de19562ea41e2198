"""Helpers for the command-line tests (the ``invoke`` fixture is in conftest.py): what more than
one test module of tests/cli uses lives here, so no test module imports another."""

from __future__ import annotations

from click.testing import Result

import dueq


def one_error_line(result: Result) -> str:
    """The single stderr line of a failed command (no traceback)."""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


#: A Redis URL nothing listens on (port 1): a command given it fails to connect.
UNREACHABLE = "redis://127.0.0.1:1/0"


def bury(q: dueq.Queue, count: int, prefix: str = "d") -> list[str]:
    """Schedule ``count`` tasks and fail each until dead (the queue allows 2 attempts)."""
    ids = q.schedule_many(dueq.Task({"n": n}, id=f"{prefix}{n}") for n in range(count)).ids
    while held := q.claim(1000, lease=60):
        for d in held:
            try:
                raise ValueError(f"{['first', 'second'][d.attempt - 1]} try of {d.id}")
            except ValueError as exc:
                d.fail(exc, retry_in=0)
    assert q.dead.count() == count
    return ids
