#!/usr/bin/env python
"""Chaos soak of events, batches and dependencies while workers and event followers are killed.

It starts its own Redis (``dueq.server.RedisServer`` via soak.py's ``Deployment``: loopback, free
ports, ``appendonly yes``, ``appendfsync always``) and never touches any other server. The queue
keeps outcome events (``configure(events=...)``) and finished tasks (``keep_results``, so every
task's final state can be read back afterwards). A producer thread schedules the plan in small
``schedule_many`` calls spread over ``--spread-s``:

- plain tasks (0.5 % poison: always raise, end dead; 5 % flaky: attempt 1 raises);
- chains of three (``c0 <- c1 <- c2``, ``after=``), a quarter with a poison head;
- fan-ins (three parents, one child with ``after=`` all three), some with a poison parent;
- tasks that expire before they are due (``expires=`` shorter than ``delay=``), some a parent;
- far-future tasks the producer cancels (``q.cancel``) a call later, some a parent.

Every task is a member of one of several batches (each batch added in many ``schedule_many``
calls); when the producer is done it closes each batch with a completion task whose id is
``done:<batch>``. One small batch is scheduled first and closed when its members have ended,
so ``close_batch`` itself schedules that completion.

Worker processes (``dueq.Worker``) log ``S id attempt claimed_ms`` when a run starts and
``E id attempt ok|fail`` when it ends (line-buffered: one write(2) per line, kept through a
SIGKILL). Two event groups follow in processes of their own: ``audit`` (one member) and
``billing`` (two members). A follower writes ``V event_id task_id kind attempt at_ms`` to its
log, then acks the event. Workers and followers are SIGKILLed at random and restarted at once
(a follower under the same consumer name, so it resumes its unacked events); one billing member
is SIGKILLed for good while it holds unacked events, which ``redeliver_after`` moves to the
other member. Once the batches are closed, the worker running a completion task (which works
1.5 s) is SIGKILLed once, so completions are re-run as attempt 2. Redis kills (SIGKILL +
restart from the AOF) are optional (``--redis-kills``).

When every task has ended and both groups have caught up (bounded waits), it judges:

- lost events: a stream entry, or a task's final outcome (its state read back: done, dead,
  cancelled, expired), that a group never saw. Must be 0 for each group. Duplicates (an event
  seen twice in a group) are counted; one is explained when the earlier sighting's follower
  was SIGKILLed (logged, not yet acked) or was the member killed for good.
- completions: per batch, the completion task was scheduled once (at most one attempt-1 start
  and exactly one ``acked`` event for ``done:<batch>``, on the stream and in each group), it
  was claimed after every member's ending event, and the batch's counts (``q.batch``) equal
  its members' final states, with nothing pending.
- dependencies: no child's run was claimed before every parent's ``acked`` event (queue clock
  on both sides); a child with a parent that did not end done ended dead (``ParentFailed``)
  and never ran.

It prints one Markdown table; the exit code is 1 on any violation.

    .venv/bin/python scripts/chaos/features.py --quick     # ~40 s: 645 tasks, 11 kills
    .venv/bin/python scripts/chaos/features.py             # ~3.5 min: 4,052 tasks, 51 kills
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import redis
import tenacity

import dueq
from dueq._util.outage import is_outage

sys.path.insert(0, str(Path(__file__).parent))
from soak import Deployment, connect  # a sibling script (scripts/chaos is on sys.path)

QUEUE = "features"
MAX_ATTEMPTS = 3
LEASE_S = 3.0
REDELIVER_S = 4.0
POISON_FRACTION = 0.005
FLAKY_FRACTION = 0.05
GROUPS = {"audit": ["audit-1"], "billing": ["billing-1", "billing-2"]}
#: The member killed for good (not restarted): its unacked events must reach the other one.
GONE_MEMBER = "billing-2"
#: How long a completion task's handler works (the other tasks: ``--work-ms``).
COMPLETION_WORK_S = 1.5
START_S = 120  # how long the first workers and followers may take to serve (an upper bound)

log = logging.getLogger("features")


def make_queue(client: redis.Redis) -> dueq.Queue:
    retry = dueq.RetryPolicy(
        max_attempts=MAX_ATTEMPTS, wait=tenacity.wait_exponential_jitter(multiplier=0.2, max=1)
    )
    return dueq.Queue(QUEUE, client, retry=retry, lease=LEASE_S)


# -- the worker and follower processes --------------------------------------------------------


def worker_main(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.ERROR, format=f"worker {os.getpid()}: %(message)s")
    q = make_queue(connect(args.port, []))
    out = open(args.log, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 (lives until SIGKILL)
    lock = threading.Lock()

    def write(line: str) -> None:
        with lock:
            out.write(line)

    def handle(d: dueq.Delivery) -> dict[str, str]:
        write(f"S {d.id} {d.attempt} {d.claimed_ms}\n")
        kind = d.payload["kind"]
        if kind == "poison" or (kind == "flaky" and d.attempt == 1):
            write(f"E {d.id} {d.attempt} fail\n")
            raise RuntimeError(f"{kind} task fails on purpose")
        # a completion works longer, so that a planned kill can land in the middle of it
        time.sleep(COMPLETION_WORK_S if "completes" in d.payload else args.work_ms / 1000)
        write(f"E {d.id} {d.attempt} ok\n")
        return {"ran": d.id}

    dueq.Worker(q, handle, concurrency=args.concurrency, grace=3.0, heartbeat=1.0).run()


def follower_main(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.ERROR, format=f"follower {os.getpid()}: %(message)s")
    q = make_queue(connect(args.port, []))
    out = open(args.log, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 (lives until SIGKILL)
    stop = threading.Event()
    since = datetime.fromtimestamp(args.since_ms / 1000, tz=timezone.utc)

    def on_event(ev: dueq.Event) -> None:
        at_ms = round(ev.at.timestamp() * 1000)
        out.write(f"V {ev.id} {ev.task_id} {ev.kind} {ev.attempt} {at_ms}\n")
        time.sleep(args.work_ms / 1000)  # the work: a kill lands between the log and the ack
        while args.hold_file and os.path.exists(args.hold_file):
            time.sleep(0.02)  # told to hold what it has (until it is killed for good)
        ev.ack()

    def on_error(exc: Exception) -> None:
        print(f"follower {args.consumer}: the events ended with {exc!r}", file=sys.stderr)
        stop.set()

    events = q.events(
        group=args.group, consumer=args.consumer, redeliver_after=REDELIVER_S, since=since
    )
    subscription = events.subscribe(on_next=on_event, on_error=on_error)
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    subscription.dispose()


# -- settings and the plan --------------------------------------------------------------------


@dataclasses.dataclass
class Settings:
    units: int
    batches: int
    workers: int
    concurrency: int
    spread_s: float
    worker_kills: int
    follower_kills: int
    redis_kills: int
    drain_s: float
    seed: int
    work_ms: float = 100.0
    follower_work_ms: float = 3.0
    chunk: int = 25


def settings_from(args: argparse.Namespace) -> Settings:
    base = Settings(
        units=400 if args.quick else 2_500,
        batches=4 if args.quick else 8,
        workers=3,
        concurrency=8,
        spread_s=30 if args.quick else 180,
        worker_kills=6 if args.quick else 30,
        follower_kills=4 if args.quick else 20,
        redis_kills=0,
        drain_s=90 if args.quick else 180,
        seed=args.seed,
    )
    for name in ("units", "spread_s", "worker_kills", "follower_kills", "redis_kills", "workers"):
        value = getattr(args, name)
        if value is not None:
            setattr(base, name, value)
    return base


@dataclasses.dataclass
class Planned:
    id: str
    kind: str  # ok, flaky, poison, expire, cancel
    batch: str
    after: tuple[str, ...] = ()

    def task(self) -> dueq.Task:
        payload = {"kind": self.kind}
        if self.kind == "cancel":
            return dueq.Task(payload, id=self.id, delay=3600, batch=self.batch, after=self.after)
        if self.kind == "expire":
            return dueq.Task(payload, id=self.id, delay=1.5, expires=0.5, batch=self.batch)
        return dueq.Task(payload, id=self.id, batch=self.batch, after=self.after)


FIRST_BATCH = "first"


def plan_units(settings: Settings, rng: random.Random) -> list[list[Planned]]:
    """Units of tasks, parents before their children; each unit goes into one call."""

    def kind() -> str:
        roll = rng.random()
        return "poison" if roll < POISON_FRACTION else "flaky" if roll < FLAKY_FRACTION else "ok"

    units: list[list[Planned]] = []
    # the first batch: ten plain tasks in two calls, closed once they have all ended
    for call in range(2):
        units.append([Planned(f"f{call}-{i}", "ok", FIRST_BATCH) for i in range(5)])
    for n in range(settings.units):
        batch = f"b{n % settings.batches}"
        roll = rng.random()
        if roll < 0.15:  # a chain of three; a quarter start with a poison head
            head = "poison" if rng.random() < 0.25 else kind()
            ids = [f"c{n}-{i}" for i in range(3)]
            units.append(
                [
                    Planned(ids[0], head, batch),
                    Planned(ids[1], kind(), batch, (ids[0],)),
                    Planned(ids[2], kind(), batch, (ids[1],)),
                ]
            )
        elif roll < 0.27:  # a fan-in: one child of three parents, some of them failing
            parents = [f"p{n}-{i}" for i in range(3)]
            kinds = [kind() for _ in parents]
            bad = rng.random()
            if bad < 0.2:
                kinds[rng.randrange(3)] = "poison"
            elif bad < 0.3:
                kinds[rng.randrange(3)] = "cancel"
            elif bad < 0.4:
                kinds[rng.randrange(3)] = "expire"
            unit = [Planned(p, k, batch) for p, k in zip(parents, kinds, strict=True)]
            unit.append(Planned(f"p{n}-child", kind(), batch, tuple(parents)))
            units.append(unit)
        elif roll < 0.30:
            units.append([Planned(f"x{n}", "expire", batch)])
        elif roll < 0.33:
            units.append([Planned(f"k{n}", "cancel", batch)])
        else:
            units.append([Planned(f"t{n}", kind(), batch)])
    return units


# -- processes --------------------------------------------------------------------------------


class Processes:
    """Worker slots and follower members; a killed one is restarted with a new log."""

    def __init__(self, settings: Settings, port: int, folder: Path, since_ms: int) -> None:
        self.settings = settings
        self.port = port
        self.folder = folder
        self.since_ms = since_ms
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}
        self.all_logs: dict[Path, str] = {}  # log -> process name
        self.killed_logs: set[Path] = set()
        self.gone: set[str] = set()
        self.generation = 0
        self.crashes = 0
        self.lock = threading.Lock()  # the completion killer thread kills, the main one restarts

    @property
    def hold_file(self) -> Path:
        """While it exists, the member that goes for good logs its events but acks none."""
        return self.folder / f"{GONE_MEMBER}.hold"

    def spawn(self, name: str) -> None:
        self.generation += 1
        path = self.folder / f"{name}-{self.generation}.log"
        common = ["--log", str(path), "--port", str(self.port)]
        if name.startswith("w"):
            command = ["worker", *common, "--concurrency", str(self.settings.concurrency)]
            command += ["--work-ms", str(self.settings.work_ms)]
        else:
            group = next(g for g, names in GROUPS.items() if name in names)
            command = ["follow", *common, "--group", group, "--consumer", name]
            command += ["--since-ms", str(self.since_ms)]
            command += ["--work-ms", str(self.settings.follower_work_ms)]
            if name == GONE_MEMBER:
                command += ["--hold-file", str(self.hold_file)]
        with open(path.with_suffix(".err"), "wb") as errors:  # the child keeps its own copy
            self.procs[name] = subprocess.Popen(
                [sys.executable, __file__, *command], stdin=subprocess.DEVNULL, stderr=errors
            )
        self.logs[name] = path
        self.all_logs[path] = name

    def start(self) -> None:
        for slot in range(self.settings.workers):
            self.spawn(f"w{slot}")
        for names in GROUPS.values():
            for name in names:
                self.spawn(name)

    def wait_serving(self, q: dueq.Queue, client: redis.Redis) -> None:
        """Until every worker is in the queue's registry and every follower has joined its
        group (bounded by ``START_S``): on a loaded machine starting a process took seconds, and
        a kill planned at 0.55 of the spread once asked for the pending events of a group no
        follower had created yet (NOGROUP), which ended the run without its table."""
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            self.restart_crashed()
            workers = len(q.workers())
            try:
                joined = {
                    c["name"].decode()
                    for g in GROUPS
                    for c in client.xinfo_consumers(q.keys.events, g)
                }
            except redis.ResponseError:  # NOGROUP: no follower of a group has started yet
                joined = set()
            if workers >= self.settings.workers and joined >= set(self.followers()):
                return
            time.sleep(0.1)
        raise RuntimeError(f"the workers and followers were not all serving after {START_S} s")

    def kill(self, name: str, restart: bool = True) -> None:
        with self.lock:
            self._kill(name, restart)

    def _kill(self, name: str, restart: bool) -> None:
        proc = self.procs[name]
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.killed_logs.add(self.logs[name])
        if restart:
            self.spawn(name)
        else:
            self.gone.add(name)
            del self.procs[name]

    def workers(self) -> list[str]:
        return [n for n in self.procs if n.startswith("w")]

    def followers(self) -> list[str]:
        return [n for n in self.procs if not n.startswith("w")]

    def running_completion(self) -> str | None:
        """The worker whose current log has a completion run started and not ended."""
        for name in self.workers():
            path = self.logs[name]
            if not path.exists():
                continue
            lines = path.read_text(encoding="utf-8").splitlines()
            started = {tuple(x.split()[1:3]) for x in lines if x.startswith("S done:")}
            ended = {tuple(x.split()[1:3]) for x in lines if x.startswith("E done:")}
            if started - ended:
                return name
        return None

    def restart_crashed(self) -> None:
        with self.lock:
            self._restart_crashed()

    def _restart_crashed(self) -> None:
        for name, proc in list(self.procs.items()):
            if proc.poll() is not None:
                log.error("%s exited by itself with %s; restarting", name, proc.returncode)
                self.crashes += 1
                self.spawn(name)

    def stderr_lines(self) -> list[str]:
        lines = []
        for path in self.all_logs:
            errors = path.with_suffix(".err")
            if errors.exists():
                text = errors.read_text(encoding="utf-8", errors="replace")
                lines += [x for x in text.splitlines() if x and "on purpose" not in x]
        return lines

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# -- the producer -----------------------------------------------------------------------------


def retrying(call: Callable[[], Any], deadline: float) -> Any:
    """``call`` again while Redis is down (a Redis kill), up to ``deadline`` (monotonic)."""
    while True:
        try:
            return call()
        except Exception as exc:  # an outage is retried (the calls are idempotent); else fatal
            if not is_outage(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class Producer(threading.Thread):
    def __init__(self, q: dueq.Queue, units: list[list[Planned]], settings: Settings) -> None:
        super().__init__(name="producer", daemon=True)
        self.q = q
        self.units = units
        self.settings = settings
        self.calls: Counter[str] = Counter()  # schedule_many calls per batch
        self.cancelled: set[str] = set()
        self.error: BaseException | None = None
        self.done = threading.Event()

    def run(self) -> None:
        try:
            self._produce()
        except BaseException as exc:  # reported by the judge as a violation
            self.error = exc
            log.exception("the producer failed")
        finally:
            self.done.set()

    def _produce(self) -> None:
        """One call per chunk of units (the first batch's two units first, in calls of their
        own); a unit is never split over two calls (parents before children). The far-future
        tasks of a call are cancelled after the next call."""
        deadline = time.monotonic() + self.settings.spread_s + 60
        chunk = self.settings.chunk
        calls = [self.units[0], self.units[1]]
        for start in range(2, len(self.units), chunk):
            calls.append([p for unit in self.units[start : start + chunk] for p in unit])
        pause_s = self.settings.spread_s / len(calls)
        to_cancel: list[str] = []
        for tasks in calls:
            retrying(lambda t=tasks: self.q.schedule_many([p.task() for p in t]), deadline)
            for batch in {p.batch for p in tasks}:
                self.calls[batch] += 1
            self._cancel(to_cancel, deadline)
            to_cancel = [p.id for p in tasks if p.kind == "cancel"]
            time.sleep(pause_s)
        self._cancel(to_cancel, deadline)

    def _cancel(self, task_ids: list[str], deadline: float) -> None:
        for task_id in task_ids:
            if retrying(lambda i=task_id: self.q.cancel(i), deadline):
                self.cancelled.add(task_id)


# -- one run ----------------------------------------------------------------------------------


def kill_plan(settings: Settings, rng: random.Random) -> list[tuple[float, str]]:
    plan = [(rng.uniform(0.05, 0.95), "worker") for _ in range(settings.worker_kills)]
    plan += [(rng.uniform(0.05, 0.95), "follower") for _ in range(settings.follower_kills)]
    plan += [((i + 1) / (settings.redis_kills + 1), "redis") for i in range(settings.redis_kills)]
    plan.append((0.55, "gone"))
    return [(at * settings.spread_s, kind) for at, kind in sorted(plan)]


def kill_gone_member(client: redis.Redis, procs: Processes, stream: str) -> list[str]:
    """SIGKILL the member that stays gone while it holds unacked events: it is told to hold
    what it reads (its hold file), and killed once it holds one (waits up to 60 s); returns the
    ids of the events it held."""
    procs.hold_file.touch()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if client.xpending_range(stream, "billing", "-", "+", 1, consumername=GONE_MEMBER):
            break
        time.sleep(0.02)
    procs.kill(GONE_MEMBER, restart=False)
    procs.hold_file.unlink()
    held = client.xpending_range(stream, "billing", "-", "+", 1000, consumername=GONE_MEMBER)
    return [entry["message_id"].decode() for entry in held]


class CompletionKiller(threading.Thread):
    """SIGKILLs, once, the worker running a batch's completion task (restarted at once), so
    that the completion's lease expires mid-run and it is delivered again."""

    def __init__(self, procs: Processes, deadline: float) -> None:
        super().__init__(name="completion-killer", daemon=True)
        self.procs = procs
        self.deadline = deadline
        self.stop = threading.Event()
        self.killed = False

    def run(self) -> None:
        while not self.stop.is_set() and time.monotonic() < self.deadline:
            name = self.procs.running_completion()
            if name is not None:
                self.procs.kill(name)
                self.killed = True
                return
            self.stop.wait(0.1)


