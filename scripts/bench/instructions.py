#!/usr/bin/env python
"""Redis server instructions per claimed and acked task (valgrind's callgrind), raw and dueq.

Instructions are counted, not timed: a drain of the same tasks runs the same instructions on
the server whatever else the machine is doing (repeat runs agree within about 0.1%), so this
is the measure to compare two versions of dueq on a shared machine. Every case runs in one
run, on one server:

raw       bulk.py's raw loop (``raw_fill`` + ``raw_loop``): ZPOPMIN(1000), then one pipeline of
          HMGET + HDEL of those bodies, ``json.loads`` of each
engine    bulk.py's engine loop (``engine_loop``): ``claim(1000)``, ``d.payload`` of each,
          ``ack_many``; a plain queue
events    the same with events on (``configure(events=3600)``, redis_cost.py's ``events_on``)
results   the same with keep_results on (``configure(keep_results=3600)``)

Method: the repo's redis-server binary (``dueq.server.find_redis_server``: redis-server on
PATH, or ``--server``/``DUEQ_REDIS_SERVER``, e.g. ``redis62`` or ``valkey9`` under
``DUEQ_SERVERS_DIR``) runs under ``valgrind --tool=callgrind --instr-atstart=no`` on a free
loopback port, persistence off. For each case the tasks are scheduled (not counted), the
scripts compiled by a two-task drain (a server compiles a script once in its life: with a
5,000-task count it would add about 5k per task), then ``callgrind_control -i on``, the
drain, ``-i off``, ``--dump``; the dump's total Ir (its ``totals:`` line) divided by the
tasks drained is the figure. A dump holds what ran since the previous one, so each case's
dump holds that case alone. (``--collect-atstart=no`` with ``-i on`` counts nothing:
instrumentation and collection are two switches, and ``-i`` flips the first.)

``--pythonpath DIR`` puts DIR first on ``sys.path`` before dueq is imported, to measure another
checkout's dueq (``--pythonpath /work/wt/base/src``); the dueq measured is printed.

    PYTHONPATH=$PWD/src .venv/bin/python scripts/bench/instructions.py [--quick] [--tasks N]
        [--cases raw,engine,events,results] [--pythonpath DIR] [--server NAME] [--timeout-s S]
        [--keep-dumps DIR]

``--keep-dumps DIR`` keeps each case's dump as ``DIR/<case>.callgrind`` (read it with
``callgrind_annotate``, or compare two versions' function by function).

Progress goes to stderr; the table to stdout, then one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

DEFAULT_TASKS = 5_000
QUICK_TASKS = 1_000
CASES = ("raw", "engine", "events", "results")
START_TIMEOUT_S = 120.0  # redis-server under valgrind starts in about a second; a loaded
# machine can stretch that a long way
DUMP_TIMEOUT_S = 120.0
TIMEOUT_S = 1_800.0  # the whole run, default
WARM_UP_TASKS = 2


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- the dump ----------------------------------------------------------------------------------


#: A dump's last line. callgrind writes it when the dump is complete; ``summary:``, near the
#: top, reads 0 in the numbered dumps of a ``callgrind_control --dump`` (valgrind 3.19).
TOTALS = re.compile(r"^totals:", re.MULTILINE)


def dump_total(text: str, event: str = "Ir") -> int:
    """The total of ``event`` in a callgrind dump's text: its ``totals:`` line, else its
    ``summary:`` line, read at ``event``'s place in the ``events:`` line (Ir first unless
    callgrind counted more events). Raises ``ValueError`` for a text with neither line or
    without that event."""
    events: list[str] | None = None
    found: dict[str, list[int]] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        if not sep:
            continue
        if key == "events":
            events = rest.split()
        elif key in ("totals", "summary"):
            found[key] = [int(v) for v in rest.split()]
    values = found.get("totals", found.get("summary"))
    if values is None:
        raise ValueError("no totals: or summary: line in the dump")
    names = events or ["Ir"]
    if event not in names:
        raise ValueError(f"the dump counted {names}, not {event}")
    at = names.index(event)
    return values[at] if at < len(values) else 0  # a trailing zero may be left out


def dump_files(out_file: Path) -> dict[int, Path]:
    """The numbered dumps callgrind wrote next to ``out_file`` (``<out_file>.<n>``), by n."""
    pattern = re.compile(re.escape(out_file.name) + r"\.(\d+)$")
    found: dict[int, Path] = {}
    for p in out_file.parent.iterdir():
        m = pattern.match(p.name)
        if m:
            found[int(m.group(1))] = p
    return found


# -- the server under callgrind ----------------------------------------------------------------


class CallgrindServer:
    """redis-server under callgrind on a free loopback port, persistence off, in a temporary
    folder (removed on ``stop``); instrumentation off until ``counting`` turns it on."""

    def __init__(self, binary: str, port: int) -> None:
        self.binary, self.port = binary, port
        self.folder = Path(tempfile.mkdtemp(prefix="dueq-callgrind-"))
        self.out_file = self.folder / "callgrind.out"
        self.log_file = self.folder / "valgrind.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.dumps = 0
        self.labels: dict[int, str] = {}  # dump number -> case

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, client: Callable[[str], Any]) -> None:
        cmd = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={self.out_file}",
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.folder),
        ]
        with self.log_file.open("wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        started = time.monotonic()
        r = client(self.url)
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"valgrind exited {self.proc.returncode}: {self.tail()}")
            try:
                if r.ping():
                    break
            except Exception:  # not listening yet (connection refused, loading): ask again
                pass
            if time.monotonic() - started > START_TIMEOUT_S:
                raise RuntimeError(f"no PING reply after {START_TIMEOUT_S:.0f} s: {self.tail()}")
            time.sleep(0.2)
        r.close()
        log(f"server: {self.binary} under callgrind, pid {self.proc.pid}, port {self.port}, up")
        log(f"  after {time.monotonic() - started:.1f} s; files in {self.folder}")

    def tail(self) -> str:
        try:
            return self.log_file.read_text(errors="replace")[-2000:]
        except OSError:
            return "(no valgrind log)"

    def control(self, *args: str) -> None:
        assert self.proc is not None
        cmd = ["callgrind_control", *args, str(self.proc.pid)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=DUMP_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: exit {done.returncode}: {done.stderr}")

    @contextmanager
    def counting(self) -> Iterator[None]:
        """Instrumentation on for the block, then off."""
        self.control("-i", "on")
        try:
            yield
        finally:
            self.control("-i", "off")

    def dump(self, label: str) -> int:
        """Dumps what was counted since the last dump and returns its total Ir."""
        self.control(f"--dump={label}")
        self.dumps += 1
        self.labels[self.dumps] = label
        deadline = time.monotonic() + DUMP_TIMEOUT_S
        while True:
            path = dump_files(self.out_file).get(self.dumps)
            text = path.read_text(errors="replace") if path is not None else ""
            if TOTALS.search(text):  # the last line: the dump is written
                return dump_total(text)
            if time.monotonic() > deadline:
                raise RuntimeError(f"no dump {self.dumps} after {DUMP_TIMEOUT_S:.0f} s")
            time.sleep(0.1)

    def stop(self, keep: Path | None = None) -> None:
        """Stops the server; with ``keep``, its dumps (``<case>.callgrind``, for
        ``callgrind_annotate``) go there before the folder is removed."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            for number, path in sorted(dump_files(self.out_file).items()):
                label = self.labels.get(number, str(number))
                shutil.copyfile(path, keep / f"{label}.callgrind")
        shutil.rmtree(self.folder, ignore_errors=True)


