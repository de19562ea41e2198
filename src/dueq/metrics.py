"""Prometheus metrics: queue state read from Redis, and what a worker process does.

Install with the ``metrics`` extra (``pip install 'dueq[metrics]'``): ``prometheus_client``.

Two sources, because they answer different questions:

- ``QueueCollector`` reads each queue's state from Redis at scrape time, through the public
  API only (``Queue.stats()``, ``Queue.history()``, ``Queue.cron.list()``). Any process may
  serve it (``dueq metrics`` does, for every queue it finds); the numbers are the same whoever
  serves them, so scrape one exporter per Redis, not every worker, or aggregate with ``max``
  by queue.
- ``WorkerMetrics`` counts what this process's handlers did: handler time, delivery lag (claim
  time minus due time, both in Redis time) and outcomes by kind. It lives in the worker (``dueq
  worker --metrics-port``) and is summed across workers.

Names follow the Prometheus conventions: a ``dueq_`` prefix, base units (``_seconds``),
counters end in ``_total``, and every series carries a ``queue`` label. What became of a task
is a label (``outcome``), never part of a name, with the same words on both sides: the
queue's ``dueq_task_outcomes_total`` and a worker's ``dueq_worker_outcomes_total`` say
``expired`` for a task past its ``expires=`` (``Outcome.kind``); a lease that ran out is
``lease_expired`` (the stats hash keeps those as ``expired_tasks`` and ``expired``). Every
family has a written help text, and docs/metrics.md lists every family and label value (a
test checks both ways).

Queue metrics (one series per queue; a queue whose stats cannot be read has ``dueq_queue_up``
0 and no other series in that scrape):

==========================================  =====  ===============================================
``dueq_tasks{state}``                       gauge  tasks by state: ``delayed`` (not yet due),
                                                   ``due`` (due, waiting for a worker), ``leased``,
                                                   ``dead``; the four add up to every task
``dueq_oldest_due_lag_seconds``             gauge  how long the oldest due task has waited past
                                                   its due time (0 when none is due)
``dueq_next_due_timestamp_seconds``         gauge  when the next task falls due (absent if none)
``dueq_paused``                             gauge  1 while ``pause()`` holds claims
``dueq_missing_tasks``                      gauge  tasks counted whose data is gone (data loss)
``dueq_cron_definitions{state}``            gauge  ``active``, ``paused``, ``broken``
``dueq_task_outcomes_total{outcome}``       count  what became of the queue's deliveries and
                                                   tasks: ``acked``, ``retried``, ``dead``,
                                                   ``released``, ``cancelled``, ``expired``
                                                   (past ``expires=``), ``lease_expired`` (the
                                                   holder's lease ran out)
``dueq_tasks_<event>_total``                count  ``scheduled``, ``claimed``, ``replayed``,
                                                   ``purged``, ``dropped``
``dueq_results_unstored_total``             count  return values ``keep_results`` could not keep
``dueq_events_lost_total``                  count  events trimmed before a group read them
``dueq_cron_<event>_total``                 count  ``skipped``, ``state_rebuilt``
``dueq_stats_counter_total{counter}``       count  a stats counter this version does not know
``dueq_task_rate_per_second{event}``        gauge  events per second in the last complete minute
                                                   of the per-minute history (``scheduled``,
                                                   ``claimed``, ``acked``, ``retried``, ``dead``,
                                                   ``lease_expired``): that minute's count / 60
``dueq_cron_last_outcome{cron,outcome}``    gauge  1 for the outcome of the definition's last
                                                   firing (``acked``, ``retrying``, ``dead``,
                                                   ``cancelled``), 0 for the others; no series
                                                   before a firing
``dueq_cron_last_outcome_timestamp_seconds`` gauge  when that outcome came (Unix time); ``cron``
``dueq_cron_last_success_timestamp_seconds`` gauge  its latest ack (absent if none yet); ``cron``
``dueq_workers``                            gauge  live worker processes serving the queue (the
                                                   worker registry, ``Queue.workers()``)
``dueq_fair_lanes``                         gauge  a fair queue's lanes with due tasks (one per
                                                   tenant with due tasks; 0 when not fair)
``dueq_tenant_due{tenant}``                 gauge  a fair queue's tenant's due tasks
``dueq_tenant_claimed_last_minute{tenant}`` gauge  its tasks claimed this minute and the one
                                                   before
``dueq_queue_up``                           gauge  1 when the queue's stats could be read
==========================================  =====  ===============================================

The tenant series are those of ``Queue.stats().tenants`` (``dueq.TenantShare``: the tenants
with the most due tasks and the most claimed in the last minute), at most ``MAX_TENANT_SERIES``
(20) a queue however many tenants it has, so the ``tenant`` label's cardinality stays bounded;
``tenant=""`` is the tasks without a key. A queue that never was fair has none.

Why a gauge of the last complete minute for rates, in events per second: the counters above
already give any rate over any window (``rate(dueq_task_outcomes_total{outcome="acked"}[5m])``),
but only from scrapes Prometheus has taken; the rate gauges come from the history the queue's
own scripts keep in Redis, so a new exporter, a restarted Prometheus or a gap in scraping
still shows the throughput of the last minute at once. The current minute is still filling,
so it is left out (its count would dip at every minute's start). Per second, not per minute,
because the conventions ask for base units: ``dueq_task_rate_per_second{event="acked"}`` lines
up with ``rate(dueq_task_outcomes_total{outcome="acked"}[1m])`` on one graph. The minute is
the queue's clock's (``Queue(clock=...)``, Redis ``TIME`` by default), which is also how tests
make it exact.

Worker metrics:

==========================================  =====  ===============================================
``dueq_handler_duration_seconds{result}``   hist.  time in the handler; ``result`` ``ok`` (it
                                                   returned) or ``error`` (it raised)
``dueq_delivery_lag_seconds``               hist.  claim time minus due time of each delivery
``dueq_worker_outcomes_total{outcome}``     count  what became of deliveries: ``Outcome.kind``
                                                   (``acked``, ``retried``, ``dead``,
                                                   ``released``, ``cancelled``, ``expired``,
                                                   ``lost``)
``dueq_bulk_calls_total{task}``             count  calls of a bulk handler (``BatchSpec``)
``dueq_bulk_call_items{task}``              hist.  items in each call of a bulk handler
``dueq_bulk_call_duration_seconds``         hist.  time in a bulk handler per call; ``task``,
                                                   ``result`` (``ok`` or ``error``)
==========================================  =====  ===============================================

A bulk handler's series carry ``task``: the named task's name (``@q.task(batch=...)``), or
``""`` for the worker's plain handler (``Worker(q, handler, batch=...)``); a worker has a few
bulk handlers at most, so the label stays small. A bulk call is measured as a call, not in
``dueq_handler_duration_seconds`` (time per delivery), but each of its items is a delivery:
its lag is in ``dueq_delivery_lag_seconds`` and its outcome in ``dueq_worker_outcomes_total``
(items settle through the same outcome stream as single deliveries, one outcome each).

Every worker metric also carries ``worker``: the name given (``WorkerMetrics(worker=...)``,
``dueq worker --name``), else the host name (``default_worker_name``), so a restarted worker
continues its series instead of starting new ones (not the per-process ``dueq.worker_id()`` of
log lines and the worker registry). Prometheus's own ``instance`` label tells apart two
workers of one host.

Which series exist from the start: every counter of a queue the exporter reads
(``STATS_COUNTERS``, exported as ``QUEUE_COUNTERS`` says, at 0 until its first event) and,
for each queue a ``WorkerMetrics`` measures (``wrap``, ``follow``, ``watch``), every outcome
kind (``OUTCOME_KINDS``) and both handler results, at 0: an alert on ``increase()`` then
sees the first event. The queue-wide series come from ``dueq metrics`` (or the dashboard's
``/metrics``), once per Redis; ``dueq worker`` adds them only with ``--queue-metrics``.
See docs/metrics-series.md.

The hook a consumer calls is ``WorkerMetrics``: ``observe_delivery(queue, delivery)`` when a
handler starts, ``observe_handler(queue, duration_s, ok)`` when it ends, and
``observe_outcome(queue, outcome)`` when a delivery is settled. ``wrap(queue, handler)`` does
the first two around any handler (sync or ``async def``), and ``follow(queue, worker)`` reads a
``Worker``'s ``outcomes`` counts at scrape time, so a worker needs no change to be measured.

Bulk handlers: ``observe_call(queue, task, items, duration_s, ok)`` when a call ends.
``wrap(queue, handler, bulk=True)`` measures a plain bulk handler (the one given to
``Worker(q, handler, batch=...)``, called with a list of items) as calls; ``wrap(queue,
dispatcher)`` of a named tasks' dispatcher (``dueq worker myapp:q``) also measures its bulk
tasks' calls, through a ``run_bulk`` on the wrapper that the processors take before the
dispatcher's own. Either way the choice is made once, when wrapping: a per-task handler's
path has no bulk test in it.
"""

