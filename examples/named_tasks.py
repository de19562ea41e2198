"""Named tasks: register functions on a queue, schedule them by name, run them with a worker
that dispatches by name (docs/named-tasks.md).

A producer that does not import the functions schedules by name; a worker without a handler
runs each task's function with its payload as keyword arguments; a name no worker knows ends
dead with ``UnknownTask``; plain payload tasks still go to a handler.

Runs on an embedded redis-server unless you pass --redis-url. Run:
    .venv/bin/python examples/named_tasks.py
"""

from __future__ import annotations

import argparse
import threading
import time

import dueq
from dueq.server import RedisServer

sent: list[str] = []


def build(url: str) -> dueq.Queue:
    q = dueq.Queue.from_url(url, "mail", retry=dueq.RetryPolicy(max_attempts=3))

    @q.task(name="send_welcome", max_attempts=5, timeout=30)
    def send_welcome(to: str, name: str = "") -> dict[str, str]:
        sent.append(f"welcome {to} ({name or 'no name'})")
        return {"sent": to}

    @q.task(name="send_digest")  # without name=: "module.qualname" of the function
    async def send_digest(to: str, items: int) -> None:
        sent.append(f"digest {to}: {items} item(s)")

    return q


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url")
    args = parser.parse_args()
    server = None if args.redis_url else RedisServer().start()
    url = args.redis_url or server.url  # type: ignore[union-attr]
    try:
        q = build(url)
        send_welcome = q.tasks["send_welcome"]
        print("registered:", ", ".join(sorted(q.tasks)))

        # 1. by the function: keyword arguments are the payload, the rest are options
        send_welcome.schedule(to="ada@example.com", name="Ada", id="welcome:ada")
        # 2. by name, from code that does not import the function
        q.schedule({"to": "bob@example.com"}, task="send_welcome", id="welcome:bob")
        q.tasks["send_digest"].schedule(to="ada@example.com", items=3, id="digest:ada")
        # 3. arguments the signature refuses are refused here, before anything is written
        try:
            send_welcome.schedule(too="typo@example.com")
        except dueq.InvalidTaskError as exc:
            print("refused:", exc)
        # 4. a name no worker knows, and a plain payload task for the handler
        q.schedule({}, task="send_invoice", id="invoice:1", max_attempts=1)
        q.schedule({"ping": True}, id="plain:1")

        plain: list[object] = []
        worker = dueq.Worker(q, lambda d: plain.append(d.payload), concurrency=2)
        thread = threading.Thread(target=worker.run)
        thread.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            stats = q.stats()
            if stats.scheduled == 0 and stats.leased == 0 and stats.dead == 1:
                break
            time.sleep(0.05)
        worker.stop()
        thread.join()

        for line in sorted(sent):
            print("ran:", line)
        print("handler got:", plain)
        dead = q.get("invoice:1")
        assert dead is not None
        print(
            f"dead: {dead.id} ({dead.task_name}): {dead.errors[-1].type}: {dead.errors[-1].message}"
        )
        print("outcomes:", dict(sorted(worker.outcomes.items())))
        q.close()
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
