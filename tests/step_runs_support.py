"""Run the due tasks of a plain ``dueq.Queue`` as a worker does, for the operator tests of
durable tasks (tests/cli, tests/dashboard): ``dueq.named``'s dispatcher, then an ack of the
value, a fail on an exception, nothing when the run settled the delivery itself (a sleep or a
wait handed the task back). tests/durable's ``durable_support.run_due`` does the same on both
front ends."""

from __future__ import annotations

from typing import Any

import dueq
from dueq.named import dispatcher


def run_due(q: dueq.Queue) -> list[Any]:
    """Claim the due tasks of ``q`` and run each; the value or exception of each run."""
    run = dispatcher([q], None, on_loop=False)
    ran: list[Any] = []
    for d in q.claim(100):
        try:
            value = run(d)
        except Exception as exc:  # the run failed: the worker fails the delivery
            if not d.settled:
                d.fail(exc)
            ran.append(exc)
            continue
        if not d.settled:
            d.ack(value)
        ran.append(value)
    return ran
