#!/usr/bin/env python
"""Consumer benchmark: delivery lag, drain throughput, event-loop gaps, idle traffic.

Starts its own throwaway redis-server (``dueq.server.RedisServer``, free loopback port) and
never touches any other server. Every figure is measured in this run, for both front ends:
the threaded consumer of ``dueq.Queue`` and the asyncio one of ``dueq.AsyncQueue`` (on a
``redis.asyncio`` client, on the loop of ``asyncio.run``). Sections:

1. lag       1,000 tasks due at 100 per second, consumed six ways: threaded ``observe`` +
             ``process`` (no-op handler, concurrency 8); ``async for d in q.deliveries()``,
             acking each; async ``observe`` + ``process`` (no-op ``async def`` handler,
             concurrency 8); ``dueq.Worker(q, handler)`` at its defaults;
             ``dueq.AsyncWorker(q, async_handler)`` at its defaults; ``dueq worker`` from
             the CLI at its defaults (a subprocess, started and idle before the tasks are
             scheduled). Two lags per delivery: by the queue's clock, ``claimed_ms -
             due_ms`` (both read from Redis TIME, whole milliseconds), and by this host's
             clock, the time the consumer handed the delivery out (for the workers: the
             handler started) minus ``due_ms`` (the host's clock is also the Redis server's).
             Early = a negative lag. Also the CPU time of the benchmark's process over each
             run, per task (not for the CLI, a process of its own). Target at defaults (issue
             31): p99 <= 2 ms and max <= 10 ms by the host's clock, 0 early. The raw Redis
             round trip (PING) in the same run is the floor any consumer pays. ``--lag-only``
             runs this section alone (``--repeat`` times, each case once per round).
2. drain     tasks due now, drained (a) threaded: ``observe(max_in_flight)`` + ``process`` with
             a no-op handler at concurrency 1 and 8; (b) async: ``async for d in
             q.deliveries(max_in_flight)`` with ``await d.ack()`` for each, and with ``await
             q.ack_many(...)`` for every 256 (acks batched, as ``process`` does); (c) async:
             ``q.observe(max_in_flight).pipe(process(noop_async_handler, concurrency=C))``
             subscribed from a coroutine, C = 1 and 64. Raw Redis baselines, sync and
             ``redis.asyncio``: one client moving the same number of tasks out with pipelined
             ZPOPMIN 1000 + HMGET + HDEL (no leases, no acks). Each async drain runs a ticker
             on the same loop (a sleep of 5 ms in a loop) and reports the largest gap between
             its ticks and their p99: the longest time the consumer held the loop, plus 5 ms.
             Async figures are compared with the best threaded drain of the same run.
3. idle      Redis commands per second (INFO total_commands_processed) while one consumer
             with the default heartbeat waits on an empty queue, threaded and async

    .venv/bin/python scripts/bench/observe.py [--quick] [--repeat N] [--lag-only]

``--quick`` shrinks the drain and the idle window for a smoke run. The table goes to stdout,
then one JSON line with every figure; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import redis
import redis.asyncio
from reactivex import Observable
from reactivex import operators as ops
from report import percentile, print_table

import dueq
from dueq import AsyncQueue, Queue, Task
from dueq.server import RedisServer

perf = time.perf_counter
T = TypeVar("T")

LAG_TASKS = 1_000
LAG_RATE_PER_S = 100
LAG_LEAD_S = 1.0  # the first task is due this long after scheduling
DRAIN_CONCURRENCY = (1, 8)
ASYNC_PROCESS_CONCURRENCY = (1, 64)
DRAIN_MAX_IN_FLIGHT = 512
PING_ROUNDS = 2_000
ASYNC_ACK_EVERY = (1, 256)  # deliveries(): await d.ack() each; await q.ack_many() per 256
TICK_S = 0.005  # the loop-gap ticker's sleep
TARGETS = {
    "lag_p99_ms_max": 2.0,
    "lag_max_ms_max": 10.0,
    "early_max": 0,
    "drain_c8_per_s_min": 25_000,
}
#: The handler ``dueq worker`` runs in the CLI lag case: one line per delivery, "host queue"
#: lags in ms, appended to the file named by DUEQ_BENCH_LAG_OUT.
LAG_HANDLER = """
    import os
    import time

    OUT = os.open(os.environ["DUEQ_BENCH_LAG_OUT"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)


    def handle(d):
        host_ms = time.time() * 1000 - d.due_ms
        os.write(OUT, f"{host_ms:.3f} {d.claimed_ms - d.due_ms}\\n".encode())
"""
CLI_START_S = 60.0  # the most the CLI worker may take to register


def log(message: str) -> None:
    print(f"[observe bench] {message}", file=sys.stderr, flush=True)


def wait_for(condition: threading.Event, what: str, timeout_s: float = 300) -> None:
    if not condition.wait(timeout_s):
        raise SystemExit(f"timed out waiting for {what}")


def run_async(coro: Coroutine[Any, Any, T], what: str, timeout_s: float = 300) -> T:
    """Run one async section on a fresh loop (``asyncio.run``), bounded in time."""

    async def bounded() -> T:
        try:
            return await asyncio.wait_for(coro, timeout_s)
        except asyncio.TimeoutError:
            raise SystemExit(f"timed out waiting for {what}") from None

    return asyncio.run(bounded())


@contextlib.asynccontextmanager
async def async_client(server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis(**server.connection_kwargs())
    try:
        yield client
    finally:
        await client.aclose()


class LoopGaps:
    """Gaps (ms) between the ticks of a ticker on the running loop that sleeps 5 ms a tick."""

    def __init__(self) -> None:
        self.gaps_ms: list[float] = []

    def figures(self) -> dict[str, float]:
        gaps = self.gaps_ms or [0.0]
        return {"max_gap_ms": max(gaps), "p99_gap_ms": percentile(gaps, 99)}


@contextlib.asynccontextmanager
async def loop_gaps() -> AsyncIterator[LoopGaps]:
    """Run the ticker of ``LoopGaps`` for the duration of the block."""
    seen = LoopGaps()

    async def tick() -> None:
        last = perf()
        while True:
            await asyncio.sleep(TICK_S)
            now = perf()
            seen.gaps_ms.append((now - last) * 1000)
            last = now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0)  # the ticker starts before the measured work
    try:
        yield seen
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker


# -- 1. lag --------------------------------------------------------------------------------------


def run_ping(r: redis.Redis) -> dict[str, float]:
    samples = []
    for _ in range(PING_ROUNDS):
        start = perf()
        r.ping()
        samples.append((perf() - start) * 1000)
    return {"p50_ms": percentile(samples, 50), "p99_ms": percentile(samples, 99)}


def lag_tasks() -> list[Task]:
    """LAG_TASKS tasks, the first due LAG_LEAD_S from now, then LAG_RATE_PER_S per second."""
    first_s = time.time() + LAG_LEAD_S
    return [
        Task({"i": i}, at=datetime.fromtimestamp(first_s + i / LAG_RATE_PER_S, tz=timezone.utc))
        for i in range(LAG_TASKS)
    ]


class Lags:
    """Lag of each delivery: by the queue's clock (claimed - due, from Redis TIME) and by the
    host's clock (handed out - due); and the CPU time of this process from the start of the
    run (the tasks scheduled) to ``figures``, per task, and the claims made and how many of
    them leased nothing (``count_claims``: the first, before anything is due, and any that
    reached Redis before the task was due; None: the consumer ran in another process)."""

    def __init__(self, in_process: bool = True) -> None:
        self.queue_ms: list[float] = []
        self.host_ms: list[float] = []
        self.cpu_start_s = time.process_time() if in_process else None
        self.claims: int | None = None
        self.empty_claims = 0

    def count_claims(self, q: Queue | AsyncQueue) -> None:
        """Count the claims of ``q`` (its ``claim_batch``, wrapped) and the empty ones."""
        self.claims = 0
        original: Any = q.claim_batch

        def seen(batch: dueq.ClaimBatch) -> dueq.ClaimBatch:
            assert self.claims is not None
            self.claims += 1
            self.empty_claims += not batch.deliveries
            return batch

        if isinstance(q, AsyncQueue):

            async def counted_async(*args: Any, **kwargs: Any) -> dueq.ClaimBatch:
                return seen(await original(*args, **kwargs))

            q.claim_batch = counted_async  # type: ignore[method-assign]
        else:
            q.claim_batch = lambda *a, **kw: seen(original(*a, **kw))  # type: ignore[method-assign]

    def record(self, d: dueq.Delivery | dueq.AsyncDelivery) -> None:
        self.host_ms.append(time.time() * 1000 - d.due_ms)
        self.queue_ms.append(d.claimed_ms - d.due_ms)

    def __len__(self) -> int:
        return len(self.host_ms)

    def figures(self, acked: int) -> dict[str, Any]:
        def spread(lags: list[float]) -> dict[str, float]:
            return {
                "p50_ms": percentile(lags, 50),
                "p99_ms": percentile(lags, 99),
                "max_ms": max(lags),
                "early": sum(lag < 0 for lag in lags),
            }

        return {
            "tasks": LAG_TASKS,
            "rate_per_s": LAG_RATE_PER_S,
            "queue_clock": spread(self.queue_ms),
            "host_clock": spread(self.host_ms),
            "acked": acked,
            "cpu_ms_per_task": None
            if self.cpu_start_s is None
            else (time.process_time() - self.cpu_start_s) * 1000 / LAG_TASKS,
            "claims": self.claims,
            "empty_claims": None if self.claims is None else self.empty_claims,
        }


def run_lag(r: redis.Redis) -> dict[str, Any]:
    r.flushdb()
    q = Queue("lag", r)
    q.schedule_many(lag_tasks())
    lags = Lags()
    lags.count_claims(q)
    outcomes: list[str] = []
    done = threading.Event()

    def settled(outcome: dueq.Outcome) -> None:
        outcomes.append(outcome.kind)
        if len(outcomes) == LAG_TASKS:
            done.set()

    stream = q.observe(max_in_flight=64).pipe(
        ops.do_action(lags.record), dueq.operators.process(lambda d: None, concurrency=8)
    )
    sub = stream.subscribe(on_next=settled)
    wait_for(done, "the lag run")
    sub.dispose()
    return lags.figures(outcomes.count("acked"))


def run_worker_lag(r: redis.Redis) -> dict[str, Any]:
    """``dueq.Worker`` at its defaults; the lag is taken as the handler starts."""
    r.flushdb()
    q = Queue("lag", r)
    q.schedule_many(lag_tasks())
    lags = Lags()
    lags.count_claims(q)
    done = threading.Event()

    def handle(d: dueq.Delivery) -> None:
        lags.record(d)
        if len(lags) == LAG_TASKS:
            done.set()

    w = dueq.Worker(q, handle)
    runner = threading.Thread(target=w.run, name="bench-worker")
    runner.start()
    try:
        wait_for(done, "the Worker lag run")
    finally:
        w.stop()
        runner.join()
    return lags.figures(w.outcomes.get("acked", 0))


def run_cli_lag(r: redis.Redis, server: RedisServer) -> dict[str, Any]:
    """``dueq worker`` from the CLI at its defaults, started and idle (registered) before the
    tasks are scheduled; the handler records each lag as it starts."""
    r.flushdb()
    q = Queue("lag", r)
    with tempfile.TemporaryDirectory(prefix="dueq-lag-") as tmp:
        Path(tmp, "lag_handler.py").write_text(textwrap.dedent(LAG_HANDLER))
        out = Path(tmp, "lags.txt")
        env = {
            **os.environ,
            "DUEQ_BENCH_LAG_OUT": str(out),
            "PYTHONPATH": os.pathsep.join([tmp, os.environ.get("PYTHONPATH", "")]),
        }
        command = [sys.executable, "-m", "dueq", "worker", "lag", "lag_handler:handle"]
        command += ["--redis-url", server.url]
        child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, cwd=tmp)
        try:
            started = perf()
            while not q.workers():
                if child.poll() is not None or perf() - started > CLI_START_S:
                    raise SystemExit("the dueq worker of the CLI lag run did not start")
                time.sleep(0.05)
            q.schedule_many(lag_tasks())
            lines: list[str] = []
            deadline = perf() + LAG_LEAD_S + LAG_TASKS / LAG_RATE_PER_S + 300
            while perf() < deadline:
                lines = out.read_text().splitlines() if out.exists() else []
                if len(lines) >= LAG_TASKS:
                    break
                time.sleep(0.1)
            else:
                raise SystemExit("timed out waiting for the CLI lag run")
        finally:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    lags = Lags(in_process=False)
    for line in lines:
        host_ms, queue_ms = line.split()
        lags.host_ms.append(float(host_ms))
        lags.queue_ms.append(float(queue_ms))
    return lags.figures(int(q.stats().counters.get("acked", 0)))


@contextlib.asynccontextmanager
async def lag_queue(server: RedisServer) -> AsyncIterator[AsyncQueue]:
    """An ``AsyncQueue`` holding the tasks of ``lag_tasks``, on a client of its own."""
    async with async_client(server) as client:
        await client.flushdb()
        q = AsyncQueue("lag", client)
        await q.schedule_many(lag_tasks())
        yield q


async def acked(q: AsyncQueue) -> int:
    return (await q.stats()).counters.get("acked", 0)


async def run_async_lag(server: RedisServer) -> dict[str, Any]:
    async with lag_queue(server) as q:
        lags = Lags()
        lags.count_claims(q)
        async with contextlib.aclosing(q.deliveries(max_in_flight=64)) as deliveries:
            async for d in deliveries:
                lags.record(d)
                await d.ack()
                if len(lags.host_ms) == LAG_TASKS:
                    break
        return lags.figures(await acked(q))


async def run_async_observe_lag(server: RedisServer) -> dict[str, Any]:
    async with lag_queue(server) as q:
        lags = Lags()
        lags.count_claims(q)
        stream = q.observe(max_in_flight=64).pipe(ops.do_action(lags.record))
        await settle_through_process(stream, LAG_TASKS, 8)
        await dueq_tasks_ended()
        return lags.figures(await acked(q))


async def run_async_worker_lag(server: RedisServer) -> dict[str, Any]:
    """``dueq.AsyncWorker`` at its defaults (an ``async def`` handler); the lag is taken as
    the handler starts."""
    async with lag_queue(server) as q:
        lags = Lags()
        lags.count_claims(q)

        async def handle(d: dueq.AsyncDelivery) -> None:
            lags.record(d)
            if len(lags) == LAG_TASKS:
                w.stop()

        w = dueq.AsyncWorker(q, handle, handle_signals=False)
        await w.run()
        return lags.figures(w.outcomes.get("acked", 0))


# -- 2. drain ------------------------------------------------------------------------------------


def run_raw_drain(r: redis.Redis, n: int) -> float:
    r.flushdb()
    q = Queue("raw", r)
    q.schedule_many(Task({"i": i}) for i in range(n))
    due, tasks = q.keys.due, q.keys.tasks
    moved = 0
    start = perf()
    while moved < n:
        popped = r.zpopmin(due, 1000)
        ids = [member for member, _ in popped]
        pipe = r.pipeline(transaction=False)
        pipe.hmget(tasks, ids)
        pipe.hdel(tasks, *ids)
        pipe.execute()
        moved += len(ids)
    return n / (perf() - start)


async def run_async_raw_drain(server: RedisServer, n: int) -> float:
    """The raw baseline of ``run_raw_drain`` on ``redis.asyncio``."""
    async with async_client(server) as client:
        await client.flushdb()
        q = AsyncQueue("raw", client)
        await q.schedule_many(Task({"i": i}) for i in range(n))
        due, tasks = q.keys.due, q.keys.tasks
        moved = 0
        start = perf()
        while moved < n:
            popped = await client.zpopmin(due, 1000)
            ids = [member for member, _ in popped]
            pipe = client.pipeline(transaction=False)
            pipe.hmget(tasks, ids)
            pipe.hdel(tasks, *ids)
            await pipe.execute()
            moved += len(ids)
        return n / (perf() - start)


def run_drain(r: redis.Redis, n: int, concurrency: int) -> float:
    r.flushdb()
    q = Queue("drain", r)
    q.schedule_many(Task({"i": i}) for i in range(n))
    count = 0
    done = threading.Event()

    def settled(outcome: dueq.Outcome) -> None:
        nonlocal count
        count += 1
        if count == n:
            done.set()

    start = perf()
    stream = q.observe(max_in_flight=DRAIN_MAX_IN_FLIGHT).pipe(
        dueq.operators.process(lambda d: None, concurrency=concurrency)
    )
    sub = stream.subscribe(on_next=settled)
    wait_for(done, f"the drain at concurrency {concurrency}")
    elapsed = perf() - start
    sub.dispose()
    acked = q.stats().counters.get("acked", 0)
    if acked != n:
        raise SystemExit(f"drain acked {acked} of {n} tasks")
    return n / elapsed


async def run_async_drain(server: RedisServer, n: int, ack_every: int) -> dict[str, float]:
    """Drain ``n`` due tasks through ``async for d in q.deliveries()``: ``await d.ack()`` for
    each (``ack_every`` 1), or ``await q.ack_many(...)`` for every ``ack_every`` deliveries."""
    async with async_client(server) as client:
        await client.flushdb()
        q = AsyncQueue("drain", client)
        await q.schedule_many(Task({"i": i}) for i in range(n))
        count = 0
        held: list[dueq.AsyncDelivery] = []
        async with loop_gaps() as gaps:
            start = perf()
            consumer = q.deliveries(max_in_flight=DRAIN_MAX_IN_FLIGHT)
            async with contextlib.aclosing(consumer) as deliveries:
                async for d in deliveries:
                    count += 1
                    if ack_every == 1:
                        await d.ack()
                    else:
                        held.append(d)
                        if len(held) == ack_every or count == n:
                            await q.ack_many(held)
                            held = []
                    if count == n:
                        break
            elapsed = perf() - start
        if (done := await acked(q)) != n:
            raise SystemExit(f"async drain acked {done} of {n} tasks")
        return {"per_s": n / elapsed, **gaps.figures()}


def best_async_drain(runs: list[dict[str, float]]) -> dict[str, float]:
    """The fastest run's rate, and the largest loop gaps of any run."""
    return {
        "per_s": max(run["per_s"] for run in runs),
        "max_gap_ms": max(run["max_gap_ms"] for run in runs),
        "p99_gap_ms": max(run["p99_gap_ms"] for run in runs),
    }


async def noop_async_handler(d: dueq.AsyncDelivery) -> None:
    """The handler of the async ``process`` drain: returns at once (the task is acked)."""


async def dueq_tasks_ended(timeout_s: float = 5.0) -> None:
    """Wait (bounded) for the tasks a disposed subscription leaves on the loop to end, so that
    the client is closed after them."""
    me = asyncio.current_task()
    others = {task for task in asyncio.all_tasks() if task is not me}
    if others:
        await asyncio.wait(others, timeout=timeout_s)


async def settle_through_process(
    stream: Observable[dueq.AsyncDelivery], n: int, concurrency: int
) -> None:
    """Subscribe ``stream`` piped into ``process(noop_async_handler)`` on the running loop and
    return once ``n`` outcomes came; the subscription is disposed and its tasks ended."""
    finished = asyncio.Event()
    count = 0
    errors: list[Exception] = []

    def settled(outcome: dueq.Outcome) -> None:
        nonlocal count
        count += 1
        if count == n:
            finished.set()

    def failed(error: Exception) -> None:
        errors.append(error)
        finished.set()

    sub = stream.pipe(
        dueq.operators.process(noop_async_handler, concurrency=concurrency)
    ).subscribe(on_next=settled, on_error=failed)
    try:
        await finished.wait()
    finally:
        sub.dispose()
    if errors:
        raise SystemExit(f"the async process stream failed: {errors[0]!r}")


async def run_async_process_drain(
    server: RedisServer, n: int, concurrency: int
) -> dict[str, float]:
    """Drain ``n`` due tasks through ``q.observe().pipe(process(noop_async_handler))``
    subscribed on the running loop."""
    async with async_client(server) as client:
        await client.flushdb()
        q = AsyncQueue("drain", client)
        await q.schedule_many(Task({"i": i}) for i in range(n))
        async with loop_gaps() as gaps:
            start = perf()
            stream = q.observe(max_in_flight=DRAIN_MAX_IN_FLIGHT)
            await settle_through_process(stream, n, concurrency)
            elapsed = perf() - start
        await dueq_tasks_ended()
        if (done := await acked(q)) != n:
            raise SystemExit(f"async process drain acked {done} of {n} tasks")
        return {"per_s": n / elapsed, **gaps.figures()}


# -- 3. idle -------------------------------------------------------------------------------------


def run_idle(r: redis.Redis, window_s: float) -> dict[str, float]:
    r.flushdb()
    q = Queue("idle", r)
    sub = q.observe().subscribe()
    time.sleep(1.0)  # let the first claim and the wake subscription happen
    before = int(r.info("stats")["total_commands_processed"])
    time.sleep(window_s)
    spent = int(r.info("stats")["total_commands_processed"]) - before - 1  # minus one INFO
    sub.dispose()
    return {"window_s": window_s, "commands": spent, "per_s": spent / window_s}


async def run_async_idle(server: RedisServer, window_s: float) -> dict[str, float]:
    async with async_client(server) as client:
        await client.flushdb()
        q = AsyncQueue("idle", client)

        async def consume() -> None:
            async with contextlib.aclosing(q.deliveries()) as deliveries:
                async for d in deliveries:
                    await d.ack()

        consumer = asyncio.create_task(consume())
        await asyncio.sleep(1.0)  # let the first claim and the wake subscription happen
        before = int((await client.info("stats"))["total_commands_processed"])
        await asyncio.sleep(window_s)
        after = int((await client.info("stats"))["total_commands_processed"])
        consumer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await consumer
        spent = after - before - 1  # minus one INFO
        return {"window_s": window_s, "commands": spent, "per_s": spent / window_s}


# -- report --------------------------------------------------------------------------------------


def drain_variants(r: redis.Redis, server: RedisServer, n: int) -> dict[str, Callable[[], Any]]:
    """Every drain of section 2, by name, as a call that runs it once."""

    def on_a_loop(make: Callable[[], Coroutine[Any, Any, Any]], what: str) -> Callable[[], Any]:
        return lambda: run_async(make(), what)

    variants: dict[str, Callable[[], Any]] = {
        "raw": partial(run_raw_drain, r, n),
        "raw_async": on_a_loop(partial(run_async_raw_drain, server, n), "the async raw drain"),
    }
    for c in DRAIN_CONCURRENCY:
        variants[f"threaded_{c}"] = partial(run_drain, r, n, c)
    for every in ASYNC_ACK_EVERY:
        make = partial(run_async_drain, server, n, every)
        variants[f"deliveries_{every}"] = on_a_loop(make, "the deliveries() drain")
    for c in ASYNC_PROCESS_CONCURRENCY:
        make = partial(run_async_process_drain, server, n, c)
        variants[f"process_{c}"] = on_a_loop(make, "the process drain")
    return variants


#: Section 1's cases: key, label in the table.
LAG_CASES = {
    "threaded": "threaded observe + process",
    "async": "async deliveries()",
    "async_observe": "async observe + process",
    "worker": "dueq.Worker, defaults",
    "async_worker": "dueq.AsyncWorker, defaults",
    "cli": "dueq worker (CLI), defaults",
}


def measure_lag(r: redis.Redis, server: RedisServer, rounds: int) -> dict[str, list[Any]]:
    """Every case of section 1, one run of each per round (outside load falls on all)."""
    runs: dict[str, Callable[[], Any]] = {
        "threaded": partial(run_lag, r),
        "async": lambda: run_async(run_async_lag(server), "the async lag run"),
        "async_observe": lambda: run_async(
            run_async_observe_lag(server), "the async observe lag run"
        ),
        "worker": partial(run_worker_lag, r),
        "async_worker": lambda: run_async(run_async_worker_lag(server), "the AsyncWorker lag run"),
        "cli": partial(run_cli_lag, r, server),
    }
    lag: dict[str, list[Any]] = {name: [] for name in runs}
    for i in range(rounds):
        for name, run in runs.items():
            log(f"lag round {i + 1}/{rounds}: {LAG_CASES[name]}")
            lag[name].append(run())
    return lag


def measure(drain_n: int, idle_s: float, repeat: int, lag_only: bool) -> dict[str, Any]:
    with RedisServer() as server:
        r = server.client()
        env = {"redis_server": r.info("server")["redis_version"]}
        log("raw round trip (PING)")
        ping = run_ping(r)
        log(f"lag: {LAG_TASKS} tasks due at {LAG_RATE_PER_S}/s, {len(LAG_CASES)} consumers")
        lag = measure_lag(r, server, repeat if lag_only else 1)
        if lag_only:
            r.close()
            return {"env": env, "ping": ping, "lag": lag}
        log(f"drain: {drain_n:,} tasks, best of {repeat}, the variants taking turns")
        # One run of every variant per round, so that load from outside this benchmark (a
        # shared machine) falls on all of them alike rather than on whichever ran last.
        drains: dict[str, list[Any]] = {}
        variants = drain_variants(r, server, drain_n)
        for _ in range(repeat):
            for name, run in variants.items():
                drains.setdefault(name, []).append(run())
        raw = {"sync": max(drains["raw"]), "async": max(drains["raw_async"])}
        threaded = {c: max(drains[f"threaded_{c}"]) for c in DRAIN_CONCURRENCY}
        deliveries = {e: best_async_drain(drains[f"deliveries_{e}"]) for e in ASYNC_ACK_EVERY}
        processed = {c: best_async_drain(drains[f"process_{c}"]) for c in ASYNC_PROCESS_CONCURRENCY}
        log(f"idle: {idle_s:.0f} s threaded, {idle_s:.0f} s async")
        idle = {
            "threaded": run_idle(r, idle_s),
            "async": run_async(run_async_idle(server, idle_s), "the async idle run"),
        }
        r.close()
    return {
        "env": env,
        "ping": ping,
        "lag": lag,
        "raw_drain": raw,
        "drain": {"threaded": threaded, "deliveries": deliveries, "process": processed},
        "idle": idle,
    }


def lag_row(label: str, lag: dict[str, Any]) -> tuple[str, str, str, str]:
    q, h = lag["queue_clock"], lag["host_clock"]
    early = q["early"] + h["early"]
    cpu_ms = lag.get("cpu_ms_per_task")
    cpu = "" if cpu_ms is None else f"; CPU {cpu_ms:.2f} ms/task (this process)"
    if lag.get("claims") is not None:
        cpu += f"; {lag['claims']} claims, {lag['empty_claims']} empty"
    ok = (
        h["p99_ms"] <= TARGETS["lag_p99_ms_max"]
        and h["max_ms"] <= TARGETS["lag_max_ms_max"]
        and early == 0
    )
    return (
        f"1 lag, {label}",
        f"p50 {h['p50_ms']:.2f} / p99 {h['p99_ms']:.2f} / max {h['max_ms']:.2f} ms, {early} early",
        f"handed out (workers: handler started) - due, host clock; claimed - due (queue "
        f"clock, whole ms): p50 {q['p50_ms']:.0f} / p99 {q['p99_ms']:.0f} / max "
        f"{q['max_ms']:.0f} ms; {lag['acked']}/{lag['tasks']} acked{cpu}",
        f"p99 <= 2, max <= 10 ms, 0 early: {'ok' if ok else 'MISSED'}",
    )


def lag_rows(lag: dict[str, list[Any]]) -> list[tuple[str, str, str, str]]:
    rows = []
    for name, runs in lag.items():
        for i, run in enumerate(runs):
            suffix = f" (run {i + 1})" if len(runs) > 1 else ""
            rows.append(lag_row(LAG_CASES[name] + suffix, run))
    return rows


def async_drain_row(
    label: str,
    drain: dict[str, float],
    raw_async: float,
    threaded_best: float,
    what: str,
    with_target: bool,
) -> tuple[str, str, str, str]:
    """One async drain: its rate against raw redis.asyncio and the threaded drain, and the
    loop gaps seen meanwhile."""
    rate = drain["per_s"]
    return (
        f"2 drain, {label}",
        f"{rate:,.0f} tasks/s",
        f"{rate / raw_async:.2f}x raw asyncio, {rate / threaded_best:.2f}x threaded best; "
        f"{what}; loop gap max {drain['max_gap_ms']:.1f} / p99 {drain['p99_gap_ms']:.1f} ms "
        "(ticks every 5 ms)",
        f">= threaded: {'ok' if rate >= threaded_best else 'MISSED'}" if with_target else "",
    )


def print_report(res: dict[str, Any], args: argparse.Namespace, wall_s: float) -> None:
    ping = res["ping"]
    mode = "lag only" if args.lag_only else "quick" if args.quick else "full"
    print(f"\ndueq consumer benchmark ({mode}, wall {wall_s:.1f} s)")
    print(
        f"redis-server {res['env']['redis_server']}, redis-py {redis.__version__}, Python "
        f"{platform.python_version()}, {platform.platform()}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    rows = [
        (
            "1 raw round trip (PING)",
            f"p50 {ping['p50_ms']:.3f} / p99 {ping['p99_ms']:.3f} ms",
            "redis-py, blocking",
            "",
        ),
        *lag_rows(res["lag"]),
    ]
    if args.lag_only:
        print_table(rows)
        return
    idle, raw = res["idle"], res["raw_drain"]
    threaded, deliveries = res["drain"]["threaded"], res["drain"]["deliveries"]
    threaded_best = max(threaded.values())
    rows += [
        (
            "2 drain, raw Redis",
            f"{raw['sync']:,.0f} tasks/s",
            "pipelined ZPOPMIN 1000 + HMGET + HDEL, no leases or acks",
            "",
        ),
        (
            "2 drain, raw redis.asyncio",
            f"{raw['async']:,.0f} tasks/s",
            "the same on redis.asyncio",
            "",
        ),
    ]
    for c, rate in threaded.items():
        target = ""
        if c == 8:
            ok = rate >= TARGETS["drain_c8_per_s_min"]
            target = f">= 25k/s: {'ok' if ok else 'MISSED'}"
        rows.append(
            (
                f"2 drain, threaded, concurrency {c}",
                f"{rate:,.0f} tasks/s",
                f"{rate / raw['sync']:.2f}x raw; observe(max_in_flight={DRAIN_MAX_IN_FLIGHT}) "
                "+ process",
                target,
            )
        )
    for every, drain in deliveries.items():
        how = "await d.ack() each" if every == 1 else f"await q.ack_many() per {every}"
        label = f"async deliveries(), {'ack each' if every == 1 else 'ack_many'}"
        what = f"deliveries(max_in_flight={DRAIN_MAX_IN_FLIGHT}), {how}"
        rows.append(async_drain_row(label, drain, raw["async"], threaded_best, what, every == 1))
    for c, drain in res["drain"]["process"].items():
        label = f"async observe + process, concurrency {c}"
        what = f"observe(max_in_flight={DRAIN_MAX_IN_FLIGHT}) + process(async no-op)"
        rows.append(async_drain_row(label, drain, raw["async"], threaded_best, what, True))
    for label, spent in (("threaded", idle["threaded"]), ("async", idle["async"])):
        rows.append(
            (
                f"3 idle consumer, {label}",
                f"{spent['per_s']:.2f} commands/s",
                f"{spent['commands']} commands in {spent['window_s']:.0f} s (heartbeat 5 s)",
                "",
            )
        )
    print_table(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller drain, shorter idle window")
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs per drain figure (best); lag rounds"
    )
    parser.add_argument("--lag-only", action="store_true", help="section 1 alone")
    args = parser.parse_args(argv)
    drain_n, idle_s = (20_000, 5.0) if args.quick else (100_000, 15.0)
    start = perf()
    result = measure(drain_n, idle_s, max(1, args.repeat), args.lag_only)
    wall_s = perf() - start
    print_report(result, args, wall_s)
    if args.lag_only:
        print(json.dumps(result, separators=(",", ":")))
        return 0
    threaded = result["drain"]["threaded"]
    result["drain"]["threaded"] = {str(c): v for c, v in threaded.items()}
    deliveries = result["drain"]["deliveries"]
    result["drain"]["deliveries"] = {f"ack_every_{k}": v for k, v in deliveries.items()}
    processed = result["drain"]["process"]
    result["drain"]["process"] = {str(c): v for c, v in processed.items()}
    print(json.dumps(result, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
