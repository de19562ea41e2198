#!/usr/bin/env python
"""Fair scheduling between tenants: a noisy neighbour, weighted shares, many tenants.

What ``configure(fairness="key")`` (docs/fairness.md) buys and costs, in one run on its own
redis-server (``dueq.server.RedisServer``, a free loopback port):

1. **noisy neighbour**: tenant A has ``--tasks`` due tasks (``schedule_many``, 1,000 a call);
   a ``Worker`` (threads, a no-op handler, ``--concurrency``) drains them while tenant B
   schedules one task every ``--b-interval-ms`` (``key="b"``). Measured: each B task's
   latency from its due time (when it was scheduled) to its handler starting (the delivery's
   ``due_ms`` against ``time.time()`` in the handler), and to its claim (``claimed_ms``, the
   server's clock: what the claim script alone adds); A's drain rate (tasks/s from the
   worker's start to A's last task) over the same window. Fairness off and on take turns,
   each on a fresh queue (``--pairs`` pairs, off first), so that load from outside falls on
   both alike; per pair, A's rate on over off (the target: at least 0.8). Off, B waits behind
   A's backlog; on, B's task goes in the next claim, and then waits behind the deliveries the
   worker already holds (its prefetch, ``max_in_flight="auto"``: up to 1,024), so one more
   fair run with ``max_in_flight`` fixed at twice the concurrency (a tenth of the tasks) says
   how much of B's latency is that hold. Raw Redis, in the same rounds: a pipelined
   ``ZPOPMIN 1000`` + ``HMGET`` + ``HDEL`` loop over ZSET + HASH tasks of the same payload
   (no leases, no acks, no handlers): A's drain rate as a share of it.
2. **weighted shares**: tenants of weight 1, 2 and 5 with backlogs larger than they can use;
   10,000 claimed tasks (``claim(100)`` x 100, each batch acked): each tenant's share against
   w / 8 (the target: within 5% of it). Then a tenant whose tasks spread over 100 keys with
   one ``fair_key`` against a tenant of one key (the target: equal shares), and the same
   tenant without ``fair_key`` (100 tenants: no target, the reason ``fair_key`` exists).
3. **many tenants**: ``claim(100)`` + ``ack_many`` with ``--tenants`` tenants of
   ``--per-tenant`` due tasks each, against one tenant with the same total, fairness on in
   both; blocks of claims take turns between the two queues. Per call: the client's time
   (p50, p99) and the server's (``INFO commandstats`` ``cmdstat_evalsha``, read between the
   calls, so the claim's and the ack's microseconds are apart); the ratio many / one (the
   target: at most 1.3x).

    PYTHONPATH=src .venv/bin/python scripts/bench/fairness.py [--quick] [--pairs N]

A full run (1,000,000 A tasks, 100,000 tenants) took 4-6 min on a 2-core VM at load 6-15,
most of it scheduling and draining A's four million tasks; ``--quick`` (100,000 and 20,000)
25-35 s. ``--sections 3 --tenants 100 --per-tenant 3000`` tells the cost of many tenants from
that of many lanes served per claim (docs/performance.md, Fairness). The table goes to stdout,
then one JSON line with every figure; progress goes to stderr. Compare alternating runs in one
sitting: this machine's speed moves between hours.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import redis
from report import percentile, print_table

import dueq
from dueq.server import RedisServer

perf = time.perf_counter
Row = tuple[str, str, str, str]
CHUNK = 1000  # tasks per schedule_many call (the schedule script's most per call)
WEIGHTS = {"w1": 1, "w2": 2, "w5": 5}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def chunks(make: Callable[[int], dueq.Task], n: int) -> Iterator[list[dueq.Task]]:
    for start in range(0, n, CHUNK):
        yield [make(i) for i in range(start, min(n, start + CHUNK))]


def maker(key: str, fair_key: str | None = None, spread: int = 0) -> Callable[[int], dueq.Task]:
    """Task ``i`` of a tenant: limit key ``key`` (``key`` + ``i % spread`` with ``spread``)."""

    def make(i: int) -> dueq.Task:
        return dueq.Task({"n": i}, key=f"{key}{i % spread}" if spread else key, fair_key=fair_key)

    return make


def schedule(q: dueq.Queue, make: Callable[[int], dueq.Task], n: int) -> float:
    """Schedule ``make(0..n-1)`` with schedule_many, CHUNK a call; the tasks per second."""
    start = perf()
    for batch in chunks(make, n):
        q.schedule_many(batch)
    return n / (perf() - start)


def evalsha_usec(r: redis.Redis) -> int:
    stat = r.info("commandstats").get("cmdstat_evalsha")
    return int(stat["usec"]) if stat else 0


def share_of(counts: Counter[str], name: str) -> float:
    total = sum(counts.values())
    return counts[name] / total if total else 0.0


# -- 1. noisy neighbour ---------------------------------------------------------------------


def raw_drain(r: redis.Redis, n: int) -> float:
    """Tasks per second of a pipelined ZPOPMIN 1000 + HMGET + HDEL loop over ``n`` tasks kept
    as ZSET + HASH with the payload A's tasks carry (filled by a pipeline, not timed)."""
    r.flushdb()
    now_ms = int(time.time() * 1000)
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        pipe.zadd("raw:due", {f"r{i}": now_ms})
        pipe.hset("raw:tasks", f"r{i}", json.dumps({"n": i}))
        if i % CHUNK == CHUNK - 1:
            pipe.execute()
    pipe.execute()
    moved = 0
    start = perf()
    while moved < n:
        popped: list[tuple[bytes, float]] = r.zpopmin("raw:due", 1000)  # type: ignore[assignment]
        ids = [member for member, _ in popped]
        pipe = r.pipeline(transaction=False)
        pipe.hmget("raw:tasks", ids)
        pipe.hdel("raw:tasks", *ids)
        pipe.execute()
        moved += len(ids)
    return n / (perf() - start)