# -- the cases ---------------------------------------------------------------------------------


def measure(server: CallgrindServer, cases: list[str], n: int) -> dict[str, dict[str, Any]]:
    """Each case's total Ir and Ir per task, counted over its drain alone."""
    import redis
    from bulk import engine_loop, payloads, raw_fill, raw_loop, schedule
    from redis_cost import events_on, results_on

    setups: dict[str, Callable[[Any], None] | None] = {
        "engine": None,
        "events": events_on,
        "results": results_on,
    }
    items = payloads(n)
    r = redis.Redis.from_url(server.url)
    out: dict[str, dict[str, Any]] = {}
    try:
        for case in cases:
            started = time.monotonic()
            if case == "raw":
                log(f"{case}: filling {n:,} tasks ...")
                raw_fill(r, items)
                log(f"{case}: draining, counted ...")
                with server.counting():
                    done = raw_loop(r, n)
            else:
                setup = setups[case]
                q = schedule(r, items[:WARM_UP_TASKS], setup)  # compiles the scripts
                engine_loop(q, WARM_UP_TASKS)
                log(f"{case}: scheduling {n:,} tasks ...")
                q = schedule(r, items, setup)
                log(f"{case}: draining, counted ...")
                with server.counting():
                    done = engine_loop(q, n)
            total = server.dump(case)
            if done != n:
                raise RuntimeError(f"{case}: drained {done} of {n} tasks")
            out[case] = {"tasks": done, "ir": total, "ir_per_task": total / done}
            log(
                f"{case}: {total / done:,.0f} instructions per task "
                f"({time.monotonic() - started:.0f} s)"
            )
    finally:
        r.close()
    return out


