"""Bounded polling for tests: wait for something that takes milliseconds when all is well."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

WAIT_S = 30  # an upper bound, never a measurement


def wait_for(condition: Callable[[], Any], what: str, wait_s: float = WAIT_S) -> Any:
    """The first truthy value of ``condition()``, polled every 20 ms; AssertionError naming
    ``what`` after ``wait_s`` seconds."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def when_still(
    read: Callable[[], int], own: int, window_s: float = 0.3, wait_s: float = WAIT_S
) -> int:
    """``read()`` once it has moved by no more than ``own`` (what reading it adds, e.g. 1 for
    an INFO counted in total_commands_processed) over ``window_s``: a consumer that is done
    starting up (its first claims, and the claim its wake listener asks for once subscribed,
    which a fixed 0.5 s sleep once missed in a loaded full run). AssertionError after
    ``wait_s`` seconds of movement."""
    deadline = time.monotonic() + wait_s
    last = read()
    while time.monotonic() < deadline:
        time.sleep(window_s)
        now = read()
        if now - last <= own:
            return now
        last = now
    raise AssertionError(f"still moving after {wait_s} s")


async def when_still_async(
    read: Callable[[], int], own: int, window_s: float = 0.3, wait_s: float = WAIT_S
) -> int:
    """``when_still`` for a test on an event loop: the waits are awaited, so the loop's own
    consumers run meanwhile."""
    deadline = time.monotonic() + wait_s
    last = read()
    while time.monotonic() < deadline:
        await asyncio.sleep(window_s)
        now = read()
        if now - last <= own:
            return now
        last = now
    raise AssertionError(f"still moving after {wait_s} s")


class Blocker:
    """Handlers for consumer tests that record each task's id (``seen``) and hold the task
    ``blocker`` until ``go_on`` is set (``running`` tells that it started): what waits behind
    it is held by the consumer, unstarted. ``handler("sync")`` blocks its thread;
    ``handler("async")`` awaits (the loop goes on)."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.running = threading.Event()
        self.go_on = threading.Event()

    def sync(self, d: Any) -> None:
        self.seen.append(d.id)
        if d.id == "blocker":
            self.running.set()
            self.go_on.wait(WAIT_S)

    async def run_async(self, d: Any) -> None:
        self.seen.append(d.id)
        if d.id == "blocker":
            self.running.set()
            while not self.go_on.is_set():
                await asyncio.sleep(0.01)

    def handler(self, kind: str) -> Callable[[Any], Any]:
        return self.run_async if kind == "async" else self.sync