def noisy_round(
    r: redis.Redis,
    url: str,
    fair: bool,
    n: int,
    args: argparse.Namespace,
    label: str,
    max_in_flight: int | None = None,
) -> dict[str, Any]:
    """One fresh queue: A's ``n`` due tasks, then a Worker draining them while B schedules
    one task every ``args.b_interval_ms``. Returns A's rates and B's latencies (ms)."""
    r.flushdb()
    q = dueq.Queue.from_url(url, f"noisy-{label}")
    q.configure(fairness="key" if fair else False)
    log(f"  {label}: scheduling {n:,} A tasks")
    memory = r.info("memory")["used_memory"]
    schedule_rate = schedule(q, maker("a"), n)
    bytes_per_task = (r.info("memory")["used_memory"] - memory) / n
    lock = threading.Lock()
    a_done = [0]
    a_last = [0.0]
    b_start: list[float] = []  # handler start minus due, ms (host clock)
    b_claim: list[float] = []  # claimed minus due, ms (the queue's clock)

    def handler(d: dueq.Delivery) -> None:
        if d.key == "b":
            b_start.append(time.time() * 1000 - d.due_ms)
            b_claim.append(float(d.claimed_ms - d.due_ms))
            return
        with lock:
            a_done[0] += 1
            if a_done[0] == n:
                a_last[0] = perf()

    producer_q = dueq.Queue.from_url(url, f"noisy-{label}")  # its own client
    drained = threading.Event()
    b_sent = [0]

    def produce_b() -> None:
        tick = args.b_interval_ms / 1000
        next_at = perf()
        while not drained.is_set():
            producer_q.schedule({"b": b_sent[0]}, key="b")
            b_sent[0] += 1
            next_at += tick
            drained.wait(max(0.0, next_at - perf()))

    worker = dueq.Worker(q, handler, concurrency=args.concurrency, max_in_flight=max_in_flight)
    worker_thread = threading.Thread(target=worker.run)
    producer = threading.Thread(target=produce_b)
    usec = evalsha_usec(r)
    start = perf()
    worker_thread.start()
    producer.start()
    try:
        deadline = start + args.limit_s
        while a_done[0] < n:
            if perf() > deadline:
                raise SystemExit(f"gave up after {args.limit_s:.0f} s: {q.stats()}")
            time.sleep(0.01)
        drained.set()
        producer.join()
        while len(b_start) < b_sent[0]:  # B's last tasks (fairness off: all of them)
            if perf() > deadline:
                raise SystemExit(f"B tasks not handled after {args.limit_s:.0f} s")
            time.sleep(0.005)
    finally:
        drained.set()
        worker.stop()
        worker_thread.join()
        producer.join()
        producer_q.redis.close()
    seconds = a_last[0] - start
    usec = evalsha_usec(r) - usec
    log(f"  {label}: drained in {seconds:.1f} s, {len(b_start)} B tasks")
    return {
        "fairness": fair,
        "tasks": n,
        "schedule_per_s": schedule_rate,
        "drain_s": seconds,
        "drain_per_s": n / seconds,
        "bytes_per_task": bytes_per_task,
        "server_us_per_task": usec / n,
        "b_tasks": len(b_start),
        "b_start_ms": latency_summary(b_start),
        "b_claim_ms": latency_summary(b_claim),
        "max_in_flight": max_in_flight,
        "_b_start": b_start,
    }


