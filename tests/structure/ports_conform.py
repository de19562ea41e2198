"""Type-checked, never run: the front ends have every member of the protocols the parts take.

The parts of a queue name no front end (tests/structure/test_import_cycles.py): each takes a
``typing.Protocol`` of what it calls. Nothing in dueq itself assigns a ``Queue`` to those protocols
where mypy sees it (a delivery is made through ``Callable[..., DeliveryBase]``), so a front end
that drifted from its protocol would only fail at run time. test_ports_conform runs mypy on this
file: each assignment below is a check that the front end (or ``QueueCore``, or ``ClaimBatch``)
still fits.
"""

from __future__ import annotations

from dueq._consume.aio import AwaitsClaims
from dueq._consume.rules import ClaimedBatch
from dueq._consume.threads import Claims
from dueq._consume.wake import Wakes
from dueq._flows.core import QueueCore
from dueq._flows.lease import ClaimBatch
from dueq._wire.ports import AwaitsFlows, DrivesFlows, QueueFlows
from dueq.async_queue import AsyncQueue
from dueq.dead import AwaitsDead, DrivesDead, ListsDead
from dueq.delivery import AsyncSettlingQueue, NamedQueue, SettlingQueue
from dueq.events.aio import AwaitsEvents
from dueq.events.stream import ReadsEvents
from dueq.queue import Queue
from dueq.registry import AwaitsBeats, Beats


def conforms(q: Queue, a: AsyncQueue, core: QueueCore, batch: ClaimBatch) -> list[object]:
    """Each protocol, assigned the value it stands for (mypy fails an assignment that does not
    fit); returned so no name is unused."""
    s1: SettlingQueue = q
    s2: Claims = q
    s3: Wakes = q
    s4: DrivesFlows = q
    s5: DrivesDead = q
    s6: Beats = q
    s7: ReadsEvents = q
    a1: AsyncSettlingQueue = a
    a2: AwaitsClaims = a
    a3: AwaitsFlows = a
    a4: AwaitsDead = a
    a5: AwaitsBeats = a
    a6: AwaitsEvents = a
    c1: QueueFlows = core
    c2: ListsDead = core
    c3: NamedQueue = core
    b1: ClaimedBatch = batch
    return [s1, s2, s3, s4, s5, s6, s7, a1, a2, a3, a4, a5, a6, c1, c2, c3, b1]
