"""The examples run to completion and show what they promise."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import importlib.util
import re
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

import pytest
from paths_support import EXAMPLES

import dueq


def run_example(name: str, *args: str, timeout: float = 60) -> str:
    """Run an example to completion; its stdout. An example still running after ``timeout``
    seconds fails the test with what it printed so far."""
    try:
        result = subprocess.run(
            [sys.executable, str(EXAMPLES / name), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
        )
    except subprocess.TimeoutExpired as exc:
        printed = [
            x.decode(errors="replace") if isinstance(x, bytes) else x or ""
            for x in (exc.stdout, exc.stderr)
        ]
        pytest.fail(f"{name} still ran after {timeout:g} s; it printed:\n{printed[0]}{printed[1]}")
    return result.stdout


def test_quickstart_retries_buries_and_replays(redis_server):
    out = run_example("quickstart.py", "--redis-url", redis_server.url)
    assert "added=0 existing=1" in out
    assert "acked    email:flaky  attempt 3" in out
    assert "dead     email:poison attempt 3" in out
    assert out.count("ValueError: mailbox does not exist") == 3
    assert "acked    email:poison attempt 1" in out  # replayed with attempts reset


@pytest.mark.timeout(150)  # above run_example's 120 s, so a slow run fails with its output
def test_service_processes_retries_and_buries_through_the_observable(redis_server):
    out = run_example(
        "service.py", "--redis-url", redis_server.url, timeout=120
    )  # exits 0 once all 60 are acked or dead
    summary = ast.literal_eval(out.split("outcomes: ", 1)[1].splitlines()[0])
    assert summary["acked"] + summary["dead"] == 60
    assert summary["retried"] > 0  # 30% of attempts fail; none failing is a 1e-9 chance
    assert "dead: hook:13 after 1 attempt(s): unsupported scheme" in out
    assert "queue: scheduled=0 leased=0" in out


def test_cron_example_fires_each_slot_once_through_the_clock_change(redis_server):
    out = run_example("cron.py", "--redis-url", redis_server.url)  # exits 1 on a double run
    assert "ran cron:nightly-report:20260329T010000Z (attempt 1)" in out  # 02:30 -> 03:00 CEST
    assert "ran cron:sync:20260328T090000Z (attempt 3)" in out
    assert "288 sync runs in 72 hours" in out
    assert len(set(re.findall(r"worker (\d):", out))) > 1  # the three workers shared the work


#: The Spark example's bound: its own local session (a JVM) and two small jobs took 78 s alone
#: on a loaded 2-core machine, over 120 s in a test run there.
SPARK_EXAMPLE_S = 240


@pytest.mark.timeout(SPARK_EXAMPLE_S + 30)
def test_spark_reminders_are_due_at_nine_local_time_once(r, redis_server):
    pytest.importorskip("pyspark", reason="pyspark is not installed: pip install 'dueq[spark]'")
    out = run_example(
        "spark_reminders.py",
        *("--redis-url", redis_server.url, "--date", "2030-01-15"),
        timeout=SPARK_EXAMPLE_S,
    )
    assert "first run: added=5 existing=0 bad=1 {'due': 1}" in out
    assert "second run: added=0 existing=5 bad=1" in out
    assert "bo    2030-01-15 14:00 UTC = 09:00 America/New_York" in out
    assert "eli   2030-01-14 20:00 UTC = 09:00 Pacific/Auckland" in out
    assert "fay   no reminder" in out


def load_example(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` as a module (registered, so its dataclasses and pydantic
    models resolve their annotations)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def fastapi_example() -> ModuleType:
    pytest.importorskip("fastapi", reason="the FastAPI example needs the dev extra")
    return load_example("fastapi_app")


def mail_service(received: list[dict[str, Any]], seen_on: list[Any]) -> Any:
    """The test's own webhook receiver (not the example's): records each body it gets, and the
    loop and thread it was called on (through ASGITransport: the caller's)."""
    from fastapi import FastAPI

    mail = FastAPI()

    @mail.post("/hook")
    async def hook(body: dict[str, Any]) -> dict[str, bool]:
        received.append(body)
        seen_on.append((asyncio.get_running_loop(), threading.current_thread()))
        return {"sent": True}

    return mail


@contextlib.asynccontextmanager
async def serve_example(redis_url: str, mail: Any, **settings: Any) -> AsyncIterator[Any]:
    """The example app with its lifespan running on this loop, webhooks going to ``mail``;
    yields an httpx client that calls it in-process (httpx.ASGITransport)."""
    import httpx

    example = fastapi_example()
    app = example.create_app(
        example.Settings(
            redis_url=redis_url,
            webhook_url="http://mail.test/hook",
            webhook_transport=httpx.ASGITransport(app=mail),
            **settings,
        )
    )
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://app.test") as client,
    ):
        yield client


