"""Recurring tasks: cron definitions on a queue (``q.cron``), each occurrence a task with the
queue's retry handling (docs/cron.md).

``flows`` holds the definitions' flows and the two front ends (``Crons``, ``AsyncCrons``);
``_keeper`` fires due occurrences at claim time; ``_spec`` is the stored definition, ``_ids``
the occurrence ids and ``expr`` the cron expression parser. The public names below load lazily
(``dueq._util.lazy``), so this package's ``__init__`` starts no import cycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dueq._util.lazy import lazy_exports

if TYPE_CHECKING:
    from dueq.cron.flows import (
        AsyncCrons,
        CronDefinition,
        Crons,
        LastOutcome,
        MissedPolicy,
        Occurrence,
        Overlap,
        Policies,
        occurrence_id,
        parse_occurrence_id,
    )

__all__ = [
    "AsyncCrons",
    "CronDefinition",
    "Crons",
    "LastOutcome",
    "MissedPolicy",
    "Occurrence",
    "Overlap",
    "Policies",
    "occurrence_id",
    "parse_occurrence_id",
]

__getattr__: Any
__getattr__, __dir__ = lazy_exports(__name__, globals(), dict.fromkeys(__all__, "flows"), __all__)