def wait_settled(
    q: dueq.Queue, client: redis.Redis, procs: Processes, batches: list[str], deadline: float
) -> bool:
    """Until nothing is scheduled, leased or waiting, every batch is complete, and each group
    has read the whole stream and acked it (bounded)."""
    while time.monotonic() < deadline:
        procs.restart_crashed()
        try:
            stats = q.stats()
            infos = [q.batch(b) for b in batches]
            groups = client.xinfo_groups(q.keys.events)
            last = client.xinfo_stream(q.keys.events)["last-generated-id"]
        except Exception as exc:  # a Redis kill: ask again
            if not is_outage(exc):
                raise
        else:
            quiet = (stats.scheduled, stats.leased, stats.waiting) == (0, 0, 0)
            complete = all(i is not None and i.complete for i in infos)
            caught_up = len(groups) == len(GROUPS) and all(
                g["pending"] == 0 and g["last-delivered-id"] == last for g in groups
            )
            if quiet and complete and caught_up:
                return True
        time.sleep(0.5)
    return False


def run(settings: Settings, out: Callable[[str], None]) -> dict[str, int]:
    rng = random.Random(settings.seed)
    folder = Path(tempfile.mkdtemp(prefix="dueq-features-"))
    deployment = Deployment(failover=False)
    deployment.start()
    try:
        client = deployment.client()
        q = make_queue(client)
        q.configure(events=timedelta(hours=1), keep_results=timedelta(hours=1))
        units = plan_units(settings, rng)
        batches = sorted({p.batch for unit in units for p in unit})
        started = time.monotonic()
        since_ms = int(client.time()[0]) * 1000 - 1000
        procs = Processes(settings, deployment.single().port, folder, since_ms)
        procs.start()
        procs.wait_serving(q, client)
        planned_from = time.monotonic()  # the kill plan's times count from here
        producer = Producer(q, units, settings)
        producer.start()
        kills: Counter[str] = Counter()
        gone_held: list[str] = []
        for at_s, kind in kill_plan(settings, rng):
            while time.monotonic() < planned_from + at_s:
                time.sleep(0.2)
                procs.restart_crashed()
            if kind == "worker":
                procs.kill(rng.choice(procs.workers()))
            elif kind == "follower":
                procs.kill(rng.choice(procs.followers()))
            elif kind == "gone":
                gone_held = kill_gone_member(client, procs, q.keys.events)
            else:
                deployment.kill_and_restart()
            kills[kind] += 1
        producer.done.wait(settings.spread_s + 120)
        deadline = time.monotonic() + settings.drain_s
        killer = CompletionKiller(procs, deadline)
        killer.start()
        closed_first = close_batches(q, batches, producer, deadline)
        settled = wait_settled(q, client, procs, batches, deadline)
        killer.stop.set()
        killer.join()
        if killer.killed:
            kills["mid-completion"] += 1
        procs.stop()
        elapsed_s = time.monotonic() - started
        counts, notes = judge(q, client, units, producer, procs, batches, gone_held)
        counts["settled"] = int(settled)
        counts["first batch closed after all its members ended"] = int(closed_first)
        print_table(settings, counts, kills, producer, procs, elapsed_s, notes, out)
        client.close()
        return counts
    finally:
        deployment.stop()
        shutil.rmtree(folder, ignore_errors=True)


