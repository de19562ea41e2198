"""``QueueCore``: every queue operation, written once as a flow that both front ends drive.

Each operation is a *flow* (``dueq._flows.drive``): a generator that validates its input, yields the
protocol steps it needs, receives each parsed reply and returns the result. ``Queue`` drives
them with the blocking client, ``AsyncQueue`` on the asyncio client. The flows live in modules
of one concept each, put together here:

- ``_flows.base.QueueBase``: the settings, keys, clock argument and the server/plain checks;
- ``_flows.schedule``: schedule, cancel, reschedule;
- ``_flows.lease``: claim, and settle (ack, fail, extend, release);
- ``_flows.steps``: durable tasks' step logs and signals;
- ``_flows.view``: get, list, run_now, history, due histogram, stats, doctor;
- ``_flows.settings``: configure, settings; ``_flows.registry``: the worker registry;
- ``_flows.progress``: task progress, written under a lease and followed by id;
- ``_flows.rotate``: key rotation, stored payloads re-sealed with another key;
- ``dueq.dead`` and ``dueq.cron``: the dead-letter and cron flows (``q.dead``, ``q.cron``).

The core: plain or sharded, chosen once
---------------------------------------
A queue runs its operations on its *core* (``Core``, below), chosen once when it is made and
kept in ``_core``: a plain queue's core is the queue itself; a sharded queue's is a
``dueq.sharding.flows.ShardedCore``, which holds the queue and its shard layout and runs each
operation of the logical queue over the shards' own (plain) queues. The front ends drive
``self._core.<op>_flow(...)`` for every operation, so no flow asks whether its queue is
sharded: the ``QueueCore`` flows are the plain ones, the ``ShardedCore`` flows the sharded ones
(as redis-py keeps ``Redis`` and ``RedisCluster`` apart, and the dead-letter and cron flows
already were: ``ShardedDeadFlows``, ``ShardedCronFlows``).

Composition, not a ``ShardedQueue`` subclass chosen in ``Queue.__new__``: a sharded queue stays
``type(q) is Queue`` (a user's subclass of a front end shards too), and nothing of the front
ends (their client, their delivery type, their locks) is made twice. The cost on the plain path
is one attribute read (``_core``) per operation, in place of the test of the queue's layout
each flow began with (callgrind: starting a claim, cancel, get or stats flow costs as many
instructions as before, or fewer). The server check (``check_server_flow``) is a member of
``Core`` too: a plain queue checks its one server, a sharded queue every shard's primary;
either marks the queue object checked (``note_server_checked``).

The one rule, for flows that use other flows (``fail_flow`` -> ``release_flow``,
``get_flow`` -> ``inspect_ids_flow``, ``schedule_many_flow`` -> ``schedule_records_flow``,
``doctor_flow`` -> ``derived_state_flow`` ...): **a flow reaches another member of ``Core``
only through ``self._core``**, never as ``self.<op>_flow``. On a plain queue (or a shard) that
is the queue itself; on a sharded queue the ``ShardedCore``. ``ShardedCore`` has each member
of ``Core``: its own over the shards for every flow that reaches the keys, and for the flows
that only put others together (``get_flow``, ``schedule_many_flow``: their encoding needs the
queue's settings; ``doctor_flow``, ``wait_check_flow`` ...) the queue's, which reach their
parts through ``_core`` again. So a sharded queue never runs a plain flow on the logical
queue's keys; were one reached anyway, ``q.keys`` raises (a sharded queue has none).
``tests/sharding/test_shards_core.py`` pins the rule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dueq._flows.lease import LeaseFlows
from dueq._flows.ports import Core, MakesCore
from dueq._flows.progress import ProgressFlows
from dueq._flows.registry import RegistryFlows
from dueq._flows.rotate import RotateFlows
from dueq._flows.schedule import ScheduleFlows
from dueq._flows.settings import SettingsFlows
from dueq._flows.steps import StepFlows
from dueq._flows.view import ViewFlows
from dueq.cron.flows import CronsCore
from dueq.dead import DeadLettersCore
from dueq.exceptions import ConfigurationError

if TYPE_CHECKING:
    pass

__all__ = ["Core", "QueueCore"]  # Core: see dueq._flows.ports


class QueueCore(
    ScheduleFlows,
    LeaseFlows,
    StepFlows,
    ViewFlows,
    SettingsFlows,
    RegistryFlows,
    ProgressFlows,
    RotateFlows,
):
    """Settings, validation and the flows of every queue operation, shared by ``Queue`` and
    ``AsyncQueue`` (which add the client, and send what the flows yield). A plain queue is
    its own core; a sharded queue's is its ``ShardedCore`` (see the module docstring)."""

    def _choose_core(self, sharded: MakesCore | None) -> Core:
        """The core of this queue, chosen once (``QueueBase.__init__``): itself, or the
        sharded core over ``sharded``'s layout."""
        return self if sharded is None else sharded.core(self)

    def shard(self, task_id: str) -> QueueCore:
        """The queue of the shard that holds ``task_id`` (a plain queue of the same front
        end, see ``dueq.sharding.flows``); a plain queue holds every task itself."""
        shard: QueueCore = self._core.shard_queue(task_id)
        return shard

    def shard_queue(self, task_id: str) -> QueueCore:
        """As the core of its own tasks: this (plain) queue holds every task."""
        return self

    def resharder(self) -> Any:
        """A plain queue has no shards to change: ConfigurationError."""
        raise ConfigurationError(
            f"queue {self.name!r} is a plain queue (shards=1): only a sharded queue "
            "(shards=2 or more) can be resharded; a plain queue's keys are not a shard's"
        )

    def part_flows(self) -> tuple[DeadLettersCore, CronsCore]:
        """The dead-letter and cron flows of this (plain) queue."""
        return DeadLettersCore(self), CronsCore(self)
