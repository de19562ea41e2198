"""The worker registry: each consumer process announces itself in every queue it serves.

A ``Worker`` or ``AsyncWorker`` (hence ``dueq worker``) beats every ``heartbeat`` seconds from
the background: one ``heartbeat.lua`` call per queue (each queue has its own hash tag, so one
call cannot cover two queues in a cluster). The call writes the process's entry (worker id,
host, pid, queues, when it started, deliveries in flight, processed and failed counts, and the
named tasks it runs with their parameters) into the queue's ``workers_info`` hash, stamps it
with the queue clock (``last_seen_ms``) and sets its expiry, ``TTL_BEATS`` beats ahead, in the
``workers`` sorted set. So:

- a process that dies stops beating and its entry expires: readers filter by the expiry, so a
  stale entry is never shown, and the next beat of any worker prunes it (the key stays as big
  as the live workers); both keys carry a Redis TTL too, so a registry nobody beats into any
  more vanishes by itself;
- a clean stop removes the entry at once (``leave``);
- a beat never blocks a handler (a thread of its own, or a task on the worker's event loop)
  and a failed beat (a Redis outage) is logged and tried again at the next one.

The named tasks (``@q.task``) are listed per queue, each with its parameters as short strings
(``"x"`` required, ``"y="`` with a default, ``"**"`` for ``**kwargs``; a context parameter
left out): what ``dueq schedule --task`` checks a task's arguments against before it writes
anything (``TaskFunction.parameters``, ``dueq.named.spec_signature``). They are computed once,
when the beat starts.

Readers (``Queue.workers``, ``AsyncQueue.workers``, ``discover_workers``) read both keys and
the clock in one round trip; an entry that cannot be read (corrupted by hand) is skipped with a
debug line, never an error. The counts are the process's, across all the queues it serves.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from dueq._util.clock import ms_datetime
from dueq._util.identity import worker_id
from dueq._wire.snapshot import text

__all__ = ["TTL_BEATS", "WorkerInfo", "merge_workers", "task_parameters"]

logger = logging.getLogger(__name__)


class Beats(Protocol):
    """What a blocking heartbeat needs of each queue it beats on (``Queue`` has it): its name,
    its named tasks (listed in the entry) and the two registry calls."""

    @property
    def name(self) -> str: ...

    @property
    def tasks(self) -> Mapping[str, Any]: ...

    def send_heartbeat(self, entry_json: str, ttl_ms: int) -> int: ...

    def leave_registry(self) -> None: ...


class AwaitsBeats(Protocol):
    """What an asyncio heartbeat needs of each queue (``AsyncQueue`` has it): as ``Beats``,
    the registry calls awaited."""

    @property
    def name(self) -> str: ...

    @property
    def tasks(self) -> Mapping[str, Any]: ...

    async def send_heartbeat(self, entry_json: str, ttl_ms: int) -> int: ...

    async def leave_registry(self) -> None: ...


#: Beats an entry outlives its last one by: a worker is shown until it misses this many.
TTL_BEATS = 3
#: Longest wait for a beat under way when the worker stops (s).
STOP_WAIT_S = 10.0
#: Floor of an entry's lifetime (ms): a beat late by a garbage collection or a busy Redis must
#: not make a live worker vanish.
MIN_TTL_MS = 500


@dataclass(frozen=True)
class WorkerInfo:
    """One live consumer process, as its last heartbeat described it.

    ``worker_id`` is ``<host>:<pid>:<random>`` (``dueq._util.identity.worker_id``, the name its log
    lines, metrics and lease holders use); ``queues`` every queue it serves; ``started_at``
    when its worker started; ``last_seen_at`` its last beat (queue clock); ``in_flight`` the
    deliveries it held then (running and waiting); ``processed`` the attempts it finished
    (acked, retried or dead) and ``failed`` those that failed (retried or dead). ``tasks``
    names the named tasks it runs, per queue: task name -> its parameters (``"x"`` required,
    ``"y="`` optional, ``"**"`` any keyword; see ``dueq.registry``).
    """

    worker_id: str
    host: str
    pid: int
    queues: tuple[str, ...]
    started_at: datetime
    last_seen_at: datetime
    in_flight: int
    processed: int
    failed: int
    tasks: Mapping[str, Mapping[str, tuple[str, ...]]] = dataclasses.field(default_factory=dict)


#: queue name -> task name -> parameters (``WorkerInfo.tasks``)
TaskParameters = Mapping[str, Mapping[str, tuple[str, ...]]]


def task_parameters(queues: Iterable[Any]) -> dict[str, dict[str, tuple[str, ...]]]:
    """The named tasks registered on ``queues``, as a beat lists them (``WorkerInfo.tasks``)."""
    return {q.name: {name: tuple(fn.parameters) for name, fn in q.tasks.items()} for q in queues}


def ttl_ms(interval_s: float) -> int:
    """How long an entry lives after a beat sent every ``interval_s`` seconds."""
    return max(MIN_TTL_MS, round(interval_s * 1000 * TTL_BEATS))


def entry_json(
    queues: Iterable[str],
    started_ms: int,
    in_flight: int,
    processed: int,
    failed: int,
    *,
    tasks: TaskParameters | None = None,
) -> str:
    """This process's entry (without ``last_seen_ms``, which heartbeat.lua adds); ``tasks``
    (``task_parameters``) only when a queue has named tasks."""
    entry: dict[str, Any] = {
        "worker_id": worker_id(),
        "host": socket.gethostname() or "localhost",
        "pid": os.getpid(),
        "queues": list(queues),
        "started_ms": started_ms,
        "in_flight": in_flight,
        "processed": processed,
        "failed": failed,
    }
    if tasks and any(tasks.values()):
        entry["tasks"] = {q: {n: list(p) for n, p in named.items()} for q, named in tasks.items()}
    return json.dumps(entry, ensure_ascii=False, separators=(",", ":"))


def _tasks(value: object) -> dict[str, dict[str, tuple[str, ...]]]:
    """An entry's ``tasks`` (missing: none); ValueError unless queue -> name -> [str]."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"tasks is not an object: {value!r}")
    found: dict[str, dict[str, tuple[str, ...]]] = {}
    for queue, named in value.items():
        if not isinstance(named, dict):
            raise ValueError(f"tasks of {queue!r} is not an object")
        found[queue] = {}
        for name, parameters in named.items():
            if not isinstance(parameters, list) or not all(isinstance(p, str) for p in parameters):
                raise ValueError(f"parameters of task {name!r} are not a list of names")
            found[queue][name] = tuple(parameters)
    return found


