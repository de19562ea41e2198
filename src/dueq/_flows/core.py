"""``QueueCore``: every queue operation, written once as a flow that both front ends drive.

Each operation is a *flow* (``dueq._flows.drive``): a generator that validates its input, yields the
protocol steps it needs, receives each parsed reply and returns the result. ``Queue`` drives
them with the blocking client, ``AsyncQueue`` on the asyncio client. The flows live in modules
of one concept each, put together here:

- ``_queue_base.QueueBase``: the settings, keys, clock argument and the server/plain checks;
- ``_schedule_flows``: schedule, cancel, reschedule;
- ``_lease_flows``: claim, and settle (ack, fail, extend, release);
- ``_view_flows``: get, list, run_now, history, due histogram, stats, doctor;
- ``_settings_flows``: configure, settings; ``_registry_flows``: the worker registry;
- ``dueq.dead`` and ``dueq.cron.flows``: the dead-letter and cron flows (``q.dead``, ``q.cron``).
"""

from __future__ import annotations

from dueq._flows.lease import LeaseFlows
from dueq._flows.registry import RegistryFlows
from dueq._flows.schedule import ScheduleFlows
from dueq._flows.settings import SettingsFlows
from dueq._flows.view import ViewFlows
from dueq.cron.flows import CronsCore
from dueq.dead import DeadLettersCore

__all__ = ["QueueCore"]


class QueueCore(ScheduleFlows, LeaseFlows, ViewFlows, SettingsFlows, RegistryFlows):
    """Settings, validation and the flows of every queue operation, shared by ``Queue`` and
    ``AsyncQueue`` (which add the client, and send what the flows yield)."""

    def shard(self, task_id: str) -> QueueCore:
        """The queue of the shard that holds ``task_id`` (a plain queue of the same front
        end, see ``dueq.sharding.flows``); a plain queue holds every task itself."""
        return self if self._sharded is None else self._sharded.shard(task_id)

    def _part_flows(self) -> tuple[DeadLettersCore, CronsCore]:
        sharded = self._sharded
        if sharded is None:
            return DeadLettersCore(self), CronsCore(self)
        return sharded.dead_flows(self), sharded.cron_flows(self)
