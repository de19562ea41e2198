"""What the parts of a queue need of the queue that holds them, spelled as ``typing.Protocol``s.

The parts (dead letters in ``dueq.dead``, cron definitions in ``dueq.cron``, the events readers in
``dueq.events``) are written once for both front ends and held by them: ``Queue.dead`` is a
``DeadLetters`` that drives its flows on the queue that made it. Naming ``Queue`` or ``QueueCore``
for that, even under ``TYPE_CHECKING``, makes each part import the front end that imports it: a
circle of modules that can only be read and changed together. As redis-py's ``Lock`` takes any
client, a part takes any object with the few members it uses, named here: ``QueueCore`` (so
``Queue`` and ``AsyncQueue``, and each shard of a sharded queue) has them all. The layers contract
(pyproject.toml) keeps this module with the wire, below every part;
tests/structure/test_import_cycles.py checks no import closes a circle.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from dueq._util.clock import Clock
from dueq._wire.codec import PayloadCodec
from dueq._wire.keys import QueueKeys
from dueq._wire.protocol import Flow

T = TypeVar("T")


class QueueFlows(Protocol):
    """What the flows of a part read off their queue: its name, keys, clock, payload limit and
    codec (``QueueCore`` has them)."""

    @property
    def name(self) -> str: ...

    @property
    def keys(self) -> QueueKeys: ...

    @property
    def max_payload_bytes(self) -> int: ...

    @property
    def payload_codec(self) -> PayloadCodec:
        """How the queue seals and opens payloads (``_wire.codec``)."""
        ...

    @property
    def clock(self) -> Clock | None:
        """The injected clock (seconds), or None for the server's (``TIME``)."""
        ...

    def now_arg(self) -> str:
        """The queue clock's argument to a script (``QueueCore.now_arg``)."""
        ...


class DrivesFlows(QueueFlows, Protocol):
    """A blocking front end (``Queue``): runs a flow, sending each step with its client."""

    def drive(self, flow: Flow[T]) -> T: ...


class AwaitsFlows(QueueFlows, Protocol):
    """An asyncio front end (``AsyncQueue``): runs a flow, awaiting each step."""

    async def drive(self, flow: Flow[T]) -> T: ...
