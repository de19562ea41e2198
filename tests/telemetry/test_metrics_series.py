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

from cli_worker_support import start_worker, wait_for
from metrics_support import free_port, stop, try_scrape
from paths_support import DOCS, SRC
from prometheus_client import generate_latest

import dueq
from dueq.metrics import (
    OUTCOME_KINDS,
    STATS_COUNTERS,
    QueueCollector,
    WorkerMetrics,
    counter_series,
    new_registry,
)

LUA = Path(dueq.__file__).parent / "_wire" / "lua"


def text_of(registry) -> str:
    return generate_latest(registry).decode()


def test_every_queue_counter_is_exported_at_0_before_its_first_event(r):
    dueq.Queue("fresh", r).schedule({"x": 1})  # scheduled once; nothing claimed, nothing died
    registry = new_registry(process=False)
    registry.register(QueueCollector(r, ["fresh"]))
    text = text_of(registry)
    assert 'dueq_task_outcomes_total{outcome="dead",queue="fresh"} 0.0' in text
    assert 'dueq_task_outcomes_total{outcome="acked",queue="fresh"} 0.0' in text
    assert 'dueq_cron_skipped_total{queue="fresh"} 0.0' in text
    assert 'dueq_tasks_scheduled_total{queue="fresh"} 1.0' in text
    for counter in STATS_COUNTERS:
        family, labels, _ = counter_series(counter)
        shown = "".join(f'{k}="{v}",' for k, v in labels.items())
        assert f'{family}_total{{{shown}queue="fresh"}}' in text


def test_the_known_counters_are_every_counter_a_script_increments():
    counted = {
        m.group(1)
        for path in LUA.glob("**/*.lua")  # the scripts and their includes
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
    assert not {"dueq_tasks", "dueq_queue_up", "dueq_task_outcomes_total"} & names_plain
    assert {
        dict(labels).get("worker") for name, labels in from_plain if name.startswith("dueq_")
    } == {"w-a"}
    assert ("dueq_queue_up", (("queue", "mw"),)) in from_both
    assert {
        dict(labels)["worker"] for name, labels in from_both if name == "dueq_worker_outcomes_total"
    } == {socket.gethostname()}


def test_the_metrics_series_pages_block_prints_the_series_it_shows(r, redis_server):
    doc = DOCS / "metrics-series.md"
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


# -- one naming scheme, documented (issue 37) ----------------------------------------------------

METRICS_DOC = DOCS / "metrics.md"
#: The labels whose values the docs list, each value in backticks in its metric's row.
LISTED_LABELS = ("state", "event", "outcome", "result")


def documented_rows() -> dict[str, str]:
    """docs/metrics.md's table: metric name (with ``_total`` for counters) -> its row."""
    rows = {}
    for line in METRICS_DOC.read_text().splitlines():
        m = re.match(
            r"\| `(dueq_[a-z_]+)(?:\{[a-z_,]*\})?` \| (?:gauge|counter|histogram) \|", line
        )
        if m:
            rows[m.group(1)] = line
    return rows


def every_family(r, clock) -> list:
    """Every dueq family a `dueq metrics` and a worker export, with every label value they
    can have: a queue with a cron definition that ran, an unknown stats counter, a worker."""
    from prometheus_client import parser

    q = dueq.Queue("all", r, clock=clock)
    q.configure(fairness="key")  # a tenant's series too
    q.schedule({"t": 1}, key="acme")
    q.cron.add("tick", "* * * * *")
    clock.advance(60)
    for d in q.claim(10):
        d.ack()
    q.schedule({"x": 1}, delay=60)
    r.hincrby("dueq:{all}:stats", "from_a_newer_dueq", 1)
    registry = new_registry(process=False)
    registry.register(QueueCollector(r, ["all"], clock=clock))
    WorkerMetrics(registry, worker="w").watch("all")
    families = parser.text_string_to_metric_families(text_of(registry))
    # (prometheus_client adds a histogram's creation time as a family "<name>_created")
    return [f for f in families if f.name.startswith("dueq_") and not f.name.endswith("_created")]


def test_every_exported_series_and_label_value_is_in_the_metrics_docs(r, clock):
    rows = documented_rows()
    for family in every_family(r, clock):
        name = family.name + ("_total" if family.type == "counter" else "")
        assert name in rows, f"{name} is exported but not in docs/metrics.md"
        for sample in family.samples:
            for label in LISTED_LABELS:
                value = sample.labels.get(label)
                if value is not None:
                    assert f"`{value}`" in rows[name], f'{name}{{{label}="{value}"}} undocumented'


def test_every_documented_metric_is_exported(r, clock):
    exported = {f.name + ("_total" if f.type == "counter" else "") for f in every_family(r, clock)}
    assert set(documented_rows()) == exported


def test_outcomes_are_one_labelled_counter_with_lease_expired_apart_from_expired(r, clock):
    q = dueq.Queue("oc", r, clock=clock, lease=10, retry=dueq.RetryPolicy(max_attempts=3))
    q.schedule({"n": 1}, id="held")
    q.schedule({"n": 2}, id="late", expires=5)
    [held] = q.claim(1)
    assert held.id == "held"
    clock.advance(11)  # held's lease runs out; late is past its expires=
    q.claim(10)
    registry = new_registry(process=False)
    registry.register(QueueCollector(r, ["oc"], clock=clock))
    value = registry.get_sample_value
    outcome = lambda o: value("dueq_task_outcomes_total", {"queue": "oc", "outcome": o})  # noqa: E731
    assert (outcome("lease_expired"), outcome("expired")) == (1, 1)
    assert outcome("acked") == 0 and outcome("dead") == 0
    for old in ("dueq_tasks_expired_total", "dueq_tasks_expired_tasks_total"):
        assert value(old, {"queue": "oc"}) is None
    rate = value("dueq_task_rate_per_second", {"queue": "oc", "event": "lease_expired"})
    assert rate is not None


def test_every_dueq_family_has_its_own_written_help_text(r, clock):
    helps = {f.name: f.documentation for f in every_family(r, clock)}
    assert len(set(helps.values())) == len(helps)  # no two families share one sentence
    assert not [h for h in helps.values() if "counted as" in h]  # not generated from the name
