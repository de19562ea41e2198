"""Wake messages: a thread that listens on a queue's wake channel (Redis Pub/Sub).

The scripts that can move a queue's head earlier (schedule, fail, release, reschedule, replay)
publish the new head's due time on ``dueq:{<queue>}:wake``. A sleeping consumer that hears it
claims at once instead of waiting for the time it computed. A lost message costs at most one
heartbeat: after every (re)subscription the listener wakes its consumer, in case something was
scheduled while it was not listening.

Sharded Pub/Sub. On Redis >= 7.0 the scripts publish with SPUBLISH (``publish_wake`` in
lua/include/wake.lua) and consumers listen with SSUBSCRIBE: in a Cluster a shard message stays on
the nodes that serve its channel's slot (the queue's own), where a classic PUBLISH is forwarded to
every node of the cluster, so wake traffic grows with the cluster instead of with each node's
share of it. Both sides choose by the server's version, so they agree: a 6.2 server has only
PUBLISH/SUBSCRIBE. (A script whose ACL user lacks ``+spublish`` falls back to PUBLISH, which
SSUBSCRIBEd consumers do not hear: they then wake at their computed times and heartbeats;
``dueq acl`` grants both.) A sharded queue's consumer subscribes to every shard's channel;
redis-py's cluster client holds one connection per node for them, read in turn
(``SHARDED_POLL_S`` each), so a message waits at most that long per other node.
"""

from __future__ import annotations

import enum
import logging
import struct
import threading
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import redis

from dueq._util.outage import Backoff, describe, is_outage

if TYPE_CHECKING:
    from redis.cluster import RedisCluster

logger = logging.getLogger("dueq.wake")

#: How long one read waits for a message; bounds how long ``stop`` takes to be noticed.
POLL_S = 0.5
#: How long one read waits on each node of a Cluster's sharded subscription (read in turn).
SHARDED_POLL_S = 0.05
#: The first Redis version with SPUBLISH/SSUBSCRIBE.
SHARDED_PUBSUB_VERSION = (7, 0)
#: Message types that carry a wake (classic and sharded Pub/Sub).
WAKE_TYPES = frozenset({"message", "smessage"})


class WakeSubscription(NamedTuple):
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


def channel_of(message: Any) -> str | None:
    """The channel a wake message came on, as text (None when it names none)."""
    channel = message.get("channel")
    if isinstance(channel, bytes):
        return channel.decode("utf-8", "replace")
    return None if channel is None else str(channel)


def is_wake(message: Any) -> bool:
    """Whether a read message is a wake (not a subscribe confirmation or nothing)."""
    return message is not None and message.get("type") in WAKE_TYPES


class WakeOp(enum.Enum):
    """What a step of ``wake_flow`` asks its driver to do (and what it sends back)."""

    SUBSCRIPTION = "subscription"  # the queue's WakeSubscription (reads the server version)
    PUBSUB = "pubsub"  # a new pubsub of the queue's client (the driver closes it at the end)
    CALL = "call"  # getattr(pubsub, method)(*args, **kwargs): its reply
    WAKE = "wake"  # tell the queue which channel woke it (queue.woken), call on_wake()
    CLOSE = "close"  # close pubsub (never raises)
    SLEEP = "sleep"  # wait delay_s (or less, when the listener is stopped)


@dataclass(frozen=True)
class WakeStep:
    """One I/O step of ``wake_flow``, for its driver (a thread or an asyncio task)."""

    op: WakeOp
    pubsub: Any = None
    method: str = ""
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    delay_s: float = 0.0
    #: (WAKE) the channel of the wake message, None after a (re)subscription (any channel)
    channel: str | None = None


_WAKE = WakeStep(WakeOp.WAKE)


