"""The worker registry's flows (``dueq.registry``): read the registry, beat into it."""

from __future__ import annotations

import logging

import redis

from dueq._flows.base import QueueBase
from dueq._flows.drive import Flow
from dueq._util.clock import clock_ms
from dueq._util.identity import worker_id
from dueq._wire import protocol as protocol
from dueq.registry import WorkerInfo, parse_workers

logger = logging.getLogger("dueq.queue")


class RegistryFlows(QueueBase):
    """The worker registry's flows."""

    def workers_flow(self) -> Flow[list[WorkerInfo]]:
        try:
            server_ms, expiries, entries = yield protocol.workers_read(self.keys)
        except redis.ResponseError as exc:
            if "WRONGTYPE" not in str(exc):
                raise
            # a registry key of another type (by hand): no readable entry; the next beat of
            # any worker replaces it (heartbeat.lua)
            logger.warning("the worker registry of %r is unreadable (%s)", self.name, exc)
            return []
        now_ms = clock_ms(self.clock) if self.clock is not None else server_ms
        return parse_workers(now_ms, expiries, entries)

    def heartbeat_flow(self, entry_json: str, ttl_ms: int, leave: bool) -> Flow[int]:
        live: int = yield protocol.heartbeat(
            self.keys, self.now_arg(), worker_id(), entry_json, ttl_ms=ttl_ms, leave=leave
        )
        return live