def latency_summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": float("nan"), "p99": float("nan"), "max": float("nan")}
    return {"p50": percentile(values, 50), "p99": percentile(values, 99), "max": max(values)}


def noisy_row(section: str, res: dict[str, Any], raw: float | None, target: str) -> Row:
    b, c = res["b_start_ms"], res["b_claim_ms"]
    share = f"{res['drain_per_s'] / raw:.2f}x raw {raw:,.0f}/s, " if raw else ""
    return (
        section,
        f"A {res['drain_per_s']:,.0f}/s",
        f"{share}{res['tasks']:,} in {res['drain_s']:.1f} s, server {res['server_us_per_task']:.1f}"
        f" us/task; B x{res['b_tasks']}: start p50 {b['p50']:.1f} p99 {b['p99']:.1f} max "
        f"{b['max']:.1f} ms, claim p99 {c['p99']:.0f} ms; schedule_many "
        f"{res['schedule_per_s']:,.0f}/s, {res['bytes_per_task']:.0f} B/task",
        target,
    )


def noisy_neighbour(
    r: redis.Redis, url: str, args: argparse.Namespace
) -> tuple[list[Row], dict[str, Any]]:
    rounds: list[dict[str, Any]] = []
    raws: list[float] = []
    rows: list[Row] = []
    raw_n = min(args.tasks, 200_000)
    for pair in range(1, args.pairs + 1):
        log(f"noisy neighbour, pair {pair}/{args.pairs}: raw drain of {raw_n:,}")
        raws.append(raw_drain(r, raw_n))
        off = noisy_round(r, url, False, args.tasks, args, f"off{pair}")
        on = noisy_round(r, url, True, args.tasks, args, f"on{pair}")
        rounds += [off, on]
        ratio = on["drain_per_s"] / off["drain_per_s"]
        rows.append(noisy_row(f"1 noisy, pair {pair}, off", off, raws[-1], ""))
        rows.append(noisy_row(f"1 noisy, pair {pair}, on", on, raws[-1], "B p99 < 10 ms"))
        rows.append((f"1 noisy, pair {pair}", f"on/off {ratio:.2f}", "A's drain rate", ">= 0.8"))
    pooled: dict[str, dict[str, float]] = {}
    for fair in (False, True):
        name = "on" if fair else "off"
        values = [v for x in rounds if x["fairness"] is fair for v in x["_b_start"]]
        pooled[name] = {"b_tasks": len(values), **latency_summary(values)}
        p = pooled[name]
        rows.append(
            (
                f"1 noisy, all pairs, {name}",
                f"B p99 {p['p99']:.1f} ms",
                f"{len(values)} B tasks, handler start minus due: p50 {p['p50']:.1f}, max "
                f"{p['max']:.1f} ms",
                "< 10 ms" if fair else "",
            )
        )
    hold = args.hold or 2 * args.concurrency
    log(f"noisy neighbour: fairness on, max_in_flight={hold}")
    held = noisy_round(r, url, True, max(args.tasks // 10, 10_000), args, "on-hold", hold)
    rows.append(noisy_row(f"1 noisy, on, max_in_flight={hold}", held, None, "(the hold)"))
    ons = [x for x in rounds if x["fairness"]]
    offs = [x for x in rounds if not x["fairness"]]
    ratios = [on["drain_per_s"] / off["drain_per_s"] for off, on in zip(offs, ons, strict=True)]
    for x in (*rounds, held):
        del x["_b_start"]
    figures = {
        "raw_drain_per_s": raws,
        "rounds": rounds,
        "on_off_ratios": ratios,
        "b_start_pooled_ms": pooled,
        "hold_round": held,
        "met_drain_ratio": min(ratios) >= 0.8,
        "met_b_p99": pooled["on"]["p99"] < 10,
    }
    return rows, figures


# -- 2. weighted shares ---------------------------------------------------------------------


def claim_counts(q: dueq.Queue, claims: int, limit: int = 100) -> Counter[str]:
    """Keys of ``claims`` x claim(limit), each batch acked."""
    counts: Counter[str] = Counter()
    for _ in range(claims):
        got = q.claim(limit)
        counts.update(d.key or "" for d in got)
        q.ack_many(got)
    return counts


def weighted_shares(r: redis.Redis, url: str) -> tuple[list[Row], dict[str, Any]]:
    log("weighted shares")
    r.flushdb()
    q = dueq.Queue.from_url(url, "shares")
    q.configure(
        fairness="key",
        key_limits={name: dueq.KeyLimit(weight=w) for name, w in WEIGHTS.items()},
    )
    for name in WEIGHTS:
        schedule(q, maker(name), 10_000)
    counts = claim_counts(q, 100)
    rows: list[Row] = []
    figures: dict[str, Any] = {"weighted": {}}
    total_w = sum(WEIGHTS.values())
    for name, w in WEIGHTS.items():
        share = share_of(counts, name)
        want = w / total_w
        dev = (share - want) / want
        figures["weighted"][name] = {"weight": w, "tasks": counts[name], "share": share}
        figures["weighted"][name]["deviation"] = dev
        rows.append(
            (
                f"2 shares, weight {w}",
                f"{share:.4f}",
                f"{counts[name]:,} of {sum(counts.values()):,} tasks; w/{total_w} {want:.4f}, "
                f"deviation {dev:+.2%}",
                "within 5%",
            )
        )
    figures["met_weighted"] = all(abs(v["deviation"]) <= 0.05 for v in figures["weighted"].values())
    for with_fair_key in (True, False):
        r.flushdb()
        q = dueq.Queue.from_url(url, "spread")
        q.configure(fairness="key")
        fair_key = "spread" if with_fair_key else None
        schedule(q, maker("spread/", fair_key, spread=100), 10_000)
        schedule(q, maker("solo"), 10_000)
        counts = claim_counts(q, 100)
        solo = share_of(counts, "solo")
        spread = 1 - solo
        name = "fair_key" if with_fair_key else "no_fair_key"
        figures[name] = {"spread_share": spread, "solo_share": solo}
        rows.append(
            (
                f"2 shares, 100 keys {'one' if with_fair_key else 'no'} fair_key",
                f"{spread:.4f} : {solo:.4f}",
                "the 100-key tenant : the one-key tenant"
                + ("" if with_fair_key else " (100 tenants: 100/101 : 1/101)"),
                "equal (within 5%)" if with_fair_key else "",
            )
        )
    figures["met_fair_key"] = abs(figures["fair_key"]["solo_share"] - 0.5) <= 0.025
    return rows, figures


# -- 3. many tenants ------------------------------------------------------------------------


def claim_block(r: redis.Redis, q: dueq.Queue, claims: int, out: dict[str, list[float]]) -> None:
    """``claims`` x (claim(100) + ack_many), each call timed by the client and by the server
    (cmdstat_evalsha read before and after it)."""
    usec = evalsha_usec(r)
    for _ in range(claims):
        start = perf()
        got = q.claim(100)
        mid = perf()
        claim_usec = evalsha_usec(r)
        ack_start = perf()
        q.ack_many(got)
        end = perf()
        ack_usec = evalsha_usec(r)
        if len(got) != 100:
            raise SystemExit(f"{q.name}: a claim got {len(got)} tasks, not 100")
        out["client_ms"].append((mid - start + end - ack_start) * 1000)
        out["claim_ms"].append((mid - start) * 1000)
        out["server_claim_us"].append(claim_usec - usec)
        out["server_ack_us"].append(ack_usec - claim_usec)
        usec = ack_usec


def many_tenants(
    r: redis.Redis, url: str, args: argparse.Namespace
) -> tuple[list[Row], dict[str, Any]]:
    r.flushdb()
    total = args.tenants * args.per_tenant
    many = dueq.Queue.from_url(url, "many")
    one = dueq.Queue.from_url(url, "one")
    tenants = args.tenants
    log(f"many tenants: scheduling {total:,} tasks over {tenants:,} tenants, and {total:,} in one")
    rates = {}
    for q, make in ((many, maker("t", spread=tenants)), (one, maker("one"))):
        q.configure(fairness="key")
        rates[q.name] = schedule(q, make, total)
    fair_lanes = {q.name: r.zcard(q.keys.fair) for q in (many, one)}
    samples: dict[str, dict[str, list[float]]] = {
        q.name: {"client_ms": [], "claim_ms": [], "server_claim_us": [], "server_ack_us": []}
        for q in (many, one)
    }
    for q in (many, one):  # warm-up: the script cache, the connection
        q.ack_many(q.claim(100))
    blocks, per_block = args.blocks, args.claims // args.blocks
    for block in range(blocks):
        order = (many, one) if block % 2 == 0 else (one, many)
        for q in order:
            claim_block(r, q, per_block, samples[q.name])
    rows: list[Row] = []
    figures: dict[str, Any] = {
        "tenants": tenants,
        "per_tenant": args.per_tenant,
        "schedule_per_s": rates,
        "lanes": fair_lanes,
    }
    for name, s in samples.items():
        figures[name] = {
            "claims": len(s["client_ms"]),
            "client_p50_ms": percentile(s["client_ms"], 50),
            "client_p99_ms": percentile(s["client_ms"], 99),
            "claim_p50_ms": percentile(s["claim_ms"], 50),
            "claim_p99_ms": percentile(s["claim_ms"], 99),
            "server_claim_us": statistics.fmean(s["server_claim_us"]),
            "server_claim_p50_us": percentile(s["server_claim_us"], 50),
            "server_ack_us": statistics.fmean(s["server_ack_us"]),
        }
        f = figures[name]
        what = (
            f"{tenants:,} tenants x {args.per_tenant}"
            if name == "many"
            else f"1 tenant x {total:,}"
        )
        rows.append(
            (
                f"3 many tenants, {name}",
                f"p50 {f['client_p50_ms']:.2f} ms",
                f"{what}; claim+ack p99 {f['client_p99_ms']:.2f} ms, claim alone p50 "
                f"{f['claim_p50_ms']:.2f} ms; server: claim {f['server_claim_us']:.0f} us, "
                f"ack {f['server_ack_us']:.0f} us; {f['claims']} claims; schedule_many "
                f"{rates[name]:,.0f}/s",
                "",
            )
        )
    m, o = figures["many"], figures["one"]
    figures["ratio_client_p50"] = m["client_p50_ms"] / o["client_p50_ms"]
    figures["ratio_server_claim"] = m["server_claim_us"] / o["server_claim_us"]
    figures["met"] = figures["ratio_client_p50"] <= 1.3 and figures["ratio_server_claim"] <= 1.3
    rows.append(
        (
            "3 many tenants, many/one",
            f"{figures['ratio_client_p50']:.2f}x",
            f"claim+ack p50; server time per claim {figures['ratio_server_claim']:.2f}x, "
            f"claim+ack p99 {m['client_p99_ms'] / o['client_p99_ms']:.2f}x",
            "<= 1.3x",
        )
    )
    return rows, figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100,000 A tasks, 20,000 tenants")
    parser.add_argument("--tasks", type=int, help="A's due tasks (default 1,000,000)")
    parser.add_argument("--pairs", type=int, default=2, help="off/on rounds of section 1")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--hold", type=int, default=0, help="max_in_flight of section 1's extra fair round"
    )
    parser.add_argument("--b-interval-ms", type=float, default=20.0)
    parser.add_argument("--tenants", type=int, help="section 3's tenants (default 100,000)")
    parser.add_argument("--per-tenant", type=int, default=3)
    parser.add_argument("--claims", type=int, default=400, help="section 3's claims per queue")
    parser.add_argument("--blocks", type=int, default=8, help="section 3's turns per queue")
    parser.add_argument("--limit-s", type=float, default=300.0, help="give up on a round after")
    parser.add_argument("--sections", default="123", help="which sections to run, e.g. 13")
    args = parser.parse_args()
    if args.tasks is None:
        args.tasks = 100_000 if args.quick else 1_000_000
    if args.tenants is None:
        args.tenants = 20_000 if args.quick else 100_000
    started = perf()
    server = RedisServer().start()
    rows: list[Row] = []
    figures: dict[str, Any] = {
        "mode": "quick" if args.quick else "full",
        "args": {k: v for k, v in vars(args).items() if k != "quick"},
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_start": os.getloadavg()[0],
    }
    try:
        r = redis.Redis.from_url(server.url)
        figures["redis"] = r.info("server")["redis_version"]
        if "1" in args.sections:
            section, figures["noisy"] = noisy_neighbour(r, server.url, args)
            rows += section
        if "2" in args.sections:
            section, figures["shares"] = weighted_shares(r, server.url)
            rows += section
        if "3" in args.sections:
            section, figures["many_tenants"] = many_tenants(r, server.url, args)
            rows += section
    finally:
        server.stop()
    figures["seconds"] = perf() - started
    figures["load_end"] = os.getloadavg()[0]
    print(
        f"fairness bench, {figures['mode']} mode, {figures['date']}, redis {figures['redis']}, "
        f"{figures['cpus']} CPUs, load {figures['load_start']:.1f} -> {figures['load_end']:.1f}, "
        f"{figures['seconds']:.0f} s"
    )
    print_table(rows)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