async def until_gone(client: Any, path: str) -> None:
    while (await client.get(path)).status_code != 404:
        await asyncio.sleep(0.02)


def test_fastapi_example_schedules_from_a_request_and_sends_once_from_the_same_loop(
    r, redis_server
):
    received: list[dict[str, Any]] = []
    seen_on: list[Any] = []
    mail = mail_service(received, seen_on)

    async def main() -> dict[str, Any]:
        settings = {"reminder_delay_s": 1.0, "queue": "fastapi-example"}
        async with serve_example(redis_server.url, mail, **settings) as client:
            reply = await client.post("/signup", json={"email": "ada@example.com"})
            assert reply.status_code == 202, reply.text
            task_id = reply.json()["task_id"]
            before = (await client.get(f"/tasks/{task_id}")).json()
            again = await client.post("/signup", json={"email": "ada@example.com"})
            assert again.json()["task_id"] == task_id  # a retried request adds nothing
            bad = await client.post("/signup", json={"email": "not an address"})
            await asyncio.wait_for(until_gone(client, f"/tasks/{task_id}"), 20)
        loop = asyncio.get_running_loop()  # the app's, the requests' and the test's
        return {"id": task_id, "before": before, "bad": bad.status_code, "loop": loop}

    result = asyncio.run(main())
    task_id = result["id"]
    assert task_id == "reminder:ada@example.com"
    before = result["before"]
    assert (before["id"], before["state"], before["attempt"]) == (task_id, "scheduled", 0)
    assert before["payload"] == {"email": "ada@example.com", "template": "welcome-reminder"}
    assert before["queue"] == "fastapi-example" and before["due_at"].endswith("Z")  # to_json
    assert result["bad"] == 422
    assert received == [
        {
            "task_id": task_id,
            "attempt": 1,
            "email": "ada@example.com",
            "template": "welcome-reminder",
        }
    ]
    # sent by the worker's handler on the app's loop (ASGITransport runs the receiver in its
    # caller's task), on this thread: no loop or thread of dueq's own
    assert seen_on == [(result["loop"], threading.current_thread())]
    stats = dueq.Queue("fastapi-example", r).stats()  # after shutdown: nothing left behind
    assert (stats.scheduled, stats.leased, stats.dead) == (0, 0, 0)
    assert stats.counters.get("acked") == 1 and "retried" not in stats.counters


def test_fastapi_example_health_answers_while_a_signup_waits_for_a_paused_redis(
    admin, redis_server
):
    mail = mail_service([], [])

    async def main() -> tuple[float, bool, int]:
        async with serve_example(redis_server.url, mail, queue="fastapi-paused") as client:
            await client.post("/signup", json={"email": "warm@example.com"})  # connected
            admin.execute_command("CLIENT", "PAUSE", 1000, "WRITE")  # as a failover does
            paused = time.monotonic()
            signup = asyncio.create_task(client.post("/signup", json={"email": "b@example.com"}))
            await asyncio.sleep(0.05)  # the schedule is in flight, held by Redis
            health = await client.get("/health")
            in_flight = not signup.done()  # /health answered while the schedule waited
            assert health.json() == {"status": "ok"}
            reply = await signup
            signup_s = time.monotonic() - paused
        return signup_s, in_flight, reply.status_code

    signup_s, in_flight, status = asyncio.run(main())
    assert signup_s >= 0.5  # the schedule really waited for Redis...
    assert in_flight and status == 202  # ...and /health did not wait behind it


