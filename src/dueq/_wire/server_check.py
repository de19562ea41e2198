"""What a queue checks of its Redis server and client: the version, the eviction policy, the
client's kind (no I/O: ``QueueBase.check_server_flow`` asks, these judge the replies).
"""

from __future__ import annotations

import logging
from typing import Any

from dueq._wire.snapshot import text
from dueq.exceptions import ConfigurationError

logger = logging.getLogger("dueq.queue")

#: Oldest Redis the scripts run on (ZMSCORE).
MIN_REDIS_VERSION = (6, 2)


def wrong_client(client: object, wanted: str, hint: str) -> ConfigurationError:
    """The error for a client of the wrong kind, naming what was given and what to use."""
    kind = type(client)
    return ConfigurationError(
        f"redis_client must be {wanted}, got {kind.__module__}.{kind.__name__}{hint}"
    )


def server_version_ok(version: str | None, where: str = "this server") -> tuple[int, ...] | None:
    """ConfigurationError for a Redis older than 6.2 (an unreadable version is let through),
    naming ``where`` it runs (a sharded queue's shard); else the version's (major, minor), or
    None when it cannot be read."""
    if version is None:
        return None
    try:
        major_minor = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        logger.debug("cannot parse Redis version %r; skipping the check", version)
        return None
    if major_minor < MIN_REDIS_VERSION:
        raise ConfigurationError(f"dueq needs Redis >= 6.2; {where} runs {version}")
    return major_minor


def pairs(reply: Any) -> dict[str, Any]:
    """A reply of names and values (a flat list in RESP2, a map in RESP3) as a dict."""
    if isinstance(reply, dict):
        return {text(k): v for k, v in reply.items()}
    return {text(k): v for k, v in zip(reply[::2], reply[1::2], strict=False)}


def hello_version(reply: Any) -> str | None:
    """The server version from a HELLO reply (RESP2 flat list or RESP3 map)."""
    if not isinstance(reply, (list, dict)):
        return None
    found = pairs(reply).get("version")
    return None if found is None else text(found)


def log_eviction_policy(policy: Any, where: str = "") -> None:
    """Say what the server's ``maxmemory-policy`` means for a queue; ``where``, appended to
    "maxmemory-policy is ...", names the servers (a sharded queue's shards) that have it.

    ``allkeys-*`` policies may evict queue keys when memory is full, losing tasks without a
    trace: a warning. ``volatile-*`` policies evict only keys with a TTL, and dueq's keys
    have none, so nothing is lost; Redis refuses writes instead, as with ``noeviction``, and
    consumers wait that out: an info line. ``noeviction``: nothing to say.
    """
    if policy is None or text(policy) == "noeviction":
        return
    if text(policy).startswith("volatile-"):
        logger.info(
            "Redis maxmemory-policy is %r%s: it evicts only keys with a TTL, and dueq's keys "
            "have none; when memory is full Redis will refuse writes (as with noeviction), "
            "which consumers wait out",
            text(policy),
            where,
        )
        return
    logger.warning(
        "Redis maxmemory-policy is %r%s: when memory is full Redis may evict queue keys and "
        "lose tasks without a trace; set maxmemory-policy noeviction",
        text(policy),
        where,
    )
