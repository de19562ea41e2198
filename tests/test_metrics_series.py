"""Which Prometheus series exist and with which labels (docs/metrics-series.md): every counter
from the start at 0, a ``worker`` label that survives restarts, queue-wide gauges exported by
``dueq metrics`` (and a worker only when asked)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

from prometheus_client import generate_latest
from test_cli_worker import start_worker, wait_for
from test_metrics import free_port, stop, try_scrape

import dueq
from dueq.metrics import (
    OUTCOME_KINDS,
    STATS_COUNTERS,
    QueueCollector,
    WorkerMetrics,
    counter_metric_name,
    new_registry,
)

LUA = Path(dueq.__file__).parent / "lua"
SRC = Path(__file__).resolve().parent.parent / "src"


def text_of(registry) -> str:
    return generate_latest(registry).decode()


def test_every_queue_counter_is_exported_at_0_before_its_first_event(r):
    dueq.Queue("fresh", r).schedule({"x": 1})  # scheduled once; nothing claimed, nothing died
    registry = new_registry(process=False)
    registry.register(QueueCollector(r, ["fresh"]))
    text = text_of(registry)
    assert 'dueq_tasks_dead_total{queue="fresh"} 0.0' in text
    assert 'dueq_tasks_acked_total{queue="fresh"} 0.0' in text
    assert 'dueq_cron_skipped_total{queue="fresh"} 0.0' in text
    assert 'dueq_tasks_scheduled_total{queue="fresh"} 1.0' in text
    for counter in STATS_COUNTERS:
        assert f'{counter_metric_name(counter)}_total{{queue="fresh"}}' in text


def test_the_known_counters_are_every_counter_a_script_increments():
    counted = {
        m.group(1)
        for path in LUA.glob("*.lua")
        for m in re.finditer(r"stat_incr\([^,]+,\s*'([a-z_]+)'", path.read_text())
    }
    assert counted == set(STATS_COUNTERS)


def test_a_workers_outcomes_and_handler_series_exist_at_0_before_any_delivery(r):
    q = dueq.Queue("wq", r)
    registry = new_registry(process=False)
    m = WorkerMetrics(registry, worker="billing-1")
    m.wrap("wq", lambda d: None)
    m.follow("wq", dueq.Worker(q, lambda d: None).outcomes)
    text = text_of(registry)
    for kind in OUTCOME_KINDS:
        series = f'dueq_worker_outcomes_total{{outcome="{kind}",queue="wq",worker="billing-1"}}'
        assert f"{series} 0.0" in text
    assert 'dueq_worker_outcomes_total{outcome="dead",queue="wq",worker="billing-1"} 0.0' in text
    for result in ("ok", "error"):
        labels = f'queue="wq",result="{result}",worker="billing-1"'
        assert f"dueq_handler_duration_seconds_count{{{labels}}} 0.0" in text
    assert 'dueq_delivery_lag_seconds_count{queue="wq",worker="billing-1"} 0.0' in text


def label_sets(text: str) -> set[str]:
    """Every series (name and labels) of a registry's text, without the values."""
    return {
        line.rsplit(" ", 1)[0]
        for line in text.splitlines()
        if line.startswith("dueq_") and not line.startswith("dueq_handler_duration_seconds_created")
    }


def test_two_worker_instances_with_the_same_name_export_the_same_series():
    texts = []
    for _ in range(2):  # a worker, then the same worker after a restart
        registry = new_registry(process=False)
        m = WorkerMetrics(registry, worker="billing-1")
        m.follow("wq", {"acked": 1})
        m.wrap("wq", lambda d: None)
        texts.append(text_of(registry))
    assert label_sets(texts[0]) == label_sets(texts[1])
    assert 'worker="billing-1"' in texts[0]


def test_the_default_worker_label_is_the_host_name_not_a_per_process_id():
    first = WorkerMetrics(new_registry(process=False))
    second = WorkerMetrics(new_registry(process=False))
    assert first.worker == second.worker == socket.gethostname()


def test_a_worker_exports_its_own_series_and_the_queue_gauges_only_when_asked(r, redis_server):
    q = dueq.Queue("mw", r)
    q.schedule({"x": 1})
    plain_port, both_port = free_port(), free_port()
    plain = start_worker(
        redis_server, "mw", "cli_handlers:noop", "--metrics-port", str(plain_port), "--name", "w-a"
    )
    both = start_worker(
        redis_server,
        "mw",
        "cli_handlers:noop",
        "--metrics-port",
        str(both_port),
        "--queue-metrics",
    )
    try:
        wait_for(lambda: bool(try_scrape(plain_port)) and bool(try_scrape(both_port)), "both")
        wait_for(lambda: q.stats().counters.get("acked") == 1, "the task acked")
        from_plain, from_both = try_scrape(plain_port), try_scrape(both_port)
    finally:
        _, plain_err = stop(plain)
        _, both_err = stop(both)
    assert plain.returncode == 0, plain_err
    assert both.returncode == 0, both_err
    names_plain = {name for name, _ in from_plain}
    assert "dueq_worker_outcomes_total" in names_plain
    assert not {"dueq_tasks", "dueq_queue_up", "dueq_tasks_acked_total"} & names_plain
    assert {
        dict(labels).get("worker") for name, labels in from_plain if name.startswith("dueq_")
    } == {"w-a"}
    assert ("dueq_queue_up", (("queue", "mw"),)) in from_both
    assert {
        dict(labels)["worker"] for name, labels in from_both if name == "dueq_worker_outcomes_total"
    } == {socket.gethostname()}


def test_the_metrics_series_pages_block_prints_the_series_it_shows(r, redis_server):
    doc = Path(__file__).resolve().parent.parent / "docs" / "metrics-series.md"
    (block,) = re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.S)
    (shown,) = re.findall(r"```\n(dueq_.*?)```", doc.read_text(), flags=re.S)
    result = subprocess.run(
        [sys.executable, "-c", block],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(SRC), "DUEQ_REDIS_URL": redis_server.url},
        check=True,
    )
    printed = result.stdout.splitlines()
    for line in shown.splitlines():
        assert line in printed
