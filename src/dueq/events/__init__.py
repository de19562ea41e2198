"""Outcome events: one entry per settled task in the queue's events stream, read with or without
a consumer group (docs/events.md).

``stream`` holds the reading flow, the event values and the stream's parsing; ``aio`` drives it
on an event loop (``AsyncQueue.events``). The public names below load lazily
(``dueq._util.lazy``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dueq._util.lazy import lazy_exports

if TYPE_CHECKING:
    from dueq.events.stream import AsyncEvent, Event, EventGroup

__all__ = ["AsyncEvent", "Event", "EventGroup"]

__getattr__: Any
__getattr__, __dir__ = lazy_exports(__name__, globals(), dict.fromkeys(__all__, "stream"), __all__)
