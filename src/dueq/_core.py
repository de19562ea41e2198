"""``QueueCore``: every queue operation, written once as a flow that both front ends drive.

Each operation is a *flow* (``dueq._drive``): a generator that validates its input, yields the
protocol steps it needs, receives each parsed reply and returns the result. ``Queue`` drives
them with the blocking client, ``AsyncQueue`` on the asyncio client. The flows live in modules
of one concept each, put together here:

- ``_queue_base.QueueBase``: the settings, keys, clock argument and the server/plain checks;
- ``_schedule_flows``: schedule, cancel, reschedule;
- ``_lease_flows``: claim, and settle (ack, fail, extend, release);
- ``_view_flows``: get, list, run_now, history, due histogram, stats, doctor;
- ``_settings_flows``: configure, settings; ``_registry_flows``: the worker registry;
- ``dueq.dead`` and ``dueq.cron``: the dead-letter and cron flows (``q.dead``, ``q.cron``).

The core: plain or sharded, chosen once
---------------------------------------
A queue runs its operations on its *core* (``Core``, below), chosen once when it is made and
kept in ``_core``: a plain queue's core is the queue itself; a sharded queue's is a
``dueq._shards.ShardedCore``, which holds the queue and its shard layout and runs each
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
instructions as before, or fewer). The server check (``check_server_flow``) stays the queue
object's own: it reads no keys, and it marks the object checked.

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
``tests/test_shards_core.py`` pins the rule.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Literal, Protocol

from ._drive import Flow
from ._lease_flows import ClaimBatch, LeaseFlows
from ._registry_flows import RegistryFlows
from ._schedule_flows import ScheduleFlows
from ._settings_flows import SettingsFlows
from ._view_flows import ViewFlows
from .cron import CronsCore
from .dead import DeadLettersCore

if TYPE_CHECKING:
    from ._shards import Sharded
    from .clock import Duration
    from .doctor import DoctorReport
    from .registry import WorkerInfo
    from .task import (
        BatchInfo,
        DeliveryBase,
        DueHistogram,
        HistoryPoint,
        KeyLimit,
        Outcome,
        QueueSettings,
        QueueStats,
        Rate,
        ScheduleResult,
        Task,
        TaskInfo,
        TaskPage,
        TaskState,
    )
    from .wake import WakeSubscription

__all__ = ["Core", "QueueCore"]


class Core(Protocol):
    """What a queue runs its operations on (``q._core``): the queue itself (``QueueCore``) or
    a ``ShardedCore`` (see the module docstring). The front ends drive these flows; a flow
    reaches another of them through ``self._core``."""

    # -- placement: the queue of a task, the wake channels, the dead-letter and cron flows
    def shard_queue(self, task_id: str) -> QueueCore: ...
    def wake_channels(self) -> list[str]: ...
    def part_flows(self) -> tuple[DeadLettersCore, CronsCore]: ...
    def batch_id(self, batch: object) -> str: ...
    def check_parents(self, task_id: str, parents: list[str], generated: bool) -> None: ...

    # -- scheduling
    def schedule_many_flow(
        self, tasks: Iterable[Task], replace: bool, batch: str | None = None
    ) -> Flow[ScheduleResult]: ...
    def schedule_records_flow(
        self, ids: list[str], records: list[bytes], replace: bool, fresh_ids: Iterator[str]
    ) -> Flow[ScheduleResult]: ...
    def close_batch_flow(self, batch: str, on_complete: Task | None) -> Flow[BatchInfo]: ...
    def batch_flow(self, batch: str) -> Flow[BatchInfo | None]: ...
    def batches_flow(self, limit: int) -> Flow[list[BatchInfo]]: ...
    def cancel_flow(self, task_id: str) -> Flow[bool]: ...
    def reschedule_flow(
        self, task_id: str, at: datetime | None, delay: Duration | None
    ) -> Flow[bool]: ...

    # -- consuming
    def wake_subscription_flow(self) -> Flow[WakeSubscription]: ...
    def claim_flow(
        self, limit: int, lease: Duration | None, holder: str | None = None
    ) -> Flow[ClaimBatch]: ...
    def ack_flow(self, deliveries: Sequence[DeliveryBase]) -> Flow[int]: ...
    def fail_flow(
        self, delivery: DeliveryBase, error: BaseException | str, retry_in: Duration | None
    ) -> Flow[Outcome]: ...
    def extend_flow(self, delivery: DeliveryBase, seconds: Duration) -> Flow[datetime]: ...
    def extend_many_flow(
        self, deliveries: Sequence[DeliveryBase], seconds: Duration
    ) -> Flow[datetime]: ...
    def release_flow(
        self, delivery: DeliveryBase, delay: Duration, *, hold: bool = False
    ) -> Flow[Outcome]: ...
    def release_many_flow(
        self, deliveries: Sequence[DeliveryBase], delay: Duration, *, hold: bool = False
    ) -> Flow[list[Outcome]]: ...

    # -- settings
    def configure_flow(
        self,
        *,
        paused: bool | None = None,
        remember_done: Duration | None = None,
        keep_results: Duration | None = None,
        rate: Rate | Literal[False] | None = None,
        key_rate: Rate | Literal[False] | None = None,
        key_concurrency: int | Literal[False] | None = None,
        concurrency: int | Literal[False] | None = None,
        key_limits: Mapping[str, KeyLimit | Literal[False] | None] | None = None,
        events: Duration | Literal[False] | None = None,
    ) -> Flow[QueueSettings]: ...
    def settings_flow(self) -> Flow[QueueSettings]: ...

    # -- views
    def get_flow(self, task_id: str) -> Flow[TaskInfo | None]: ...
    def get_many_flow(self, task_ids: Iterable[str]) -> Flow[list[TaskInfo]]: ...
    def inspect_ids_flow(self, ids: Sequence[str]) -> Flow[list[TaskInfo]]: ...
    def ended_subscription_flow(self, task_id: str) -> Flow[WakeSubscription]: ...
    def wait_check_flow(self, task_id: str) -> Flow[TaskInfo | None]: ...
    def list_flow(
        self,
        state: TaskState,
        *,
        limit: int = 100,
        cursor: str | None = None,
        id_prefix: str | None = None,
        grep: str | None = None,
        error_type: str | None = None,
        after: datetime | None = None,
        before: datetime | None = None,
    ) -> Flow[TaskPage]: ...
    def run_now_flow(self, task_id: str) -> Flow[bool]: ...
    def history_flow(self, minutes: int) -> Flow[list[HistoryPoint]]: ...
    def due_histogram_flow(self, bucket: Duration, buckets: int) -> Flow[DueHistogram]: ...
    def stats_flow(self) -> Flow[QueueStats]: ...
    def doctor_flow(self, fix: bool, batch: int) -> Flow[DoctorReport]: ...
    def derived_state_flow(self, fix: bool, batch: int) -> Flow[DoctorReport]: ...

    # -- worker registry
    def workers_flow(self) -> Flow[list[WorkerInfo]]: ...
    def heartbeat_flow(self, entry_json: str, ttl_ms: int, leave: bool) -> Flow[int]: ...


class QueueCore(ScheduleFlows, LeaseFlows, ViewFlows, SettingsFlows, RegistryFlows):
    """Settings, validation and the flows of every queue operation, shared by ``Queue`` and
    ``AsyncQueue`` (which add the client, and send what the flows yield). A plain queue is
    its own core; a sharded queue's is its ``ShardedCore`` (see the module docstring)."""

    def _choose_core(self, sharded: Sharded | None) -> Core:
        """The core of this queue, chosen once (``QueueBase.__init__``): itself, or the
        sharded core over ``sharded``'s layout."""
        return self if sharded is None else sharded.core(self)

    def shard(self, task_id: str) -> QueueCore:
        """The queue of the shard that holds ``task_id`` (a plain queue of the same front
        end, see ``dueq._shards``); a plain queue holds every task itself."""
        return self._core.shard_queue(task_id)

    def shard_queue(self, task_id: str) -> QueueCore:
        """As the core of its own tasks: this (plain) queue holds every task."""
        return self

    def part_flows(self) -> tuple[DeadLettersCore, CronsCore]:
        """The dead-letter and cron flows of this (plain) queue."""
        return DeadLettersCore(self), CronsCore(self)
