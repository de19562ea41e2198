"""Wake messages: a thread that listens on a queue's wake channel (Redis Pub/Sub).

The scripts that can move a queue's head earlier (schedule, fail, release, reschedule, replay)
publish the new head's due time on ``dueq:{<queue>}:wake``. A sleeping consumer that hears it
claims at once instead of waiting for the time it computed. A lost message costs at most one
heartbeat: after every (re)subscription the listener wakes its consumer, in case something was
scheduled while it was not listening.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .outage import Backoff, is_outage

if TYPE_CHECKING:
    from .queue import Queue

logger = logging.getLogger(__name__)

#: How long one read waits for a message; bounds how long ``stop`` takes to be noticed.
POLL_S = 0.5


class WakeListener:
    """Calls ``on_wake()`` for each message on the queue's wake channel, until ``stop()``."""

    def __init__(self, queue: Queue, on_wake: Callable[[], None]) -> None:
        self._queue = queue
        self._on_wake = on_wake
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"dueq-wake-{queue.name}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end (within POLL_S); does not wait for it."""
        self._stopped.set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        backoff = Backoff()
        pubsub: Any = None
        try:
            while not self._stopped.is_set():
                try:
                    if pubsub is None:
                        pubsub = self._queue.redis.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
                        pubsub.subscribe(*self._queue._wake_channels())
                        if backoff.succeeded():
                            logger.info("queue %r: wake channel back", self._queue.name)
                        self._on_wake()  # anything scheduled while we were not listening
                    message = pubsub.get_message(timeout=POLL_S)
                except Exception as exc:
                    if self._stopped.is_set():
                        return  # e.g. the client was closed right after the consumer stopped
                    if not is_outage(exc):
                        logger.exception("queue %r: wake listener stopped", self._queue.name)
                        return  # the consumer still wakes at its computed times and heartbeat
                    _close(pubsub)
                    pubsub = None
                    delay_s = backoff.failed()
                    logger.debug("queue %r: wake channel down (%s)", self._queue.name, exc)
                    self._stopped.wait(delay_s)
                    continue
                if message is not None and message.get("type") == "message":
                    self._on_wake()
        finally:
            _close(pubsub)


def _close(pubsub: Any) -> None:
    if pubsub is not None:
        try:
            pubsub.close()
        except Exception:  # closing a broken connection may raise; nothing to do about it
            logger.debug("error closing the wake subscription", exc_info=True)
