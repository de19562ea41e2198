"""Metrics of bulk handlers (``BatchSpec``): calls, items per call and call time by task, each
item's lag and outcome counted per item, in a real worker (in process and ``dueq worker
--batch-max --metrics-port``)."""

from __future__ import annotations

import asyncio
import threading
import time

import redis.asyncio
from cli_worker_support import start_worker, wait_for
from metrics_support import free_port, scrape, stop, try_scrape

import dueq
from dueq.metrics import WorkerMetrics, new_registry
from dueq.named import Dispatcher


def _until(condition, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the worker did not get there in time"
        time.sleep(0.01)


def test_a_plain_bulk_handler_is_measured_per_call_and_its_items_per_item(r):
    q = dueq.Queue("mb", r)
    q.schedule_many(dueq.Task({"n": n}) for n in range(35))
    q.schedule({"fail": True}, id="bad")
    registry = new_registry(process=False)
    m = WorkerMetrics(registry, worker="w1")
    sizes: list[int] = []

    def handler(items: list[dueq.Item]) -> None:
        sizes.append(len(items))
        for item in items:
            if item.payload.get("fail"):
                item.fail(ValueError("no"))

    w = dueq.Worker(q, m.wrap("mb", handler, bulk=True), batch=dueq.BatchSpec(max=10, linger=0.02))
    m.follow("mb", w.outcomes)
    thread = threading.Thread(target=w.run)
    thread.start()
    try:
        _until(lambda: w.outcomes["acked"] == 35 and w.outcomes["retried"] >= 1)
    finally:
        w.stop()
        thread.join(30)
    value = registry.get_sample_value
    labels = {"queue": "mb", "worker": "w1", "task": ""}
    assert value("dueq_bulk_calls_total", labels) == len(sizes)
    assert value("dueq_bulk_call_items_count", labels) == len(sizes)
    assert value("dueq_bulk_call_items_sum", labels) == sum(sizes)
    assert max(sizes) <= 10
    assert value("dueq_bulk_call_duration_seconds_count", {**labels, "result": "ok"}) == len(sizes)
    assert value("dueq_bulk_call_duration_seconds_count", {**labels, "result": "error"}) == 0
    # each item is a delivery: its lag and its outcome, one each (not one per call)
    assert value("dueq_delivery_lag_seconds_count", {"queue": "mb", "worker": "w1"}) == sum(sizes)
    outcome = {"queue": "mb", "worker": "w1"}
    assert value("dueq_worker_outcomes_total", {**outcome, "outcome": "acked"}) == 35
    assert value("dueq_worker_outcomes_total", {**outcome, "outcome": "retried"}) >= 1
    # a bulk call is not a per-delivery handler time
    assert value("dueq_handler_duration_seconds_count", {**outcome, "result": "ok"}) == 0


def test_a_raising_async_bulk_handler_counts_an_error_call_and_fails_each_item(redis_server):
    registry = new_registry(process=False)
    m = WorkerMetrics(registry, worker="w2")

    async def handler(items: list[dueq.Item]) -> None:
        raise ValueError("the whole call")

    async def main() -> dueq.AsyncWorker:
        client = redis.asyncio.Redis.from_url(redis_server.url)
        aq = dueq.AsyncQueue("mba", client, retry=dueq.RetryPolicy(max_attempts=1))
        await aq.schedule_many(dueq.Task({"n": n}) for n in range(6))
        w = dueq.AsyncWorker(
            aq,
            m.wrap("mba", handler, bulk=True),
            batch=dueq.BatchSpec(max=100, linger=0.05),
            handle_signals=False,
        )
        m.follow("mba", w.outcomes)
        running = asyncio.ensure_future(w.run())
        deadline = time.monotonic() + 20
        while w.outcomes["dead"] < 6:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        w.stop()
        await asyncio.wait_for(running, 30)
        await client.aclose()
        return w

    asyncio.run(main())
    value = registry.get_sample_value
    labels = {"queue": "mba", "worker": "w2", "task": ""}
    calls = value("dueq_bulk_calls_total", labels)
    assert calls >= 1
    assert value("dueq_bulk_call_items_sum", labels) == 6
    assert value("dueq_bulk_call_duration_seconds_count", {**labels, "result": "error"}) == calls
    outcome = {"queue": "mba", "worker": "w2", "outcome": "dead"}
    assert value("dueq_worker_outcomes_total", outcome) == 6


def test_a_named_bulk_tasks_calls_are_measured_through_the_wrapped_dispatcher(r):
    q = dueq.Queue("mbn", r)
    sizes: list[int] = []

    @q.task(name="gather", batch=dueq.BatchSpec(max=8))
    def gather(items: list[dueq.Item]) -> None:
        sizes.append(len(items))

    @q.task(name="single")
    def single(n: int) -> int:
        return n

    for n in range(20):
        gather.schedule(n=n)
    single.schedule(n=1)
    registry = new_registry(process=False)
    m = WorkerMetrics(registry, worker="w3")
    m.watch_bulk("mbn", "gather")
    w = dueq.Worker(q, m.wrap("mbn", Dispatcher([q], None)))
    m.follow("mbn", w.outcomes)
    thread = threading.Thread(target=w.run)
    thread.start()
    try:
        _until(lambda: w.outcomes["acked"] == 21)
    finally:
        w.stop()
        thread.join(30)
    value = registry.get_sample_value
    labels = {"queue": "mbn", "worker": "w3", "task": "gather"}
    assert value("dueq_bulk_calls_total", labels) == len(sizes)
    assert value("dueq_bulk_call_items_sum", labels) == 20
    assert max(sizes) <= 8
    # the named single task is a per-delivery handler call, as before
    per_delivery = {"queue": "mbn", "worker": "w3", "result": "ok"}
    assert value("dueq_handler_duration_seconds_count", per_delivery) == 1
    assert value("dueq_delivery_lag_seconds_count", {"queue": "mbn", "worker": "w3"}) == 21


def test_dueq_worker_with_batch_max_serves_its_bulk_calls_and_per_item_outcomes(r, redis_server):
    q = dueq.Queue("mbw", r)
    q.schedule_many(dueq.Task({"n": n}) for n in range(120))
    port = free_port()
    child = start_worker(
        redis_server,
        "mbw",
        "cli_handlers:record_calls",
        "--batch-max",
        "50",
        "--linger",
        "20",
        "--metrics-port",
        str(port),
    )
    try:

        def settled() -> bool:
            key = ("dueq_worker_outcomes_total", "acked")
            found = try_scrape(port)
            return any(
                (name, dict(labels).get("outcome")) == key and v == 120
                for (name, labels), v in found.items()
            )

        wait_for(settled, "120 acked outcomes in /metrics")
        samples = scrape(port)
    finally:
        _, err = stop(child)
    assert child.returncode == 0, err
    sizes = [int(x) for x in r.lrange("call_sizes", 0, -1)]
    bulk = {
        name: v
        for (name, labels), v in samples.items()
        if name.startswith("dueq_bulk_call")
        and dict(labels).get("task") == ""
        and dict(labels).get("result", "ok") == "ok"
    }
    assert bulk["dueq_bulk_calls_total"] == len(sizes)
    assert bulk["dueq_bulk_call_items_sum"] == sum(sizes) == 120
    assert bulk["dueq_bulk_call_duration_seconds_count"] == len(sizes)
