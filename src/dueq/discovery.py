"""Which queues a Redis database holds, found from their key names.

A queue has no registry entry of its own: it exists while any of its keys does. So finding
"every queue" is an incremental SCAN for ``dueq:{*}:*`` keys whose suffix is one a queue has
(``KEY_SUFFIXES``); anything else under the prefix (a key by hand, a name that is not a valid
queue name) is skipped. The CLI (``dueq stats``, ``dueq metrics``) and the Prometheus collector
both use this, so they agree on what a queue is.
"""

from __future__ import annotations

from typing import Any

from .exceptions import ConfigurationError
from .keys import PREFIX, QueueKeys, validate_queue_name

__all__ = ["KEY_SUFFIXES", "async_queue_names", "queue_names", "queue_of_key"]

#: What follows ``dueq:{<queue>}:`` in the name of each key a queue has.
KEY_SUFFIXES = frozenset(
    key.removeprefix("dueq:{x}:")
    for key in QueueKeys.for_queue("x").names()
    if key.startswith("dueq:{x}:")
)
#: Keys asked for per SCAN call.
SCAN_COUNT = 1000


def queue_of_key(key: bytes | str) -> str | None:
    """The queue whose key this is, or None for a key no dueq queue has (``dueq:{}:x``,
    ``dueq:{a}b:c``, a name that is not UTF-8 or not a valid queue name, an unknown suffix)."""
    try:
        name = key.decode("utf-8") if isinstance(key, bytes) else key
    except UnicodeDecodeError:
        return None
    start = f"{PREFIX}:{{"
    if not name.startswith(start):
        return None
    queue, close, suffix = name[len(start) :].partition("}:")
    if not close or suffix not in KEY_SUFFIXES:
        return None
    try:
        return validate_queue_name(queue)
    except ConfigurationError:
        return None


def queue_names(client: Any) -> list[str]:
    """Sorted names of the queues with any key in this database (a blocking redis-py client).

    SCAN is incremental, so this never blocks Redis, but it walks the whole keyspace: call it
    once per scrape or refresh, not per task. redis-py's NoPermissionError propagates when this
    user may not SCAN (name the queues instead).
    """
    return sorted(
        {
            queue
            for key in client.scan_iter(match=f"{PREFIX}:{{*}}:*", count=SCAN_COUNT)
            if (queue := queue_of_key(key)) is not None
        }
    )


async def async_queue_names(client: Any) -> list[str]:
    """As ``queue_names``, on a ``redis.asyncio`` client (the dashboard's)."""
    found: set[str] = set()
    async for key in client.scan_iter(match=f"{PREFIX}:{{*}}:*", count=SCAN_COUNT):
        if (queue := queue_of_key(key)) is not None:
            found.add(queue)
    return sorted(found)