def rows(figures: dict[str, dict[str, Any]]) -> list[tuple[str, str, str, str]]:
    raw = figures.get("raw")
    table = []
    for case, f in figures.items():
        ratio = f"{f['ir_per_task'] / raw['ir_per_task']:.2f}x raw" if raw else ""
        table.append(
            (
                case,
                f"{f['ir_per_task'] / 1000:,.1f}k instr/task",
                f"{f['ir']:,} Ir over {f['tasks']:,} tasks",
                ratio,
            )
        )
    return table


# -- main --------------------------------------------------------------------------------------


class Timeout(Exception):
    pass


def on_alarm(signum: int, frame: FrameType | None) -> None:
    raise Timeout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tasks", type=int, help=f"tasks per case (default {DEFAULT_TASKS:,})")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_TASKS:,} tasks per case")
    parser.add_argument(
        "--cases", default=",".join(CASES), help="comma list of " + ", ".join(CASES)
    )
    parser.add_argument("--pythonpath", help="a folder put first on sys.path (another dueq)")
    parser.add_argument("--server", help="the server binary: a path, redis, redis62, valkey9")
    parser.add_argument("--keep-dumps", type=Path, help="a folder for each case's dump")
    parser.add_argument("--timeout-s", type=float, default=TIMEOUT_S, help="the whole run")
    args = parser.parse_args(argv)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    for case in cases:
        if case not in CASES:
            parser.error(f"unknown case {case!r}: one of {', '.join(CASES)}")
    n = args.tasks or (QUICK_TASKS if args.quick else DEFAULT_TASKS)
    if args.pythonpath:
        sys.path.insert(0, os.path.abspath(args.pythonpath))
    import redis

    import dueq
    from dueq.server import find_redis_server, free_port

    log(f"dueq {dueq.__file__}")
    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(max(1, int(args.timeout_s)))
    server = CallgrindServer(find_redis_server(args.server), free_port())
    try:
        server.start(redis.Redis.from_url)
        version = redis.Redis.from_url(server.url).info("server")["redis_version"]
        figures = measure(server, cases, n)
    except Timeout:
        log(f"stopped: the run took more than {args.timeout_s:g} s (--timeout-s)")
        return 2
    finally:
        signal.alarm(0)
        server.stop(args.keep_dumps)
    from report import print_table

    print_table(rows(figures))
    print(json.dumps({"dueq": dueq.__file__, "server": version, "tasks": n, "cases": figures}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