def _count(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 2**53:
        return value
    raise ValueError(f"not a count: {value!r}")


def _entry(wid: str, raw: bytes | str) -> WorkerInfo:
    item = json.loads(text(raw))
    if not isinstance(item, dict):
        raise ValueError("not a JSON object")
    queues = item["queues"]
    host = item["host"]
    if not isinstance(queues, list) or not all(isinstance(q, str) for q in queues):
        raise ValueError(f"queues is not a list of names: {queues!r}")
    if not isinstance(host, str):
        raise ValueError(f"host is not a string: {host!r}")
    return WorkerInfo(
        worker_id=wid,
        host=host,
        pid=_count(item["pid"]),
        queues=tuple(queues),
        started_at=ms_datetime(_count(item["started_ms"])),
        last_seen_at=ms_datetime(_count(item["last_seen_ms"])),
        in_flight=_count(item["in_flight"]),
        processed=_count(item["processed"]),
        failed=_count(item["failed"]),
        tasks=_tasks(item.get("tasks")),
    )


def parse_workers(now_ms: int, expiries: Any, entries: Any) -> list[WorkerInfo]:
    """The live entries, sorted by worker id: ``expiries`` is ZRANGE WITHSCORES of the
    ``workers`` set (pairs), ``entries`` HGETALL of ``workers_info`` (a dict). An entry past
    its expiry, without one, or unreadable is left out."""
    live = {text(member) for member, score in expiries if float(score) > now_ms}
    found: list[WorkerInfo] = []
    for field, raw in (entries or {}).items():
        wid = text(field)
        if wid not in live:
            continue
        try:
            found.append(_entry(wid, raw))
        except (ValueError, KeyError, TypeError, OverflowError, RecursionError) as exc:
            # a corrupted entry costs only itself: the next beat of its worker rewrites it
            logger.debug("worker registry entry %r is unreadable (%s); skipped", wid, exc)
    return sorted(found, key=lambda w: w.worker_id)


def merge_workers(lists: Iterable[list[WorkerInfo]]) -> list[WorkerInfo]:
    """One entry per worker id (the most recently seen) from the registries of several
    queues, sorted by worker id."""
    best: dict[str, WorkerInfo] = {}
    for infos in lists:
        for w in infos:
            seen = best.get(w.worker_id)
            if seen is None or w.last_seen_at > seen.last_seen_at:
                best[w.worker_id] = w
    return [best[k] for k in sorted(best)]


# -- the beat ----------------------------------------------------------------------------------

#: (in flight, processed, failed) of the process now
Counts = Callable[[], tuple[int, int, int]]


class _Beat:
    """What both heartbeats share: the entry to send and how a failed beat is logged."""

    def __init__(
        self,
        queue_names: list[str],
        interval_s: float,
        counts: Counts,
        tasks: TaskParameters | None = None,
    ) -> None:
        self.queue_names = queue_names
        self.tasks = tasks
        self.interval_s = interval_s
        self.ttl_ms = ttl_ms(interval_s)
        self.counts = counts
        self.started_ms = int(time.time() * 1000)
        self._failing = False

    def entry(self) -> str:
        return entry_json(self.queue_names, self.started_ms, *self.counts(), tasks=self.tasks)

    def failed(self, name: str, exc: Exception) -> None:
        """A beat failed: a warning the first time, debug lines while it goes on failing."""
        log = logger.debug if self._failing else logger.warning
        log("worker registry heartbeat on %r failed (%s); trying again next beat", name, exc)
        self._failing = True

    def succeeded(self) -> None:
        if self._failing:
            logger.info("worker registry heartbeat works again")
        self._failing = False


class Heartbeat(_Beat):
    """The blocking worker's beat: a daemon thread, one call per queue per beat."""

    def __init__(self, queues: Sequence[Beats], interval_s: float, counts: Counts) -> None:
        super().__init__([q.name for q in queues], interval_s, counts, task_parameters(queues))
        self._queues = queues
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dueq-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _beat_all(self) -> None:
        entry = self.entry()
        ok = True
        for q in self._queues:
            try:
                q.send_heartbeat(entry, self.ttl_ms)
            except Exception as exc:  # an outage, or anything else: logged, tried next beat
                self.failed(q.name, exc)
                ok = False
        if ok:
            self.succeeded()

    def _run(self) -> None:
        while True:
            self._beat_all()
            if self._stop.wait(self.interval_s):
                return

    def stop(self) -> None:
        """Stop beating and remove the entries (a failure is logged: they expire anyway)."""
        self._stop.set()
        self._thread.join(STOP_WAIT_S)
        if self._thread.is_alive():  # a beat hangs on an unresponsive Redis: leave it be
            logger.warning("worker registry heartbeat did not stop; its entries will expire")
            return
        for q in self._queues:
            try:
                q.leave_registry()
            except Exception as exc:  # the entry then expires after its TTL instead
                logger.warning("could not leave the worker registry of %r (%s)", q.name, exc)


class AsyncHeartbeat(_Beat):
    """The asyncio worker's beat: a task on the worker's loop, one call per queue per beat."""

    def __init__(self, queues: Sequence[AwaitsBeats], interval_s: float, counts: Counts) -> None:
        super().__init__([q.name for q in queues], interval_s, counts, task_parameters(queues))
        self._queues = queues
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            entry = self.entry()
            ok = True
            for q in self._queues:
                try:
                    await q.send_heartbeat(entry, self.ttl_ms)
                except Exception as exc:  # an outage, or anything else: logged, tried next beat
                    self.failed(q.name, exc)
                    ok = False
            if ok:
                self.succeeded()
            await asyncio.sleep(self.interval_s)

    async def stop(self) -> None:
        """Stop beating and remove the entries (a failure is logged: they expire anyway)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        leaving: list[Awaitable[None]] = [q.leave_registry() for q in self._queues]
        for q, result in zip(
            self._queues, await asyncio.gather(*leaving, return_exceptions=True), strict=True
        ):
            if isinstance(result, Exception):
                logger.warning("could not leave the worker registry of %r (%s)", q.name, result)
