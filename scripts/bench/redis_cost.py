#!/usr/bin/env python
"""Redis cost per task of the hot path: claim + ack, and schedule, with each feature on and off.

Counted on the server, not timed on the client, so that load from other processes on the
machine moves the figures far less than a throughput rate:

- ``usec``: server time per task from ``INFO commandstats``, each command once
  (``command_time``: the script calls, whose time holds the commands they run);
- ``cpu_us``: the server's CPU time per task (``INFO`` used_cpu_user + used_cpu_sys);
- the same per task for the raw loops in the same run (pipelined ZADD + HSET to schedule,
  ZPOPMIN(1000) + HMGET + HDEL to drain), and the ratio of dueq's cost to theirs.

Cases (``--cases``, comma-separated; default all): ``plain`` (no options, due now), ``spread``
(no options, each task due at its own ms), ``keyed`` (every task its own limit key, as over
10,000 keys), ``priorities`` (priority i % 10), ``events`` (events kept for an hour),
``results`` (keep_results for an hour), ``batch`` (every task in one batch),
``key_limits`` (keyed, with key_concurrency 5). Each case schedules ``--tasks`` tasks with
``schedule_many`` (the "schedule" figure) and drains them with ``claim(1000)`` + ``ack_many``
(the "drain" figure).

    PYTHONPATH=src .venv/bin/python scripts/bench/redis_cost.py [--tasks N] [--repeat R]

``--redis-url`` uses a running server instead of starting one, for example a redis-server under
``valgrind --tool=callgrind --instr-atstart=no``: each measured phase is bracketed by
``callgrind_control -i on`` / ``-i off`` when ``--callgrind PID`` is given, and ``--phase`` picks
the one phase to count (``schedule`` or ``drain``), so the dump holds the instructions of that
phase alone (divide by ``--tasks``). The scripts are loaded and compiled before any phase (a
server compiles each script once in its life), so no figure includes a compile.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import redis

from dueq import Queue, Task
from dueq.server import RedisServer

KEYS = 10_000
CLAIM = 1_000


def payload(i: int) -> dict[str, Any]:
    """The payload shape of core.py (the same encoded length for every i below 90 million)."""
    return {
        "user_id": 10_000_000 + i,
        "action": "send_welcome_email",
        "locale": "en-GB",
        "retries_left": 3,
    }


def plain_task(i: int) -> Task:
    return Task(payload(i))


#: The "spread" case's tasks are due one ms apart from SPREAD_AFTER_S after they are made (a
#: due time in the past is stored as now); the drain waits until the last is due.
SPREAD_AFTER_S = 1.0


def spread_task(i: int) -> Task:
    """A plain task due at its own ms (no two share a due ms, so no two first deliveries share
    a lease record, which bulk-scheduled tasks due "now" do)."""
    return Task(payload(i), delay=SPREAD_AFTER_S + i / 1000)


def keyed_task(i: int) -> Task:
    return Task(payload(i), key=f"tenant:{i % KEYS}")


def priority_task(i: int) -> Task:
    return Task(payload(i), priority=i % 10)


def batch_task(i: int) -> Task:
    return Task(payload(i), batch="b1")


Setup = Callable[[Queue], None]


def no_setup(q: Queue) -> None:
    return None


def events_on(q: Queue) -> None:
    q.configure(events=3600)


def results_on(q: Queue) -> None:
    q.configure(keep_results=3600)


def key_limits_on(q: Queue) -> None:
    q.configure(key_concurrency=5)


CASES: dict[str, tuple[Callable[[int], Task], Setup]] = {
    "plain": (plain_task, no_setup),
    "spread": (spread_task, no_setup),
    "keyed": (keyed_task, no_setup),
    "priorities": (priority_task, no_setup),
    "events": (plain_task, events_on),
    "results": (plain_task, results_on),
    "batch": (batch_task, no_setup),
    "key_limits": (keyed_task, key_limits_on),
}


#: Commands that run a script: their time includes the commands the script calls, which
#: commandstats also lists under their own names.
SCRIPT_COMMANDS = ("eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro")
#: The measurement's own commands (reading and resetting the stats), never counted.
OWN_COMMANDS = ("info", "config|resetstat", "config")


def command_time(r: redis.Redis) -> tuple[int, int]:
    """(usec, calls) of the commands ``INFO commandstats`` holds since the last CONFIG
    RESETSTAT, each command's time counted once, the measurement's own (OWN_COMMANDS) left out.

    A script call's time (EVALSHA, ...) holds the time of every command the script runs, and
    commandstats lists those commands again under their own names (ZADD, HSET, ...), with
    nothing to tell them from the same commands sent by a client. So: when any script ran,
    only the script calls count (their commands inside them, once); when none did, every
    command counts. A plain command sent beside scripts in one phase (a GET of a sharded
    queue's layout, a SCRIPT LOAD after NOSCRIPT) is then left out: the phases measured here
    send next to none, and the server's CPU time (``cpu_s``) counts everything once."""
    names = {k.removeprefix("cmdstat_"): v for k, v in r.info("commandstats").items()}
    scripted = any(n in names for n in SCRIPT_COMMANDS)
    usec = calls = 0
    for name, v in names.items():
        if name in OWN_COMMANDS or (scripted and name not in SCRIPT_COMMANDS):
            continue
        usec += int(v.get("usec", 0))
        calls += int(v.get("calls", 0))
    return usec, calls


def server_usec(r: redis.Redis) -> int:
    """Server time in commands since the last CONFIG RESETSTAT, us: ``command_time``'s, each
    command once (a script's commands inside its call, not again under their own names)."""
    return command_time(r)[0]


def cpu_s(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


class Meter:
    """Measures one phase: commandstats usec and server CPU, optionally callgrind's collection."""

    def __init__(self, r: redis.Redis, callgrind: int | None, phase: str | None) -> None:
        self.r, self.callgrind, self.phase = r, callgrind, phase

    def run(self, name: str, n: int, fn: Callable[[], object]) -> dict[str, float]:
        counted = self.callgrind is not None and name == self.phase
        self.r.config_resetstat()
        cpu_before = cpu_s(self.r)
        if counted:
            subprocess.run(["callgrind_control", "-i", "on", str(self.callgrind)], check=True)
        print(f"{name}: start", file=sys.stderr, flush=True)
        fn()
        print(f"{name}: end", file=sys.stderr, flush=True)
        if counted:
            subprocess.run(["callgrind_control", "-i", "off", str(self.callgrind)], check=True)
        cpu = cpu_s(self.r) - cpu_before
        return {"usec": server_usec(self.r) / n, "cpu_us": cpu / n * 1e6}


def drain(q: Queue) -> int:
    done = 0
    while batch := q.claim(limit=CLAIM):
        done += q.ack_many(batch)
    return done


def measure_case(r: redis.Redis, meter: Meter, case: str, n: int) -> dict[str, dict[str, float]]:
    make, setup = CASES[case]
    r.flushall()
    q = Queue("cost", r)
    setup(q)
    tasks = [make(i) for i in range(n)]
    out = {"schedule": meter.run("schedule", n, lambda: q.schedule_many(tasks))}
    if make is spread_task:  # until the last one is due (outside every measure)
        time.sleep(SPREAD_AFTER_S + n / 1000 + 0.1)
    q.check_server()  # the one-off CONFIG GET of the first claim, outside the measure
    done: list[int] = []
    if meter.phase in ("claim", "ack"):  # the drain's two halves apart: claim all, ack all
        held: list[Any] = []
        out["claim"] = meter.run("claim", n, lambda: claim_all(q, held))
        out["ack"] = meter.run("ack", n, lambda: done.append(sum(q.ack_many(b) for b in held)))
    else:
        out["drain"] = meter.run("drain", n, lambda: done.append(drain(q)))
    assert done == [n], (done, n)
    return out


def claim_all(q: Queue, held: list[Any]) -> None:
    while batch := q.claim(limit=CLAIM):
        held.append(batch)


def measure_raw(r: redis.Redis, meter: Meter, n: int) -> dict[str, dict[str, float]]:
    encode = json.JSONEncoder(separators=(",", ":")).encode
    r.flushall()
    now_ms = int(time.time() * 1000)

    def schedule() -> None:
        pipe = r.pipeline(transaction=False)
        for i in range(n):
            pipe.zadd("raw:due", {f"t{i}": now_ms})
            pipe.hset("raw:tasks", f"t{i}", encode(payload(i)))
            if i % 1000 == 999:
                pipe.execute()
        pipe.execute()

    def drain_raw() -> None:
        moved = 0
        while moved < n:
            ids = [m for m, _ in r.zpopmin("raw:due", CLAIM)]
            pipe = r.pipeline(transaction=False)
            pipe.hmget("raw:tasks", ids)
            pipe.hdel("raw:tasks", *ids)
            pipe.execute()
            moved += len(ids)

    return {"schedule": meter.run("raw", n, schedule), "drain": meter.run("raw", n, drain_raw)}


def warm_up(r: redis.Redis) -> None:
    """Load and compile each script once, outside every measure: a server compiles a script
    once in its life (at SCRIPT LOAD), so its compile is no cost per task (it would add about
    5k instructions per task to a 5,000-task callgrind count)."""
    q = Queue("cost-warm-up", r)
    q.schedule_many([plain_task(0), plain_task(1)])
    q.ack_many(q.claim(limit=2))
    r.flushall()


def measure(
    url: str, cases: list[str], n: int, repeat: int, callgrind: int | None, phase: str | None
) -> dict[str, Any]:
    r = redis.Redis.from_url(url)
    meter = Meter(r, callgrind, phase)
    warm_up(r)
    runs: dict[str, list[dict[str, dict[str, float]]]] = {}
    for _ in range(repeat):
        if callgrind is None:
            runs.setdefault("raw", []).append(measure_raw(r, meter, n))
        for case in cases:
            runs.setdefault(case, []).append(measure_case(r, meter, case, n))
    r.close()
    best: dict[str, Any] = {}
    for case, results in runs.items():
        best[case] = {
            part: {k: round(min(res[part][k] for res in results), 2) for k in ("usec", "cpu_us")}
            for part in results[0]
        }
    return best


def print_table(best: dict[str, Any]) -> None:
    raw = best.get("raw")
    print(f"{'case':<12} {'part':<9} {'usec/task':>10} {'cpu us/task':>12} {'x raw (usec)':>13}")
    for case, parts in best.items():
        for part, v in parts.items():
            ratio = f"{v['usec'] / raw[part]['usec']:.1f}x" if raw and raw[part]["usec"] else "-"
            print(f"{case:<12} {part:<9} {v['usec']:>10.2f} {v['cpu_us']:>12.2f} {ratio:>13}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tasks", type=int, default=5_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--redis-url")
    parser.add_argument("--callgrind", type=int, help="pid of a redis-server under callgrind")
    parser.add_argument("--phase", choices=("schedule", "drain", "claim", "ack"), default="drain")
    args = parser.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    for case in cases:
        if case not in CASES:
            parser.error(f"unknown case {case!r}: one of {', '.join(CASES)}")
    if args.redis_url:
        best = measure(args.redis_url, cases, args.tasks, args.repeat, args.callgrind, args.phase)
    else:
        with RedisServer() as server:
            best = measure(server.url, cases, args.tasks, args.repeat, None, None)
    print_table(best)
    print(json.dumps(best))
    return 0


if __name__ == "__main__":
    sys.exit(main())
