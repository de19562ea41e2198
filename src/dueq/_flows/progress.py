"""Task progress: ``d.progress(body)`` under the lease, and ``q.progress(task_id)``, a follower.

Writing (``progress_flow``): one call of progress.lua checks the delivery's lease as extend
does (a stale holder gets LeaseLost, TaskCancelled when cancelled), appends the entry
``<seq>\\t<ms>\\t<JSON>`` to the task's history (field ``<id>\\0p`` of the queue's ``steps``
hash, its last ``PROGRESS_KEPT`` entries), adds a "progress" event while events are on, and
publishes the entry on the queue's progress channel (SPUBLISH where the server has it). Under
an encrypting codec the body is sealed first (``PayloadCodec.seal_value``, bound to queue and
task as a result is): a JSON string, so the entry's line keeps its tabs and newline apart, and
the history, the channel and the event never hold the plaintext. Readers open it here, for
the plain and the sharded queue alike (``_opened``: the body, or its SealedMarker).

Following (``progress_follow_flow``, driven by ``dueq._consume.progress``): subscribe to the
progress and ended channels of the task's queue (its shard's), and only once the
subscription is confirmed read the kept history, so an entry written in between comes both
ways and is yielded once (by its seq); then each live entry, filling a gap in the seqs (a
message lost while reconnecting) from the history. The follow ends when the task ends: its
id on the ended channel (dead, cancelled, expired; acked while results are kept), or a look
at its state (``get``) after ``QUIET_S`` with no entry of its own (an ack without results
publishes nothing); or after ``timeout`` with no entry.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from dueq._consume.progress import FollowFlow, FollowOp, FollowStep
from dueq._consume.wake import WAKE_TYPES, WakeSubscription, ended_ids, sharded_pubsub
from dueq._flows.base import QueueBase
from dueq._flows.drive import Flow
from dueq._util.clock import Duration, duration_ms
from dueq._util.outage import Backoff, is_outage
from dueq._wire import protocol as protocol
from dueq._wire.codec import PROGRESS_PURPOSE
from dueq._wire.envelope import json_text, validate_id
from dueq._wire.snapshot import text
from dueq.delivery import DeliveryBase
from dueq.exceptions import LeaseLost, TaskCancelled
from dueq.model import FINAL_STATES, Progress

#: Largest progress body, in bytes of JSON.
MAX_PROGRESS_BYTES = 64 * 1024
#: Seconds without an entry of its own after which a follower looks at its task's state.
QUIET_S = 1.0
#: Seconds a follower waits for its subscription to be confirmed.
CONFIRM_S = 5.0
#: Seconds a follower keeps reading, once its task has ended, for entries still in flight.
DRAIN_S = 0.05

_CONFIRMS = frozenset({"subscribe", "ssubscribe"})


def progress_body(obj: Any) -> str:
    """``obj`` as the JSON text of a progress entry; PayloadError when it is not JSON or its
    JSON is over MAX_PROGRESS_BYTES."""
    return json_text(obj, "progress", MAX_PROGRESS_BYTES)


def _kind(message: Any) -> str:
    return "" if message is None else text(message.get("type") or "")


class ProgressFlows(QueueBase):
    """The flows of task progress: write an entry under a lease, read and follow a task's."""

    def progress_flow(self, delivery: DeliveryBase, obj: Any) -> Flow[int]:
        """Write ``obj`` as the delivery's next progress entry; its seq."""
        body = self.payload_codec.seal_value(
            progress_body(obj), self.name, delivery.id, PROGRESS_PURPOSE
        )
        reply: protocol.ProgressReply = yield protocol.progress(
            self.keys, self.now_arg(), delivery.id, delivery.token, body
        )
        if reply.verdict == "c":
            delivery.mark_cancelled()
            raise TaskCancelled(
                f"task {delivery.id!r} was cancelled while leased; progress not recorded",
                [delivery.id],
            )
        if reply.verdict != "h":
            raise LeaseLost(
                f"lease on task {delivery.id!r} was lost; progress not recorded", [delivery.id]
            )
        return reply.seq

    def progress_history_flow(self, task_id: str) -> Flow[list[Progress]]:
        """The task's kept progress entries, oldest first."""
        keys = self._core.shard_queue(validate_id(task_id)).keys
        found: list[Progress] = yield protocol.progress_history(keys, task_id)
        return [self._opened(entry) for entry in found]

    def _opened(self, entry: Progress) -> Progress:
        """``entry`` with its body opened when it was sealed (``progress_flow``), or its
        SealedMarker when this queue's codec cannot open it; any other entry as it is."""
        body = self.payload_codec.shown_value(
            entry.body, self.name, entry.task_id, PROGRESS_PURPOSE
        )
        return entry if body is entry.body else replace(entry, body=body)

    def progress_subscription_flow(self, task_id: str) -> Flow[WakeSubscription]:
        """What a follower subscribes to: the progress and ended channels of the queue (or
        shard) that holds ``task_id``, by SSUBSCRIBE where the scripts SPUBLISH."""
        if not self._server_checked:
            yield from self._core.check_server_flow()
        keys = self._core.shard_queue(validate_id(task_id)).keys
        return WakeSubscription(
            (keys.progress, keys.ended), sharded=sharded_pubsub(self._server_version)
        )

    def progress_follow_flow(
        self,
        task_id: str,
        timeout: Duration | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> FollowFlow:
        """A follower of the task's progress (see the module docstring); the id and the
        timeout are checked here, before it starts."""
        task_id = validate_id(task_id)
        timeout_s = None if timeout is None else duration_ms(timeout, "timeout") / 1000
        return self._follow(task_id, timeout_s, monotonic)

    def _follow(
        self, task_id: str, timeout_s: float | None, monotonic: Callable[[], float]
    ) -> FollowFlow:
        subscription = yield from self._core.progress_subscription_flow(task_id)
        progress_channel, ended_channel = subscription.channels
        last = 0  # the seq of the last entry yielded
        backoff = Backoff()

        def fresh(entries: list[Progress], below: int | None = None) -> list[Progress]:
            return [e for e in entries if e.seq > last and (below is None or e.seq < below)]

        def ended(message: Any) -> bool:
            return text(message.get("channel") or "") == ended_channel and task_id in ended_ids(
                message["data"]
            )

        def own_entry(message: Any) -> Progress | None:
            if text(message.get("channel") or "") != progress_channel:
                return None
            entry = protocol.progress_message(message["data"])
            if entry is None or entry.task_id != task_id:
                return None
            return self._opened(entry)

        def subscribe() -> FollowFlow:
            """Open the subscription and wait for its confirmations; live entries read
            meanwhile are dropped (the history read next has them)."""
            yield FollowStep(FollowOp.OPEN, subscription)
            waiting = set(subscription.channels)
            until = monotonic() + CONFIRM_S
            while waiting and monotonic() < until:
                message = yield FollowStep(FollowOp.READ, timeout_s=until - monotonic())
                if _kind(message) in _CONFIRMS:
                    waiting.discard(text(message.get("channel") or ""))

        def drain() -> FollowFlow:
            """The task ended: the entries still on their way (for DRAIN_S at most, however
            busy the channel is with other tasks' entries), then the end."""
            nonlocal last
            until = monotonic() + DRAIN_S
            while (left := until - monotonic()) > 0:
                message = yield FollowStep(FollowOp.READ, timeout_s=left)
                if message is None:
                    return
                entry = own_entry(message) if _kind(message) in WAKE_TYPES else None
                if entry is not None and entry.seq > last:
                    yield FollowStep(FollowOp.EMIT, entry=entry)
                    last = entry.seq

        def catch_up(below: int | None = None) -> FollowFlow:
            """Yield the kept entries not yielded yet (below seq ``below``)."""
            nonlocal last
            entries = yield from self._core.progress_history_flow(task_id)
            for entry in fresh(entries, below):
                yield FollowStep(FollowOp.EMIT, entry=entry)
                last = entry.seq

        def is_over() -> Flow[bool]:
            info = yield from self._core.get_flow(task_id)
            return info is None or info.state in FINAL_STATES

        yield from subscribe()
        yield from catch_up()
        if (yield from is_over()):
            yield from drain()
            return
        heard = looked = monotonic()  # the last own entry, the last look at the state
        while True:
            now = monotonic()
            wait = max(looked + QUIET_S - now, 0.0)
            if timeout_s is not None:
                wait = min(wait, max(heard + timeout_s - now, 0.0))
            try:
                message = yield FollowStep(FollowOp.READ, timeout_s=wait)
            except Exception as exc:  # an outage: subscribe again, and catch up
                if not is_outage(exc):
                    raise
                yield FollowStep(FollowOp.SLEEP, timeout_s=backoff.failed())
                try:
                    yield from subscribe()
                    yield from catch_up()
                except Exception as again:
                    if not is_outage(again):
                        raise
                continue
            backoff.succeeded()
            kind = _kind(message)
            if kind in _CONFIRMS:  # subscribed again (redis-py reconnected): catch up
                yield from catch_up()
            elif kind in WAKE_TYPES:
                if ended(message):  # (entries published before the end came before it)
                    return
                entry = own_entry(message)
                if entry is not None and entry.seq > last:
                    if entry.seq > last + 1:  # missed some: the history has them
                        yield from catch_up(below=entry.seq)
                    yield FollowStep(FollowOp.EMIT, entry=entry)
                    last = entry.seq
                    heard = looked = monotonic()
                    continue
            now = monotonic()
            if timeout_s is not None and now - heard >= timeout_s:
                return
            if now - looked >= QUIET_S:
                if (yield from is_over()):
                    yield from drain()
                    return
                looked = monotonic()
