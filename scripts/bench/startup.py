#!/usr/bin/env python
"""Start-up benchmark: process start to the first handled task, for a worker started cold.

Starts its own throwaway redis-server (``dueq.server.RedisServer``, free loopback port). Before
each run the server is emptied and one task due now is scheduled; then a process is spawned
and its handler, at the first task, writes ``time.time()`` to a file. The figure is that time
minus ``time.time()`` just before ``Popen`` (spawn, interpreter start, imports, connecting,
the worker's checks and its first claim). Beside it, the CPU seconds the process had used by
then (``time.process_time()`` in the handler, every thread): on a shared, busy machine the
wall figure swings with the load, the CPU figure much less. Cases, run in rounds (one run of
each per round, so a noisy moment hits every case alike):

1. pass       ``python -c`` writing the time at once: the interpreter's own start, the floor
2. redis      ``python -c "import redis"`` then the time: the floor of anything on redis-py
3. cli        ``python -m dueq worker QUEUE startup_handler:handle`` (the target)
4. script     a plain script: ``dueq.Worker(dueq.Queue.from_url(url, QUEUE), handle).run()``
5. asyncio    a plain script: ``asyncio.run(dueq.AsyncWorker(dueq.AsyncQueue(...), h).run())``

Bytecode: the children write and read their ``.pyc`` files under a temporary
``PYTHONPYCACHEPREFIX`` (``PYTHONDONTWRITEBYTECODE`` removed) and one uncounted warm-up round
fills it, so the figures are those of an installed package (pip compiles on install); with
``--no-bytecode-cache`` every run compiles dueq's modules from source again, as a process does
with ``PYTHONDONTWRITEBYTECODE=1`` and a source checkout (about 0.15 s more here).

Each case runs ``--runs`` times (default 7); best and median are printed. Every run is bounded
(``--timeout``, default 20 s, then the process is killed and the run fails). With
``--importtime N`` one more cli run under ``python -X importtime`` prints where its import time
goes: per top-level package, and the N slowest dueq modules by their own (self) time.

    .venv/bin/python scripts/bench/startup.py [--runs N] [--timeout S] [--importtime N]
        [--cases pass,redis,cli,script,asyncio] [--no-bytecode-cache]

The table goes to stdout, followed by one JSON line with every figure; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from report import print_table

import dueq
from dueq.server import RedisServer

QUEUE = "startup"
POLL_S = 0.002
TARGET_S = 0.25

HANDLER = """
import os
import time


def handle(d):
    stamp, cpu = time.time(), time.process_time()
    with open(os.environ["BENCH_OUT"], "a") as out:
        out.write(f"{stamp!r} {cpu!r}\\n")


async def ahandle(d):
    handle(d)
"""

FLOOR = """
import os, time
{imports}
with open(os.environ["BENCH_OUT"], "a") as out:
    out.write(f"{{time.time()!r}} {{time.process_time()!r}}\\n")
"""

SCRIPT = """
import os
import dueq
from startup_handler import handle

dueq.Worker(dueq.Queue.from_url(os.environ["BENCH_URL"], "startup"), handle).run()
"""

ASYNC_SCRIPT = """
import asyncio, os
import dueq
from startup_handler import ahandle


async def main():
    q = dueq.AsyncQueue.from_url(os.environ["BENCH_URL"], "startup")
    await dueq.AsyncWorker(q, ahandle).run()