from __future__ import annotations

import functools
import inspect
import logging
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, get_args
from wsgiref.simple_server import WSGIServer

try:
    from prometheus_client import CollectorRegistry, Histogram, start_http_server
    from prometheus_client import Counter as PromCounter
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
    from prometheus_client.gc_collector import GCCollector
    from prometheus_client.platform_collector import PlatformCollector
    from prometheus_client.process_collector import ProcessCollector
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("dueq.metrics needs prometheus_client: pip install 'dueq[metrics]'") from exc

import redis

from dueq import discovery
from dueq._wire.keys import validate_queue_name
from dueq.cron.flows import CronDefinition, LastOutcome
from dueq.exceptions import DueqError
from dueq.model import (
    HISTORY_COUNTERS,
    MAX_BATCH_ITEMS,
    Outcome,
    OutcomeKind,
    QueueStats,
    ShardStats,
)
from dueq.operators._process import is_async_handler
from dueq.queue import Queue

__all__ = [
    "BULK_ITEMS_BUCKETS",
    "DELIVERY_LAG_BUCKETS_S",
    "HANDLER_BUCKETS_S",
    "MAX_TENANT_SERIES",
    "OUTCOME_KINDS",
    "QUEUE_COUNTERS",
    "RATE_EVENTS",
    "STATS_COUNTERS",
    "CounterSeries",
    "QueueCollector",
    "WorkerMetrics",
    "counter_series",
    "default_worker_name",
    "new_registry",
    "serve",
]

