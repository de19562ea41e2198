"""The inspection flows: get and list tasks, history, due histogram, stats, doctor, run_now."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import logging
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from dueq._consume.wake import WakeSubscription, sharded_pubsub
from dueq._flows.drive import Flow
from dueq._flows.registry import RegistryFlows
from dueq._util.checks import whole_number
from dueq._util.clock import Duration, datetime_ms, ms_datetime
from dueq._util.clock import positive_duration_ms as _positive_ms
from dueq._wire import protocol as protocol
from dueq._wire.codec import SealedMarker
from dueq._wire.envelope import validate_id
from dueq._wire.snapshot import settings_from_hash
from dueq.doctor import DoctorFinding, DoctorReport
from dueq.exceptions import ConfigurationError, InvalidTaskError, TaskNotFound
from dueq.model import (
    FINAL_STATES,
    BatchInfo,
    DueHistogram,
    HistoryPoint,
    QueueSettings,
    QueueStats,
    TaskInfo,
    TaskPage,
    TaskState,
)

if TYPE_CHECKING:
    from dueq.health import Health

logger = logging.getLogger("dueq.queue")

#: Most tasks one listing page returns, and entries one page looks at (list_tasks.lua's cost).
MAX_PAGE = 1000
LIST_BUDGET = 1000
#: The history's window (minutes) and the due histogram's largest shape.
HISTORY_MINUTES = 1440
#: Most keys, entries or ids one doctor.lua call looks at (``Queue.doctor(batch=...)``).
MAX_DOCTOR_BATCH = 10_000
#: Most leases (and rate entries) one doctor.lua call counts: about 10 ms of Redis time.
DOCTOR_LEASE_CAP = 20_000
#: Most dependency edges one doctor.lua "cycles" call follows (7 to 25 µs of Redis time each).
DOCTOR_EDGE_CAP = 2_000
MAX_BUCKETS = 1000
_STATES = ("scheduled", "leased", "dead", "done", "cancelled", "expired", "waiting")


def _encode_cursor(raw: str) -> str | None:
    return base64.urlsafe_b64encode(raw.encode()).decode() if raw else None


def _decode_cursor(cursor: object, state: str) -> str:
    """The script's cursor inside one ``TaskPage.cursor`` of a listing of ``state``."""
    if cursor is None:
        return ""
    sources = {"scheduled": "0123456789p", "leased": "l", "dead": "d"}.get(state, "f")
    try:
        raw = base64.urlsafe_b64decode(str(cursor).encode()).decode() if cursor else ""
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raw = ""
    if not (isinstance(cursor, str) and raw[:1] in tuple(sources) and raw[1:2] == "|"):
        raise InvalidTaskError(f"cursor {cursor!r} is not one a {state} listing returned")
    return raw


