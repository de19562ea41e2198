#!/usr/bin/env python
"""Chaos soak: many tasks through real worker processes while Redis and workers are killed.

It starts its own Redis (``dueq.server.RedisServer``, loopback, free ports, ``appendonly yes``
with ``appendfsync always``) and never touches any other server. A producer thread schedules
the tasks with explicit ids a few seconds before they are due (due times spread over a window;
the payload records the due time), several ``dueq.Worker`` processes run them, and faults are
injected on a fixed, seeded plan:

- single mode (default): random SIGKILLs of worker processes (each restarted at once), Redis
  SIGKILL + restart from its AOF, and a SIGSTOP of Redis for several seconds, then SIGCONT;
- ``--failover``: a primary, two replicas and three Redis Sentinels; the fault is SIGKILL of the
  current primary (Sentinel promotes a replica; the killed server restarts as a replica of the
  new primary). Every client goes through ``redis.sentinel.Sentinel(...).master_for(...)``. It
  runs twice, without and with ``Queue(wait_replicas=1)`` (Redis ``WAIT`` after each change),
  and measures the throughput of ``schedule()`` both ways before the faults start.

The handler appends one line when it starts (``S id attempt start_ms due_ms claimed_ms
payload_due_ms history``) and one when it ends (``E id attempt ok|fail``) to a per-process log,
line-buffered: each line is one write(2), so it survives a SIGKILL of the process. 0.5 % of the
tasks are poison (always raise: they end dead after max_attempts) and 5 % are flaky (attempt 1
raises, so retries happen). On attempts after the first the handler reads the task's error
history (``Queue.get``) into its start line.

Every loop is bounded in count and time; the run stops by itself (``--max-duration``). Then it
waits (bounded) for the queue to drain and prints one table (Markdown). How each row is judged:

- scheduled: schedules that returned normally (acknowledged). A producer retries a failed or
  unconfirmed (``ReplicationTimeout``) batch with the same ids, which is idempotent.
- acked / dead / still queued: acknowledged ids that are gone after a run that returned
  normally / in the dead set / still scheduled or leased.
- lost: acknowledged, but neither acked, dead nor still queued.
- early: a run that began before its due time. By the queue clock (Redis TIME) the claim time
  the claim script returned must be >= the delivery's due time and the payload's due time,
  exactly. The handler's own start time (``time.time()``) is compared too: Redis and the
  handler read the same kernel clock on this machine, and the handler reads it after the claim
  script did, so the only slack is the rounding of the script's whole milliseconds: 1 ms.
- over max_attempts: a task with more runs than ``max_attempts``.
- duplicate: a run that follows a run of the same task that did not fail on purpose (it
  returned, or never ended). It is explained when the earlier run's worker was SIGKILLed, when
  its error history (read by the later run) holds a LeaseExpired record for the earlier attempt,
  or when a Redis fault window (kill until it serves again, stop until continue, failover until
  the new primary serves, each plus lease + outage backoff) lies between the two starts. In
  failover mode the sentinels' logs are read afterwards: a primary switch that no planned kill
  explains is reported as an unplanned failover and counts as a fault window too.

The exit code is 1 when lost, early, over max_attempts or unexplained duplicates are not 0.

    .venv/bin/python scripts/chaos/soak.py                # full: 80,000 tasks, ~12 min
    .venv/bin/python scripts/chaos/soak.py --quick        # ~2 min, fewer tasks and faults
    .venv/bin/python scripts/chaos/soak.py --failover     # Sentinel failovers, WAIT off and on
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import logging
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import redis
import tenacity
from redis.sentinel import Sentinel

import dueq
from dueq._util.outage import is_outage
from dueq._wire.keys import QueueKeys
from dueq.server import RedisServer, SentinelServer, current_primary

QUEUE = "soak"
SERVICE = "dueq"
MAX_ATTEMPTS = 4
LEASE_S = 3.0
POISON_FRACTION = 0.005
FLAKY_FRACTION = 0.05
#: Slack for the handler's own start time against due times (the scripts' whole milliseconds).
CLOCK_TOLERANCE_MS = 1.0
#: A Redis fault explains a duplicate up to this long after Redis serves again: the lease of a
#: delivery whose ack waited through the outage, plus the consumer's longest outage backoff.
FAULT_MARGIN_MS = (LEASE_S + 5.5) * 1000
SOCKET_TIMEOUT_S = 5.0
#: A Sentinel log line announcing a new primary (local time, as Redis logs it).
SWITCH_MASTER = re.compile(
    r"(?P<at>\d+ \w+ \d+ [\d:.]+) # \+switch-master \S+ \S+ (?P<old>\d+) \S+ (?P<new>\d+)"
)

log = logging.getLogger("soak")


def now_ms() -> float:
    return time.time() * 1000


def retry_policy() -> dueq.RetryPolicy:
    return dueq.RetryPolicy(
        max_attempts=MAX_ATTEMPTS, wait=tenacity.wait_exponential_jitter(multiplier=0.5, max=3)
    )


def make_queue(client: redis.Redis, wait_replicas: int, name: str = QUEUE) -> dueq.Queue:
    kwargs: dict[str, Any] = {}
    if wait_replicas:
        kwargs = {"wait_replicas": wait_replicas, "wait_timeout": 1.0}
    return dueq.Queue(name, client, retry=retry_policy(), lease=LEASE_S, **kwargs)


def connect(port: int | None, sentinels: list[tuple[str, int]]) -> redis.Redis:
    """A client of the single server, or of the primary that the sentinels name."""
    timeouts: dict[str, Any] = {
        "socket_timeout": SOCKET_TIMEOUT_S,
        "socket_connect_timeout": 2.0,
    }
    if sentinels:
        return Sentinel(sentinels, **timeouts).master_for(SERVICE, **timeouts)
    return redis.Redis(host="127.0.0.1", port=port, **timeouts)


# -- the worker process ----------------------------------------------------------------------


def worker_main(args: argparse.Namespace) -> None:
    logging.basicConfig(
        level=logging.ERROR, format=f"worker {os.getpid()}: %(levelname)s %(name)s %(message)s"
    )
    sentinels = parse_addresses(args.sentinels)
    q = make_queue(connect(args.port, sentinels), args.wait_replicas)
    out = open(args.log, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 (lives until SIGKILL)
    lock = threading.Lock()
    work_s = args.work_ms / 1000

    def write(line: str) -> None:
        with lock:
            out.write(line)

    def handle(d: dueq.Delivery) -> None:
        start_ms = now_ms()
        history = "-"
        if d.attempt > 1:
            try:
                info = q.get(d.id)
            except Exception:  # Redis is down or failing over: this run's history is unknown
                history = "?"
            else:
                errors = info.errors if info is not None else []
                history = "|".join(f"{e.attempt}:{e.type}" for e in errors) or "none"
        payload = d.payload
        write(
            f"S {d.id} {d.attempt} {start_ms:.3f} {d.due_ms} {d.claimed_ms} "
            f"{payload['due_ms']} {history}\n"
        )
        kind = payload["kind"]
        if kind == "poison" or (kind == "flaky" and d.attempt == 1):
            write(f"E {d.id} {d.attempt} fail\n")
            raise RuntimeError(f"{kind} task fails on purpose")
        time.sleep(work_s)
        write(f"E {d.id} {d.attempt} ok\n")

    dueq.Worker(q, handle, concurrency=args.concurrency, grace=5.0, heartbeat=2.0).run()
    out.close()


def parse_addresses(text: str) -> list[tuple[str, int]]:
    pairs = [item.rsplit(":", 1) for item in text.split(",") if item]
    return [(host, int(port)) for host, port in pairs]


# -- settings --------------------------------------------------------------------------------


@dataclasses.dataclass
class Settings:
    tasks: int
    workers: int
    concurrency: int
    seed: int
    spread_s: float
    worker_kills: int
    redis_kills: int
    stop_s: float
    drain_s: float
    max_duration_s: float
    failover: bool
    primary_kills: int
    wait_replicas: int
    batch: int
    work_ms: float
    ahead_s: float = 3.0
    bench_rounds: int = 8
    keep_logs: str = ""
    failover_timeout_ms: int = 10_000
    down_after_ms: int = 5_000


def settings_from(args: argparse.Namespace, wait_replicas: int = 0) -> Settings:
    if args.failover:
        base = Settings(
            tasks=3_000 if args.quick else 15_000,
            workers=3,
            concurrency=8,
            seed=args.seed,
            spread_s=40 if args.quick else 120,
            worker_kills=0,
            redis_kills=0,
            stop_s=0,
            drain_s=60 if args.quick else 120,
            max_duration_s=150 if args.quick else 360,
            failover=True,
            primary_kills=1 if args.quick else 3,
            wait_replicas=wait_replicas,
            batch=50,
            work_ms=20,
            bench_rounds=3 if args.quick else 8,
        )
    else:
        base = Settings(
            tasks=6_000 if args.quick else 80_000,
            workers=4,
            concurrency=8,
            seed=args.seed,
            spread_s=50 if args.quick else 420,
            worker_kills=4 if args.quick else 20,
            redis_kills=1 if args.quick else 2,
            stop_s=5 if args.quick else 9,
            drain_s=60 if args.quick else 200,
            max_duration_s=150 if args.quick else 720,
            failover=False,
            primary_kills=0,
            wait_replicas=0,
            batch=200,
            work_ms=20,
        )
    names = (
        "tasks",
        "workers",
        "spread_s",
        "max_duration_s",
        "worker_kills",
        "failover_timeout_ms",
        "down_after_ms",
        "keep_logs",
    )
    for name in names:
        value = getattr(args, name)
        if value is not None:
            setattr(base, name, value)
    return base


# -- the deployment: one server, or a primary with replicas and sentinels ----------------------


class Deployment:
    """The Redis processes of one run and the faults that can be done to them."""

    def __init__(
        self, failover: bool, failover_timeout_ms: int = 10_000, down_after_ms: int = 5_000
    ) -> None:
        self.failover = failover
        self.failover_timeout_ms = failover_timeout_ms
        self.down_after_ms = down_after_ms
        self.servers: dict[int, RedisServer] = {}
        self.sentinels: list[SentinelServer] = []

    def start(self) -> None:
        primary = RedisServer(appendonly=True).start()
        self.servers[primary.port] = primary
        if not self.failover:
            return
        for _ in range(2):
            replica = RedisServer(appendonly=True, replica_of=("127.0.0.1", primary.port))
            replica.start().wait_in_sync()
            self.servers[replica.port] = replica
        self.sentinels = [
            SentinelServer(
                ("127.0.0.1", primary.port),
                failover_timeout_ms=self.failover_timeout_ms,
                down_after_ms=self.down_after_ms,
            ).start()
            for _ in range(3)
        ]
        time.sleep(1.5)  # the sentinels discover the replicas and each other

    def addresses(self) -> list[tuple[str, int]]:
        return [s.address for s in self.sentinels]

    def single(self) -> RedisServer:
        return next(iter(self.servers.values()))

    def client(self) -> redis.Redis:
        if self.failover:
            return connect(None, self.addresses())
        return connect(self.single().port, [])

    def worker_args(self) -> list[str]:
        if self.failover:
            return ["--sentinels", ",".join(f"{h}:{p}" for h, p in self.addresses())]
        return ["--port", str(self.single().port)]

    def kill_and_restart(self, down_s: float = 1.0) -> None:
        """SIGKILL the single server, leave it down ``down_s``, restart it from its AOF."""
        server = self.single()
        server.kill()
        time.sleep(down_s)
        server.restart()

    def stop_for(self, seconds: float) -> None:
        pid = self.single().pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.kill(pid, signal.SIGCONT)

    def kill_primary(self, timeout_s: float = 40.0) -> str:
        """SIGKILL the current primary; wait for a promotion; restart it as a replica."""
        _, old_port = current_primary(self.sentinels, SERVICE)
        old = self.servers[old_port]
        offset = self._offset(old, "master_repl_offset")
        old.kill()
        behind = [
            f"{port}: {offset - self._offset(server, 'slave_repl_offset')} B"
            for port, server in self.servers.items()
            if port != old_port
        ]
        deadline = time.monotonic() + timeout_s
        new_port = old_port
        while new_port == old_port and time.monotonic() < deadline:
            time.sleep(0.1)
            _, new_port = current_primary(self.sentinels, SERVICE)
        if new_port == old_port:
            raise RuntimeError(f"no promotion within {timeout_s} s")
        probe = self.servers[new_port].client(socket_timeout=1)
        try:
            while time.monotonic() < deadline:
                role = probe.info("replication").get("role")
                if role == "master":
                    break
                time.sleep(0.05)
        finally:
            probe.close()
        old.restart(replica_of=("127.0.0.1", new_port))
        old.wait_in_sync(timeout_s=max(deadline - time.monotonic(), 1.0))
        return (
            f"{old_port} -> {new_port}; each replica's applied offset just after the kill, "
            f"bytes behind the primary's offset just before it (negative: it was not behind): "
            f"{', '.join(behind)}"
        )

    @staticmethod
    def _offset(server: RedisServer, field: str) -> int:
        probe = server.client(socket_timeout=1)
        try:
            return int(probe.info("replication").get(field, 0))
        finally:
            probe.close()

    def switches(self) -> list[tuple[float, str]]:
        """(epoch ms, "old -> new") of each primary switch the sentinels logged (+switch-master,
        deduplicated across the sentinels: the same switch within 10 s counts once)."""
        seen: list[tuple[float, str]] = []
        for sentinel in self.sentinels:
            path = sentinel.dir / "sentinel.log"
            if not path.exists():
                continue
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                match = SWITCH_MASTER.search(line)
                if match is None:
                    continue
                stamp = datetime.strptime(match["at"], "%d %b %Y %H:%M:%S.%f").timestamp()
                seen.append((stamp * 1000, f"{match['old']} -> {match['new']}"))
        switches: list[tuple[float, str]] = []
        for at_ms, what in sorted(seen):
            if not any(w == what and at_ms - a < 10_000 for a, w in switches):
                switches.append((at_ms, what))
        return switches

    def keep_logs(self, folder: Path) -> None:
        """Copy the Redis and Sentinel logs to ``folder`` (they go with the servers' folders)."""
        folder.mkdir(parents=True, exist_ok=True)
        for port, server in self.servers.items():
            with contextlib.suppress(OSError):
                shutil.copy(server.dir / "redis.log", folder / f"redis-{port}.log")
        for sentinel in self.sentinels:
            with contextlib.suppress(OSError):
                shutil.copy(sentinel.dir / "sentinel.log", folder / f"sentinel-{sentinel.port}.log")

    def failover_events(self) -> str:
        """What the sentinels logged: failovers started (a leader selected a replica), ended,
        aborted; more starts than primary kills would mean a second, unplanned failover."""
        events: Counter[str] = Counter()
        for sentinel in self.sentinels:
            path = sentinel.dir / "sentinel.log"
            if path.exists():
                for word in path.read_text(encoding="utf-8", errors="replace").split():
                    if word.startswith(("+selected-slave", "+failover-end", "-failover-abort")):
                        events[word] += 1
        return ", ".join(f"{k} {v}" for k, v in sorted(events.items())) or "none"

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        for server in self.servers.values():
            server.stop()


# -- producer --------------------------------------------------------------------------------


@dataclasses.dataclass
class Planned:
    id: str
    due_ms: int
    kind: str


def plan_tasks(settings: Settings, start_ms: float, rng: random.Random) -> list[Planned]:
    plan = []
    lead_ms = settings.ahead_s * 1000
    for i in range(settings.tasks):
        due = int(start_ms + lead_ms + settings.spread_s * 1000 * i / settings.tasks)
        due += rng.randrange(0, 1000)
        roll = rng.random()
        kind = "poison" if roll < POISON_FRACTION else "flaky" if roll < FLAKY_FRACTION else "ok"
        plan.append(Planned(f"t{i:06d}", due, kind))
    return plan


class Producer(threading.Thread):
    """Schedules the plan batch by batch, ``ahead_s`` before each batch is due; retries a
    batch that failed or was not confirmed by replicas with the same ids (idempotent)."""

    def __init__(
        self, q: dueq.Queue, plan: list[Planned], settings: Settings, deadline: float
    ) -> None:
        super().__init__(name="producer", daemon=True)
        self.q = q
        self.plan = plan
        self.settings = settings
        self.deadline = deadline
        self.acknowledged: set[str] = set()
        self.acked_at: dict[str, float] = {}
        self.retries: Counter[str] = Counter()
        self.given_up = 0
        self.done = threading.Event()

    def run(self) -> None:
        try:
            self._produce()
        finally:
            self.done.set()

    def _produce(self) -> None:
        batch, ahead_ms = self.settings.batch, self.settings.ahead_s * 1000
        for start in range(0, len(self.plan), batch):
            chunk = self.plan[start : start + batch]
            pause_s = (chunk[0].due_ms - ahead_ms - now_ms()) / 1000
            if pause_s > 0:
                time.sleep(pause_s)
            tasks = [
                dueq.Task(
                    {"due_ms": p.due_ms, "kind": p.kind},
                    id=p.id,
                    at=datetime.fromtimestamp(p.due_ms / 1000, tz=timezone.utc),
                )
                for p in chunk
            ]
            if self._schedule(tasks):
                self.acknowledged.update(p.id for p in chunk)
                acked_ms = now_ms()
                self.acked_at.update((p.id, acked_ms) for p in chunk)
            else:
                self.given_up += len(chunk)

    def _schedule(self, tasks: list[dueq.Task]) -> bool:
        while time.monotonic() < self.deadline:
            try:
                self.q.schedule_many(tasks)
                return True
            except dueq.ReplicationTimeout as exc:  # written on the primary, not confirmed: again
                self.retries[type(exc).__name__] += 1
            except Exception as exc:  # an outage: retry the same ids; anything else is fatal
                if not is_outage(exc):
                    raise
                self.retries[type(exc).__name__] += 1
                time.sleep(0.2)
        return False


# -- one run ---------------------------------------------------------------------------------


@dataclasses.dataclass
class Fault:
    kind: str  # worker-kill, redis-kill, redis-stop, primary-kill
    start_ms: float
    end_ms: float
    detail: str = ""


class Workers:
    """The worker processes, each slot restarted with a new log when killed."""

    def __init__(self, settings: Settings, deployment: Deployment, folder: Path) -> None:
        self.settings = settings
        self.deployment = deployment
        self.folder = folder
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        self.all_logs: list[Path] = []
        self.generation = 0
        self.crashes = 0

    def command(self, path: Path) -> list[str]:
        """The command line of a worker process that logs to ``path`` (another soak that
        reuses these slots gives its own worker here)."""
        command = [sys.executable, __file__, "worker", "--log", str(path)]
        command += self.deployment.worker_args()
        command += ["--concurrency", str(self.settings.concurrency)]
        command += ["--wait-replicas", str(self.settings.wait_replicas)]
        command += ["--work-ms", str(self.settings.work_ms)]
        return command

    def spawn(self, slot: int) -> None:
        self.generation += 1
        path = self.folder / f"w{slot}-{self.generation}.log"
        command = self.command(path)
        with open(path.with_suffix(".err"), "wb") as errors:  # the child keeps its own copy
            proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stderr=errors)
        if slot < len(self.procs):
            self.procs[slot], self.logs[slot] = proc, path
        else:
            self.procs.append(proc)
            self.logs.append(path)
        self.all_logs.append(path)

    def start(self) -> None:
        for slot in range(self.settings.workers):
            self.spawn(slot)

    def kill(self, slot: int) -> Path:
        killed = self.logs[slot]
        self.procs[slot].send_signal(signal.SIGKILL)
        self.procs[slot].wait()
        self.spawn(slot)
        return killed

    def restart_crashed(self) -> None:
        for slot, proc in enumerate(self.procs):
            if proc.poll() is not None:
                log.error("worker %d exited by itself with %s; restarting", slot, proc.returncode)
                self.crashes += 1
                self.spawn(slot)

    def unexpected_errors(self) -> list[str]:
        """Lines the workers logged (ERROR and above) other than the planned failures."""
        lines = []
        for path in self.all_logs:
            errors = path.with_suffix(".err")
            if errors.exists():
                text = errors.read_text(encoding="utf-8", errors="replace")
                lines += [x for x in text.splitlines() if x and "on purpose" not in x]
        return lines

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def fault_plan(settings: Settings, rng: random.Random) -> list[tuple[float, str]]:
    """(seconds after the start, kind): Redis faults evenly spaced, worker kills at random."""
    redis_faults = ["redis-kill"] * settings.redis_kills
    if settings.stop_s:
        redis_faults.insert(len(redis_faults) // 2, "redis-stop")
    redis_faults += ["primary-kill"] * settings.primary_kills
    window = settings.spread_s
    plan = [(window * (i + 1) / (len(redis_faults) + 1), k) for i, k in enumerate(redis_faults)]
    plan += [
        (window * rng.uniform(0.05, 0.95), "worker-kill") for _ in range(settings.worker_kills)
    ]
    return sorted(plan)


def measure_schedule_rates(client: redis.Redis, seconds: float, rounds: int) -> list[str]:
    """Throughput of schedule() calls and of schedule_many batches of 100, without WAIT and
    with wait_replicas=1. Short measurements alternate (``rounds`` pairs of ``seconds`` each)
    and the medians are kept, with the median of the per-pair ratios, so that the load of
    other processes on a shared machine affects both settings alike."""
    serial = itertools.count()

    def calls(q: dueq.Queue) -> float:
        count, start = 0, time.monotonic()
        while time.monotonic() - start < seconds:
            q.schedule({"n": count}, id=f"one-{next(serial)}", delay=3600)
            count += 1
        return count / (time.monotonic() - start)

    def batches(q: dueq.Queue) -> float:
        count, start = 0, time.monotonic()
        while time.monotonic() - start < seconds:
            ids = [f"many-{next(serial)}" for _ in range(100)]
            q.schedule_many(dueq.Task({"n": i}, id=i, delay=3600) for i in ids)
            count += 100
        return count / (time.monotonic() - start)

    queues = [make_queue(client, wait, name="soak-bench") for wait in (0, 1)]
    lines = []
    for what, measure in (("schedule() calls/s", calls), ("tasks/s in batches of 100", batches)):
        pairs = [(measure(queues[0]), measure(queues[1])) for _ in range(rounds)]
        off = statistics.median(a for a, _ in pairs)
        on = statistics.median(b for _, b in pairs)
        ratio = statistics.median(b / a for a, b in pairs)
        lines.append(
            f"throughput before the faults, {what}: without WAIT {off:,.0f}, "
            f"with wait_replicas=1 {on:,.0f} (median ratio {ratio:.0%}, {rounds} pairs)"
        )
    keys = QueueKeys.for_queue("soak-bench")
    client.delete(keys.due, keys.tasks, keys.meta, keys.errors, keys.stats)
    return lines


def run_soak(settings: Settings, out: Callable[[str], None]) -> dict[str, int]:
    rng = random.Random(settings.seed)
    folder = Path(tempfile.mkdtemp(prefix="dueq-soak-"))
    deployment = Deployment(settings.failover, settings.failover_timeout_ms, settings.down_after_ms)
    deployment.start()
    faults: list[Fault] = []
    try:
        client = deployment.client()
        q = make_queue(client, settings.wait_replicas)
        rates = (
            measure_schedule_rates(client, 0.5, settings.bench_rounds) if settings.failover else []
        )
        started = time.monotonic()
        hard_deadline = started + settings.max_duration_s
        start_ms = now_ms()
        plan = plan_tasks(settings, start_ms, rng)
        workers = Workers(settings, deployment, folder)
        workers.start()
        producer = Producer(q, plan, settings, deadline=hard_deadline - settings.drain_s / 2)
        producer.start()
        for at_s, kind in fault_plan(settings, rng):
            while time.monotonic() < min(started + at_s, hard_deadline):
                time.sleep(min(0.5, max(started + at_s - time.monotonic(), 0.01)))
                workers.restart_crashed()
            if time.monotonic() >= hard_deadline:
                break
            faults.append(inject(kind, settings, deployment, workers, rng))
            log.info("fault %s at %.0f s: %s", kind, time.monotonic() - started, faults[-1].detail)
        producer.done.wait(max(hard_deadline - time.monotonic(), 0))
        drained = wait_drained(q, min(time.monotonic() + settings.drain_s, hard_deadline), workers)
        workers.stop()
        elapsed_s = time.monotonic() - started
        notes: list[str] = []
        if settings.failover:
            notes.append(f"sentinel events: {deployment.failover_events()}")
            faults += unplanned_failovers(deployment.switches(), faults, start_ms, notes)
        if settings.keep_logs:
            deployment.keep_logs(Path(settings.keep_logs))
            for path in workers.all_logs:
                with contextlib.suppress(OSError):
                    shutil.copy(path, Path(settings.keep_logs) / path.name)
        counts = analyse(q, client, producer, workers, faults, notes)
        print_table(settings, counts, faults, producer, workers, drained, elapsed_s, rates, out)
        for fault in faults:
            if fault.kind != "worker-kill":
                at_s = (fault.start_ms - start_ms) / 1000
                out(f"  {fault.kind} at {at_s:.1f} s for {fault.end_ms - fault.start_ms:.0f} ms")
                if fault.detail:
                    out(f"    {fault.detail}")
        for note in notes:
            out(note.replace("START", f"{start_ms:.0f}"))
        client.close()
        return counts
    finally:
        deployment.stop()
        shutil.rmtree(folder, ignore_errors=True)


def unplanned_failovers(
    switches: list[tuple[float, str]], faults: list[Fault], start_ms: float, notes: list[str]
) -> list[Fault]:
    """Primary switches that no planned primary kill explains: a failover the sentinels chose
    on their own (a primary that stalled past down-after-milliseconds). Each becomes a fault
    window of its own, from 5 s before the switch (the stall and the election) to the switch."""
    planned = [f for f in faults if f.kind == "primary-kill"]
    extra = []
    for at_ms, what in switches:
        if not any(
            f.detail.startswith(f"{what};") and f.start_ms <= at_ms <= f.end_ms + 1000
            for f in planned
        ):
            extra.append(Fault("unplanned-failover", at_ms - 5000, at_ms, what))
            notes.append(f"unplanned failover at {(at_ms - start_ms) / 1000:.1f} s: {what}")
    return extra


def inject(
    kind: str, settings: Settings, deployment: Deployment, workers: Workers, rng: random.Random
) -> Fault:
    start = now_ms()
    detail = ""
    if kind == "worker-kill":
        detail = str(workers.kill(rng.randrange(settings.workers)))
    elif kind == "redis-kill":
        deployment.kill_and_restart()
    elif kind == "redis-stop":
        deployment.stop_for(settings.stop_s)
    elif kind == "primary-kill":
        detail = deployment.kill_primary()
    return Fault(kind, start, now_ms(), detail)


def wait_drained(q: dueq.Queue, deadline: float, workers: Workers) -> bool:
    """Wait until nothing is scheduled or leased (bounded); True if it drained."""
    while time.monotonic() < deadline:
        workers.restart_crashed()
        try:
            stats = q.stats()
        except Exception as exc:  # a failover still settling: ask again
            if not is_outage(exc):
                raise
        else:
            if stats.scheduled == 0 and stats.leased == 0:
                return True
        time.sleep(1.0)
    return False


# -- analysis --------------------------------------------------------------------------------


@dataclasses.dataclass
class Run:
    id: str
    attempt: int
    start_ms: float
    due_ms: int
    claimed_ms: int
    payload_due_ms: int
    history: str
    log: Path
    end: str | None = None


def read_runs(logs: list[Path]) -> dict[str, list[Run]]:
    runs: dict[str, list[Run]] = defaultdict(list)
    for path in logs:
        if not path.exists():
            continue
        open_runs: dict[tuple[str, int], Run] = {}
        for line in path.read_text(encoding="utf-8").splitlines():
            parts = line.split()
            if len(parts) == 8 and parts[0] == "S":
                _, task_id, attempt, start, due, claimed, payload_due, history = parts
                run = Run(
                    task_id,
                    int(attempt),
                    float(start),
                    int(due),
                    int(claimed),
                    int(payload_due),
                    history,
                    path,
                )
                runs[task_id].append(run)
                open_runs[(task_id, run.attempt)] = run
            elif len(parts) == 4 and parts[0] == "E":
                found = open_runs.pop((parts[1], int(parts[2])), None)
                if found is not None:
                    found.end = parts[3]
            # anything else is a line cut by a SIGKILL: that run has no end
    for task_runs in runs.values():
        task_runs.sort(key=lambda r: r.start_ms)
    return runs


def members(client: redis.Redis, key: str) -> set[str]:
    return {m.decode() for m in client.zrange(key, 0, -1)}


def explain(previous: Run, run: Run, killed: set[Path], windows: list[Fault]) -> str | None:
    """Why ``run`` happened again after ``previous`` did not fail on purpose, or None."""
    if previous.log in killed:
        return "worker kill"
    if f"{previous.attempt}:LeaseExpired" in run.history.split("|"):
        return "LeaseExpired in the history"
    for fault in windows:
        if previous.start_ms <= fault.end_ms + FAULT_MARGIN_MS and run.start_ms >= fault.start_ms:
            return "Redis fault window"
    return None


def analyse(
    q: dueq.Queue,
    client: redis.Redis,
    producer: Producer,
    workers: Workers,
    faults: list[Fault],
    notes: list[str],
) -> dict[str, int]:
    keys = q.keys
    for _ in range(100):  # after a failover the primary may still be settling
        try:
            present = members(client, keys.due) | members(client, keys.leased)
            dead = members(client, keys.dead)
            break
        except Exception as exc:  # an outage: ask again (bounded)
            if not is_outage(exc):
                raise
            time.sleep(0.3)
    else:
        raise RuntimeError("Redis did not answer after the run")
    runs = read_runs(workers.all_logs)
    killed = {Path(f.detail) for f in faults if f.kind == "worker-kill"}
    windows = [f for f in faults if f.kind != "worker-kill"]
    counts: Counter[str] = Counter()
    acknowledged = producer.acknowledged
    lost: list[str] = []
    for task_id in acknowledged:
        task_runs = runs.get(task_id, [])
        if task_id in dead:
            counts["dead"] += 1
        elif task_id in present:
            counts["still queued"] += 1
        elif any(r.end == "ok" for r in task_runs):
            counts["acked"] += 1
        else:
            counts["lost"] += 1
            lost.append(task_id)
    for task_runs in runs.values():
        counts["runs"] += len(task_runs)
        if len(task_runs) > MAX_ATTEMPTS:
            counts["over max_attempts"] += 1
        for run in task_runs:
            by_queue_clock = run.claimed_ms < max(run.due_ms, run.payload_due_ms)
            due = max(run.due_ms, run.payload_due_ms)
            if by_queue_clock or run.start_ms + CLOCK_TOLERANCE_MS < due:
                counts["early"] += 1
        for previous, run in itertools.pairwise(task_runs):
            if previous.end == "fail":
                continue  # a planned retry
            counts["duplicates"] += 1
            reason = explain(previous, run, killed, windows)
            counts[f"explained: {reason}" if reason else "unexplained duplicates"] += 1
    if lost:
        kinds = {p.id: p.kind for p in producer.plan}
        lost_kinds = Counter(kinds[i] for i in lost)
        ran = Counter(
            ",".join(r.end or "cut" for r in runs.get(i, [])) or "never ran" for i in lost
        )
        notes.append(f"lost by kind: {dict(lost_kinds)}; by runs: {dict(ran)}")
        times = sorted(producer.acked_at[i] for i in lost)
        notes.append(
            f"lost ids (first 5): {sorted(lost)[:5]}; acknowledged between {times[0]:.0f} and "
            f"{times[-1]:.0f} ms epoch (run started at START)"
        )
    over = [i for i, task_runs in runs.items() if len(task_runs) > MAX_ATTEMPTS]
    if over:
        notes.append(f"over max_attempts (first 5): {sorted(over)[:5]}")
    counts["scheduled"] = len(acknowledged)
    counts["poison"] = sum(1 for p in producer.plan if p.kind == "poison" and p.id in acknowledged)
    return dict(counts)


ROWS = [
    ("scheduled", "scheduled (acknowledged)"),
    ("acked", "acked"),
    ("dead", "dead"),
    ("poison", "  of which poison (always raise)"),
    ("still queued", "still queued"),
    ("lost", "lost"),
    ("early", "early"),
    ("over max_attempts", "over max_attempts"),
    ("runs", "handler runs"),
    ("duplicates", "duplicate runs"),
    ("explained: worker kill", "  explained by a worker SIGKILL"),
    ("explained: LeaseExpired in the history", "  explained by LeaseExpired in the history"),
    ("explained: Redis fault window", "  explained by a Redis fault window"),
    ("unexplained duplicates", "unexplained duplicates"),
]


def print_table(
    settings: Settings,
    counts: dict[str, int],
    faults: list[Fault],
    producer: Producer,
    workers: Workers,
    drained: bool,
    elapsed_s: float,
    rates: list[str],
    out: Callable[[str], None],
) -> None:
    mode = "failover" if settings.failover else "single"
    wait = f", wait_replicas={settings.wait_replicas}" if settings.failover else ""
    out(
        f"\nsoak ({mode}{wait}): {settings.tasks} tasks due over {settings.spread_s:.0f} s, "
        f"{settings.workers} workers x {settings.concurrency}, max_attempts {MAX_ATTEMPTS}, "
        f"lease {LEASE_S:.0f} s, seed {settings.seed}, appendfsync always, {elapsed_s:.0f} s"
    )
    out("")
    out("| metric | count |")
    out("|---|---:|")
    for key, label in ROWS:
        out(f"| {label} | {counts.get(key, 0)} |")
    kinds = Counter(f.kind for f in faults)
    stop = f" ({settings.stop_s:.0f} s)" if kinds["redis-stop"] else ""
    out("")
    out(
        f"faults: worker SIGKILL {kinds['worker-kill']}, Redis SIGKILL + AOF restart "
        f"{kinds['redis-kill']}, Redis SIGSTOP{stop} {kinds['redis-stop']}, "
        f"primary SIGKILL + Sentinel failover {kinds['primary-kill']}, "
        f"unplanned Sentinel failover {kinds['unplanned-failover']}; "
        f"worker exits not caused by a kill: {workers.crashes}"
    )
    retried = ", ".join(f"{k} {v}" for k, v in sorted(producer.retries.items())) or "none"
    given_up = producer.given_up // settings.batch
    out(f"producer batch retries: {retried}; batches given up: {given_up}")
    for line in rates:
        out(line)
    if not drained:
        out("warning: the queue had not drained when the drain bound ran out")
    unexpected = workers.unexpected_errors()
    out(f"worker log lines other than the planned failures: {len(unexpected)}")
    for line in unexpected[:10]:
        log.info("worker said: %s", line)


def failed(counts: dict[str, int]) -> bool:
    bad = ("lost", "early", "over max_attempts", "unexplained duplicates")
    return any(counts.get(key, 0) > 0 for key in bad)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    worker = sub.add_parser("worker", help="internal: one worker process")
    worker.add_argument("--log", required=True)
    worker.add_argument("--port", type=int)
    worker.add_argument("--sentinels", default="")
    worker.add_argument("--concurrency", type=int, default=8)
    worker.add_argument("--wait-replicas", type=int, default=0)
    worker.add_argument("--work-ms", type=float, default=2)
    parser.add_argument("--quick", action="store_true", help="about 2 minutes")
    parser.add_argument("--failover", action="store_true", help="Sentinel failovers")
    parser.add_argument(
        "--wait-replicas",
        type=int,
        choices=(0, 1, 2),
        help="failover: only this WAIT setting (default: 0, then 1)",
    )
    parser.add_argument("--tasks", type=int)
    parser.add_argument("--workers", type=int)
    parser.add_argument("--worker-kills", type=int)
    parser.add_argument("--spread-s", type=float, help="seconds over which tasks fall due")
    parser.add_argument("--max-duration-s", type=float, help="bound of one run, seconds")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--failover-timeout-ms", type=int, help="Sentinel failover-timeout")
    parser.add_argument("--down-after-ms", type=int, help="Sentinel down-after-milliseconds")
    parser.add_argument("--keep-logs", help="copy worker, Redis and Sentinel logs to this folder")
    args = parser.parse_args()
    if args.command == "worker":
        worker_main(args)
        return 0
    logging.basicConfig(level=logging.INFO, format="soak: %(message)s", stream=sys.stderr)

    def out(line: str) -> None:
        print(line, flush=True)

    waits = [0, 1] if args.failover and args.wait_replicas is None else [args.wait_replicas or 0]
    bad = False
    for wait in waits:
        counts = run_soak(settings_from(args, wait), out)
        bad = bad or failed(counts)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
