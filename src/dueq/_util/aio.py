"""asyncio helpers shared by the readers that loop until their task is cancelled.

``cancel_pending`` is here, below both, because two unrelated readers need it: the wake listener
of the asyncio consumer (``dueq._consume.aio``) and the asyncio events reader (``dueq.events.aio``).
Each checks it before every step, since redis-py can swallow a cancellation inside its read (see
``dueq._consume.aio._listen``). Kept out of either so that events need not import the consumers.
"""

from __future__ import annotations

import asyncio
from typing import Any


def cancel_pending(task: asyncio.Task[Any] | None) -> bool:
    """Whether ``task`` has a cancellation requested and not yet uncancelled (Python 3.11+;
    always False on 3.10, where ``_listen`` relies on its owner's flag)."""
    cancelling = getattr(task, "cancelling", None)
    return cancelling is not None and cancelling() > 0
