"""The ports of the flows: what a queue runs its operations on (``Core``), and what makes a
sharded queue's core (``MakesCore``), as ``typing.Protocol``s.

They live at the bottom of ``dueq._flows`` so that every flow module, and ``QueueBase``, can
name the core they reach other flows through (``self._core``, see ``dueq._flows.core``)
without importing the module that puts the flows together, nor ``dueq.sharding`` (which sits
above the flows): the plain core is ``QueueCore`` and the sharded one ``ShardedCore``, and
mypy checks each against ``Core`` where it is chosen. ``shard_queue`` returns ``Any``: the
shard's queue is of the front end's own class, which this layer cannot name.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol

from dueq._flows.drive import Flow

if TYPE_CHECKING:
    from dueq._consume.wake import WakeSubscription
    from dueq._util.clock import Duration
    from dueq._wire.protocol import DurableOp, StepReply
    from dueq.cron.flows import CronsCore
    from dueq.dead import DeadLettersCore
    from dueq.delivery import DeliveryBase, FailItem
    from dueq.doctor import DoctorReport
    from dueq.model import (
        BatchInfo,
        ClaimBatch,
        DueHistogram,
        HistoryPoint,
        KeyLimit,
        KeyRotation,
        Outcome,
        Progress,
        QueueSettings,
        QueueStats,
        Rate,
        ScheduleResult,
        StepInfo,
        Task,
        TaskInfo,
        TaskPage,
        TaskState,
    )
    from dueq.registry import WorkerInfo

__all__ = ["Core", "MakesCore"]


class Core(Protocol):
    """What a queue runs its operations on (``q._core``): the queue itself (``QueueCore``) or
    a ``ShardedCore`` (see the module docstring). The front ends drive these flows; a flow
    reaches another of them through ``self._core``."""

    # -- placement: the queue of a task, the wake channels, the dead-letter and cron flows
    def shard_queue(self, task_id: str) -> Any: ...
    def wake_channels(self) -> list[str]: ...
    def note_wake(self, channel: str | None) -> None: ...
    def part_flows(self) -> tuple[DeadLettersCore, CronsCore]: ...
    def batch_id(self, batch: object) -> str: ...
    def check_parents(self, task_id: str, parents: list[str], generated: bool) -> None: ...
    def task_id_for(self, position: int, task: Task, fresh_ids: Iterator[str]) -> str: ...

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
    def check_server_flow(self) -> Flow[None]: ...
    def wake_subscription_flow(self) -> Flow[WakeSubscription]: ...
    def claim_flow(
        self, limit: int, lease: Duration | None, holder: str | None = None
    ) -> Flow[ClaimBatch]: ...
    def ack_flow(self, deliveries: Sequence[DeliveryBase]) -> Flow[int]: ...
    def fail_flow(
        self, delivery: DeliveryBase, error: BaseException | str, retry_in: Duration | None
    ) -> Flow[Outcome]: ...
    def fail_many_flow(self, items: Sequence[FailItem[DeliveryBase]]) -> Flow[list[Outcome]]: ...
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

    # -- durable tasks
    def step_log_flow(self, delivery: DeliveryBase) -> Flow[list[StepInfo]]: ...
    def step_flow(
        self,
        delivery: DeliveryBase,
        op: DurableOp,
        position: int,
        head: str,
        value: str,
        extra: str = "",
    ) -> Flow[StepReply]: ...
    def signal_flow(self, task_id: str, name: str, payload: object) -> Flow[int]: ...

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
        fairness: Literal["key", False] | None = None,
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

    # -- resharding (a sharded queue's; a plain queue refuses)
    def resharder(self) -> Any: ...

    # -- key rotation
    def rotate_key_flow(
        self,
        to: str,
        batch: int,
        cursor: str | None,
        progress: Callable[[KeyRotation], Any] | None,
    ) -> Flow[KeyRotation]: ...

    # -- task progress
    def progress_flow(self, delivery: DeliveryBase, obj: Any) -> Flow[int]: ...
    def progress_history_flow(self, task_id: str) -> Flow[list[Progress]]: ...
    def progress_subscription_flow(self, task_id: str) -> Flow[WakeSubscription]: ...
    def progress_follow_flow(
        self, task_id: str, timeout: Duration | None = None, monotonic: Callable[[], float] = ...
    ) -> Generator[Any, Any, None]: ...

    # -- worker registry
    def workers_flow(self) -> Flow[list[WorkerInfo]]: ...
    def heartbeat_flow(self, entry_json: str, ttl_ms: int, leave: bool) -> Flow[int]: ...


class MakesCore(Protocol):
    """A sharded queue's layout, as ``QueueBase`` takes it (``dueq.sharding.flows.Sharded``):
    how many shards and their names, and the core it makes for the logical queue."""

    count: int
    names: tuple[str, ...]

    def core(self, queue: Any) -> Core: ...