logger = logging.getLogger(__name__)

#: Handler time buckets: a few ms (an in-memory handler) to minutes (a slow API).
HANDLER_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
#: Delivery lag buckets: a claim right at the due time to an hour behind.
DELIVERY_LAG_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
#: Items per bulk call: one (a call that lingered in vain) to the most a BatchSpec allows.
BULK_ITEMS_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, MAX_BATCH_ITEMS)


class CounterSeries(NamedTuple):
    """The series one stats-hash counter is exported as: a counter family (without
    ``_total``), the family's help text, and the label that tells it apart in a labelled
    family (``("outcome", "acked")``) or None."""

    family: str
    help: str
    label: tuple[str, str] | None = None


#: What became of a queue's deliveries and tasks: one family, the outcome a label.
TASK_OUTCOMES = "dueq_task_outcomes"
_OUTCOMES_HELP = (
    "What became of the queue's deliveries and tasks since it was created, by outcome: acked, "
    "retried, dead, released, cancelled, expired (past its expires= before it started) or "
    "lease_expired (the holder's lease ran out)"
)


def _outcome(outcome: str) -> CounterSeries:
    return CounterSeries(TASK_OUTCOMES, _OUTCOMES_HELP, ("outcome", outcome))


#: Every counter the queue's scripts keep in its stats hash (a test checks this against the
#: Lua sources), with the series it is exported as: from the start, at 0 until its first
#: event. The stats hash's ``expired`` counts leases that ran out (``lease_expired``) and its
#: ``expired_tasks`` the tasks past their ``expires=`` (``expired``, the word workers and
#: ``Outcome.kind`` use).
QUEUE_COUNTERS: dict[str, CounterSeries] = {
    "scheduled": CounterSeries(
        "dueq_tasks_scheduled",
        "Tasks added to the queue since it was created (scheduled, cron occurrences, batch "
        "completions, replaced tasks)",
    ),
    "claimed": CounterSeries(
        "dueq_tasks_claimed", "Deliveries leased to consumers since the queue was created"
    ),
    "acked": _outcome("acked"),
    "retried": _outcome("retried"),
    "dead": _outcome("dead"),
    "expired": _outcome("lease_expired"),
    "expired_tasks": _outcome("expired"),
    "released": _outcome("released"),
    "cancelled": _outcome("cancelled"),
    "replayed": CounterSeries(
        "dueq_tasks_replayed", "Dead tasks put back to run since the queue was created"
    ),
    "purged": CounterSeries(
        "dueq_tasks_purged", "Dead tasks deleted for good since the queue was created"
    ),
    "dropped": CounterSeries(
        "dueq_tasks_dropped",
        "Due ids dropped because their task data was gone (evicted or deleted by hand): data loss",
    ),
    "results_unstored": CounterSeries(
        "dueq_results_unstored",
        "Return values of acked tasks that keep_results could not keep",
    ),
    "events_lost": CounterSeries(
        "dueq_events_lost",
        "Outcome events trimmed (older than the events retention) before a consumer group "
        "read or acked them",
    ),
    "cron_skipped": CounterSeries(
        "dueq_cron_skipped",
        "Cron occurrences dropped without running (missed slots, overlap, limit, pause after "
        "failures)",
    ),
    "cron_state_rebuilt": CounterSeries(
        "dueq_cron_state_rebuilt",
        "Cron schedule states rebuilt because they were missing or could not be read",
    ),
}
#: The family of a stats-hash counter this version does not know (written by a newer dueq or
#: another tool): kept, with the counter's name as a label, not dropped.
OTHER_COUNTERS = CounterSeries(
    "dueq_stats_counter",
    "Counters of the queue's stats hash that this dueq version does not know, by name",
)
STATS_COUNTERS = tuple(QUEUE_COUNTERS)
#: The ``event`` label of ``dueq_task_rate_per_second`` for each per-minute history counter:
#: the history's ``expired`` counts leases that ran out, as the outcome label says.
RATE_EVENTS = {name: "lease_expired" if name == "expired" else name for name in HISTORY_COUNTERS}
#: The most tenants of one queue with ``dueq_tenant_*`` series (bounded label cardinality):
#: ``QueueStats.tenants`` holds at most ten with the most due and ten with the most claimed.
MAX_TENANT_SERIES = 20
#: What can become of a delivery (``Outcome.kind``): each has a series from the start.
OUTCOME_KINDS: tuple[str, ...] = get_args(OutcomeKind)