def close_batches(q: dueq.Queue, batches: list[str], producer: Producer, deadline: float) -> bool:
    """Close the first batch once all its members ended (so close_batch schedules its
    completion), and every other batch now. Returns whether the first one had ended."""
    for batch in batches:
        if batch == FIRST_BATCH:
            continue
        done = dueq.Task({"kind": "ok", "completes": batch}, id=f"done:{batch}")
        retrying(lambda b=batch, t=done: q.close_batch(b, on_complete=t), deadline)
    ended = False
    while time.monotonic() < deadline:
        info = retrying(lambda: q.batch(FIRST_BATCH), deadline)
        if info is not None and info.pending == 0:
            ended = True
            break
        time.sleep(0.2)
    done = dueq.Task({"kind": "ok", "completes": FIRST_BATCH}, id=f"done:{FIRST_BATCH}")
    retrying(lambda: q.close_batch(FIRST_BATCH, on_complete=done), deadline)
    return ended


# -- judging ----------------------------------------------------------------------------------


@dataclasses.dataclass
class Start:
    id: str
    attempt: int
    claimed_ms: int
    log: Path


@dataclasses.dataclass
class Seen:
    event_id: str
    task_id: str
    kind: str
    attempt: int
    at_ms: int
    log: Path


def read_logs(
    procs: Processes,
) -> tuple[dict[str, list[Start]], Counter[str], Counter[str], dict[str, list[Seen]]]:
    """Worker starts per task, ends and ok ends per task, and event sightings per group."""
    starts: dict[str, list[Start]] = defaultdict(list)
    ends: Counter[str] = Counter()
    oks: Counter[str] = Counter()
    seen: dict[str, list[Seen]] = defaultdict(list)
    for path, name in procs.all_logs.items():
        if not path.exists():
            continue
        group = next((g for g, names in GROUPS.items() if name in names), None)
        for line in path.read_text(encoding="utf-8").splitlines():
            parts = line.split()
            if len(parts) == 4 and parts[0] == "S":
                starts[parts[1]].append(Start(parts[1], int(parts[2]), int(parts[3]), path))
            elif len(parts) == 4 and parts[0] == "E":
                ends[parts[1]] += 1
                oks[parts[1]] += parts[3] == "ok"
            elif len(parts) == 6 and parts[0] == "V" and group is not None:
                _, event_id, task_id, kind, attempt, at_ms = parts
                seen[group].append(Seen(event_id, task_id, kind, int(attempt), int(at_ms), path))
            # anything else is a line cut by a SIGKILL
    return starts, ends, oks, seen