def wake_flow(queue_name: str) -> Generator[WakeStep, Any, None]:
    """The wake listener, written once: subscribe (SSUBSCRIBE or SUBSCRIBE, see the module
    docstring), wake the consumer once (anything scheduled while it was not listening), then
    wake it for each wake message read; when the queue's channels change (a sharded queue
    followed a reshard), subscribe to the new ones. An outage (an error of a step, thrown in
    by the driver) closes the subscription and subscribes again after a backoff; any other
    error ends the flow (the consumer still wakes at its computed times and heartbeat). It
    does no I/O: the driver runs each step and sends its reply back; ``WakeListener`` and the
    asyncio consumer's listener are its drivers."""
    backoff = Backoff()
    while True:
        pubsub: Any = None
        try:
            subscription = yield WakeStep(WakeOp.SUBSCRIPTION)
            pubsub = yield WakeStep(WakeOp.PUBSUB)
            method, channels = subscribe_args(subscription)
            yield WakeStep(WakeOp.CALL, pubsub, method, channels)
            read, read_kwargs = read_call(pubsub, subscription)
            if backoff.succeeded():
                logger.info("queue %r: wake channel back", queue_name)
            yield _WAKE
            while True:
                check_subscribed(pubsub, subscription)
                message = yield WakeStep(WakeOp.CALL, pubsub, read, (), read_kwargs)
                if is_wake(message):
                    yield WakeStep(WakeOp.WAKE, channel=channel_of(message))
                latest = yield WakeStep(WakeOp.SUBSCRIPTION)  # (a sharded queue reads its layout)
                if latest.channels != subscription.channels:
                    break  # a reshard changed the shards: listen on the new layout's channels
            yield WakeStep(WakeOp.CLOSE, pubsub)
        except Exception as exc:  # an outage is waited out; anything else ends the listener
            if not is_outage(exc):
                logger.error("queue %r: wake listener stopped", queue_name, exc_info=exc)
                return
            delay_s = backoff.failed()
            logger.debug(
                "queue %r: wake channel down (%s); subscribing again in %.2f s",
                queue_name,
                describe(exc),
                delay_s,
            )
            if pubsub is not None:
                yield WakeStep(WakeOp.CLOSE, pubsub)
            yield WakeStep(WakeOp.SLEEP, delay_s=delay_s)


def close_failed() -> None:
    """Log a subscription that raised as it was closed (broken, or slow to close)."""
    logger.debug("error closing the wake subscription", exc_info=True)


class Wakes(Protocol):
    """What a wake listener needs of its queue (``Queue`` has it): its name, its client and
    what to subscribe to."""

    @property
    def name(self) -> str: ...

    @property
    def redis(self) -> redis.Redis | RedisCluster: ...

    def wake_subscription(self) -> WakeSubscription: ...

    def woken(self, channel: str | None) -> None:
        """A wake message came on ``channel`` (None: after a (re)subscription)."""
        ...


class WakeListener:
    """Calls ``on_wake()`` for each message on the queue's wake channel, until ``stop()``."""

    def __init__(self, queue: Wakes, on_wake: Callable[[], None]) -> None:
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
        """Drive ``wake_flow`` with blocking I/O until ``stop()``."""
        flow = wake_flow(self._queue.name)
        opened: Any = None  # the subscription open now: closed when the listener ends
        try:
            step = next(flow)
            while not self._stopped.is_set():
                reply: Any = None
                try:
                    if step.op is WakeOp.SUBSCRIPTION:
                        reply = self._queue.wake_subscription()
                    elif step.op is WakeOp.PUBSUB:
                        # (typed Any: redis-py's pubsub() is untyped in some releases, typed in
                        # others, and one annotation cannot fit both)
                        client: Any = self._queue.redis
                        reply = opened = client.pubsub(ignore_subscribe_messages=True)
                    elif step.op is WakeOp.CALL:
                        reply = getattr(step.pubsub, step.method)(*step.args, **step.kwargs)
                    elif step.op is WakeOp.WAKE:
                        self._queue.woken(step.channel)
                        self._on_wake()
                    elif step.op is WakeOp.CLOSE:
                        _close(step.pubsub)
                        opened = None
                    else:
                        self._stopped.wait(step.delay_s)
                except Exception as exc:  # the flow decides (an outage, or the end)
                    if self._stopped.is_set():
                        return  # e.g. the client was closed right after the consumer stopped
                    step = flow.throw(exc)
                else:
                    step = flow.send(reply)
        except StopIteration:
            pass  # the flow ended (an error that is not an outage; logged there)
        finally:
            flow.close()
            _close(opened)


def _close(pubsub: Any) -> None:
    if pubsub is not None:
        try:
            pubsub.close()
        except Exception:  # closing a broken connection may raise; nothing to do about it
            close_failed()


def ended_ids(data: bytes | str) -> list[str]:
    """The task ids of a message on a queue's ended channel (packed as struct '>Hc0' each by
    ``publish_ended`` in lua/include/wake.lua); what cannot be read is left out."""
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    ids: list[str] = []
    pos = 0
    while pos + 2 <= len(raw):
        (size,) = struct.unpack_from(">H", raw, pos)
        ids.append(raw[pos + 2 : pos + 2 + size].decode("utf-8", "replace"))
        pos += 2 + size
    return ids


def read_method(pubsub: Any, subscription: WakeSubscription) -> str:
    """The pubsub method that reads one message with ``timeout=``: a Cluster's sharded
    subscription is read by ``get_sharded_message`` (as ``read_call``)."""
    if subscription.sharded and hasattr(pubsub, "get_sharded_message"):
        return "get_sharded_message"
    return "get_message"


def is_subscribed(message: Any) -> bool:
    """Whether a read message confirms a (sharded) subscription."""
    return message is not None and message.get("type") in ("subscribe", "ssubscribe")