asyncio.run(main())
"""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def commands(tmp: Path) -> dict[str, list[str]]:
    py = sys.executable
    return {
        "pass": [py, "-c", FLOOR.format(imports="")],
        "redis": [py, "-c", FLOOR.format(imports="import redis")],
        "cli": [py, "-m", "dueq", "worker", QUEUE, "startup_handler:handle"],
        "script": [py, str(tmp / "worker_script.py")],
        "asyncio": [py, str(tmp / "async_script.py")],
    }


def first_stamp(out: Path) -> tuple[float, float] | None:
    """(wall time, the process's CPU seconds) the first handled task wrote, if it did."""
    try:
        text = out.read_text()
    except FileNotFoundError:
        return None
    line = text.split("\n", 1)[0]
    if not text.endswith("\n") or not line:
        return None
    wall, cpu = line.split()
    return float(wall), float(cpu)


def stop(child: subprocess.Popen[bytes]) -> str:
    """Stop ``child`` (SIGTERM, then SIGKILL after 10 s); its stderr."""
    if child.poll() is None:
        child.send_signal(signal.SIGTERM)
    try:
        _, err = child.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        child.kill()
        _, err = child.communicate()
    return err.decode(errors="replace")


def run_once(
    command: list[str], env: dict[str, str], out: Path, q: dueq.Queue, timeout_s: float
) -> tuple[float, float]:
    """Seconds from just before spawning ``command`` to the time its handler (or floor
    script) wrote, and the CPU seconds the process had used by then (all its threads: the
    figure a busy machine disturbs least); one task due now is waiting in the queue."""
    q.redis.flushall()
    q.schedule({"n": 1})
    out.unlink(missing_ok=True)
    began = time.time()
    child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while (stamp := first_stamp(out)) is None:
            if time.time() - began > timeout_s:
                raise RuntimeError(f"{command[1:]} handled nothing in {timeout_s} s")
            if child.poll() is not None and first_stamp(out) is None:
                raise RuntimeError(f"{command[1:]} exited: {stop(child)[-2000:]}")
            time.sleep(POLL_S)
    finally:
        stop(child)
    return stamp[0] - began, stamp[1]


def import_profile(
    command: list[str], env: dict[str, str], out: Path, q: dueq.Queue, top: int
) -> dict[str, Any]:
    """One run under ``-X importtime``: milliseconds per top-level package (self times
    summed) and the ``top`` dueq modules with the largest self time."""
    q.redis.flushall()
    q.schedule({"n": 1})
    out.unlink(missing_ok=True)
    child = subprocess.Popen(
        [command[0], "-X", "importtime", *command[1:]],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    began = time.time()
    while first_stamp(out) is None and time.time() - began < 20 and child.poll() is None:
        time.sleep(POLL_S)
    err = stop(child)
    packages: dict[str, float] = defaultdict(float)
    modules: list[tuple[float, str]] = []
    for line in err.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, _cumulative, name = line[len("import time:") :].split("|")
        module = name.strip()
        packages[module.split(".")[0]] += int(self_us) / 1000
        if module.split(".")[0] == "dueq":
            modules.append((int(self_us) / 1000, module))
    return {
        "packages_ms": dict(sorted(packages.items(), key=lambda kv: -kv[1])[:top]),
        "dueq_modules_ms": {m: ms for ms, m in sorted(modules, reverse=True)[:top]},
        "total_ms": sum(packages.values()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds per run")
    parser.add_argument("--importtime", type=int, default=0, metavar="N")
    parser.add_argument("--cases", default="pass,redis,cli,script,asyncio")
    parser.add_argument(
        "--no-bytecode-cache", action="store_true", help="compile from source in every run"
    )
    args = parser.parse_args()
    chosen = [c.strip() for c in args.cases.split(",") if c.strip()]
    figures: dict[str, Any] = {"runs": args.runs, "python": platform.python_version()}
    times: dict[str, list[float]] = {c: [] for c in chosen}
    cpus: dict[str, list[float]] = {c: [] for c in chosen}
    with tempfile.TemporaryDirectory(prefix="dueq-startup-") as tmp, RedisServer() as server:
        folder = Path(tmp)
        (folder / "startup_handler.py").write_text(textwrap.dedent(HANDLER))
        (folder / "worker_script.py").write_text(textwrap.dedent(SCRIPT))
        (folder / "async_script.py").write_text(textwrap.dedent(ASYNC_SCRIPT))
        out = folder / "first.txt"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([tmp, os.environ.get("PYTHONPATH", "")]),
            "BENCH_OUT": str(out),
            "BENCH_URL": server.url,
            "DUEQ_REDIS_URL": server.url,
        }
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        if args.no_bytecode_cache:
            env["PYTHONDONTWRITEBYTECODE"] = "1"
        else:
            env["PYTHONPYCACHEPREFIX"] = str(folder / "pycache")
        figures["bytecode_cache"] = not args.no_bytecode_cache
        everything = commands(folder)
        q = dueq.Queue(QUEUE, server.client())
        if not args.no_bytecode_cache:
            log("warm-up round (fills the bytecode cache) ...")
            for case in chosen:
                run_once(everything[case], env, out, q, args.timeout)
        for round_ in range(args.runs):
            log(f"round {round_ + 1} of {args.runs} ...")
            for case in chosen:
                wall, cpu = run_once(everything[case], env, out, q, args.timeout)
                times[case].append(wall)
                cpus[case].append(cpu)
        if args.importtime:
            log("cli under -X importtime ...")
            figures["importtime"] = import_profile(everything["cli"], env, out, q, args.importtime)
        q.close()
    rows: list[tuple[str, str, str, str]] = []
    for case in chosen:
        best, median = min(times[case]), statistics.median(times[case])
        cpu_best, cpu_median = min(cpus[case]), statistics.median(cpus[case])
        figures[case] = {
            "best_s": best,
            "median_s": median,
            "all_s": times[case],
            "cpu_best_s": cpu_best,
            "cpu_median_s": cpu_median,
        }
        target = f"<= {TARGET_S}" if case == "cli" else ""
        detail = " ".join(f"{t:.3f}" for t in times[case])
        rows.append((case, f"best {best:.3f} s, median {median:.3f} s", detail, target))
        rows.append(
            ("  CPU", f"best {cpu_best:.3f} s, median {cpu_median:.3f} s", "process CPU", "")
        )
    if "importtime" in figures:
        profile = figures["importtime"]
        rows.append(("imports", f"{profile['total_ms']:.0f} ms", "cli, all modules", ""))
        for package, ms in profile["packages_ms"].items():
            rows.append(("  package", f"{ms:.1f} ms", package, ""))
        for module, ms in profile["dueq_modules_ms"].items():
            rows.append(("  dueq self", f"{ms:.1f} ms", module, ""))
    print_table(rows)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