OUTCOME = {"done": "acked", "dead": "dead", "cancelled": "cancelled", "expired": "expired"}


def judge(
    q: dueq.Queue,
    client: redis.Redis,
    units: list[list[Planned]],
    producer: Producer,
    procs: Processes,
    batches: list[str],
    gone_held: list[str],
) -> tuple[dict[str, int], list[str]]:
    counts: Counter[str] = Counter()
    notes: list[str] = []
    planned = {p.id: p for unit in units for p in unit}
    completions = [f"done:{b}" for b in batches]
    infos = {i.id: i for i in q.get_many([*planned, *completions])}
    starts, ends, oks, seen = read_logs(procs)
    stream = [(eid.decode(), fields) for eid, fields in client.xrange(q.keys.events)]
    stream_ids = {eid for eid, _ in stream}
    counts["tasks"] = len(planned)
    counts["events on the stream"] = len(stream)
    for kind, n in sorted(Counter(f.get(b"kind", b"?").decode() for _, f in stream).items()):
        counts[f"  {kind}"] = n
    counts["producer failed"] = int(producer.error is not None)
    counts["not ended"] = sum(
        1 for i in planned if infos.get(i) is None or infos[i].state not in OUTCOME
    )
    for state in OUTCOME:
        counts[f"ended {state}"] = sum(1 for i in planned if i in infos and infos[i].state == state)

    # events: every stream entry and every final outcome seen by each group
    acked_at: dict[str, int] = {}
    ended_at: dict[str, int] = {}
    for group in GROUPS:
        sightings = seen[group]
        by_event: dict[str, list[Seen]] = defaultdict(list)
        for s in sightings:
            by_event[s.event_id].append(s)
            if s.kind == "acked":
                acked_at[s.task_id] = s.at_ms
            if s.kind != "retried":
                ended_at[s.task_id] = s.at_ms
        counts[f"{group}: events seen"] = len(sightings)
        counts[f"{group}: distinct events"] = len(by_event)
        counts[f"{group}: lost stream entries"] = len(stream_ids - by_event.keys())
        kinds = {(s.task_id, s.kind) for s in sightings}
        lost = [
            i
            for i, info in infos.items()
            if info.state in OUTCOME and (i, OUTCOME[info.state]) not in kinds
        ]
        counts[f"{group}: lost outcomes"] = len(lost)
        if lost:
            notes.append(f"{group} never saw the outcome of {sorted(lost)[:5]}")
        for found in by_event.values():
            for earlier in found[:-1]:
                counts[f"{group}: duplicates"] += 1
                if earlier.log in procs.killed_logs:
                    counts[f"{group}: duplicates explained by a follower kill"] += 1
                else:
                    counts[f"{group}: duplicates unexplained"] += 1
        for member in GROUPS[group]:
            member_logs = [p for p, n in procs.all_logs.items() if n == member]
            counts[f"{member}: events"] = sum(1 for s in sightings if s.log in member_logs)

    # the member killed for good: what it held unacked went to the other member
    others = {p for p, n in procs.all_logs.items() if n in GROUPS["billing"] and n != GONE_MEMBER}
    taken_over = {s.event_id for s in seen["billing"] if s.log in others}
    counts["member killed for good: unacked events it held"] = len(gone_held)
    counts["  of which the other member saw"] = len(taken_over & set(gone_held))
    counts["events held by the gone member never seen by the other"] = len(
        set(gone_held) - taken_over
    )

    # completions and batches
    stream_acked = Counter(
        fields[b"id"].decode()
        for _, fields in stream
        if fields.get(b"kind") == b"acked" and b"id" in fields
    )
    for batch, done_id in zip(batches, completions, strict=True):
        members = [p.id for p in planned.values() if p.batch == batch]
        runs = starts.get(done_id, [])
        firsts = sum(1 for s in runs if s.attempt == 1)
        counts["completion runs"] += len(runs)
        counts["completion runs that returned"] += oks[done_id]
        counts["completion runs as attempt 1 (one per batch at most)"] += firsts
        if firsts > 1 or stream_acked[done_id] != 1:
            counts["completion scheduled more or less than once"] += 1
            notes.append(f"{done_id}: {firsts} first runs, {stream_acked[done_id]} acked events")
        for group in GROUPS:
            acked_events = {
                s.event_id for s in seen[group] if s.task_id == done_id and s.kind == "acked"
            }
            if len(acked_events) != 1:
                counts["completion acked events per group not 1"] += 1
        last_end = max((ended_at.get(m, 0) for m in members), default=0)
        if any(s.claimed_ms < last_end for s in runs):
            counts["completion before a member ended"] += 1
            notes.append(f"{done_id} claimed before its last member ended at {last_end}")
        info = q.batch(batch)
        states = Counter(infos[m].state if m in infos else "missing" for m in members)
        expected = (
            len(members),
            states["done"],
            states["dead"],
            states["cancelled"],
            states["expired"],
            0,
            True,
        )
        got = (
            None
            if info is None
            else (
                info.total,
                info.acked,
                info.dead,
                info.cancelled,
                info.expired,
                info.pending,
                info.complete,
            )
        )
        if got != expected:
            counts["batch counts wrong"] += 1
            notes.append(f"batch {batch}: BatchInfo {got}, members' states {expected}")
        counts["batches complete"] += int(info is not None and info.complete)
        counts["schedule_many calls per batch (fewest)"] = min(
            counts.get("schedule_many calls per batch (fewest)", 10**9), producer.calls[batch]
        )

    # dependencies
    for p in planned.values():
        if not p.after:
            continue
        counts["children"] += 1
        parent_states = [infos[a].state if a in infos else "missing" for a in p.after]
        runs = starts.get(p.id, [])
        if all(s == "done" for s in parent_states):
            release_ms = max(acked_at.get(a, 10**15) for a in p.after)
            early = [s for s in runs if s.claimed_ms < release_ms]
            if early:
                counts["child ran before its parents were acked"] += 1
                notes.append(f"{p.id} claimed at {early[0].claimed_ms}, parents acked {release_ms}")
        else:
            counts["children of a failed parent"] += 1
            info = infos.get(p.id)
            buried = (
                info is not None
                and info.state == "dead"
                and bool(info.errors)
                and info.errors[-1].type == "ParentFailed"
            )
            if not buried:
                counts["failed parent's child not dead (ParentFailed)"] += 1
                notes.append(f"{p.id}: parents {parent_states}, child {info and info.state}")
            if runs:
                counts["failed parent's child ran"] += 1
    counts["cancelled by the producer"] = len(producer.cancelled)
    counts["handler runs"] = sum(len(r) for r in starts.values())
    counts["  runs cut by a worker kill (no end line)"] = sum(
        len(r) for r in starts.values()
    ) - sum(ends.values())
    return dict(counts), notes


