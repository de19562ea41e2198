"""The base of ``QueueCore``: a queue's settings, keys and the checks every flow relies on."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from datetime import timedelta
from functools import cached_property
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import redis

from dueq._consume.wake import WakeSubscription, sharded_pubsub
from dueq._flows.drive import Flow
from dueq._util.checks import validate_holder, whole_number
from dueq._util.clock import Clock, Duration, clock_ms
from dueq._util.clock import positive_duration_ms as _positive_ms
from dueq._wire import protocol as protocol
from dueq._wire.codec import Compression, Encrypted, PayloadCodec
from dueq._wire.envelope import DEFAULT_MAX_PAYLOAD_BYTES
from dueq._wire.keys import QueueKeys, layout_key
from dueq._wire.server_check import hello_version, log_eviction_policy, pairs, server_version_ok
from dueq._wire.snapshot import text
from dueq.delivery import DeliveryBase
from dueq.exceptions import ConfigurationError
from dueq.named import TaskFunction
from dueq.retry import RetryPolicy

if TYPE_CHECKING:
    from dueq._flows.ports import Core, MakesCore

logger = logging.getLogger("dueq.queue")

#: Largest payload limit a queue accepts.
MAX_PAYLOAD_LIMIT = 64 * 1024 * 1024


class QueueBase:
    """What every flow of a queue stands on: its settings (validated once), its keys, its clock
    argument, and the checks before its first schedule or claim. ``QueueCore`` puts it together
    with the flows (``_flows.schedule``, ``_flows.lease``, ``_flows.view``, ``_flows.settings``,
    ``_flows.registry``); ``Queue`` and ``AsyncQueue`` add the client, and send what they yield.

    ``sharded`` is the layout of a sharded queue (``dueq.sharding.flows.Sharded``, made by the front
    end), or None for a plain queue. It chooses the queue's *core* once, here (``_core``, see
    ``dueq._flows.core``): the queue itself, or the ``ShardedCore`` over that layout. The front ends
    run every operation on it, and a flow reaches another through it.
    """

    #: The delivery class of the front end (blocking or awaitable methods); a claim makes one
    #: per leased task, called with this queue and ``DeliveryBase``'s fields.
    _delivery_type: type[DeliveryBase]

    def __init__(
        self,
        name: str,
        *,
        retry: RetryPolicy | None = None,
        lease: Duration = 30.0,
        clock: Clock | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        dead_max_count: int = 100_000,
        dead_max_age: Duration = timedelta(days=14),
        remember_done: Duration | None = None,
        wait_replicas: int = 0,
        wait_timeout: Duration = 1.0,
        holder: str | None = None,
        codec: Encrypted | None = None,
        compression: Compression | None = None,
        sharded: MakesCore | None = None,
    ) -> None:
        keys = QueueKeys.for_queue(name)  # checks the name, sharded or not
        if sharded is None:  # a sharded queue has no keys of its own (see ``keys``)
            self.keys = keys
        #: how many shards the queue has (1: a plain queue), and their queues' names
        self.shard_count = 1 if sharded is None else sharded.count
        self.shard_names = (name,) if sharded is None else sharded.names
        #: who this queue's claims lease to (None: this process's worker id, see ``default_holder``)
        self.holder = None if holder is None else validate_holder(holder)
        self.name = name
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise ConfigurationError(f"retry must be a dueq.RetryPolicy, got {retry!r}")
        if clock is not None and not callable(clock):
            raise ConfigurationError("clock must be a zero-argument callable returning seconds")
        whole_number(max_payload_bytes, "max_payload_bytes", low=1, high=MAX_PAYLOAD_LIMIT)
        whole_number(dead_max_count, "dead_max_count", low=1)
        whole_number(wait_replicas, "wait_replicas", low=0, high=100)
        self.retry = retry or RetryPolicy()
        #: (monotonic s, the policy, its backoff table ms): see LeaseFlows.backoff_table_ms
        self.backoff_cache: tuple[float, RetryPolicy, list[int]] | None = None
        self.lease_ms = _positive_ms(lease, "lease")
        self.clock = clock
        self.max_payload_bytes = max_payload_bytes
        #: how payloads are sealed and opened (``_wire.codec``): codec= and compression=
        self.payload_codec = PayloadCodec(codec, compression)
        self.dead_max_count = dead_max_count
        self.dead_max_age_ms = _positive_ms(dead_max_age, "dead_max_age")
        #: the deprecated constructor keyword's window, used only while the queue has no
        #: remember_done setting in Redis (``configure``)
        self.remember_done_ms = (
            0 if remember_done is None else _positive_ms(remember_done, "remember_done")
        )
        if remember_done is not None:
            warnings.warn(
                f"{type(self).__name__}(remember_done=...) is deprecated: a window set in one "
                "process only is not seen by the others. Set it once for every producer and "
                "consumer with q.configure(remember_done=...) (or dueq configure QUEUE "
                "--remember-done ...); until then this process's window applies only while the "
                "queue has no setting of its own",
                DeprecationWarning,
                stacklevel=3,
            )
        self.wait_replicas = wait_replicas
        self.wait_timeout_ms = _positive_ms(wait_timeout, "wait_timeout")
        self._server_checked = False
        self._server_version: tuple[int, ...] | None = None
        # no sharded queue has '#' in its name (a shard's has): nothing to refuse then
        self._plain_checked = "#" in name
        #: what every operation runs on, chosen once: this queue, or its ShardedCore
        self._core: Core = self._choose_core(sharded)
        # what q.dead and q.cron drive, and the cron keeper of this queue's claims
        self._dead_flows, self._cron_flows = self._core.part_flows()
        self._task_functions: dict[str, TaskFunction[Any, Any]] = {}
        #: the named tasks registered on this queue (``@q.task``): name -> TaskFunction
        self.tasks: Mapping[str, TaskFunction[Any, Any]] = MappingProxyType(self._task_functions)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    @cached_property
    def keys(self) -> QueueKeys:
        """The queue's Redis keys (``dueq._wire.keys.QueueKeys``). A plain queue sets them in
        ``__init__`` (over this attribute), so only a sharded queue gets here: it has none of
        its own (each shard has its own), and asking raises ConfigurationError. No key set
        names the logical queue, so a flow not written for shards must not run on ``{name}``
        keys, where it would silently miss every task."""
        raise ConfigurationError(
            f"a single key set for {self.name!r} (each shard has its own) is not available "
            "on a sharded queue yet"
        )

    def register_task(self, task_function: TaskFunction[Any, Any]) -> None:
        """Add a named task to ``tasks``; ConfigurationError if its name is another
        function's already (registering the same function again is allowed)."""
        name = task_function.name
        known = self._task_functions.get(name)
        if known is not None and known.fn is not task_function.fn:
            raise ConfigurationError(
                f"queue {self.name!r} already has a task named {name!r} ({known.fn!r}): "
                "give one of them another name (@q.task(name=...))"
            )
        self._task_functions[name] = task_function

    def _choose_core(self, sharded: MakesCore | None) -> Core:
        """This queue's core, chosen once (``QueueCore._choose_core``: the plain core is the
        whole queue, flows and all, which this base is not)."""
        raise NotImplementedError

    # -- helpers -----------------------------------------------------------------------------

    def wake_channels(self) -> list[str]:
        """The Pub/Sub channels whose messages wake this (plain) queue's consumers."""
        return [self.keys.wake]

    def note_wake(self, channel: str | None) -> None:
        """As the core: a wake message came on ``channel`` (None: after a (re)subscription).
        A plain queue asks its one key set on every claim, so there is nothing to note; a
        sharded queue's core notes which shard to ask again (``ShardedCore.note_wake``)."""

    def wake_subscription_flow(self) -> Flow[WakeSubscription]:
        """How this queue's consumers listen for wake messages: its channels, by SSUBSCRIBE
        where the scripts SPUBLISH (see ``publish_wake`` in lua/include/wake.lua and
        ``_consume.wake``)."""
        if not self._server_checked:
            yield from self._core.check_server_flow()
        return WakeSubscription(
            tuple(self._core.wake_channels()), sharded=sharded_pubsub(self._server_version)
        )

    def now_arg(self) -> str:
        return "" if self.clock is None else str(clock_ms(self.clock))

    def cron_on_claim_flow(
        self, deliveries: list[Any], now_ms: int
    ) -> Flow[tuple[list[Any], int | None]]:
        """The cron keeper of a claim (``CronsCore.on_claim_flow``)."""
        return self._cron_flows.on_claim_flow(deliveries, now_ms)

    def plain_check_flow(self) -> Flow[None]:
        """Once per queue object, before its first schedule or claim: refuse to work as a
        plain queue over a sharded queue of the same name (``sharding.flows``), whose tasks live
        under other keys: it would schedule tasks no sharded consumer sees and claim none.

        One GET of the layout key, whose slot differs from the queue's (so it cannot be read
        inside the scripts); the other operations do not check (they read only). A user who
        may not read that key (an ACL rule from before sharded queues) skips the check.
        """
        if self._plain_checked:
            return
        try:
            recorded = yield protocol.command("GET", layout_key(self.name))
        except redis.exceptions.NoPermissionError as exc:  # cannot tell: work as before
            logger.debug("cannot read the shard count of %r (%s); not checked", self.name, exc)
            recorded = None
        if recorded is not None:
            shards = text(recorded)
            raise ConfigurationError(
                f"queue {self.name!r} is a sharded queue ({shards} shards, recorded in "
                f"{layout_key(self.name)}); a plain queue of that name would not see its tasks. "
                f"Open it with shards={shards}, or with dueq.discovery.open_queue(client, name)"
            )
        self._plain_checked = True

    def check_server_flow(self) -> Flow[None]:
        """Check the Redis server once: refuse versions before 6.2, and say what its
        ``maxmemory-policy`` means for the queue (see ``log_eviction_policy``). A sharded
        queue's core checks the primary of every shard (``ShardedCore.check_server_flow``).
        """
        version, _ = yield from self.server_info_flow()
        self.note_server_checked(server_version_ok(version))
        log_eviction_policy((yield from self.eviction_policy_flow()))

    def note_server_checked(self, version: tuple[int, ...] | None) -> None:
        """The server check passed (``check_server_flow``; a sharded queue's over every shard):
        ``version`` (the lowest seen) decides what the queue uses (sharded Pub/Sub)."""
        self._server_version = version
        self._server_checked = True

    def server_info_flow(self, route: str | None = None) -> Flow[tuple[str | None, str | None]]:
        """The server's version and TCP port (each None when it cannot be read), asked of the
        node of key ``route`` on a Redis Cluster (``protocol.Command.route``; None: any node).

        A least-privileged consumer needs no INFO: the version comes from ``INFO server`` or
        else ``HELLO`` (which every user may send); a check Redis refuses is skipped with a
        debug line.
        """
        try:
            info = yield protocol.command("INFO", "server", route=route)
            port = info.get("tcp_port")
            return str(info.get("redis_version", "0")), None if port is None else str(port)
        except redis.ResponseError:  # NOPERM for an ACL user without +info, or INFO renamed
            try:
                return hello_version((yield protocol.command("HELLO", route=route))), None
            except (redis.ResponseError, AttributeError, TypeError) as exc:  # none to read
                logger.debug("cannot read the Redis version (%s); skipping the check", exc)
                return None, None

    def eviction_policy_flow(self, route: str | None = None) -> Flow[Any]:
        """The server's ``maxmemory-policy`` (None when it cannot be read), of the node of key
        ``route`` as ``server_version_flow``: from ``INFO memory``, or else ``CONFIG GET`` (a
        user without +info); neither allowed (CONFIG disabled on managed services too): a
        debug line."""
        try:  # INFO memory names the policy too, and needs no CONFIG (which can read secrets)
            memory = yield protocol.command("INFO", "memory", route=route)
            return memory.get("maxmemory_policy")
        except redis.ResponseError:  # no +info (or INFO renamed): try CONFIG GET
            try:
                found = yield protocol.command(
                    "CONFIG GET", "maxmemory-policy", parse=pairs, route=route
                )
            except redis.ResponseError as exc:  # CONFIG disabled (managed services) too
                logger.debug("cannot read maxmemory-policy (%s); skipping the check", exc)
                return None
            return found.get("maxmemory-policy")
