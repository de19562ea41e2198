"""Durable steps: an order flow that charges a card, e-mails the customer, waits for the
warehouse's "shipped" signal and follows up, surviving a worker that stops halfway
(docs/durable.md).

Each ``ctx.step`` body runs until it succeeds and its result is committed under the lease;
a later run of the task (after a failure, a crash, a deploy) gets the stored result without
running the body again. ``ctx.wait_for`` and ``ctx.sleep`` hand the task back: while it waits
no worker, thread or connection holds it, so this script stops its first worker there, sends
the signal, and a second worker finishes the order.

Runs on an embedded redis-server unless you pass --redis-url. Run:
    .venv/bin/python examples/durable_order.py
"""

from __future__ import annotations

import argparse
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import dueq
from dueq.server import RedisServer

#: How many times each step's body ran, counted outside Redis.
ran: Counter[str] = Counter()
#: The idempotency keys the payment provider saw (one per charge, however often it ran).
charges: set[str] = set()


def charge_card(order_id: str, cents: int, key: str) -> dict[str, Any]:
    ran["charge"] += 1
    charges.add(key)
    if ran["charge"] == 1:
        raise ConnectionError("payment provider timed out")  # retried, the same key again
    return {"charge_id": f"ch_{order_id}", "cents": cents}


def send_email(to: str, subject: str) -> str:
    ran[subject] += 1
    return f"sent {subject!r} to {to}"


def build(url: str) -> dueq.Queue:
    q = dueq.Queue.from_url(
        url, "orders", retry=dueq.RetryPolicy(max_attempts=5, wait=lambda state: 0.2)
    )
    q.configure(keep_results=3600)  # keep each finished order's result and steps an hour

    @q.task(name="fulfil_order", durable=True)
    def fulfil_order(ctx: dueq.StepContext, order_id: str, email: str, cents: int) -> dict:
        charge = ctx.step(
            "charge", lambda: charge_card(order_id, cents, key=ctx.step_id)
        )  # ctx.step_id: the same on every run of this step
        ctx.step("confirmation", send_email, email, "order confirmed")
        shipped = ctx.wait_for("shipped", timeout=30)  # no worker held while it waits
        if shipped is None:
            ctx.step("apology", send_email, email, "order delayed")
            return {"order": order_id, "status": "delayed", "charge": charge["charge_id"]}
        ctx.sleep(0.5)  # a short pause before asking for a review (days, in real life)
        ctx.step("review", send_email, email, "how was it?")
        return {"order": order_id, "status": "shipped", "tracking": shipped["tracking"]}

    return q


def until(check: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up waiting for {what}")
        time.sleep(0.05)


def run_worker(q: dueq.Queue, check: Callable[[], bool], what: str) -> dict[str, int]:
    worker = dueq.Worker(q, concurrency=2)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        until(check, what)
    finally:
        worker.stop()
        thread.join()
    return dict(worker.outcomes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url")
    args = parser.parse_args()
    server = None if args.redis_url else RedisServer().start()
    url = args.redis_url or server.url  # type: ignore[union-attr]
    try:
        q = build(url)
        tid = q.tasks["fulfil_order"].schedule(
            order_id="A-1001", email="ada@example.com", cents=4200, id="order:A-1001"
        )

        def waiting() -> bool:
            info = q.get(tid)
            return info is not None and info.state == "waiting"

        outcomes = run_worker(q, waiting, "the order to wait for its signal")
        print("first worker:", dict(sorted(outcomes.items())))
        info = q.get(tid)
        assert info is not None
        print("while waiting:", info.state, "leased now:", q.stats().leased)
        for step in info.steps:
            print(
                f"  step {step.position} {step.kind} {step.name!r}: {step.state}, runs={step.runs}"
            )

        q.signal(tid, "shipped", {"tracking": "1Z999"})  # from the warehouse's process

        def ended() -> bool:
            found = q.get(tid)
            return found is not None and found.state == "done"

        outcomes = run_worker(q, ended, "the order to finish")
        print("second worker:", dict(sorted(outcomes.items())))
        done = q.get(tid)
        assert done is not None
        print("result:", done.result)
        print("bodies ran:", dict(sorted(ran.items())))
        print("charges with distinct idempotency keys:", len(charges))
        q.close()
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