VIOLATIONS = (
    "events held by the gone member never seen by the other",
    "producer failed",
    "not ended",
    "audit: lost stream entries",
    "audit: lost outcomes",
    "billing: lost stream entries",
    "billing: lost outcomes",
    "completion scheduled more or less than once",
    "completion acked events per group not 1",
    "completion before a member ended",
    "batch counts wrong",
    "child ran before its parents were acked",
    "failed parent's child not dead (ParentFailed)",
    "failed parent's child ran",
)


def failed(counts: dict[str, int]) -> bool:
    return any(counts.get(k, 0) for k in VIOLATIONS) or not counts.get("settled")


def print_table(
    settings: Settings,
    counts: dict[str, int],
    kills: Counter[str],
    producer: Producer,
    procs: Processes,
    elapsed_s: float,
    notes: list[str],
    out: Callable[[str], None],
) -> None:
    out(
        f"\nfeatures soak: {counts['tasks']} tasks ({settings.units} units) in "
        f"{len(producer.calls)} batches over {settings.spread_s:.0f} s, {settings.workers} "
        f"workers x {settings.concurrency}, max_attempts {MAX_ATTEMPTS}, lease {LEASE_S:.0f} s, "
        f"redeliver_after {REDELIVER_S:.0f} s, seed {settings.seed}, {elapsed_s:.0f} s"
    )
    out("")
    out("| metric | count |")
    out("|---|---:|")
    for key, value in counts.items():
        mark = " **(violation)**" if key in VIOLATIONS and value else ""
        out(f"| {key}{mark} | {value} |")
    out("")
    out(
        f"kills: worker SIGKILL {kills['worker']}, follower SIGKILL (restarted under the same "
        f"name) {kills['follower']}, member killed for good {kills['gone']}, Redis SIGKILL + AOF "
        f"restart {kills['redis']}, worker SIGKILL mid-completion {kills['mid-completion']}; "
        f"exits not caused by a kill: {procs.crashes}"
    )
    lines = procs.stderr_lines()
    out(f"process stderr lines other than the planned failures: {len(lines)}")
    for line in lines[:10]:
        out(f"  {line}")
    for note in notes:
        out(note)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    for name in ("worker", "follow"):
        child = sub.add_parser(name, help="internal: one process")
        child.add_argument("--log", required=True)
        child.add_argument("--port", type=int, required=True)
        child.add_argument("--concurrency", type=int, default=8)
        child.add_argument("--work-ms", type=float, default=10)
        child.add_argument("--group")
        child.add_argument("--consumer")
        child.add_argument("--since-ms", type=int, default=0)
        child.add_argument("--hold-file", help="follow: while it exists, log events, never ack")
    parser.add_argument("--quick", action="store_true", help="about 40 seconds")
    parser.add_argument("--units", type=int, help="units planned (a unit: 1 to 4 tasks)")
    parser.add_argument("--spread-s", type=float, help="seconds over which tasks are scheduled")
    parser.add_argument("--workers", type=int)
    parser.add_argument("--worker-kills", type=int)
    parser.add_argument("--follower-kills", type=int)
    parser.add_argument("--redis-kills", type=int, help="SIGKILL + AOF restarts (default 0)")
    parser.add_argument("--seed", type=int, default=30)
    args = parser.parse_args()
    if args.command == "worker":
        worker_main(args)
        return 0
    if args.command == "follow":
        follower_main(args)
        return 0
    logging.basicConfig(level=logging.INFO, format="features: %(message)s", stream=sys.stderr)
    counts = run(settings_from(args), lambda line: print(line, flush=True))
    return 1 if failed(counts) else 0


if __name__ == "__main__":
    sys.exit(main())
