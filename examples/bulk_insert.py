"""Bulk handlers: write rows in one statement per call, with per-row outcomes.

A producer schedules 5,000 "row" tasks. One bulk handler takes up to 1,000 at a time
(``BatchSpec(max=1000)``) and writes them with one call to a stand-in database, which costs
a fixed 20 ms per statement whatever its size. Rows whose data is invalid are failed
alone (``item.fail``, then dead after their attempts); one statement fails the first time, and
its rows are retried. Their failures are recorded one after another, so their retries fall
due over some milliseconds: ``linger=0.05`` lets a call wait 50 ms for the rest of them, so
they are written in a few statements, not one or two rows at a time (without it, 159
statements instead of 13 in one run). The same rows handled one task per call would pay the
statement cost 5,000 times.

Runs on an embedded redis-server unless you pass --redis-url. Run:
    .venv/bin/python examples/bulk_insert.py
"""

from __future__ import annotations

import argparse
import threading
import time

import redis

import dueq
from dueq.server import RedisServer

ROWS = 5000
STATEMENT_S = 0.02  # what one INSERT costs, whatever its size


class Database:
    """A stand-in for a database: one INSERT of many rows costs STATEMENT_S."""

    def __init__(self) -> None:
        self.rows: dict[str, dict] = {}
        self.statements = 0
        self._lock = threading.Lock()

    def insert_many(self, rows: list[tuple[str, dict]]) -> None:
        time.sleep(STATEMENT_S)
        with self._lock:
            self.statements += 1
            if self.statements == 2:
                raise ConnectionError("connection reset by peer")  # one flaky statement
            self.rows.update(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-url", help="a Redis to use (default: an embedded one)")
    args = parser.parse_args()
    server = None if args.redis_url else RedisServer().start()
    try:
        r = redis.Redis.from_url(args.redis_url or server.url)  # type: ignore[union-attr]
        r.flushdb()
        q = dueq.Queue("rows", r, retry=dueq.RetryPolicy(max_attempts=2, wait=lambda s: 0.2))
        db = Database()
        calls: list[int] = []

        @q.task(name="write_row", batch=dueq.BatchSpec(max=1000, linger=0.05))
        def write_row(items: list[dueq.Item]) -> None:
            calls.append(len(items))
            good = []
            for item in items:
                if item.payload["amount"] < 0:
                    item.fail(ValueError(f"row {item.payload['row']}: negative amount"))
                else:
                    good.append((item.id, item.payload))
            db.insert_many(good)  # raises: every item not failed above is retried

        q.schedule_many(
            write_row.task({"row": n, "amount": -1 if n % 1000 == 7 else n}, id=f"row-{n}")
            for n in range(ROWS)
        )
        worker = dueq.Worker(q, concurrency=2)
        thread = threading.Thread(target=worker.run)
        started = time.perf_counter()
        thread.start()
        deadline = started + 60
        while time.perf_counter() < deadline:
            stats = q.stats()
            if not (stats.scheduled or stats.leased):
                break
            time.sleep(0.05)
        took_s = time.perf_counter() - started
        worker.stop()
        thread.join()
        dead = q.dead.list()
        print(f"rows written: {len(db.rows)} of {ROWS} in {db.statements} statements")
        print(f"calls: {len(calls)}, largest {max(calls)} rows")
        print(f"dead rows: {sorted(t.id for t in dead)}")
        print(f"outcomes: {dict(sorted(worker.outcomes.items()))}")
        print(
            f"took {took_s:.2f} s; one task per call would take at least "
            f"{ROWS * STATEMENT_S / 2:.0f} s on 2 threads"
        )
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
