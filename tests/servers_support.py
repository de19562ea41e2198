"""Helpers for tests that must behave the same on every server of the matrix (docs/servers.md)."""

from __future__ import annotations

from typing import Any

import redis

from dueq._consume.wake import sharded_pubsub
from dueq.server import server_build


def subscribe_wake(client: redis.Redis, channel: str, **kwargs: Any) -> Any:
    """A pubsub of ``client`` on a wake channel, listening the way dueq's scripts publish on
    this server: SSUBSCRIBE from Redis 7.0 (Valkey too), SUBSCRIBE on Redis 6.2."""
    pubsub = client.pubsub(**kwargs)
    _, version = server_build(client)
    (pubsub.ssubscribe if sharded_pubsub(version) else pubsub.subscribe)(channel)
    return pubsub
