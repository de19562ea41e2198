"""Sharded queues: one logical queue over N queues, each on its own hash tag (docs/sharding.md).

``layout`` maps a task to its shard (``dueq.shard_of``) and builds the per-shard queues,
``fanout`` sends one step to every shard, and ``flows`` holds the sharded variants of the
queue's, the dead letters' and cron's flows, chosen once when the queue is made.
"""

from __future__ import annotations

from dueq.sharding.layout import shard_of

__all__ = ["shard_of"]
