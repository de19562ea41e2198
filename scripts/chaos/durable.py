#!/usr/bin/env python
"""Chaos proof of durable tasks (issue 39): no committed step's body runs again, while worker
processes are SIGKILLed and Redis is SIGKILLed and restarted from its AOF.

It starts its own Redis (soak.py's ``Deployment``: ``dueq.server.RedisServer``, loopback, a free
port, ``appendonly yes``, ``appendfsync always``) and never touches any other server. It
schedules ``--runs`` runs of one durable task (``@q.task(durable=True)``) of ten steps, with a
short ``ctx.sleep`` after the fifth (``--sleep-ms``, 0 for none), on a queue with a short lease
and ``keep_results`` on, and runs them in ``--workers`` ``dueq.Worker`` processes (soak.py's
``Workers``: each slot restarted with a new log when killed), or with ``--front-end async``
``dueq.AsyncWorker`` processes on an ``AsyncQueue``.

Each step's body, in the worker process, outside Redis:

- appends ``S task step run attempt start_ms`` to its process's log when it starts (the log is
  line-buffered: one write(2) a line, kept through a SIGKILL; ``start_ms`` is ``time.time()``),
  then works ``--work-ms``;
- fails on purpose once for 5 % of the (task, step) pairs, chosen by the seed (the first run to
  create the pair's marker file raises and logs ``F run``): even steps leave it to the task's
  retry policy, odd steps have a ``retry=`` policy of their own (handed back, no attempt used);
- otherwise logs ``E run`` and returns a value made of the task's argument, the step's position
  and the previous step's result; the task returns the list of its ten step results.

One worker, chosen at random, is SIGKILLed every ``--kill-every`` seconds and restarted; Redis
is SIGKILLed once half the runs have finished and restarted on the same port and folder. With
``--stop-every`` a worker is also SIGSTOPped for ``--stop-for`` seconds (past its leases, so the
other workers take its tasks over and finish them), then SIGCONTed: it goes on with the
deliveries it held, whose leases are gone. On this branch that finds re-runs of committed
steps (tests/durable/test_stale_runs.py has the cause). With ``--redis-stop-s`` Redis is
SIGSTOPped that long (past the leases and the clients' socket timeout) once a third of the runs
have finished, then SIGCONTed.

When every run has finished (or the time bound ``--max-duration-s`` ran out) it reads each
task back (``q.get``: its state, result and ``steps``) and judges from the outside:

- every run finished: state ``done`` (none dead, none lost), its result the expected list;
- every step committed (state ``done``) and its body run at least once;
- **re-runs after commit**: a body run that started more than 50 ms after its step's commit
  (``StepInfo.ended_at``, the commit script's Redis time; Redis and the bodies read the same
  kernel clock) is a committed step's body run again. Must be 0;
- no step's log counts more runs (``StepInfo.runs``) than its body ran.

Body runs beyond the first are broken down by what ended them: a failure on purpose, a SIGKILL
mid-body (no end line, in a killed process's log), or a return whose commit did not happen
(the process was killed before it, or its lease was lost). It prints one Markdown table; the
exit code is 1 on any violation.

    .venv/bin/python scripts/chaos/durable.py                      # 1,000 runs, about 50 s
    .venv/bin/python scripts/chaos/durable.py --runs 100 --workers 3 --kill-every 1
    .venv/bin/python scripts/chaos/durable.py --runs 600 --stop-every 2   # stale deliveries
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import logging
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import redis
import redis.asyncio
import tenacity

import dueq
from dueq._util.outage import is_outage

sys.path.insert(0, str(Path(__file__).parent))
from features import retrying  # sibling scripts (scripts/chaos is on sys.path)
from soak import (
    SOCKET_TIMEOUT_S,
    Deployment,
    Fault,
    Workers,
    connect,
    inject,
    now_ms,
    wait_drained,
)

QUEUE = "durable-chaos"
TASK = "chaos.ten_steps"
STEPS = 10
#: The task sleeps (``ctx.sleep``) after this many steps.
SLEEP_AFTER = 5
LEASE_S = 2.5
HEARTBEAT_S = 0.8
MAX_ATTEMPTS = 40
FAIL_FRACTION = 0.05
#: A body run that starts this long after its step's commit is a re-run of a committed step:
#: the slack covers the rounding of the commit's Redis time and nothing else (a body starts
#: before its own commit).
COMMIT_SLACK_MS = 50.0
#: The policy of the odd steps' own retries (``ctx.step(..., retry=)``).
STEP_RETRY = dueq.RetryPolicy(max_attempts=5, wait=lambda state: 0.1)

log = logging.getLogger("durable-chaos")


def make_queue(client: redis.Redis, kind: type[Any] = dueq.Queue) -> Any:
    """The chaos queue on ``client``: a ``dueq.Queue``, or ``kind=dueq.AsyncQueue`` on a
    ``redis.asyncio`` client."""
    retry = dueq.RetryPolicy(max_attempts=MAX_ATTEMPTS, wait=tenacity.wait_random(0.05, 0.3))
    return kind(QUEUE, client, retry=retry, lease=LEASE_S)


def step_value(n: int, position: int, previous: int) -> int:
    """What step ``position`` of run ``n`` returns, given the previous step's result."""
    return (previous * 31 + n * 7 + position + 1) % 1_000_003


