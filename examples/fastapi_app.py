"""A FastAPI service that schedules reminders and sends them, in one process on one event loop.

- ``POST /signup`` schedules a reminder with ``await queue.schedule(..., delay=...)`` and
  answers with its task id at once. The id is derived from the e-mail address, so a retried
  request schedules nothing twice (an existing id is left alone).
- An ``AsyncWorker`` started in the app's lifespan consumes the queue on the same loop as the
  request handlers. Its ``async def`` handler POSTs each reminder to a webhook with the app's
  shared ``httpx.AsyncClient`` (also created in the lifespan): no thread, no second loop, so
  the handler can use any object of the application. A webhook that fails (a non-2xx answer,
  a timeout) fails the attempt, which the queue retries with backoff and finally buries in
  its dead-letter queue. At shutdown the worker is stopped and awaited: handlers that are
  running get ``grace`` seconds, tasks not started go back to the queue for the next process.
- ``GET /tasks/{id}`` shows a task in its JSON form (``info.to_json``, docs/json.md), 404
  once it is done.
- ``GET /health`` never touches Redis, and nothing blocks the loop: while Redis stalls (a
  failover pauses writes for seconds), ``/signup`` waits for it and ``/health`` answers at
  once.

The worker runs with ``handle_signals=False``: the web server owns SIGINT/SIGTERM and runs
the lifespan's shutdown, which stops the worker.

Settings come from the environment (``DUEQ_REDIS_URL``; ``REMINDER_WEBHOOK_URL``;
``REMINDER_DELAY_S``) or the command line. Without a Redis URL an embedded redis-server (a
throwaway process on a free loopback port) is started. Without ``REMINDER_WEBHOOK_URL`` the
webhook is this app's own ``/demo/reminders`` route, which stands in for a mail service and
only logs what it gets; its address is learned from the requests: the address and port the
server accepted them on (the ASGI ``server``, not the client's ``Host`` header, which would
let a caller send the reminders anywhere), so ``uvicorn --port 9000`` works as well as 8000.
A reminder due before the first request is retried until then.

Failures show: a webhook that fails raises ``WebhookFailed`` naming the URL, and the worker
logs each failed attempt (task id, attempt, error). Under uvicorn, which configures only its
own ``uvicorn*`` loggers, those lines go to stderr by dueq's fallback (docs/worker-output.md);
configure logging (``--log-config``) to route them elsewhere.

Run (uvicorn is optional: ``pip install uvicorn``):
    uvicorn examples.fastapi_app:app                 # from the repository root
    .venv/bin/python examples/fastapi_app.py         # the same, on 127.0.0.1:8000
    .venv/bin/python examples/fastapi_app.py --self-test   # no uvicorn needed: a scripted
                                                      # demo through httpx.ASGITransport
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import redis.asyncio
import tenacity
from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel, Field

import dueq
from dueq.server import RedisServer

logger = logging.getLogger("fastapi_app")

#: The demo mail service's route, on whichever address the server listens on.
DEMO_WEBHOOK_PATH = "/demo/reminders"


class WebhookFailed(Exception):
    """A reminder's webhook did not take it (the attempt fails and is retried)."""


@dataclass
class Settings:
    """What the service needs to know; ``from_env`` reads it from the environment."""

    redis_url: str | None = None  # None: start an embedded redis-server
    webhook_url: str | None = None  # None: this app's demo route, at the server's address
    reminder_delay_s: float = 24 * 3600.0
    queue: str = "signup-reminders"
    concurrency: int = 32  # webhooks in flight at once
    grace_s: float = 10.0  # at shutdown, how long running webhooks may take to finish
    #: Where the webhook client sends its requests: None for the network; an
    #: ``httpx.ASGITransport`` to call an ASGI app in-process (the self-test and the tests).
    webhook_transport: httpx.AsyncBaseTransport | None = None

    @classmethod
    def from_env(cls) -> Settings:
        return cls(
            redis_url=os.environ.get("DUEQ_REDIS_URL") or None,
            webhook_url=os.environ.get("REMINDER_WEBHOOK_URL") or None,
            reminder_delay_s=float(os.environ.get("REMINDER_DELAY_S", cls.reminder_delay_s)),
        )


class Signup(BaseModel):
    email: str = Field(pattern=r"^[^@\s]+@[^@\s]+$", max_length=254)


class Scheduled(BaseModel):
    task_id: str
    due_in_s: float


