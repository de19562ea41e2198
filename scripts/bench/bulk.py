#!/usr/bin/env python
"""Bulk handlers (``BatchSpec``, issue 41): drain speed and Redis cost per task, and a linger's
punctuality and idle traffic. Run by ``worker.py`` (its "bulk" and "linger" sections) or alone.

Every consumer here runs in this process (the workers on a thread of their own, each
``AsyncWorker`` on its own event loop in a thread), so the parent waits on the workers' own
outcome counters, not on Redis: the server's command stats hold the consumer's commands only.

bulk      ``--bulk-tasks`` tasks due now (the worker.py payload), drained by, in turns, round
          after round (``--repeat``):

          raw        pipelined ZPOPMIN(1000) + HMGET + HDEL, ``json.loads`` per body
          engine     ``claim(1000)``, ``d.payload`` per task, ``ack_many``, one thread
          per-task   ``Worker(q, handle)`` with defaults, ``handle`` reads ``d.payload``
          bulk       ``Worker(q, handle_many, batch=BatchSpec(max=1000))``, ``handle_many``
                     reads ``item.payload`` of each item and returns (every item acked)
          async-bulk ``AsyncWorker(q, ahandle_many, batch=BatchSpec(max=1000))``, the same
                     as a coroutine on the worker's loop

          Each handler does what the raw loop does per task (decode the payload) and nothing
          else. Drain rate: tasks / (last ack seen - first handler call) for the workers (the
          parent reads ``worker.outcomes`` every ms), from the first call to the last for the
          loops. Server time, from a CONFIG RESETSTAT before the consumer starts to the last ack
          (so a worker's start-up commands are in it: a heartbeat, the first claims), per task,
          two ways: INFO commandstats ``usec`` (every command but INFO and CONFIG; when
          scripts ran, the script commands only, since their time holds the commands they
          call, which commandstats lists again), and the redis-server process's CPU time
          (INFO cpu: parsing and networking too, nothing counted twice).

linger    ``Worker(q, handle_many, batch=BatchSpec(max=1000, linger=0.05))``; every
          ``ROUND_GAP_S`` a round of ``LINGER_ROUND_TASKS`` tasks due together ``LEAD_S``
          ahead (``Task(at=...)``, one ``schedule_many``). Lateness of a call = the time the
          handler is called - its first item's due time - the linger (wall clock of this
          machine, which the server shares). Then idle traffic: commands the server counted
          over ``--idle-s`` seconds of an idle worker, with that linger and without one.

    PYTHONPATH=src .venv/bin/python scripts/bench/bulk.py [--quick] [--repeat N]
        [--bulk-tasks N] [--linger-rounds N] [--idle-s S] [--sections bulk,linger]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import string
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import redis
import redis.asyncio
from redis_cost import OWN_COMMANDS, command_time
from report import percentile, print_table

import dueq
from dueq.server import RedisServer

perf = time.perf_counter
Row = tuple[str, str, str, str]

QUEUE = "bulk"
CLAIM = 1000
BULK_MAX = 1000
LINGER_S = 0.05
LINGER_ROUND_TASKS = 10
LEAD_S = 0.3  # a round is scheduled this long before it falls due
ROUND_GAP_S = 0.15  # rounds fall due this far apart (far more than the linger: one call each)
WAIT_POLL_S = 0.001
TIMEOUT_S = 120.0
SETTLE_S = 0.5  # an idle worker's start-up traffic dies down in this long
#: issue 41's targets (measured, not enforced)
TARGETS = {
    "bulk_vs_raw_min": 0.5,
    "per_task_vs_engine_min": 0.8,
    "engine_vs_raw_min": 0.5,
    "usec_vs_raw_max": 3.0,
    "lateness_p99_ms_max": 2.0,
}
KINDS = ("raw", "engine", "per-task", "bulk", "async-bulk")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def payloads(n: int, seed: int = 1) -> list[dict[str, Any]]:
    """worker.py's payload shape: ``{"k", "tid", "due", "payload": <100 letters>}``."""
    rnd = random.Random(seed)
    now = time.time()
    letters = string.ascii_letters
    return [
        {"k": "R", "tid": i, "due": now, "payload": "".join(rnd.choices(letters, k=100))}
        for i in range(n)
    ]


#: The redis-server process's CPU time (INFO cpu) when the stats were last reset, us.
_cpu_mark = [0.0]