class ViewFlows(RegistryFlows):
    """The flows that read a queue: get, list, history, stats, doctor (and run_now); over the
    registry's flows, whose live workers doctor's health verdict counts."""

    def get_flow(self, task_id: str) -> Flow[TaskInfo | None]:
        found = yield from self._core.inspect_ids_flow([validate_id(task_id)])
        return found[0] if found else None

    def get_many_flow(self, task_ids: Iterable[str]) -> Flow[list[TaskInfo]]:
        if isinstance(task_ids, (str, bytes)):  # a lone id would be read as its characters
            raise InvalidTaskError(f"task_ids must be an iterable of ids, got {task_ids!r}")
        ids = list(dict.fromkeys(validate_id(task_id) for task_id in task_ids))
        found: list[TaskInfo] = []
        for start in range(0, len(ids), MAX_PAGE):  # one snapshot per page of MAX_PAGE ids
            found += yield from self._core.inspect_ids_flow(ids[start : start + MAX_PAGE])
        return found

    def ended_subscription_flow(self, task_id: str) -> Flow[WakeSubscription]:
        """What ``wait`` subscribes to: the ended channel of the queue (or shard) that holds
        ``task_id``, by SSUBSCRIBE where the scripts SPUBLISH (as ``dueq._consume.wake``)."""
        if not self._server_checked:
            yield from self._core.check_server_flow()
        keys = self._core.shard_queue(task_id).keys
        return WakeSubscription((keys.ended,), sharded=sharded_pubsub(self._server_version))

    def wait_check_flow(self, task_id: str) -> Flow[TaskInfo | None]:
        """One look for ``wait``: the task when it has ended (done, dead, cancelled), None
        while it has not. TaskNotFound when there is no such task (never scheduled, or gone:
        acked or cancelled without keep_results, or kept past the retention, or purged);
        ConfigurationError when it is live but the queue keeps no results (its end would
        leave nothing to read)."""
        info = yield from self._core.get_flow(task_id)
        if info is None:
            raise TaskNotFound(
                f"no task {task_id!r} to wait for: never scheduled, or it ended and the queue "
                "keeps no result for it (keep_results off, or its retention ended)",
                [task_id],
            )
        if info.state in FINAL_STATES:
            if isinstance(info.result, SealedMarker):  # what was waited for cannot be read
                raise info.result.error
            return info
        keys = self._core.shard_queue(task_id).keys
        settings: QueueSettings = yield protocol.command(
            "HGETALL", keys.config, parse=settings_from_hash
        )
        if settings.keep_results is None:
            raise ConfigurationError(
                f"cannot wait for task {task_id!r}: queue {self.name!r} keeps no results, so "
                "an acked task leaves nothing to read; q.configure(keep_results=...) first"
            )
        return None

    def inspect_ids_flow(self, ids: Sequence[str]) -> Flow[list[TaskInfo]]:
        found: list[TaskInfo] = yield protocol.inspect_ids(
            self.keys, self.now_arg(), ids, self.payload_codec
        )
        return found

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
    ) -> Flow[TaskPage]:
        if state not in _STATES:
            raise InvalidTaskError(f"state must be one of {', '.join(_STATES)}, got {state!r}")
        whole_number(limit, "limit", low=1, high=MAX_PAGE)
        texts = {"id_prefix": id_prefix, "grep": grep, "error_type": error_type}
        for name, value in texts.items():
            if value is not None and not isinstance(value, str):
                raise InvalidTaskError(f"{name} must be a string, got {value!r}")
        keep = protocol.ListFilter(
            id_prefix or "",
            grep or "",
            error_type or "",
            None if after is None else datetime_ms(after),
            None if before is None else datetime_ms(before),
        )
        reply: protocol.ListReply = yield protocol.list_tasks(
            self.keys,
            self.now_arg(),
            state,
            _decode_cursor(cursor, state),
            limit,
            max(LIST_BUDGET, limit),
            keep,
            self.payload_codec,
        )
        return TaskPage(reply.tasks, _encode_cursor(reply.cursor), reply.looked_at)

    def run_now_flow(self, task_id: str) -> Flow[bool]:
        """A scheduled task (parked ones too) becomes due now; a dead one is replayed (attempts
        and errors reset, due now); a leased one is left alone (it is running): False."""
        task_id = validate_id(task_id)
        moved: protocol.TimeReply = yield protocol.reschedule(
            self.keys, self.now_arg(), task_id, absolute=False, due_ms=0
        )
        if moved.status is protocol.Status.OK:
            return True
        replayed: protocol.DeadReply = yield protocol.dead_ids(
            self.keys, self.now_arg(), "replay", [task_id]
        )
        return replayed.status is protocol.Status.OK

    def history_flow(self, minutes: int) -> Flow[list[HistoryPoint]]:
        whole_number(minutes, "minutes", low=1, high=HISTORY_MINUTES)
        reply: protocol.HistoryReply = yield protocol.history(
            self.keys, self.now_arg(), minutes=minutes, bucket_ms=1, buckets=0
        )
        first_ms = (reply.now_ms // 60_000 - minutes + 1) * 60_000
        return [
            HistoryPoint(ms_datetime(first_ms + i * 60_000), *row)
            for i, row in enumerate(reply.minutes)
        ]

    def due_histogram_flow(self, bucket: Duration, buckets: int) -> Flow[DueHistogram]:
        bucket_ms = _positive_ms(bucket, "bucket")
        whole_number(buckets, "buckets", low=1, high=MAX_BUCKETS)
        reply: protocol.HistoryReply = yield protocol.history(
            self.keys, self.now_arg(), minutes=0, bucket_ms=bucket_ms, buckets=buckets
        )
        return DueHistogram(
            ms_datetime(reply.now_ms),
            timedelta(milliseconds=bucket_ms),
            reply.overdue,
            reply.buckets,
            reply.later,
        )

    def stats_flow(self) -> Flow[QueueStats]:
        stats: QueueStats = yield protocol.stats(self.keys, self.now_arg())
        return stats

    def doctor_flow(self, fix: bool, batch: int) -> Flow[DoctorReport]:
        """The derived-state checks, then the queue's health verdict (``health_flow``)."""
        report = yield from self._core.derived_state_flow(fix, batch)
        health = yield from self.health_flow()
        return dataclasses.replace(report, health=health)

    def health_flow(self) -> Flow[Health]:
        """The queue's health as the dashboard judges it, with the default rules: its stats,
        the live workers that serve it, the history of the dead-letter window, judged by
        ``dueq.health.judge_health`` (the one verdict)."""
        from dueq.health import HealthRules, judge_health  # (its dataclasses: made when used)

        rules = HealthRules()
        stats = yield from self._core.stats_flow()
        workers = yield from self._core.workers_flow()
        history = yield from self._core.history_flow(rules.history_minutes)
        serving = sum(self.name in w.queues for w in workers)  # the dashboard's count
        return judge_health(stats, live_workers=serving, history=history, rules=rules)

    def derived_state_flow(self, fix: bool, batch: int) -> Flow[DoctorReport]:
        """Every doctor.lua phase, batch by batch (each call atomic for its batch); one finding
        per what and subject (a key can be looked at twice while the queue runs on)."""
        if not isinstance(fix, bool):
            raise ConfigurationError(f"fix must be True or False, got {fix!r}")
        whole_number(batch, "batch", low=1, high=MAX_DOCTOR_BATCH)
        findings: dict[tuple[str, str], DoctorFinding] = {}
        notes: list[str] = []
        for phase in protocol.DOCTOR_PHASES:
            cursor = ""
            while True:
                reply: protocol.DoctorReply = yield protocol.doctor(
                    self.keys,
                    self.now_arg(),
                    phase,
                    cursor,
                    batch=batch,
                    fix=fix,
                    lease_cap=DOCTOR_LEASE_CAP,
                    edge_cap=DOCTOR_EDGE_CAP,
                )
                for finding in reply.findings:
                    findings.setdefault((finding.what, finding.subject), finding)
                if reply.note and reply.note not in notes:
                    notes.append(reply.note)
                if not reply.cursor:
                    break
                cursor = reply.cursor
        for finding in findings.values():
            if finding.fixed:  # a change to Redis: say what was changed
                logger.info("doctor repaired %r: %s", self.name, finding.line())
        return DoctorReport(self.name, fix, list(findings.values()), notes)

    def batch_flow(self, batch: str) -> Flow[BatchInfo | None]:
        """A batch's counts, or None when there is no such batch (never used, or trimmed)."""
        info: BatchInfo | None = yield protocol.batch_read(self.keys, validate_id(batch))
        return info

    def batches_flow(self, limit: int) -> Flow[list[BatchInfo]]:
        """Up to ``limit`` batches (open ones first, then by creation, newest first)."""
        found: list[BatchInfo] = []
        cursor = 0
        while True:
            cursor, infos = yield protocol.batches_scan(self.keys, cursor, 500)
            found += infos
            if cursor == 0:
                break
        found.sort(
            key=lambda b: (b.complete, -b.created_at.timestamp() if b.created_at else 0, b.id)
        )
        return found[:limit]