def create_app(settings: Settings) -> FastAPI:
    """The service. The queue, the Redis client and the webhook client live in the lifespan
    (``app.state``), so nothing connects when the module is imported."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        server = None
        redis_url = settings.redis_url
        if redis_url is None:
            server = await asyncio.to_thread(RedisServer().start)  # blocking: off the loop
            redis_url = server.url
            logger.info("embedded redis-server on %s", redis_url)
        redis_client = redis.asyncio.Redis.from_url(redis_url)
        http = httpx.AsyncClient(transport=settings.webhook_transport, timeout=10.0)
        queue = dueq.AsyncQueue(
            settings.queue,
            redis_client,
            retry=dueq.RetryPolicy(
                max_attempts=8,  # over about 10 minutes, then dead (kept for replay)
                wait=tenacity.wait_exponential(multiplier=5, max=300) + tenacity.wait_random(0, 5),
            ),
            lease=60.0,  # longer than the webhook timeout; the worker extends it anyway
        )

        async def send_reminder(delivery: dueq.AsyncDelivery) -> None:
            """The handler: runs on this loop and uses the app's HTTP client. Returning acks
            the task; raising (``raise_for_status``, a timeout) fails the attempt."""
            url = settings.webhook_url or app.state.webhook_url
            if url is None:
                raise WebhookFailed("no webhook yet: set REMINDER_WEBHOOK_URL, or send a request")
            body = {"task_id": delivery.id, "attempt": delivery.attempt, **delivery.payload}
            try:
                response = await http.post(url, json=body)
                response.raise_for_status()
            except httpx.HTTPError as exc:  # the worker logs it with the task id and attempt
                raise WebhookFailed(f"POST {url}: {type(exc).__name__}: {exc}") from exc

        worker = dueq.AsyncWorker(
            queue,
            send_reminder,
            concurrency=settings.concurrency,
            grace=settings.grace_s,
            handle_signals=False,  # the web server owns the signals and runs our shutdown
        )
        running = asyncio.create_task(worker.run())
        app.state.queue = queue
        app.state.webhook_url = settings.webhook_url
        try:
            yield
        finally:
            worker.stop()  # no new tasks; running webhooks get the grace period
            try:
                await running  # raises the error that ended the worker, if one did
            finally:
                await http.aclose()
                await redis_client.aclose()
                if server is not None:
                    await asyncio.to_thread(server.stop)

    app = FastAPI(title="signup reminders (dueq example)", lifespan=lifespan)

    def queue_of(request: Request) -> dueq.AsyncQueue:
        queue: dueq.AsyncQueue = request.app.state.queue
        return queue

    @app.post("/signup", status_code=202)
    async def signup(body: Signup, request: Request) -> Scheduled:
        if request.app.state.webhook_url is None:
            request.app.state.webhook_url = own_webhook_url(request)
        task_id = await queue_of(request).schedule(
            {"email": body.email, "template": "welcome-reminder"},
            id=f"reminder:{body.email.lower()}",
            delay=settings.reminder_delay_s,
        )
        return Scheduled(task_id=task_id, due_in_s=settings.reminder_delay_s)

    @app.get("/tasks/{task_id}")
    async def task(task_id: str, request: Request) -> dict[str, Any]:
        queue = queue_of(request)
        info = await queue.get(task_id)
        if info is None:
            raise HTTPException(404, f"no task {task_id!r} (never scheduled, or done)")
        return info.to_json(queue.name)  # the task's one JSON form (docs/json.md)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}  # never touches Redis: an outage is waited out, not fatal

    app.mount("/demo", demo_mail_service([]))
    return app


def own_webhook_url(request: Request) -> str:
    """The demo route at the address and port the server accepted ``request`` on (ASGI
    ``scope["server"]``; a client cannot choose it as it can the ``Host`` header)."""
    server = request.scope.get("server")
    if not server or server[1] is None:  # a Unix socket: the request's own base URL
        return str(request.base_url).rstrip("/") + DEMO_WEBHOOK_PATH
    host, port = server
    host = f"[{host}]" if ":" in host else host  # an IPv6 address
    if host in ("0.0.0.0", "[::]"):  # bound to every address: loopback reaches it
        host = "127.0.0.1"
    return f"http://{host}:{port}{DEMO_WEBHOOK_PATH}"


def demo_mail_service(received: list[dict[str, Any]]) -> FastAPI:
    """Stands in for a mail service: ``POST /reminders`` logs each reminder and appends it
    to ``received``. A real deployment points ``REMINDER_WEBHOOK_URL`` elsewhere."""
    mail = FastAPI()

    @mail.post("/reminders")
    async def reminder(body: dict[str, Any]) -> dict[str, bool]:
        logger.info("reminder for %s (task %s)", body.get("email"), body.get("task_id"))
        received.append(body)
        return {"sent": True}

    return mail


#: The app for ``uvicorn examples.fastapi_app:app``, configured from the environment.
app = create_app(Settings.from_env())


async def self_test(redis_url: str | None) -> int:
    """A scripted demo without a web server: sign up, watch the reminder be sent, and (on the
    embedded Redis only) show /health answering while Redis is paused. Returns the exit status.
    """
    server = None
    if redis_url is None:
        server = await asyncio.to_thread(RedisServer().start)
        redis_url = server.url
    received: list[dict[str, Any]] = []
    settings = Settings(
        redis_url=redis_url,
        webhook_url="http://mail.test/reminders",
        webhook_transport=httpx.ASGITransport(app=demo_mail_service(received)),
        reminder_delay_s=0.5,
        queue="fastapi-self-test",
    )
    service = create_app(settings)
    transport = httpx.ASGITransport(app=service)
    ok = True
    try:
        async with (
            service.router.lifespan_context(service),
            httpx.AsyncClient(transport=transport, base_url="http://service.test") as client,
        ):
            reply = await client.post("/signup", json={"email": "ada@example.com"})
            task_id = reply.json()["task_id"]
            print(f"POST /signup -> {reply.status_code} {reply.json()}")
            info = (await client.get(f"/tasks/{task_id}")).json()
            print(f"GET /tasks/{task_id} -> state={info['state']} due_at={info['due_at']}")
            await asyncio.wait_for(_until(lambda: bool(received)), 20)
            print(f"webhook received {received[0]}")
            await asyncio.wait_for(_until_gone(client, task_id), 20)
            print(f"GET /tasks/{task_id} -> 404 (sent and acked)")
            if server is not None:  # never pause a Redis someone else runs
                ok = await _health_while_paused(client, service.state.queue)
        ok = ok and len(received) == 1
    finally:
        if server is not None:
            await asyncio.to_thread(server.stop)
    print("self-test", "passed" if ok else "FAILED")
    return 0 if ok else 1


async def _health_while_paused(client: httpx.AsyncClient, queue: dueq.AsyncQueue) -> bool:
    """Pause Redis writes for 1 s as a failover does; /signup waits, /health does not."""
    await queue.redis.execute_command("CLIENT", "PAUSE", 1000, "WRITE")
    signup = asyncio.create_task(client.post("/signup", json={"email": "bob@example.com"}))
    await asyncio.sleep(0.1)  # the schedule is now waiting for Redis
    started = time.perf_counter()
    health = await client.get("/health")
    health_ms = (time.perf_counter() - started) * 1000
    waiting = not signup.done()
    print(f"Redis paused: GET /health -> {health.status_code} in {health_ms:.1f} ms; ", end="")
    print(f"/signup still waiting: {waiting}")
    reply = await signup
    print(f"after the pause: POST /signup -> {reply.status_code} {reply.json()}")
    return health.status_code == 200 and health_ms < 500 and waiting and reply.status_code == 202


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.02)


async def _until_gone(client: httpx.AsyncClient, task_id: str) -> None:
    while (await client.get(f"/tasks/{task_id}")).status_code != 404:
        await asyncio.sleep(0.02)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--redis-url", help="use this Redis (default: $DUEQ_REDIS_URL, else embedded)"
    )
    parser.add_argument("--port", type=int, default=8000, help="uvicorn's port on 127.0.0.1")
    parser.add_argument(
        "--self-test", action="store_true", help="run a scripted demo in-process, no server"
    )
    args = parser.parse_args()
    redis_url = args.redis_url or os.environ.get("DUEQ_REDIS_URL") or None
    if args.self_test:
        logging.basicConfig(level=logging.WARNING)
        return asyncio.run(self_test(redis_url))
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        import uvicorn
    except ImportError:
        print(
            "uvicorn is not installed (pip install uvicorn); or run with --self-test",
            file=sys.stderr,
        )
        return 2
    settings = Settings.from_env()
    settings.redis_url = redis_url
    uvicorn.run(create_app(settings), host="127.0.0.1", port=args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