def _metric_word(name: str) -> str:
    """A stats-hash counter name as a label value: ``[a-z0-9_]`` only."""
    return "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in name.lower())


def counter_series(counter: str) -> tuple[str, dict[str, str], str]:
    """(family without ``_total``, its labels besides ``queue``, help text) of a stats-hash
    counter: ``claimed`` -> ``dueq_tasks_claimed``; ``acked`` -> ``dueq_task_outcomes``
    ``{outcome="acked"}``; an unknown one -> ``dueq_stats_counter{counter=...}``."""
    series = QUEUE_COUNTERS.get(counter)
    if series is None:
        return OTHER_COUNTERS.family, {"counter": _metric_word(counter)}, OTHER_COUNTERS.help
    return series.family, dict([series.label] if series.label else []), series.help


class QueueCollector(Collector):
    """Queue gauges and counters read from Redis at each scrape (see the module doc).

    ``queues`` names the queues; None finds every queue in the database at each scrape
    (``dueq.discovery.queue_names``, an incremental SCAN). ``client`` is a blocking redis-py
    client; scrapes may come from any thread (redis-py's pool is thread-safe). ``clock`` is the
    queues' clock (see ``Queue(clock=...)``; None: Redis ``TIME``), which picks the minute the
    rates come from.
    """

    def __init__(
        self,
        client: redis.Redis,
        queues: Sequence[str] | None = None,
        *,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._client = client
        self._clock = clock
        self._names = list(queues) if queues is not None else None
        self._queues: dict[str, Queue] = {}
        self._lock = threading.Lock()
        for name in self._names or ():
            validate_queue_name(name)  # a bad name is refused here, not at the first scrape

    def _queue(self, name: str) -> Queue:
        """Queue ``name`` as stored: a sharded queue with its recorded shard count (read at
        each scrape, one GET, so a queue sharded after the collector started is seen)."""
        shards = discovery.shard_count(self._client, name)
        with self._lock:
            q = self._queues.get(name)
            if q is None or getattr(q, "shard_count", 1) != shards:
                q = Queue(name, self._client, clock=self._clock, shards=shards)
                self._queues[name] = q
            return q

    def describe(self) -> Iterable[Metric]:
        """Nothing: the families depend on the queues found, so registering reads nothing."""
        return []

    def collect(self) -> Iterator[Metric]:
        names = self._names if self._names is not None else discovery.queue_names(self._client)
        up = GaugeMetricFamily(
            "dueq_queue_up", "1 when the queue's stats could be read", labels=["queue"]
        )
        tasks = GaugeMetricFamily(
            "dueq_tasks",
            "Tasks by state: delayed (not yet due), due (waiting for a worker), leased, dead",
            labels=["queue", "state"],
        )
        lag = GaugeMetricFamily(
            "dueq_oldest_due_lag_seconds",
            "How long the oldest due task has waited past its due time",
            labels=["queue"],
        )
        next_due = GaugeMetricFamily(
            "dueq_next_due_timestamp_seconds",
            "When the next task falls due (Unix time)",
            labels=["queue"],
        )
        paused = GaugeMetricFamily("dueq_paused", "1 while the queue is paused", labels=["queue"])
        missing = GaugeMetricFamily(
            "dueq_missing_tasks",
            "Tasks counted in a state whose data is gone (evicted or deleted)",
            labels=["queue"],
        )
        crons = GaugeMetricFamily(
            "dueq_cron_definitions",
            "Cron definitions by state: active, paused, broken (cannot be kept going as stored)",
            labels=["queue", "state"],
        )
        rates = GaugeMetricFamily(
            "dueq_task_rate_per_second",
            "Events per second in the last complete minute of the queue's per-minute history: "
            "scheduled, claimed, acked, retried, dead, lease_expired",
            labels=["queue", "event"],
        )
        workers = GaugeMetricFamily(
            "dueq_workers", "Live worker processes serving the queue", labels=["queue"]
        )
        shard_tasks = GaugeMetricFamily(
            "dueq_shard_tasks",
            "A sharded queue's tasks by shard and state (as dueq_tasks)",
            labels=["queue", "shard", "state"],
        )
        shard_lag = GaugeMetricFamily(
            "dueq_shard_oldest_due_lag_seconds",
            "How long the oldest due task of each shard of a sharded queue has waited",
            labels=["queue", "shard"],
        )
        fair = _Fairness()
        cron_last = _CronLast()
        counters: dict[str, CounterMetricFamily] = {}
        for name in names:
            try:
                q = self._queue(name)
                s = q.stats()
                last_minute = q.history(2)[0]
                definitions = q.cron.list()
                alive = len(q.workers())
            except (redis.RedisError, DueqError, ValueError) as exc:
                # one unreadable queue (no permission, corrupted data, Redis away) must not
                # fail the scrape of the others: it shows as dueq_queue_up 0
                logger.warning("metrics: cannot read queue %r: %s", name, exc)
                up.add_metric([name], 0)
                continue
            up.add_metric([name], 1)
            self._add_stats(name, s, tasks, lag, next_due, paused, missing)
            for part in s.shards:
                for state, count in _by_state(part):
                    shard_tasks.add_metric([name, part.shard, state], count)
                shard_lag.add_metric(
                    [name, part.shard], part.oldest_due_lag_s if part.due_now else 0.0
                )
            cron_states = Counter(
                "broken" if d.problem else "paused" if d.paused else "active" for d in definitions
            )
            for state in ("active", "paused", "broken"):
                crons.add_metric([name, state], cron_states[state])
            for event in HISTORY_COUNTERS:
                rates.add_metric([name, RATE_EVENTS[event]], getattr(last_minute, event) / 60)
            cron_last.add(name, definitions)
            workers.add_metric([name], alive)
            fair.add(name, s)
            # every known counter, at 0 before its first event: an alert on increase() then
            # sees the first one (a series that appears at 1 has no increase)
            for counter in sorted({*STATS_COUNTERS, *s.counters}):
                family, labels, help_text = counter_series(counter)
                if family not in counters:
                    counters[family] = CounterMetricFamily(
                        family, help_text, labels=["queue", *labels]
                    )
                counters[family].add_metric([name, *labels.values()], s.counters.get(counter, 0))
        yield from (up, tasks, lag, next_due, paused, missing, crons, rates, workers)
        yield from (shard_tasks, shard_lag)
        yield from fair.families
        yield from cron_last.families
        yield from (counters[family] for family in sorted(counters))

    @staticmethod
    def _add_stats(
        name: str,
        s: QueueStats,
        tasks: GaugeMetricFamily,
        lag: GaugeMetricFamily,
        next_due: GaugeMetricFamily,
        paused: GaugeMetricFamily,
        missing: GaugeMetricFamily,
    ) -> None:
        for state, count in _by_state(s):
            tasks.add_metric([name, state], count)
        lag.add_metric([name], s.oldest_due_lag_s if s.due_now else 0.0)
        if s.next_due_at is not None:
            next_due.add_metric([name], s.next_due_at.timestamp())
        paused.add_metric([name], 1 if s.paused else 0)
        missing.add_metric([name], s.missing)


def _by_state(s: QueueStats | ShardStats) -> tuple[tuple[str, int], ...]:
    """The states of ``dueq_tasks`` with their counts (a queue's or one shard's)."""
    return (
        ("delayed", s.scheduled - s.due_now),
        ("due", s.due_now),
        ("leased", s.leased),
        ("dead", s.dead),
    )


class _Fairness:
    """The families of a fair queue's lanes and tenants (see the module doc)."""

    def __init__(self) -> None:
        self.lanes = GaugeMetricFamily(
            "dueq_fair_lanes",
            "Lanes of a fair queue with due tasks: one per tenant with due tasks",
            labels=["queue"],
        )
        self.due = GaugeMetricFamily(
            "dueq_tenant_due",
            "Due tasks of a tenant of a fair queue (at most 20 tenants a queue)",
            labels=["queue", "tenant"],
        )
        self.claimed = GaugeMetricFamily(
            "dueq_tenant_claimed_last_minute",
            "Tasks of a tenant of a fair queue claimed in this minute and the one before",
            labels=["queue", "tenant"],
        )
        self.families = (self.lanes, self.due, self.claimed)

    def add(self, queue: str, s: QueueStats) -> None:
        self.lanes.add_metric([queue], s.fair_lanes)
        for t in s.tenants[:MAX_TENANT_SERIES]:
            self.due.add_metric([queue, t.tenant], t.due)
            self.claimed.add_metric([queue, t.tenant], t.claimed)


class _CronLast:
    """The families of each cron definition's last outcome (see the module doc)."""

    def __init__(self) -> None:
        labels = ["queue", "cron"]
        self.outcome = GaugeMetricFamily(
            "dueq_cron_last_outcome",
            "1 for the outcome of the cron definition's last firing, 0 for the others",
            labels=[*labels, "outcome"],
        )
        self.at = GaugeMetricFamily(
            "dueq_cron_last_outcome_timestamp_seconds",
            "When the cron definition's last firing had its outcome (Unix time)",
            labels=labels,
        )
        self.success = GaugeMetricFamily(
            "dueq_cron_last_success_timestamp_seconds",
            "When an occurrence of the cron definition was last acked (Unix time)",
            labels=labels,
        )
        self.families = (self.outcome, self.at, self.success)

    def add(self, queue: str, definitions: Iterable[CronDefinition]) -> None:
        for d in definitions:
            if d.last_outcome is not None and d.last_outcome_at is not None:
                for outcome in get_args(LastOutcome):
                    self.outcome.add_metric(
                        [queue, d.name, outcome], float(d.last_outcome == outcome)
                    )
                self.at.add_metric([queue, d.name], d.last_outcome_at.timestamp())
            if d.last_success_at is not None:
                self.success.add_metric([queue, d.name], d.last_success_at.timestamp())


class _Outcomes(Collector):
    """``dueq_worker_outcomes_total``: observed outcomes plus the counts of followed workers."""

    def __init__(self, owner: WorkerMetrics) -> None:
        self._owner = owner

    def describe(self) -> Iterable[Metric]:
        return [self._family()]

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(
            "dueq_worker_outcomes",
            "What became of this worker's deliveries, by outcome: acked, retried, dead, "
            "released, cancelled, expired (past its expires=) or lost (its lease was taken "
            "over, or the settle could not reach Redis)",
            labels=["queue", "worker", "outcome"],
        )

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        counts = self._owner.outcome_counts()
        for queue in self._owner.queues():
            for kind in OUTCOME_KINDS:
                counts.setdefault((queue, kind), 0)  # from the start, at 0
        for (queue, kind), count in sorted(counts.items()):
            family.add_metric([queue, self._owner.worker, kind], count)
        yield family


class WorkerMetrics:
    """Worker-side metrics in ``registry``: the hook a consumer calls (see the module doc)."""

    def __init__(self, registry: CollectorRegistry, *, worker: str | None = None) -> None:
        self.worker = worker or default_worker_name()
        self.handler_seconds = Histogram(
            "dueq_handler_duration_seconds",
            "Time in the handler per delivery",
            ["queue", "worker", "result"],
            buckets=HANDLER_BUCKETS_S,
            registry=registry,
        )
        self.delivery_lag_seconds = Histogram(
            "dueq_delivery_lag_seconds",
            "Claim time minus due time of each delivery (Redis time)",
            ["queue", "worker"],
            buckets=DELIVERY_LAG_BUCKETS_S,
            registry=registry,
        )
        self.bulk_calls = PromCounter(
            "dueq_bulk_calls",
            "Calls of a bulk handler (BatchSpec); task: the named task, or empty for the "
            "worker's plain handler",
            ["queue", "worker", "task"],
            registry=registry,
        )
        self.bulk_call_items = Histogram(
            "dueq_bulk_call_items",
            "Items in each call of a bulk handler",
            ["queue", "worker", "task"],
            buckets=BULK_ITEMS_BUCKETS,
            registry=registry,
        )
        self.bulk_call_seconds = Histogram(
            "dueq_bulk_call_duration_seconds",
            "Time in a bulk handler per call",
            ["queue", "worker", "task", "result"],
            buckets=HANDLER_BUCKETS_S,
            registry=registry,
        )
        self._lock = threading.Lock()
        self._observed: Counter[tuple[str, str]] = Counter()
        self._followed: list[tuple[str, Mapping[str, int]]] = []
        self._queues: dict[str, None] = {}  # the queues measured, in the order first seen
        registry.register(_Outcomes(self))

    def watch(self, queue: str) -> None:
        """Export ``queue``'s series now, at 0 (``wrap`` and ``follow`` call it): a counter
        that appears only at its first event hides that event from ``increase()``."""
        if queue in self._queues:  # the common case, on every delivery: no lock
            return
        with self._lock:
            if queue in self._queues:
                return
            self._queues[queue] = None
        for result in ("ok", "error"):
            self.handler_seconds.labels(queue, self.worker, result)
        self.delivery_lag_seconds.labels(queue, self.worker)

    def watch_bulk(self, queue: str, task: str) -> None:
        """Export the bulk series of ``queue``'s bulk handler ``task`` (``""``: the plain
        handler) now, at 0, as ``watch`` does for the per-delivery ones."""
        self.watch(queue)
        self.bulk_calls.labels(queue, self.worker, task)
        self.bulk_call_items.labels(queue, self.worker, task)
        for result in ("ok", "error"):
            self.bulk_call_seconds.labels(queue, self.worker, task, result)

    def queues(self) -> list[str]:
        """The queues this worker's series are exported for."""
        with self._lock:
            return list(self._queues)

    # -- the hook ----------------------------------------------------------------------------

    def observe_delivery(self, queue: str, delivery: Any) -> None:
        """A handler starts on ``delivery`` (anything with ``claimed_ms`` and ``due_ms``)."""
        self.watch(queue)
        lag_s = max(0, delivery.claimed_ms - delivery.due_ms) / 1000
        self.delivery_lag_seconds.labels(queue, self.worker).observe(lag_s)

    def observe_handler(self, queue: str, duration_s: float, ok: bool) -> None:
        """A handler returned (``ok``) or raised after ``duration_s``."""
        self.watch(queue)
        result = "ok" if ok else "error"
        self.handler_seconds.labels(queue, self.worker, result).observe(duration_s)

    def observe_outcome(self, queue: str, outcome: Outcome) -> None:
        """A delivery of ``queue`` was settled as ``outcome.kind``."""
        self.watch(queue)
        with self._lock:
            self._observed[queue, outcome.kind] += 1

    def observe_call(self, queue: str, task: str, items: int, duration_s: float, ok: bool) -> None:
        """A call of bulk handler ``task`` (``""``: the plain handler) on ``items`` items
        returned (``ok``) or raised after ``duration_s``."""
        self.bulk_calls.labels(queue, self.worker, task).inc()
        self.bulk_call_items.labels(queue, self.worker, task).observe(items)
        result = "ok" if ok else "error"
        self.bulk_call_seconds.labels(queue, self.worker, task, result).observe(duration_s)

    # -- without a change to the consumer ----------------------------------------------------

    def follow(self, queue: str, outcomes: Mapping[str, int]) -> None:
        """Report ``outcomes`` (a ``Worker.outcomes`` counter, read at each scrape) as the
        outcomes of ``queue``. Use it or ``observe_outcome`` for a queue, not both."""
        self.watch(queue)
        with self._lock:
            self._followed.append((queue, outcomes))

    def outcome_counts(self) -> dict[tuple[str, str], int]:
        """Every (queue, outcome kind) counted so far."""
        with self._lock:
            counts = Counter(self._observed)
            followed = list(self._followed)
        for queue, outcomes in followed:
            for kind, count in _snapshot(outcomes).items():
                counts[queue, kind] += count
        return dict(counts)

    def wrap(
        self, queue: str, handler: Callable[..., Any], *, bulk: bool = False
    ) -> Callable[..., Any]:
        """``handler`` (sync or ``async def``) with its deliveries and time measured;
        ``bulk``: it is a bulk handler (called with a list of ``dueq.Item``), measured as
        calls. A named tasks' dispatcher's bulk calls are measured too (see the module doc)."""
        self.watch(queue)
        if bulk:
            return self._wrap_bulk(queue, handler)
        measured = self._wrap(queue, handler)
        dispatch = inspect.unwrap(handler)
        if getattr(dispatch, "bulk", False):  # a dispatcher with bulk tasks: their calls
            measured.run_bulk = self._measured_run_bulk(queue, dispatch.run_bulk)  # type: ignore[attr-defined]
        return measured

    def _wrap(self, queue: str, handler: Callable[..., Any]) -> Callable[..., Any]:
        if is_async_handler(handler):

            @functools.wraps(handler)
            async def measured_async(delivery: Any) -> Any:
                self.observe_delivery(queue, delivery)
                start = time.perf_counter()
                ok = False
                try:
                    result = await handler(delivery)
                    ok = True
                    return result
                finally:
                    self.observe_handler(queue, time.perf_counter() - start, ok)

            return measured_async

        @functools.wraps(handler)
        def measured(delivery: Any) -> Any:
            self.observe_delivery(queue, delivery)
            start = time.perf_counter()
            ok = False
            try:
                result = handler(delivery)
                ok = True
                return result
            finally:
                self.observe_handler(queue, time.perf_counter() - start, ok)

        return measured

    def _wrap_bulk(self, queue: str, handler: Callable[..., Any]) -> Callable[..., Any]:
        """A plain bulk handler measured per call (its items' lag per item)."""
        self.watch_bulk(queue, "")
        if is_async_handler(handler):

            @functools.wraps(handler)
            async def measured_async(items: list[Any]) -> Any:
                start = self._bulk_started(queue, items)
                ok = False
                try:
                    result = await handler(items)
                    ok = True
                    return result
                finally:
                    self.observe_call(queue, "", len(items), time.perf_counter() - start, ok)

            return measured_async

        @functools.wraps(handler)
        def measured(items: list[Any]) -> Any:
            start = self._bulk_started(queue, items)
            ok = False
            try:
                result = handler(items)
                ok = True
                return result
            finally:
                self.observe_call(queue, "", len(items), time.perf_counter() - start, ok)

        return measured

    def _bulk_started(self, queue: str, items: list[Any]) -> float:
        """A bulk call starts on ``items``: each item's delivery lag; the start time."""
        for item in items:
            self.observe_delivery(queue, item.delivery)
        return time.perf_counter()

    def _measured_run_bulk(self, queue: str, run_bulk: Callable[..., Any]) -> Callable[..., Any]:
        """A dispatcher's ``run_bulk`` (which may return a coroutine to await) measured per
        call, labelled with the named task's name (``""`` for the plain handler)."""

        def measured_run_bulk(group: Any, items: list[Any]) -> Any:
            task = getattr(group, "name", "")  # (a TaskFunction, or the plain handler's mark)
            self.watch_bulk(queue, task)
            start = self._bulk_started(queue, items)
            try:
                value = run_bulk(group, items)
            except BaseException:  # the call's failure: measured, then the processor's
                self.observe_call(queue, task, len(items), time.perf_counter() - start, False)
                raise
            if inspect.isawaitable(value):
                return self._awaited_call(queue, task, items, start, value)
            self.observe_call(queue, task, len(items), time.perf_counter() - start, True)
            return None

        return measured_run_bulk

    async def _awaited_call(
        self, queue: str, task: str, items: list[Any], start: float, awaitable: Any
    ) -> Any:
        ok = False
        try:
            value = await awaitable
            ok = True
            return value
        finally:
            self.observe_call(queue, task, len(items), time.perf_counter() - start, ok)


def default_worker_name() -> str:
    """The ``worker`` label when none is given: the host name, the same after a restart (a
    container's or pod's name), unlike the per-process ``dueq.worker_id()``."""
    return socket.gethostname() or "localhost"


def _snapshot(outcomes: Mapping[str, int]) -> dict[str, int]:
    """A copy of a counter another thread may be adding a key to."""
    for _ in range(3):
        try:
            return dict(outcomes)
        except RuntimeError:  # "dictionary changed size during iteration": copy again
            continue
    return {}


def new_registry(*, process: bool = True) -> CollectorRegistry:
    """A registry of its own (not prometheus_client's global one), with the standard process,
    platform and garbage-collector metrics unless ``process=False``."""
    registry = CollectorRegistry()
    if process:
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
    return registry


def serve(registry: CollectorRegistry, port: int, host: str = "127.0.0.1") -> WSGIServer:
    """Serve ``registry`` at ``http://host:port/metrics`` from a daemon thread; returns the
    server (``server_port`` is the port bound, useful with ``port=0``; ``shutdown()`` stops
    it, then ``server_close()`` frees its socket). Binds loopback unless told otherwise: the
    metrics name queues and hosts."""
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server
