#!/usr/bin/env python
"""What advancing cron occurrences costs, in units that do not depend on the machine's load.

The same work as ``cron.py``'s "advance" section (N definitions "* * * * *" in Europe/Berlin,
every first slot due at once, ``claim(1000)`` + ``ack_many`` until empty), counted instead of
timed:

- Redis commands per occurrence: every command the scripts run (``INFO commandstats`` calls,
  which count the commands a script calls), by command;
- script calls per occurrence and the bytes sent with them (keys and arguments), by script;
- Redis CPU per occurrence (``INFO`` used_cpu_user + used_cpu_sys; CPU time, not wall time, so
  other processes on the machine change it far less than a wall-clock rate);
- Python per occurrence: CPU time of this process, and function calls (cProfile), for the
  drain.

Run it against two checkouts to compare them (the figures are the best of ``--repeat``):

    PYTHONPATH=src .venv/bin/python scripts/bench/cron_cost.py [--definitions N] [--repeat R]

``--redis-url`` uses a running server instead of starting one (for example a redis-server under
``valgrind --tool=callgrind``: the drain is then between two "advance:" lines on stderr).
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import pstats
import sys
import time
from collections import Counter
from typing import Any

import redis

import dueq
from dueq._wire.scripts import SCRIPT_NAMES, script_source
from dueq.server import RedisServer

START = 1_800_000_000.0  # a whole minute
SHAS = {hashlib.sha1(script_source(n).encode()).hexdigest(): n for n in SCRIPT_NAMES}


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


class CountingRedis(redis.Redis):
    """A client that counts its script calls and the bytes each sends, by script name."""

    calls: Counter[str]
    sent: Counter[str]

    def execute_command(self, *args: Any, **options: Any) -> Any:
        if str(args[0]).upper() == "EVALSHA":
            name = SHAS.get(str(args[1]), "?")
            self.calls[name] += 1
            self.sent[name] += sum(len(a) if isinstance(a, bytes | str) else 8 for a in args[3:])
        return super().execute_command(*args, **options)


def command_calls(r: redis.Redis) -> Counter[str]:
    stats = r.info("commandstats")
    return Counter({k.removeprefix("cmdstat_"): v["calls"] for k, v in stats.items()})


def cpu_s(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def measure(url: str, n: int) -> dict[str, Any]:
    r = CountingRedis.from_url(url)
    r.calls, r.sent = Counter(), Counter()
    plain = redis.Redis.from_url(url)
    clock = Clock()
    q = dueq.Queue("bench-cron", r, clock=clock)
    plain.flushall()
    for i in range(n):
        q.cron.add(f"job-{i}", "* * * * *", payload={"n": i}, tz="Europe/Berlin")
    clock.now = START + 60
    r.calls.clear()
    r.sent.clear()
    plain.config_resetstat()
    cpu_before = cpu_s(plain)
    print("advance: start", file=sys.stderr, flush=True)
    profile = cProfile.Profile()
    py_before = time.process_time()
    profile.enable()
    done = 0
    while batch := q.claim(limit=1000):
        done += q.ack_many(batch)
    profile.disable()
    py_s = time.process_time() - py_before
    print("advance: end", file=sys.stderr, flush=True)
    redis_cpu = cpu_s(plain) - cpu_before
    assert done == n, done
    commands = command_calls(plain)
    for own in ("info", "config|resetstat", "config"):
        commands.pop(own, None)
    scripts = commands.pop("evalsha", 0)
    stats = pstats.Stats(profile)
    py_calls = sum(v[1] for v in stats.stats.values())  # type: ignore[attr-defined]
    r.close()
    plain.close()
    return {
        "redis_commands": {k: v / n for k, v in sorted(commands.items())},
        "redis_commands_total": sum(commands.values()) / n,
        "script_calls": {k: v / n for k, v in sorted(r.calls.items())},
        "evalsha": scripts / n,
        "bytes_sent": {k: v / n for k, v in sorted(r.sent.items())},
        "redis_cpu_us": redis_cpu / n * 1e6,
        "python_cpu_us": py_s / n * 1e6,
        "python_calls": py_calls / n,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--definitions", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--redis-url")
    args = parser.parse_args()
    if args.redis_url:
        runs = [measure(args.redis_url, args.definitions) for _ in range(args.repeat)]
    else:
        with RedisServer() as server:
            runs = [measure(server.url, args.definitions) for _ in range(args.repeat)]
    best = dict(runs[0])
    for key in ("redis_cpu_us", "python_cpu_us"):
        best[key] = round(min(run[key] for run in runs), 2)
    print(json.dumps(best, indent=1))


if __name__ == "__main__":
    main()