def server_cpu_us(r: redis.Redis) -> float:
    info = r.info("cpu")
    return (float(info["used_cpu_user"]) + float(info["used_cpu_sys"])) * 1e6


def reset_stats(r: redis.Redis) -> None:
    """CONFIG RESETSTAT, and the server's CPU time now (``commandstats`` reports from here)."""
    r.config_resetstat()
    _cpu_mark[0] = server_cpu_us(r)


def commandstats(r: redis.Redis) -> tuple[int, int, float]:
    """(usec, calls, server CPU us) since ``reset_stats``: ``redis_cost.command_time`` (each
    command once, the bench's own left out) and the process's CPU time, parsing and networking
    included, the one measure that cannot count anything twice."""
    usec, calls = command_time(r)
    return usec, calls, server_cpu_us(r) - _cpu_mark[0]


def schedule(
    r: redis.Redis,
    items: list[dict[str, Any]],
    setup: Callable[[dueq.Queue], object] | None = None,
) -> dueq.Queue:
    """A fresh queue (``setup`` configures it first: events, keep_results, ...) holding
    ``items`` due now."""
    r.flushall()
    q = dueq.Queue(QUEUE, r)
    if setup is not None:
        setup(q)
    for i in range(0, len(items), 10_000):
        q.schedule_many(dueq.Task(p) for p in items[i : i + 10_000])
    q.check_server()  # the one-off CONFIG GET of a first claim, outside the measure
    return q


# -- the loops -------------------------------------------------------------------------------


def raw_drain(r: redis.Redis, items: list[dict[str, Any]]) -> dict[str, float]:
    raw_fill(r, items)
    reset_stats(r)
    start = perf()
    done = raw_loop(r, len(items))
    return loop_figures(r, done, perf() - start)


def raw_fill(r: redis.Redis, items: list[dict[str, Any]]) -> None:
    """The raw loop's tasks: ``raw:due`` (id -> now ms) and ``raw:tasks`` (id -> JSON body),
    pipelined ZADD + HSET, on an emptied server."""
    r.flushall()
    pipe = r.pipeline(transaction=False)
    now_ms = time.time() * 1000
    for i, p in enumerate(items):
        tid = f"{i:012d}"  # an id of dueq's length
        pipe.zadd("raw:due", {tid: now_ms})
        pipe.hset("raw:tasks", tid, json.dumps(p))
        if i % 1000 == 999:
            pipe.execute()
    pipe.execute()


def raw_loop(r: redis.Redis, n: int) -> int:
    """Drains ``raw_fill``'s tasks: ZPOPMIN(1000), then one pipeline of HMGET + HDEL of those
    bodies, ``json.loads`` of each; the tasks drained (at most ``n``)."""
    done = 0
    while done < n:
        ids = [member for member, _ in r.zpopmin("raw:due", CLAIM)]
        if not ids:
            break
        pipe = r.pipeline(transaction=False)
        pipe.hmget("raw:tasks", ids)
        pipe.hdel("raw:tasks", *ids)
        bodies, _ = pipe.execute()
        for body in bodies:
            json.loads(body)
        done += len(ids)
    return done


def loop_figures(r: redis.Redis, done: int, elapsed_s: float) -> dict[str, float]:
    """A loop's figures: the tasks it drained in ``elapsed_s``, its rate, and the server's
    time and CPU per task since ``reset_stats``."""
    usec, _, cpu_us = commandstats(r)
    return {
        "tasks": done,
        "per_s": done / elapsed_s,
        "usec_per_task": usec / max(done, 1),
        "cpu_us_per_task": cpu_us / max(done, 1),
    }


def engine_drain(r: redis.Redis, items: list[dict[str, Any]]) -> dict[str, float]:
    q = schedule(r, items)
    reset_stats(r)
    start = perf()
    done = engine_loop(q, len(items))
    return loop_figures(r, done, perf() - start)


def engine_loop(q: dueq.Queue, n: int) -> int:
    """Drains ``q``: ``claim(1000)``, ``d.payload`` of each delivery, ``ack_many``; the tasks
    acked (at most about ``n``)."""
    done = 0
    while done < n:
        batch = q.claim(limit=CLAIM)
        if not batch:
            break
        for d in batch:
            d.payload  # noqa: B018 (decoded, as the raw loop's json.loads)
        done += q.ack_many(batch)
    return done


# -- the workers -----------------------------------------------------------------------------


