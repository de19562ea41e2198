"""Prometheus metrics (``dueq.metrics``): scraped over HTTP from a running ``dueq worker
--metrics-port`` and from ``dueq metrics``, parsed with ``prometheus_client.parser``."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from typing import Any

import pytest
from cli_worker_support import start_worker, wait_for
from metrics_support import free_port, scrape, stop, try_scrape

import dueq
from dueq.metrics import (
    RATE_EVENTS,
    QueueCollector,
    WorkerMetrics,
    counter_series,
    new_registry,
    serve,
)
from dueq.model import HISTORY_COUNTERS as HISTORY


def test_a_running_worker_serves_acked_and_dead_counts_equal_to_what_happened(r, redis_server):
    q = dueq.Queue("w", r)
    q.schedule_many(dueq.Task({"n": n}) for n in range(12))
    q.schedule({"fail": True}, id="bad")
    q.schedule({"n": "later"}, id="later", delay=3600)
    port = free_port()
    child = start_worker(
        redis_server,
        "w",
        "cli_handlers:record",
        "--max-attempts",
        "1",
        "--metrics-port",
        str(port),
        "--queue-metrics",  # the queue-wide series too (by default only dueq metrics has them)
    )
    try:

        def settled() -> bool:
            found = try_scrape(port)
            outcomes = {
                dict(labels)["outcome"]: v
                for (name, labels), v in found.items()
                if name == "dueq_worker_outcomes_total"
            }
            return {k: v for k, v in outcomes.items() if v} == {"acked": 12, "dead": 1}

        wait_for(settled, "12 acked and 1 dead outcome in /metrics")
        samples = scrape(port)
    finally:
        _, err = stop(child)
    assert child.returncode == 0, err
    qw = (("queue", "w"),)
    assert samples["dueq_task_outcomes_total", (("outcome", "acked"), ("queue", "w"))] == 12
    assert samples["dueq_task_outcomes_total", (("outcome", "dead"), ("queue", "w"))] == 1
    assert samples["dueq_tasks_scheduled_total", qw] == 14
    assert samples["dueq_tasks", (("queue", "w"), ("state", "dead"))] == 1
    assert samples["dueq_tasks", (("queue", "w"), ("state", "delayed"))] == 1
    assert samples["dueq_tasks", (("queue", "w"), ("state", "due"))] == 0
    assert samples["dueq_tasks", (("queue", "w"), ("state", "leased"))] == 0
    assert samples["dueq_queue_up", qw] == 1
    assert samples["dueq_paused", qw] == 0
    assert samples["dueq_oldest_due_lag_seconds", qw] == 0
    assert samples["dueq_workers", qw] == 1  # the worker's registry entry, while it ran
    worker = {
        dict(labels)["worker"]
        for (name, labels) in samples
        if name == "dueq_handler_duration_seconds_count"
    }
    assert len(worker) == 1
    (wid,) = worker
    assert wid == socket.gethostname()  # no --name: the host name, the same after a restart
    handled = {
        dict(labels)["result"]: v
        for (name, labels), v in samples.items()
        if name == "dueq_handler_duration_seconds_count"
    }
    assert handled == {"ok": 12, "error": 1}
    lag = (("queue", "w"), ("worker", wid))
    assert samples["dueq_delivery_lag_seconds_count", lag] == 13
    assert samples["process_cpu_seconds_total", ()] > 0


def test_dueq_metrics_exports_every_queue_found_at_each_scrape(r, redis_server):
    dueq.Queue("a", r).schedule({"x": 1})
    port = free_port()
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dueq",
            "metrics",
            "--port",
            str(port),
            "--redis-url",
            redis_server.url,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: bool(try_scrape(port)), "the exporter")
        first = scrape(port)
        b = dueq.Queue("b", r)
        b.schedule({"x": 2}, id="t")
        b.pause()
        second = scrape(port)
    finally:
        _, err = stop(child)
    assert child.returncode == 0, err
    assert f"serving metrics on http://127.0.0.1:{port}/metrics" in err
    assert first["dueq_tasks", (("queue", "a"), ("state", "due"))] == 1
    assert ("dueq_queue_up", (("queue", "b"),)) not in first
    assert second["dueq_tasks", (("queue", "b"), ("state", "due"))] == 1
    assert second["dueq_paused", (("queue", "b"),)] == 1
    assert second["dueq_paused", (("queue", "a"),)] == 0


def test_the_collector_reads_named_queues_and_counts_cron_definitions_by_state(r):
    q = dueq.Queue("c", r)
    q.cron.add("nightly", "0 3 * * *")
    q.cron.add("hourly", "@hourly")
    q.cron.pause("hourly")
    registry = new_registry(process=False)
    registry.register(QueueCollector(r, ["c"]))
    cron = {
        s.labels["state"]: s.value
        for family in registry.collect()
        for s in family.samples
        if s.name == "dueq_cron_definitions"
    }
    assert cron == {"active": 1, "paused": 1, "broken": 0}


def test_an_unreadable_queue_is_reported_down_and_the_others_still_export(r, admin):
    dueq.Queue("good", r).schedule({"x": 1})
    dueq.Queue("bad", r).schedule({"x": 1})
    admin.delete("dueq:{bad}:config")
    admin.set("dueq:{bad}:config", "not a hash")
    registry = new_registry(process=False)
    registry.register(QueueCollector(r))
    up = {
        s.labels["queue"]: s.value
        for family in registry.collect()
        for s in family.samples
        if s.name == "dueq_queue_up"
    }
    assert up == {"good": 1, "bad": 0}


def test_the_worker_hook_measures_sync_and_async_handlers_and_counts_outcomes():
    registry = new_registry(process=False)
    m = WorkerMetrics(registry, worker="h:1:x")

    class D:
        claimed_ms, due_ms = 5_000, 3_500

    def ok(d):
        return "done"

    async def boom(d):
        raise ValueError("no")

    assert m.wrap("q", ok)(D()) == "done"
    with pytest.raises(ValueError):
        asyncio.run(m.wrap("q", boom)(D()))
    m.observe_outcome("q", dueq.Outcome("a", "acked", 1))
    m.follow("q", {"acked": 2, "dead": 1})
    value = registry.get_sample_value
    assert (
        value(
            "dueq_handler_duration_seconds_count", {"queue": "q", "worker": "h:1:x", "result": "ok"}
        )
        == 1
    )
    assert (
        value(
            "dueq_handler_duration_seconds_count",
            {"queue": "q", "worker": "h:1:x", "result": "error"},
        )
        == 1
    )
    assert value("dueq_delivery_lag_seconds_sum", {"queue": "q", "worker": "h:1:x"}) == 3.0
    assert (
        value("dueq_worker_outcomes_total", {"queue": "q", "worker": "h:1:x", "outcome": "acked"})
        == 3
    )
    assert (
        value("dueq_worker_outcomes_total", {"queue": "q", "worker": "h:1:x", "outcome": "dead"})
        == 1
    )


@pytest.mark.parametrize(
    ("counter", "family", "labels"),
    [
        ("claimed", "dueq_tasks_claimed", {}),
        ("acked", "dueq_task_outcomes", {"outcome": "acked"}),
        ("expired", "dueq_task_outcomes", {"outcome": "lease_expired"}),
        ("expired_tasks", "dueq_task_outcomes", {"outcome": "expired"}),
        ("cron_skipped", "dueq_cron_skipped", {}),
        ("odd-name é", "dueq_stats_counter", {"counter": "odd_name__"}),
    ],
)
def test_stats_counters_become_prometheus_series(counter, family, labels):
    assert counter_series(counter)[:2] == (family, labels)


def serve_collector(r: Any, queues: list[str], clock: Any) -> tuple[Any, int]:
    """A QueueCollector of ``queues`` on the given clock, served over HTTP on a free port."""
    registry = new_registry(process=False)
    registry.register(QueueCollector(r, queues, clock=clock))
    server = serve(registry, 0)
    return server, int(server.server_port)


def test_rates_are_the_last_complete_minutes_counts_per_second_scraped_over_http(r, clock):
    clock.now -= clock.now % 60  # the start of a minute
    q = dueq.Queue("rates", r, clock=clock, retry=dueq.RetryPolicy(max_attempts=2))
    q.schedule_many(dueq.Task(i) for i in range(9))
    batch = q.claim(10)
    q.ack_many(batch[:6])
    for d in batch[6:8]:
        d.fail("again")  # retried
    q.fail(batch[8], dueq.Unrecoverable("no"))  # dead
    clock.advance(59)
    server, port = serve_collector(r, ["rates"], clock)
    try:
        filling = scrape(port)  # the minute is not over: the one before it had nothing
        clock.advance(1)
        q.schedule("next minute")  # counts in the new minute, not in the rates
        done = scrape(port)
    finally:
        server.shutdown()
        server.server_close()
    event = lambda e: ("dueq_task_rate_per_second", (("event", e), ("queue", "rates")))  # noqa: E731
    events = [RATE_EVENTS[e] for e in HISTORY]
    assert {e: filling[event(e)] for e in events} == dict.fromkeys(events, 0.0)
    assert {e: done[event(e)] for e in events} == {
        "scheduled": 9 / 60,
        "claimed": 9 / 60,
        "acked": 6 / 60,
        "retried": 2 / 60,
        "dead": 1 / 60,
        "lease_expired": 0.0,
    }


def test_each_cron_definitions_last_outcome_is_scraped_over_http(r, clock):
    clock.now -= clock.now % 60
    q = dueq.Queue("cr", r, clock=clock, retry=dueq.RetryPolicy(max_attempts=1))
    q.cron.add("ok", "* * * * *")
    q.cron.add("bad", "* * * * *")
    q.cron.add("idle", "0 3 * * *")
    clock.advance(60)
    acked_at = clock.now
    for d in q.claim(10):
        if d.id.startswith("cron:ok:"):
            d.ack()
    clock.advance(31)  # bad's lease (30 s) runs out: with one attempt it is dead
    q.claim(0)
    server, port = serve_collector(r, ["cr"], clock)
    try:
        found = scrape(port)
    finally:
        server.shutdown()
        server.server_close()

    def labels(cron: str, **more: str) -> tuple[tuple[str, str], ...]:
        return tuple(sorted({"queue": "cr", "cron": cron, **more}.items()))

    outcome = {
        (dict(lb)["cron"], dict(lb)["outcome"]): v
        for (name, lb), v in found.items()
        if name == "dueq_cron_last_outcome"
    }
    assert outcome == {
        ("ok", "acked"): 1.0,
        ("ok", "retrying"): 0.0,
        ("ok", "dead"): 0.0,
        ("ok", "cancelled"): 0.0,
        ("bad", "acked"): 0.0,
        ("bad", "retrying"): 0.0,
        ("bad", "dead"): 1.0,
        ("bad", "cancelled"): 0.0,
    }
    assert found["dueq_cron_last_success_timestamp_seconds", labels("ok")] == acked_at
    assert ("dueq_cron_last_success_timestamp_seconds", labels("bad")) not in found
    assert found["dueq_cron_last_outcome_timestamp_seconds", labels("bad")] == clock.now
    assert ("dueq_cron_last_outcome_timestamp_seconds", labels("idle")) not in found


def test_no_metric_label_of_a_sealed_queue_holds_a_payload(r):
    pytest.importorskip("cryptography")
    import os

    marker = "PLAINTEXT-" + os.urandom(6).hex()
    q = dueq.Queue(
        "sealed",
        r,
        codec=dueq.Encrypted(keys={"k1": os.urandom(32)}),
        retry=dueq.RetryPolicy(max_attempts=1),
    )
    q.schedule_many(dueq.Task({"card": marker, "n": i}, key="tenant-a") for i in range(3))
    [d, *_] = q.claim(limit=2)
    d.fail(RuntimeError("declined"))
    registry = new_registry(process=False)
    registry.register(QueueCollector(r, ["sealed"]))
    samples = [(s.name, s.labels) for family in registry.collect() for s in family.samples]
    assert ("dueq_queue_up", {"queue": "sealed"}) in samples
    assert marker not in repr(samples)
