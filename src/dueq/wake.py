"""Wake messages: a thread that listens on a queue's wake channel (Redis Pub/Sub).

The scripts that can move a queue's head earlier (schedule, fail, release, reschedule, replay)
publish the new head's due time on ``dueq:{<queue>}:wake``. A sleeping consumer that hears it
claims at once instead of waiting for the time it computed. A lost message costs at most one
heartbeat: after every (re)subscription the listener wakes its consumer, in case something was
scheduled while it was not listening.

Sharded Pub/Sub. On Redis >= 7.0 the scripts publish with SPUBLISH (``publish_wake`` in
_prelude.lua) and consumers listen with SSUBSCRIBE: in a Cluster a shard message stays on the
nodes that serve its channel's slot (the queue's own), where a classic PUBLISH is forwarded to
every node of the cluster, so wake traffic grows with the cluster instead of with each node's
share of it. Both sides choose by the server's version, so they agree: a 6.2 server has only
PUBLISH/SUBSCRIBE. (A script whose ACL user lacks ``+spublish`` falls back to PUBLISH, which
SSUBSCRIBEd consumers do not hear: they then wake at their computed times and heartbeats;
``dueq acl`` grants both.) A sharded queue's consumer subscribes to every shard's channel;
redis-py's cluster client holds one connection per node for them, read in turn
(``SHARDED_POLL_S`` each), so a message waits at most that long per other node.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from .outage import Backoff, describe, is_outage

if TYPE_CHECKING:
    from .queue import Queue

logger = logging.getLogger(__name__)

#: How long one read waits for a message; bounds how long ``stop`` takes to be noticed.
POLL_S = 0.5
#: How long one read waits on each node of a Cluster's sharded subscription (read in turn).
SHARDED_POLL_S = 0.05
#: The first Redis version with SPUBLISH/SSUBSCRIBE.
SHARDED_PUBSUB_VERSION = (7, 0)
#: Message types that carry a wake (classic and sharded Pub/Sub).
WAKE_TYPES = frozenset({"message", "smessage"})


@dataclass(frozen=True)
class WakeSubscription:
    """What a consumer subscribes to: the queue's wake channels (one per shard), and whether
    by SSUBSCRIBE (``sharded``) or SUBSCRIBE."""

    channels: tuple[str, ...]
    sharded: bool


def sharded_pubsub(version: tuple[int, ...] | None) -> bool:
    """Whether a server of ``version`` has sharded Pub/Sub (an unreadable version is taken to
    be a current one: dueq's scripts try SPUBLISH first either way)."""
    return version is None or version >= SHARDED_PUBSUB_VERSION


def subscribe_args(subscription: WakeSubscription) -> tuple[str, tuple[str, ...]]:
    """The pubsub method (``ssubscribe`` or ``subscribe``) and its channels."""
    return ("ssubscribe" if subscription.sharded else "subscribe"), subscription.channels


def read_call(pubsub: Any, subscription: WakeSubscription) -> tuple[str, dict[str, Any]]:
    """The pubsub method and keywords that read the next message: a Cluster's sharded
    subscription spans a connection per node, read by ``get_sharded_message``."""
    if subscription.sharded and hasattr(pubsub, "get_sharded_message"):
        return "get_sharded_message", {"ignore_subscribe_messages": True, "timeout": SHARDED_POLL_S}
    return "get_message", {"timeout": POLL_S}


def check_subscribed(pubsub: Any, subscription: WakeSubscription) -> None:
    """ConnectionError when a Cluster's sharded subscription holds no node any more (its
    nodes went away in a failover or a slot move): reading it would return at once, a busy
    loop, so the listener subscribes again after its outage backoff instead."""
    cluster = subscription.sharded and hasattr(pubsub, "get_sharded_message")
    if cluster and not getattr(pubsub, "node_pubsub_mapping", True):
        raise redis.ConnectionError("the sharded wake subscription holds no node")


def is_wake(message: Any) -> bool:
    """Whether a read message is a wake (not a subscribe confirmation or nothing)."""
    return message is not None and message.get("type") in WAKE_TYPES


class WakeRules:
    """The wake listener's decisions, written once for ``WakeListener`` (a thread) and the
    asyncio consumer's listener task (``dueq._async_consume``), which only do the I/O:
    subscribe (``subscribe_args``), read (``read_call``, ``check_subscribed``), hand each
    wake on (``is_wake``), and on an error close and ask ``failed`` how long to back off."""

    def __init__(self, queue_name: str) -> None:
        self.queue_name = queue_name
        self._backoff = Backoff()

    def subscribed(self) -> None:
        """A (re)subscription is made (the listener then wakes its consumer once, in case
        something was scheduled while it was not listening)."""
        if self._backoff.succeeded():
            logger.info("queue %r: wake channel back", self.queue_name)

    def failed(self, exc: Exception) -> float | None:
        """Subscribing or reading raised ``exc``: seconds to wait before subscribing again
        (an outage), or None when the listener stops (anything else; its consumer still
        wakes at its computed times and heartbeat)."""
        if not is_outage(exc):
            logger.error("queue %r: wake listener stopped", self.queue_name, exc_info=exc)
            return None
        delay_s = self._backoff.failed()
        logger.debug(
            "queue %r: wake channel down (%s); subscribing again in %.2f s",
            self.queue_name,
            describe(exc),
            delay_s,
        )
        return delay_s


def close_failed() -> None:
    """Log a subscription that raised as it was closed (broken, or slow to close)."""
    logger.debug("error closing the wake subscription", exc_info=True)


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
        rules = WakeRules(self._queue.name)
        pubsub: Any = None
        try:
            while not self._stopped.is_set():
                try:
                    if pubsub is None:
                        subscription = self._queue.wake_subscription()
                        pubsub = self._queue.redis.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
                        method, channels = subscribe_args(subscription)
                        getattr(pubsub, method)(*channels)
                        read, read_kwargs = read_call(pubsub, subscription)
                        rules.subscribed()
                        self._on_wake()  # anything scheduled while we were not listening
                    check_subscribed(pubsub, subscription)
                    message = getattr(pubsub, read)(**read_kwargs)
                except Exception as exc:  # the rules decide: an outage's backoff, or the end
                    if self._stopped.is_set():
                        return  # e.g. the client was closed right after the consumer stopped
                    delay_s = rules.failed(exc)
                    if delay_s is None:
                        return
                    _close(pubsub)
                    pubsub = None
                    self._stopped.wait(delay_s)
                    continue
                if is_wake(message):
                    self._on_wake()
        finally:
            _close(pubsub)


def _close(pubsub: Any) -> None:
    if pubsub is not None:
        try:
            pubsub.close()
        except Exception:  # closing a broken connection may raise; nothing to do about it
            close_failed()