class Calls:
    """What the handlers saw: the first call's time, items handed over, each call's size."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.items = 0
        self.sizes: list[int] = []
        self.ids: set[str] = set()
        self.lock = threading.Lock()

    def saw(self, ids: list[str]) -> None:
        with self.lock:
            if self.first is None:
                self.first = perf()
            self.items += len(ids)
            self.sizes.append(len(ids))
            self.ids.update(ids)


class Running:
    """A worker on a thread of its own (an ``AsyncWorker`` on its own loop there)."""

    def __init__(self, worker: dueq.Worker | dueq.AsyncWorker, client: Any = None) -> None:
        self.worker, self.client = worker, client
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            if isinstance(self.worker, dueq.AsyncWorker):
                asyncio.run(self._arun())
            else:
                self.worker.run()
        except BaseException as error:  # reported by stop(): the bench fails with it
            self.error = error

    async def _arun(self) -> None:
        assert isinstance(self.worker, dueq.AsyncWorker)
        try:
            await self.worker.run()
        finally:
            await self.client.aclose()

    def stop(self) -> None:
        self.worker.stop()
        self.thread.join(60)
        if self.thread.is_alive():
            raise RuntimeError("the worker did not stop within 60 s")
        if self.error is not None:
            raise RuntimeError(f"the worker failed: {self.error!r}") from self.error


def make_worker(
    kind: str, server: RedisServer, calls: Calls, batch: dueq.BatchSpec | None = None
) -> Running:
    if kind == "per-task":

        def handle(d: dueq.Delivery) -> None:
            d.payload  # noqa: B018
            calls.saw([d.id])

        return Running(dueq.Worker(dueq.Queue(QUEUE, server.client()), handle))
    if kind == "bulk":

        def handle_many(items: list[dueq.Item]) -> None:
            for item in items:
                item.payload  # noqa: B018
            calls.saw([item.id for item in items])

        spec = batch or dueq.BatchSpec(max=BULK_MAX)
        return Running(dueq.Worker(dueq.Queue(QUEUE, server.client()), handle_many, batch=spec))
    if kind == "async-bulk":

        async def ahandle_many(items: list[dueq.Item]) -> None:
            for item in items:
                item.payload  # noqa: B018
            calls.saw([item.id for item in items])

        client = redis.asyncio.Redis.from_url(server.url)
        worker = dueq.AsyncWorker(
            dueq.AsyncQueue(QUEUE, client),
            ahandle_many,
            handle_signals=False,
            batch=batch or dueq.BatchSpec(max=BULK_MAX),
        )
        return Running(worker, client)
    raise ValueError(kind)


def worker_drain(
    kind: str, server: RedisServer, r: redis.Redis, items: list[dict[str, Any]]
) -> dict[str, float]:
    schedule(r, items)
    n = len(items)
    calls = Calls()
    reset_stats(r)
    running = make_worker(kind, server, calls)
    started = perf()
    try:
        while running.worker.outcomes["acked"] < n:
            if perf() - started > TIMEOUT_S or not running.thread.is_alive():
                raise RuntimeError(
                    f"{kind}: {running.worker.outcomes['acked']} of {n} acked "
                    f"({calls.items} handed over, {dict(running.worker.outcomes)}) "
                    f"after {perf() - started:.0f} s; error {running.error!r}"
                )
            time.sleep(WAIT_POLL_S)
        last = perf()
        usec, _, cpu_us = commandstats(r)
    finally:
        running.stop()
    assert calls.first is not None
    left = r.zcard(f"dueq:{{{QUEUE}}}:due")
    return {
        "tasks": calls.items,
        "distinct": len(calls.ids),
        "acked": running.worker.outcomes["acked"],
        "left_due": left,
        "calls": len(calls.sizes),
        "mean_call": calls.items / max(len(calls.sizes), 1),
        "startup_s": calls.first - started,
        "per_s": n / max(last - calls.first, 1e-9),
        "usec_per_task": usec / n,
        "cpu_us_per_task": cpu_us / n,
    }


def measure_bulk(
    server: RedisServer, r: redis.Redis, n: int, repeat: int, kinds: tuple[str, ...] = KINDS
) -> dict[str, list[dict[str, float]]]:
    items = payloads(n)
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
    loops: dict[str, Callable[[redis.Redis, list[dict[str, Any]]], dict[str, float]]] = {
        "raw": raw_drain,
        "engine": engine_drain,
    }
    for i in range(repeat):
        for kind in kinds:  # in turns: outside load falls on each alike
            log(f"bulk: {kind}, round {i + 1} ...")
            if kind in loops:
                runs[kind].append(loops[kind](r, items))
            else:
                runs[kind].append(worker_drain(kind, server, r, items))
    return runs


def bulk_rows(runs: dict[str, list[dict[str, float]]], n: int) -> list[Row]:
    """One row per run; ratios against the raw loop (and the engine loop) of the same round."""
    rows: list[Row] = []
    t = TARGETS
    for kind, results in runs.items():
        for i, res in enumerate(results):
            raw = runs["raw"][i]
            engine = runs["engine"][i] if "engine" in runs else None
            ratio = res["per_s"] / raw["per_s"]
            usec_ratio = res["usec_per_task"] / raw["usec_per_task"]
            usec = res["usec_per_task"]
            cpu_ratio = res["cpu_us_per_task"] / raw["cpu_us_per_task"]
            detail = (
                f"{ratio:.2f}x raw; Redis {usec:.2f} us/task ({usec_ratio:.2f}x raw), server CPU "
                f"{res['cpu_us_per_task']:.2f} us/task ({cpu_ratio:.2f}x raw)"
            )
            target = ""
            if kind == "engine":
                target = f">= {t['engine_vs_raw_min']}x raw"
            if kind == "per-task" and engine is not None:
                detail += f"; {res['per_s'] / engine['per_s']:.2f}x engine"
                target = f">= {t['per_task_vs_engine_min']}x engine"
            if kind in ("bulk", "async-bulk"):
                target = f">= {t['bulk_vs_raw_min']}x raw; <= {t['usec_vs_raw_max']}x raw us"
            if "calls" in res:
                detail += (
                    f"; {res['calls']:.0f} calls (mean {res['mean_call']:.0f}), start-up "
                    f"{res['startup_s']:.2f} s"
                )
                if res["tasks"] != n or res["distinct"] != n or res["left_due"]:
                    detail += (
                        f"; MISMATCH: {res['tasks']:.0f} handed over, {res['distinct']:.0f} "
                        f"distinct, {res['left_due']:.0f} left due"
                    )
            rows.append((f"{kind} #{i + 1}", f"{res['per_s']:,.0f} tasks/s", detail, target))
    return rows


# -- linger ----------------------------------------------------------------------------------


def measure_lateness(server: RedisServer, r: redis.Redis, rounds: int) -> dict[str, Any]:
    r.flushall()
    q = dueq.Queue(QUEUE, r)
    got: list[tuple[float, float, int]] = []  # (called at, first due, items)
    cond = threading.Condition()
    ids: set[str] = set()

    def handle_many(items: list[dueq.Item]) -> None:
        called = time.time()
        first_due = min(item.due_at.timestamp() for item in items)
        with cond:
            got.append((called, first_due, len(items)))
            ids.update(item.id for item in items)
            cond.notify_all()

    spec = dueq.BatchSpec(max=BULK_MAX, linger=LINGER_S)
    running = Running(dueq.Worker(dueq.Queue(QUEUE, server.client()), handle_many, batch=spec))
    time.sleep(SETTLE_S)
    try:
        t0 = time.time() + LEAD_S
        for k in range(rounds):
            due = t0 + k * ROUND_GAP_S
            wait = due - LEAD_S - time.time()
            if wait > 0:
                time.sleep(wait)
            at = datetime.fromtimestamp(due, UTC)
            q.schedule_many(
                dueq.Task({"round": k, "i": i}, at=at) for i in range(LINGER_ROUND_TASKS)
            )
        deadline = time.time() + LEAD_S + LINGER_S + 5
        with cond:
            while len(ids) < rounds * LINGER_ROUND_TASKS and time.time() < deadline:
                cond.wait(0.1)
    finally:
        running.stop()
    late_ms = [(called - due - LINGER_S) * 1000 for called, due, _ in got]
    sizes = [size for _, _, size in got]
    return {
        "rounds": rounds,
        "calls": len(got),
        "tasks": sum(sizes),
        "distinct": len(ids),
        "full_calls": sum(1 for s in sizes if s == LINGER_ROUND_TASKS),
        "late_ms": {
            "p50": percentile(late_ms, 50),
            "p99": percentile(late_ms, 99),
            "max": max(late_ms),
            "min": min(late_ms),
        },
    }


def idle_calls(server: RedisServer, r: redis.Redis, spec: dueq.BatchSpec, idle_s: float) -> dict:
    """Commands (and which) the server ran over ``idle_s`` of an idle worker with ``spec``."""
    r.flushall()
    running = make_worker("bulk", server, Calls(), batch=spec)
    try:
        time.sleep(SETTLE_S)
        reset_stats(r)
        time.sleep(idle_s)
        stats = r.info("commandstats")
        blocked = int(r.info("clients")["blocked_clients"])
    finally:
        running.stop()
    by_command = {
        name.removeprefix("cmdstat_"): int(v["calls"])
        for name, v in stats.items()
        if name.removeprefix("cmdstat_") not in OWN_COMMANDS
    }
    return {"calls": sum(by_command.values()), "by_command": by_command, "blocked": blocked}


def measure_linger(
    server: RedisServer, r: redis.Redis, rounds: int, idle_s: float
) -> dict[str, Any]:
    log(f"linger: {rounds} rounds of {LINGER_ROUND_TASKS} tasks ...")
    out: dict[str, Any] = {"lateness": measure_lateness(server, r, rounds)}
    log(f"linger: idle traffic over {idle_s:g} s, with and without a linger ...")
    out["idle_linger"] = idle_calls(
        server, r, dueq.BatchSpec(max=BULK_MAX, linger=LINGER_S), idle_s
    )
    out["idle_no_linger"] = idle_calls(server, r, dueq.BatchSpec(max=BULK_MAX), idle_s)
    out["idle_s"] = idle_s
    return out


def linger_rows(res: dict[str, Any]) -> list[Row]:
    lat = res["lateness"]
    late = lat["late_ms"]
    n = lat["rounds"] * LINGER_ROUND_TASKS
    detail = (
        f"p50 {late['p50']:.2f} ms, max {late['max']:.2f}, min {late['min']:.2f}; "
        f"{lat['rounds']} rounds of {LINGER_ROUND_TASKS}, {lat['calls']} calls "
        f"({lat['full_calls']} with all {LINGER_ROUND_TASKS})"
    )
    if lat["tasks"] != n or lat["distinct"] != n:
        detail += f"; MISMATCH: {lat['tasks']} handed over, {lat['distinct']} distinct of {n}"
    rows: list[Row] = [
        (
            "linger late p99",
            f"{late['p99']:.2f} ms",
            detail,
            f"<= {TARGETS['lateness_p99_ms_max']} ms",
        )
    ]
    for key, label in (("idle_linger", "linger 0.05"), ("idle_no_linger", "no linger")):
        idle = res[key]
        detail = ", ".join(f"{c} {k}" for k, c in sorted(idle["by_command"].items())) or "none"
        detail += f"; {idle['blocked']} client(s) blocked at the end"
        rows.append(
            (
                f"idle, {label}",
                f"{idle['calls']} commands",
                f"over {res['idle_s']:g} s: {detail}",
                "",
            )
        )
    return rows


# -- main ------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bulk-tasks", type=int, help="tasks per drain (default 50,000; quick 5,000)"
    )
    parser.add_argument("--linger-rounds", type=int, help="linger rounds (default 200; quick 40)")
    parser.add_argument("--idle-s", type=float, default=2.0, help="idle traffic window, seconds")


def run_sections(
    server: RedisServer, args: argparse.Namespace, sections: list[str], repeat: int
) -> tuple[list[Row], dict[str, Any]]:
    n = args.bulk_tasks or (5_000 if args.quick else 50_000)
    rounds = args.linger_rounds or (40 if args.quick else 200)
    r = server.client()
    rows: list[Row] = []
    figures: dict[str, Any] = {}
    try:
        if "bulk" in sections:
            runs = measure_bulk(server, r, n, repeat)
            figures["bulk"] = {"tasks": n, "runs": runs}
            rows += bulk_rows(runs, n)
        if "linger" in sections:
            figures["linger"] = measure_linger(server, r, rounds, args.idle_s)
            rows += linger_rows(figures["linger"])
    finally:
        r.close()
    return rows, figures


def main() -> None:
    logging.basicConfig(level=logging.WARNING)  # the workers' start and stop lines: not here
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, one round")
    parser.add_argument("--repeat", type=int, default=2, help="rounds of the drains")
    parser.add_argument("--sections", default="bulk,linger", help="comma list: bulk, linger")
    add_arguments(parser)
    args = parser.parse_args()
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    repeat = 1 if args.quick else args.repeat
    with RedisServer() as server:
        rows, figures = run_sections(server, args, sections, repeat)
    print_table(rows)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