def test_fastapi_example_self_test_runs_without_a_web_server():
    fastapi_example()
    out = run_example("fastapi_app.py", "--self-test")  # embedded Redis; exits 1 on failure
    assert "GET /tasks/reminder:ada@example.com -> state=scheduled" in out
    assert "webhook received {'task_id': 'reminder:ada@example.com', 'attempt': 1" in out
    assert "-> 404 (sent and acked)" in out
    assert "/signup still waiting: True" in out
    assert out.rstrip().endswith("self-test passed")


def test_flow_control_example_limits_tenants_runs_urgent_first_and_times_out(redis_server):
    out = run_example("flow_control.py", "--redis-url", redis_server.url)
    assert "while paused, handlers started: 0" in out
    assert "outcomes: {'acked': 28, 'dead': 1}" in out
    assert "first started: urgent" in out
    most = ast.literal_eval(out.split("most sends at once per tenant: ", 1)[1].splitlines()[0])
    assert most["tenant:big"] <= 2 and most["tenant:small"] <= 2
    position = int(re.search(r"small tenant done starting at position (\d+)", out).group(1))
    assert position < 24  # not behind the big tenant's 24 tasks
    assert "dead: hangs: TaskTimeout: handler ran past its timeout of 0.3 s" in out


@contextlib.contextmanager
def uvicorn_example(redis_url: str, **env: str) -> Any:
    """``uvicorn fastapi_app:app`` as a user runs it, on a free port other than 8000; yields
    (base URL, the process) and stops it (SIGTERM) on the way out."""
    import os
    import socket

    pytest.importorskip("uvicorn")
    fastapi_example()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    assert port != 8000
    child = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "fastapi_app:app", "--port", str(port)],
        cwd=EXAMPLES,
        env={**os.environ, "DUEQ_REDIS_URL": redis_url, "REMINDER_DELAY_S": "0.2", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        serving(base, child)
        yield base, child
    finally:
        if child.poll() is None:
            child.terminate()
        try:
            child.communicate(timeout=30)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()


#: How long uvicorn may take to answer /health: importing FastAPI, uvicorn and dueq took over
#: 20 s in a full run on a loaded 2-core machine. An upper bound, never a measurement.
SERVER_START_S = 120


def serving(base: str, child: subprocess.Popen[str]) -> None:
    """Return once ``base``/health answers 200; fail at once, with uvicorn's output, if the
    process ended, or after ``SERVER_START_S`` of a start that never finished."""
    import httpx

    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        if child.poll() is not None:
            out, err = child.communicate()
            pytest.fail(f"uvicorn exited with {child.returncode} before serving:\n{out}{err}")
        try:
            if httpx.get(f"{base}/health").status_code == 200:
                return
        except httpx.TransportError:  # not listening yet
            pass
        time.sleep(0.05)
    pytest.fail(f"uvicorn did not answer {base}/health within {SERVER_START_S} s")


def wait_until(condition: Any, what: str, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except Exception:  # httpx.TransportError, OSError: the server is not listening yet
            pass
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.timeout(SERVER_START_S + 60)
def test_fastapi_example_under_uvicorn_on_another_port_sends_its_reminders(r, redis_server):
    import httpx

    with uvicorn_example(redis_server.url) as (base, _child):
        reply = httpx.post(f"{base}/signup", json={"email": "ada@example.com"})
        assert reply.status_code == 202, reply.text
        q = dueq.Queue("signup-reminders", r)
        wait_until(lambda: q.stats().counters.get("acked") == 1, "the reminder acked")
    stats = dueq.Queue("signup-reminders", r).stats()
    assert "retried" not in stats.counters and stats.dead == 0


@pytest.mark.timeout(SERVER_START_S + 60)
def test_fastapi_example_under_uvicorn_prints_a_failing_webhook(r, redis_server):
    import httpx

    closed = "http://127.0.0.1:9/nothing-listens-here"  # the discard port: refused
    with uvicorn_example(redis_server.url, REMINDER_WEBHOOK_URL=closed) as (base, child):
        httpx.post(f"{base}/signup", json={"email": "bo@example.com"})
        q = dueq.Queue("signup-reminders", r)
        wait_until(lambda: q.stats().counters.get("retried") == 1, "a failed attempt")
        child.terminate()
        _, err = child.communicate(timeout=30)
    failed = [line for line in err.splitlines() if "attempt 1 failed (retried)" in line]
    assert len(failed) == 1, err
    assert "task 'reminder:bo@example.com'" in failed[0]
    assert closed in failed[0]  # the error names the webhook it could not reach


def test_named_tasks_example_dispatches_by_name_and_buries_an_unknown_name(redis_server):
    out = run_example("named_tasks.py", "--redis-url", redis_server.url)
    assert "registered: send_digest, send_welcome" in out
    assert "refused: " in out and "missing a required argument: 'to'" in out
    assert "ran: welcome ada@example.com (Ada)" in out
    assert "ran: welcome bob@example.com (no name)" in out
    assert "ran: digest ada@example.com: 3 item(s)" in out
    assert "handler got: [{'ping': True}]" in out
    assert "dead: invoice:1 (send_invoice): UnknownTask: no task named 'send_invoice'" in out
    assert "outcomes: {'acked': 4, 'dead': 1}" in out


def test_durable_order_example_goes_on_from_its_first_unfinished_step_after_a_stopped_worker(
    redis_server,
):
    out = run_example("durable_order.py", "--redis-url", redis_server.url)
    assert "while waiting: waiting leased now: 0" in out
    assert "step 0 step 'charge': done, runs=2" in out
    assert "step 2 wait 'shipped': waiting, runs=1" in out
    assert "result: {'order': 'A-1001', 'status': 'shipped', 'tracking': '1Z999'}" in out
    # each body ran once after it succeeded: the charge failed once, nothing ran again
    assert "bodies ran: {'charge': 2, 'how was it?': 1, 'order confirmed': 1}" in out
    assert "charges with distinct idempotency keys: 1" in out


def test_fair_tenants_keeps_small_tenants_out_of_the_noisy_neighbours_backlog(redis_server):
    out = run_example("fair_tenants.py", "--redis-url", redis_server.url, timeout=120)
    waits = {
        mode: int(median)
        for mode, median in re.findall(r"fairness (on|off) *: .* waited for (\d+) bulk", out)
    }
    assert set(waits) == {"on", "off"}, out
    # without fairness a small tenant waits for most of the 6,000; with it, for what the
    # worker had already claimed (its hold), whatever the speed of the machine
    assert waits["off"] > 2 * waits["on"], out
    gold, bulk = map(int, re.findall(r"gold (\d+), bulk (\d+)", out)[0])
    assert gold + bulk == 1000 and abs(gold - 750) <= 8, out  # 3 : 1, within two turns of 4


def test_bulk_insert_writes_rows_in_few_statements_and_fails_bad_rows_alone(redis_server):
    out = run_example("bulk_insert.py", "--redis-url", redis_server.url, timeout=120)
    written, total, statements = map(
        int, re.findall(r"rows written: (\d+) of (\d+) in (\d+)", out)[0]
    )
    assert (written, total) == (4995, 5000), out
    assert statements <= 60, out  # thousands of rows per statement, not one
    assert "dead rows: ['row-1007', 'row-2007', 'row-3007', 'row-4007', 'row-7']" in out
    assert "'acked': 4995" in out and "'dead': 5" in out, out
