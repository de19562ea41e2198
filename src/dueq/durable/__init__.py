"""Durable tasks (``@q.task(durable=True)``; docs/durable.md): functions whose steps are
committed under the lease, so a run after a crash, a failure or a deploy goes on from the
first unfinished step; that sleep and wait for signals with no worker held.

``StepContext`` (a plain function's) and ``AsyncStepContext`` (an ``async def`` one's) are
what the function receives first; ``TaskContext`` is a named task's context without steps
(``@q.task(context=True)``). ``MAX_PENDING_SIGNALS`` bounds the signals a task holds untaken.
"""

from dueq._wire.signals import MAX_PENDING_SIGNALS
from dueq.durable._context import (
    AsyncStepContext,
    StepContext,
    StepContextBase,
    TaskContext,
    step_context,
)
from dueq.durable._run import MAX_STEP_RESULT_BYTES, Suspended

__all__ = [
    "MAX_PENDING_SIGNALS",
    "MAX_STEP_RESULT_BYTES",
    "AsyncStepContext",
    "StepContext",
    "StepContextBase",
    "Suspended",
    "TaskContext",
    "step_context",
]