def expected(n: int) -> list[int]:
    results, previous = [], 0
    for position in range(STEPS):
        previous = step_value(n, position, previous)
        results.append(previous)
    return results


def fails_once(seed: int, task_id: str, step: str) -> bool:
    """Whether the seed picks this (task, step) to fail on its first run."""
    return random.Random(f"{seed}/{task_id}/{step}").random() < FAIL_FRACTION


def task_id(n: int) -> str:
    return f"d{n:05d}"


# -- the worker process ----------------------------------------------------------------------


class Bodies:
    """The step bodies of one worker process (see the module docstring)."""

    def __init__(self, log_path: Path, marks: Path, seed: int, work_s: float) -> None:
        self.out = open(log_path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 (until SIGKILL)
        self.lock = threading.Lock()
        self.marks = marks
        self.seed = seed
        self.work_s = work_s
        self.serial = itertools.count(1)
        self.prefix = f"p{os.getpid()}-"

    def write(self, line: str) -> None:
        with self.lock:
            self.out.write(line)

    def first_failure(self, tid: str, step: str) -> bool:
        """True for the one run that creates the pair's marker (the planned failure)."""
        try:
            os.close(os.open(self.marks / f"{tid}.{step}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True

    def __call__(
        self, ctx: dueq.StepContext, step: str, n: int, position: int, previous: int
    ) -> int:
        run = f"{self.prefix}{next(self.serial)}"
        self.write(f"S {ctx.id} {step} {run} {ctx.attempt} {now_ms():.3f}\n")
        time.sleep(self.work_s)
        if fails_once(self.seed, ctx.id, step) and self.first_failure(ctx.id, step):
            self.write(f"F {run}\n")
            raise RuntimeError(f"step {step} of {ctx.id} fails on purpose")
        self.write(f"E {run}\n")
        return step_value(n, position, previous)


def register(q: Any, body: Callable[..., int], rerun_committed: bool = False) -> Any:
    """The chaos task on ``q``, its steps run by ``body``. ``rerun_committed`` (a check of the
    check) makes it call the first step's body once more, outside ``ctx.step``, at its end: what
    a library that re-ran a committed step would do, which the judge must report."""

    @q.task(name=TASK, durable=True)
    def ten_steps(ctx: dueq.StepContext, n: int, sleep_ms: int) -> list[int]:
        results: list[int] = []
        previous = 0
        for position in range(STEPS):
            if position == SLEEP_AFTER and sleep_ms:
                ctx.sleep(sleep_ms / 1000)
            step = f"s{position}"
            retry = STEP_RETRY if position % 2 else None
            previous = ctx.step(step, body, ctx, step, n, position, previous, retry=retry)
            results.append(previous)
        if rerun_committed:
            body(ctx, "s0", n, 0, 0)
        return results

    return ten_steps


def worker_main(args: argparse.Namespace) -> None:
    """A ``dueq.Worker`` on a ``Queue``, or with ``--front-end async`` an ``AsyncWorker`` on an
    ``AsyncQueue`` (the same plain function: it runs on a worker thread and its steps are
    written by the consumer's loop, the asyncio front end's step protocol)."""
    logging.basicConfig(level=logging.ERROR, format=f"worker {os.getpid()}: %(message)s")
    bodies = Bodies(Path(args.log), Path(args.marks), args.seed, args.work_ms / 1000)
    options: dict[str, Any] = {"concurrency": args.concurrency, "grace": 2.0}
    options["heartbeat"] = HEARTBEAT_S
    if args.front_end == "sync":
        q = make_queue(connect(args.port, []))
        register(q, bodies, args.rerun_committed)
        dueq.Worker(q, **options).run()
        return
    aclient = redis.asyncio.Redis(
        host="127.0.0.1", port=args.port, socket_timeout=SOCKET_TIMEOUT_S, socket_connect_timeout=2
    )
    aq = make_queue(aclient, dueq.AsyncQueue)
    register(aq, bodies, args.rerun_committed)
    asyncio.run(dueq.AsyncWorker(aq, **options).run())


# -- the worker processes --------------------------------------------------------------------


class DurableWorkers(Workers):
    """soak.py's worker slots, running this script's worker."""

    def __init__(self, settings: argparse.Namespace, deployment: Deployment, folder: Path) -> None:
        super().__init__(settings, deployment, folder)
        self.marks = folder / "marks"
        self.marks.mkdir(exist_ok=True)

    def command(self, path: Path) -> list[str]:
        s = self.settings
        command = [sys.executable, __file__, "worker", "--log", str(path)]
        command += [*self.deployment.worker_args(), "--marks", str(self.marks)]
        command += ["--seed", str(s.seed), "--concurrency", str(s.concurrency)]
        command += ["--work-ms", str(s.work_ms), "--front-end", s.front_end]
        return command + (["--rerun-committed"] if s.rerun_committed else [])


# -- one run ---------------------------------------------------------------------------------


def finished(q: dueq.Queue, runs: int) -> int | None:
    """How many runs are no longer scheduled or leased (None while Redis is down)."""
    try:
        stats = q.stats()
    except Exception as exc:  # Redis is down (the planned kill); anything else is fatal
        if not is_outage(exc):
            raise
        return None
    return runs - stats.scheduled - stats.leased


def faults_until_finished(
    q: dueq.Queue,
    settings: argparse.Namespace,
    deployment: Deployment,
    workers: DurableWorkers,
    rng: random.Random,
    deadline: float,
) -> list[Fault]:
    """Kill a worker every ``kill_every`` and Redis once half the runs have finished, until
    every run has finished or ``deadline`` (monotonic) passes."""
    faults: list[Fault] = []
    next_kill = time.monotonic() + settings.kill_every
    next_stop = time.monotonic() + settings.stop_every
    redis_kills = redis_stops = 0
    while time.monotonic() < deadline:
        workers.restart_crashed()
        done = finished(q, settings.runs)
        if done == settings.runs:
            break
        half = done is not None and done >= settings.runs / 2
        if half and redis_kills < settings.redis_restarts:
            faults.append(inject("redis-kill", settings, deployment, workers, rng))
            redis_kills += 1
            log.info(
                "Redis SIGKILLed and restarted with %s of %s runs finished", done, settings.runs
            )
        third = done is not None and done >= settings.runs / 3
        if third and settings.stop_s and not redis_stops:
            faults.append(inject("redis-stop", settings, deployment, workers, rng))
            redis_stops += 1
            log.info("Redis SIGSTOPped for %s s with %s runs finished", settings.stop_s, done)
        if settings.kill_every and time.monotonic() >= next_kill:
            faults.append(inject("worker-kill", settings, deployment, workers, rng))
            next_kill += settings.kill_every
        if settings.stop_every and time.monotonic() >= next_stop:
            faults.append(stop_worker(workers, rng, settings.stop_for))
            next_stop = time.monotonic() + settings.stop_every
        time.sleep(0.05)
    return faults


def stop_worker(workers: DurableWorkers, rng: random.Random, seconds: float) -> Fault:
    """SIGSTOP a worker chosen at random for ``seconds`` (past its leases), then SIGCONT: the
    deliveries it held are taken over by the others, and it goes on with them when it wakes."""
    slot = rng.randrange(len(workers.procs))
    proc, path = workers.procs[slot], workers.logs[slot]
    start = now_ms()
    proc.send_signal(signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        proc.send_signal(signal.SIGCONT)
    return Fault("worker-stop", start, now_ms(), str(path))


def schedule_runs(q: dueq.Queue, settings: argparse.Namespace) -> None:
    """Schedule every run (ids ``d00000``...), due now, in batches of 200."""
    ten_steps = register(q, lambda *args: 0)  # (this process only schedules it)
    tasks = [
        ten_steps.task({"n": n, "sleep_ms": settings.sleep_ms}, id=task_id(n))
        for n in range(settings.runs)
    ]
    for start in range(0, len(tasks), 200):
        q.schedule_many(tasks[start : start + 200])


def run(settings: argparse.Namespace, out: Callable[[str], None]) -> dict[str, int]:
    """One chaos run on a Redis of its own; its counts (``failed`` judges them)."""
    folder = Path(tempfile.mkdtemp(prefix="dueq-durable-chaos-"))
    deployment = Deployment(failover=False)
    deployment.start()
    try:
        return run_on(deployment, folder, settings, out)
    finally:
        deployment.stop()
        shutil.rmtree(folder, ignore_errors=True)


def run_on(
    deployment: Deployment, folder: Path, settings: argparse.Namespace, out: Callable[[str], None]
) -> dict[str, int]:
    client = deployment.client()
    q = make_queue(client)
    q.configure(keep_results=timedelta(hours=2))
    schedule_runs(q, settings)
    started = time.monotonic()
    deadline = started + settings.max_duration_s
    workers = DurableWorkers(settings, deployment, folder)
    workers.start()
    rng = random.Random(settings.seed)
    faults = faults_until_finished(q, settings, deployment, workers, rng, deadline)
    drained = wait_drained(q, deadline, workers)
    elapsed_s = time.monotonic() - started
    workers.stop()
    counts, notes = judge(q, settings, workers, faults)
    counts["drained"] = int(drained)
    print_table(settings, counts, faults, workers, elapsed_s, notes, out)
    client.close()
    return counts


# -- judging ---------------------------------------------------------------------------------


@dataclasses.dataclass
class BodyRun:
    run: str
    attempt: int
    start_ms: float
    log: Path
    end: str = ""  # "E" returned, "F" failed on purpose, "" cut (no end line)


def read_body_runs(logs: list[Path]) -> dict[tuple[str, str], list[BodyRun]]:
    """The body runs per (task, step), from every worker log (a line cut by a SIGKILL, the
    last of its log, is left out)."""
    runs: dict[tuple[str, str], list[BodyRun]] = defaultdict(list)
    for path in logs:
        if not path.exists():
            continue
        by_run: dict[str, BodyRun] = {}
        for line in path.read_text(encoding="utf-8").splitlines():
            parts = line.split()
            if len(parts) == 6 and parts[0] == "S":
                _, tid, step, run_id, attempt, start = parts
                body = BodyRun(run_id, int(attempt), float(start), path)
                runs[(tid, step)].append(body)
                by_run[run_id] = body
            elif len(parts) == 2 and parts[0] in ("E", "F") and parts[1] in by_run:
                by_run[parts[1]].end = parts[0]
    return runs


def judge(
    q: dueq.Queue, settings: argparse.Namespace, workers: DurableWorkers, faults: list[Fault]
) -> tuple[Counter[str], list[str]]:
    bodies = read_body_runs(workers.all_logs)
    killed = {Path(f.detail) for f in faults if f.kind == "worker-kill"}
    stopped = {Path(f.detail) for f in faults if f.kind == "worker-stop"}
    counts: Counter[str] = Counter()
    notes: list[str] = []
    per_step: list[int] = []
    deadline = time.monotonic() + 30
    for n in range(settings.runs):
        tid = task_id(n)
        info = retrying(lambda tid=tid: q.get(tid), deadline)
        if info is None:
            counts["lost"] += 1
            continue
        counts[f"state {info.state}"] += 1
        if info.state == "done" and info.result == expected(n):
            counts["results right"] += 1
        elif info.state == "done":
            notes.append(f"{tid}: result {info.result}, expected {expected(n)}")
        records = {s.name: s for s in info.steps if s.kind == "step"}
        counts["sleeps committed"] += sum(1 for s in info.steps if s.kind == "sleep")
        for position in range(STEPS):
            step = f"s{position}"
            runs = bodies.get((tid, step), [])
            per_step.append(len(runs))
            counts["body runs"] += len(runs)
            if not runs:
                counts["steps whose body never ran"] += 1
            record = records.get(step)
            if record is None or record.state != "done" or record.ended_at is None:
                counts["steps not committed"] += 1
                continue
            counts["steps committed"] += 1
            commit_ms = record.ended_at.timestamp() * 1000
            late = [r for r in runs if r.start_ms > commit_ms + COMMIT_SLACK_MS]
            counts["re-runs after commit"] += len(late)
            counts["re-runs after commit in a SIGSTOPped worker"] += sum(
                1 for r in late if r.log in stopped
            )
            for r in late:
                where = ", a SIGSTOPped worker" if r.log in stopped else ""
                notes.append(
                    f"re-run after commit: {tid} {step} run {r.run} attempt {r.attempt} started "
                    f"{r.start_ms - commit_ms:.0f} ms after the commit ({r.log.name}{where}; "
                    f"the task {info.state} after {info.attempt} attempt(s))"
                )
            if record.runs > len(runs):
                counts["steps whose log counts more runs than ran"] += 1
            counts["failed on purpose"] += sum(1 for r in runs if r.end == "F")
            counts["cut by a SIGKILL mid-body"] += sum(
                1 for r in runs if not r.end and r.log in killed
            )
            counts["cut otherwise"] += sum(1 for r in runs if not r.end and r.log not in killed)
            counts["returned, not committed"] += max(sum(1 for r in runs if r.end == "E") - 1, 0)
    counts["body runs per step (fewest)"] = min(per_step, default=0)
    counts["body runs per step (most)"] = max(per_step, default=0)
    counts["runs"] = settings.runs
    counts["steps"] = settings.runs * STEPS
    return counts, notes


def failed(counts: dict[str, int]) -> list[str]:
    """The violations (empty: the proof held)."""
    bad = []
    if counts.get("state done", 0) != counts["runs"]:
        bad.append("not every run finished done")
    if counts.get("results right", 0) != counts["runs"]:
        bad.append("wrong results")
    for key in (
        "lost",
        "re-runs after commit",
        "steps whose body never ran",
        "steps not committed",
        "steps whose log counts more runs than ran",
    ):
        if counts.get(key, 0):
            bad.append(key)
    return bad


ROWS = [
    ("runs", "runs"),
    ("state done", "finished (state done)"),
    ("state dead", "dead"),
    ("lost", "lost (gone, not kept)"),
    ("results right", "final result right"),
    ("steps", "steps"),
    ("steps committed", "steps committed"),
    ("sleeps committed", "sleeps committed"),
    ("steps whose body never ran", "steps whose body never ran"),
    ("body runs", "body runs"),
    ("body runs per step (fewest)", "body runs per step (fewest)"),
    ("body runs per step (most)", "body runs per step (most)"),
    ("failed on purpose", "  beyond the first: failed on purpose"),
    ("cut by a SIGKILL mid-body", "  beyond the first: cut by a SIGKILL mid-body"),
    ("returned, not committed", "  beyond the first: returned, commit not done"),
    ("cut otherwise", "  beyond the first: cut otherwise"),
    ("steps whose log counts more runs than ran", "steps whose log counts more runs than ran"),
    ("re-runs after commit", "re-runs after commit"),
    ("re-runs after commit in a SIGSTOPped worker", "  of which in a SIGSTOPped worker"),
]


def print_table(
    settings: argparse.Namespace,
    counts: Counter[str],
    faults: list[Fault],
    workers: DurableWorkers,
    elapsed_s: float,
    notes: list[str],
    out: Callable[[str], None],
) -> None:
    kind = "Worker" if settings.front_end == "sync" else "AsyncWorker"
    out(
        f"\ndurable chaos: {settings.runs} runs of {STEPS} steps (a {settings.sleep_ms} ms sleep "
        f"after step {SLEEP_AFTER}), {settings.workers} {kind}s x {settings.concurrency}, "
        f"{settings.work_ms:.0f} ms a body, lease {LEASE_S} s, max_attempts {MAX_ATTEMPTS}, "
        f"seed {settings.seed}, appendfsync always"
    )
    out("")
    out("| metric | count |")
    out("|---|---:|")
    violations = failed(counts)
    for key, label in ROWS:
        mark = " **(violation)**" if key in violations else ""
        out(f"| {label}{mark} | {counts.get(key, 0)} |")
    kinds = Counter(f.kind for f in faults)
    down = [f.end_ms - f.start_ms for f in faults if f.kind == "redis-kill"]
    out("")
    out(
        f"faults: worker SIGKILL {kinds['worker-kill']}, Redis SIGKILL + AOF restart "
        f"{kinds['redis-kill']} (down {statistics.mean(down) if down else 0:.0f} ms), "
        f"worker SIGSTOP {kinds['worker-stop']}, Redis SIGSTOP {kinds['redis-stop']}; "
        f"worker exits not caused by a kill: {workers.crashes}"
    )
    out(f"wall time: {elapsed_s:.1f} s; drained: {'yes' if counts['drained'] else 'no'}")
    lines = workers.unexpected_errors()
    out(f"worker stderr lines other than the planned failures: {len(lines)}")
    for line in lines[:5]:
        out(f"  {line}")
    for note in notes[:50]:
        out(note)
    out("violations: " + (", ".join(violations) if violations else "none"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    worker = sub.add_parser("worker", help="internal: one worker process")
    worker.add_argument("--log", required=True)
    worker.add_argument("--port", type=int, required=True)
    worker.add_argument("--marks", required=True)
    worker.add_argument("--seed", type=int, required=True)
    worker.add_argument("--concurrency", type=int, default=4)
    worker.add_argument("--work-ms", type=float, default=50)
    worker.add_argument("--front-end", choices=("sync", "async"), default="sync")
    rerun = "a check of the check: re-run the first step's body at the end (must be reported)"
    worker.add_argument("--rerun-committed", action="store_true", help=rerun)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=4, help="worker processes")
    parser.add_argument("--concurrency", type=int, default=4, help="handler threads of each")
    parser.add_argument(
        "--kill-every", type=float, default=3.0, help="s between worker SIGKILLs (0: none)"
    )
    parser.add_argument(
        "--redis-restarts",
        type=int,
        choices=(0, 1),
        default=1,
        help="Redis SIGKILLed and restarted from its AOF once half the runs have finished",
    )
    parser.add_argument("--work-ms", type=float, default=50.0, help="how long a body works")
    parser.add_argument(
        "--sleep-ms", type=int, default=100, help=f"a ctx.sleep after step {SLEEP_AFTER} (0: none)"
    )
    parser.add_argument("--seed", type=int, default=39)
    parser.add_argument(
        "--front-end",
        choices=("sync", "async"),
        default="sync",
        help="the workers: Worker on a Queue, or AsyncWorker on an AsyncQueue",
    )
    parser.add_argument(
        "--max-duration-s", type=float, default=300.0, help="bound of the whole run, drain included"
    )
    parser.add_argument(
        "--stop-every",
        type=float,
        default=0.0,
        help="s between SIGSTOPs of a worker for --stop-for s, then SIGCONT (0: none)",
    )
    parser.add_argument("--stop-for", type=float, default=LEASE_S * 2 + 1)
    parser.add_argument("--rerun-committed", action="store_true", help=rerun)
    parser.add_argument(
        "--redis-stop-s",
        dest="stop_s",
        type=float,
        default=0.0,
        help="SIGSTOP Redis this long once a third of the runs have finished (0: never)",
    )
    args = parser.parse_args()
    if args.command == "worker":
        worker_main(args)
        return 0
    logging.basicConfig(level=logging.INFO, format="durable-chaos: %(message)s", stream=sys.stderr)
    counts = run(args, lambda line: print(line, flush=True))
    return 1 if failed(counts) else 0


if __name__ == "__main__":
    sys.exit(main())
