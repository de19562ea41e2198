"""What ``process`` does with a delivery once its handler is done, written once for both
front ends.

Settling (ack a round's successes in one call per queue, record failures through the retry
policy, keep what Redis refuses during an outage for a later round), releasing and keeping
leases are decisions plus calls to Redis. The decisions live here as generator *flows* that
yield the calls to make: each yielded item is an ``Op``, a function of no arguments. The
threaded ``Processor`` drives a flow with ``run_flow`` (the op's return value is sent back in),
the asyncio ``AsyncProcessor`` with ``run_flow_async`` (the op returns an awaitable, which is
awaited). An op's exception is thrown into the flow at the ``yield``. So the sync and async
consumers share every rule and every log line, and differ only in how they wait.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import redis

from dueq._flows.drive import drive, drive_async
from dueq._util.outage import Backoff, describe, is_outage
from dueq.delivery import DeliveryBase
from dueq.exceptions import DueqError, KeyCooldown, LeaseLost, TaskTimeout, Unrecoverable
from dueq.logs import task_fields
from dueq.model import Outcome, settled_outcome
from dueq.operators._bulk import Release, Retry

logger = logging.getLogger("dueq.operators._process")

#: A call to make: returns its result (threaded consumer) or an awaitable of it (asyncio).
Op = Callable[[], Any]
#: A settle flow: yields ops, gets their results back, returns its own result.
OpFlow = Generator[Op, Any, "R"]
R = TypeVar("R")
D = TypeVar("D", bound=DeliveryBase)
_Finished = tuple[Any, Any]  # (a delivery, its error or a bulk item's verdict)

#: Most results settled in one round (one ack_many call per queue).
SETTLE_BATCH = 1000
#: Longest pause between two lease-keeper rounds, in seconds.
KEEPER_TICK_MAX_S = 1.0
#: Shortest pause between two rounds: an extension due sooner than this is made now (clocks
#: of ~1.8e9 s in floats, or a scheduler with microsecond steps, cannot wait less).
KEEPER_TICK_MIN_S = 0.001


def run_flow(flow: Generator[Op, Any, R]) -> R:
    """Drive ``flow`` with blocking calls (the flows' own driver, each op called)."""
    return drive(flow, _call)


def _call(op: Op) -> Any:
    return op()


async def run_flow_async(
    flow: Generator[Op, Any, R], in_thread: Callable[..., Awaitable[Any]]
) -> R:
    """Drive ``flow`` on the running loop (the flows' own async driver): an op that is a
    coroutine function (an ``AsyncDelivery``'s ack, say) is awaited; any other op would block,
    so it runs through ``in_thread`` (a sync ``Queue``'s delivery consumed on a loop)."""

    async def send(op: Op) -> Any:
        return await (op() if is_coroutine_op(op) else in_thread(op))

    return await drive_async(flow, send)


def is_coroutine_op(op: Op) -> bool:
    """True when calling ``op`` returns a coroutine (looking through ``functools.partial``)."""
    func: Any = op
    while isinstance(func, partial):
        func = func.func
    return inspect.iscoroutinefunction(func)


class Pending:
    """Settle work that Redis refused for an outage, and when to try it again."""

    def __init__(self) -> None:
        self.acks: dict[Any, list[Any]] = defaultdict(list)
        self.failures: list[tuple[Any, BaseException]] = []
        self._backoff = Backoff()
        self._retry_at: float | None = None  # time.monotonic() of the next round

    def __bool__(self) -> bool:
        return bool(self.failures) or any(self.acks.values())

    def wait_s(self) -> float | None:
        """How long the settler may wait for new work before trying again (None: no limit)."""
        if self._retry_at is None:
            return None
        return max(self._retry_at - time.monotonic(), 0.0)

    def refused(self, exc: Exception) -> None:
        delay_s = self._backoff.failed()
        self._retry_at = time.monotonic() + delay_s
        logger.warning(
            "Redis unavailable while settling (try %d): %s; %d ack(s) and %d failure(s) wait, "
            "their leases kept; retrying in %.2f s",
            self._backoff.failures,
            describe(exc),
            sum(len(ds) for ds in self.acks.values()),
            len(self.failures),
            delay_s,
        )

    def served(self) -> None:
        self._retry_at = None
        if self._backoff.succeeded():
            logger.info("Redis is back; every waiting ack and failure is settled")


@dataclass
class KeeperRound:
    """What one lease-keeper round did: when the next is due, what it extended and lost."""

    tick_s: float = KEEPER_TICK_MAX_S
    extended: list[Any] = field(default_factory=list)
    lost: list[Any] = field(default_factory=list)  # not held any more (cancelled ones too)
    cancelled: list[Any] = field(default_factory=list)  # their task was cancelled


class Cooldowns:
    """The limit keys a handler of this consumer cooled down (``raise KeyCooldown``), so that
    the deliveries it holds and has not started for such a key wait as the key's tasks in Redis
    do: they are given back (no attempt counted, due at the cooldown's end), never run early.

    Released, not kept: a held delivery's lease would have to be kept alive for the whole
    cooldown (a 429's minute, say) while it fills a slot of the hold that other keys' tasks
    could use; given back, it is parked in Redis with the key's other tasks and claimed by
    whichever consumer is free when the key may run again.

    A key is cooling from the handler's raise (``note``) on. Once the cooled task's release is
    recorded (``confirmed``: Redis holds the key until ``until_ms`` on the queue clock) a claim
    can lease the key's tasks only at or after that time, so a delivery of the key claimed
    before it (``claimed_ms``) was leased before the hold, and is given back too; one claimed
    after it may run (and the entry is dropped). Judged on the queue clock only: no timers.
    Thread-safe (the threaded consumer's handler threads and settler both use it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: (queue name, key) -> (end of the cooldown on the queue clock, ms: inf until its
        #: release is recorded; the cooldown, s). Empty (the usual case): nothing cools, and
        #: the consumers' per-task paths look no further (an attribute read, no call).
        self.keys: dict[tuple[str, str], tuple[float, float]] = {}

    def note(self, d: Any, error: BaseException | None) -> float | None:
        """``d``'s handler raised ``error``: when it is a KeyCooldown of a keyed task, its key
        cools from now; returns the cooldown's seconds (None: nothing cools)."""
        if not isinstance(error, KeyCooldown) or d.key is None:
            return None
        with self._lock:
            self.keys[(d.queue_name, d.key)] = (math.inf, error.seconds)
        return error.seconds

    def confirmed(self, d: Any, outcome: Outcome) -> None:
        """The cooled task's release was recorded (``released``: the key is held until
        ``outcome.at``) or not (its lease was lost: nothing is held, nothing waits)."""
        entry = (d.queue_name, d.key)
        with self._lock:
            if entry not in self.keys:
                return
            if outcome.kind == "released" and outcome.at is not None:
                self.keys[entry] = (outcome.at.timestamp() * 1000, self.keys[entry][1])
            else:
                del self.keys[entry]

    def holds(self, d: Any) -> float | None:
        """The cooldown's seconds when ``d`` must not start (its key cools and it was claimed
        before the hold's end), else None."""
        if not self.keys or d.key is None:
            return None
        entry = (d.queue_name, d.key)
        with self._lock:
            found = self.keys.get(entry)
            if found is None:
                return None
            until_ms, seconds = found
            if d.claimed_ms >= until_ms:  # claimed once the key could run again: it may
                del self.keys[entry]
                return None
            return seconds


class Settling:
    """The rules of settling, releasing and keeping leases, as flows (see the module doc).

    Subclasses say whether a delivery is still held (``_holds``) and how to pause between
    tries during an outage (``_pause``), and drive the flows; they make ``cooldowns``.
    """

    cooldowns: Cooldowns

    def _holds(self, d: Any) -> bool:
        raise NotImplementedError

    def _still_held(self, deliveries: list[Any]) -> list[Any]:
        """Those of ``deliveries`` still held (one look for all, where that is cheaper)."""
        return [d for d in deliveries if self._holds(d)]

    def _pause(self, delay_s: float) -> Op:
        """An op that waits ``delay_s`` (less if the consumer gives up meanwhile)."""
        raise NotImplementedError

    def _giving_up(self) -> bool:
        """True once releases and settles should stop retrying through an outage."""
        raise NotImplementedError

    def settle_flow(
        self, batch: list[_Finished], pending: Pending, *, final: bool
    ) -> Generator[Op, Any, list[tuple[Any, Outcome]]]:
        """One round: ack every success waiting (one ``ack_many`` per queue), then record the
        failures waiting, in order. Work that Redis refuses for an outage stays in ``pending``
        for a later round (after a backoff), so a refused failure never holds back the acks
        of this or later rounds, and the lease keeper goes on extending what waits (it stays
        held until settled). The ``final`` round tries once more and reports the rest lost.
        Returns the deliveries settled in this round with their outcomes."""
        settled: list[tuple[Any, Outcome]] = []
        releases: dict[tuple[Any, Any], list[Any]] = defaultdict(list)
        for d, error in batch:
            if d.settled:  # the handler acked, failed or released it itself
                settled.append((d, d.outcome or settled_outcome(d.id, "acked", d.attempt)))
            elif error is None:
                pending.acks[d.queue].append(d)
            elif type(error) is Release:  # a bulk handler's item.release(delay)
                releases[(d.queue, error.delay)].append(d)
            else:
                pending.failures.append((d, error))
        if releases:
            settled += yield from self.release_items_flow(releases)
        refusal: Exception | None = None
        for q in list(pending.acks):
            deliveries = self._still_held(pending.acks.pop(q))
            try:
                outcomes = yield from self.ack_flow(q, deliveries, final)
            except Exception as exc:  # an outage (_ack_flow reports every other error as lost)
                pending.acks[q] = deliveries
                refusal = exc
                continue
            settled += zip(deliveries, outcomes, strict=True)
        failures, pending.failures = pending.failures, []
        by_queue: dict[Any, list[tuple[Any, Any]]] = defaultdict(list)
        for d, error in failures:
            by_queue[d.queue].append((d, error))
        groups = list(by_queue.values())
        for i, group in enumerate(groups):
            group = [(d, error) for d, error in group if self._holds(d)]  # (close() releases)
            try:
                settled += yield from self.fail_many_flow(group, final)
            except Exception as exc:  # an outage: the next ones would meet it too
                pending.failures = [f for g in groups[i:] for f in g]
                refusal = exc
                break
        if refusal is not None:
            pending.refused(refusal)
        elif not pending:
            pending.served()
        return settled

    @staticmethod
    def ack_flow(q: Any, deliveries: list[Any], final: bool) -> Generator[Op, Any, list[Outcome]]:
        """Outcomes of acking ``deliveries``; raises an outage unless ``final``."""
        if not deliveries:
            return []
        try:
            yield partial(q.ack_many, deliveries)
        except LeaseLost as exc:
            cancelled = set(exc.cancelled)
            for d in deliveries:
                if d.id in cancelled:
                    logger.info(
                        "queue %r: task %r attempt %d cancelled while running",
                        q.name,
                        d.id,
                        d.attempt,
                        extra=task_fields(q.name, d.id, d.attempt),
                    )
                elif d.id in exc.ids:
                    logger.warning(
                        "queue %r: task %r attempt %d: lease lost before ack; delivered again",
                        q.name,
                        d.id,
                        d.attempt,
                        extra=task_fields(q.name, d.id, d.attempt),
                    )
        except Exception as exc:
            if is_outage(exc) and not final:
                raise
            logger.error(
                "queue %r: could not ack %d task(s): %s", q.name, len(deliveries), describe(exc)
            )
            return [Outcome(d.id, "lost", d.attempt, error=describe(exc)) for d in deliveries]
        return [d.outcome or settled_outcome(d.id, "acked", d.attempt) for d in deliveries]

    def fail_many_flow(
        self, group: list[tuple[Any, Any]], final: bool
    ) -> Generator[Op, Any, list[tuple[Any, Outcome]]]:
        """Record the failures of one queue's deliveries in one ``fail_many`` call (one per
        1,000): each outcome as ``fail_flow`` would give and log it. Raises an outage unless
        ``final``. A group Redis or dueq refuses for another reason (an exception whose text
        cannot be made, say) is recorded one by one, where each gets its stand-in."""
        if not group:
            return []
        if len(group) == 1:
            d, error = group[0]
            return [(d, (yield from self.fail_flow(d, error, final)))]
        items: list[tuple[Any, Any, Any]] = []
        for d, error in group:
            if type(error) is Retry:
                items.append((d, error.error, error.retry_in))
            else:
                items.append((d, error, None))
        q = group[0][0].queue
        try:
            outcomes: list[Outcome] = yield partial(q.fail_many, items)
        except Exception as exc:
            if is_outage(exc) and not final:
                raise
            # not an outage (or the last round): each alone, where a failure that cannot be
            # recorded as it is gets its stand-in, and what Redis refuses is logged as lost
            settled = []
            for d, error in group:
                settled.append((d, (yield from self.fail_flow(d, error, final))))
            return settled
        settled = []
        for (d, error, _), outcome in zip(items, outcomes, strict=True):
            if outcome.kind in ("lost", "cancelled"):
                self._log_unrecorded(d, outcome.kind == "cancelled")
                outcome = d.outcome or outcome
                if isinstance(error, KeyCooldown):
                    self.cooldowns.confirmed(d, outcome)  # nothing is held: nothing waits
            else:
                if isinstance(error, KeyCooldown):  # the key's held deliveries wait as long
                    self.cooldowns.confirmed(d, outcome)
                self._log_failure(d, error, outcome)
            settled.append((d, outcome))
        return settled

    @staticmethod
    def _log_unrecorded(d: Any, cancelled: bool) -> None:
        """Say why a failure was not recorded: its task was cancelled, or its lease lost."""
        if cancelled:
            logger.info(
                "queue %r: task %r attempt %d cancelled while running",
                d.queue.name,
                d.id,
                d.attempt,
                extra=task_fields(d.queue.name, d.id, d.attempt),
            )
        else:
            logger.warning(
                "queue %r: task %r attempt %d: lease lost before its failure was recorded",
                d.queue.name,
                d.id,
                d.attempt,
                extra=task_fields(d.queue.name, d.id, d.attempt),
            )

    @staticmethod
    def _log_failure(d: Any, error: Any, outcome: Outcome) -> None:
        """The line of a recorded failure: released (a KeyCooldown), retried or dead."""
        if outcome.kind == "released":  # a KeyCooldown: no attempt counted
            logger.info(
                "queue %r: task %r attempt %d: %s; back at %s, its key held as long",
                d.queue.name,
                d.id,
                d.attempt,
                describe(error) if isinstance(error, Exception) else error,
                outcome.at,
                extra=task_fields(d.queue.name, d.id, d.attempt),
            )
            return
        log = logger.error if outcome.kind == "dead" else logger.info
        log(
            "queue %r: task %r attempt %d failed (%s): %s",
            d.queue.name,
            d.id,
            d.attempt,
            outcome.kind,
            outcome.error,
            extra=task_fields(d.queue.name, d.id, d.attempt),
        )

    def fail_flow(
        self, d: Any, error: Any, final: bool, *, stand_in: bool = False
    ) -> Generator[Op, Any, Outcome]:
        """The outcome of recording ``error`` for ``d`` (a bulk handler's item may give a
        message, and a ``Retry`` its own delay); raises an outage unless ``final``."""
        retry_in = None
        if type(error) is Retry:
            error, retry_in = error.error, error.retry_in
        try:
            outcome: Outcome = yield partial(d.fail, error, retry_in=retry_in)
        except LeaseLost as exc:
            self._log_unrecorded(d, bool(exc.cancelled))
            outcome = d.outcome or Outcome(d.id, "lost", d.attempt)
            if isinstance(error, KeyCooldown):
                self.cooldowns.confirmed(d, outcome)  # nothing is held: nothing waits
            return outcome
        except Exception as exc:
            if is_outage(exc) and not final:
                raise
            if isinstance(error, KeyCooldown):  # not recorded: nothing is held, nothing waits
                self.cooldowns.confirmed(d, Outcome(d.id, "lost", d.attempt))
            if (
                not stand_in
                and isinstance(error, BaseException)
                and not isinstance(exc, (redis.RedisError, DueqError))
            ):
                # the handler's exception could not be recorded as it is (its __str__ raised,
                # say): record a stand-in, so the task follows its retry policy all the same
                return (yield from self.fail_flow(d, _stand_in(error, exc), final, stand_in=True))
            logger.error(
                "queue %r: task %r attempt %d: could not record its failure: %s",
                d.queue.name,
                d.id,
                d.attempt,
                describe(exc),
                extra=task_fields(d.queue.name, d.id, d.attempt),
            )
            return Outcome(d.id, "lost", d.attempt, error=describe(exc))
        if isinstance(error, KeyCooldown):  # the key's held deliveries wait as long
            self.cooldowns.confirmed(d, outcome)
        self._log_failure(d, error, outcome)
        return outcome

    def release_flow(self, d: Any) -> Generator[Op, Any, Outcome]:
        """Give ``d`` back without counting it, retrying through an outage until the consumer
        gives up; a lease that could not be given back runs out by itself."""
        backoff = Backoff()
        while True:
            try:
                outcome: Outcome = yield d.release
            except LeaseLost:
                return d.outcome or Outcome(d.id, "lost", d.attempt)
            except Exception as exc:  # its lease expires on its own; it is delivered again
                if is_outage(exc) and not self._giving_up():
                    delay_s = backoff.failed()
                    logger.warning(
                        "Redis unavailable while releasing a task (try %d): %s; retrying in %.2f s",
                        backoff.failures,
                        describe(exc),
                        delay_s,
                    )
                    yield self._pause(delay_s)
                    continue
                logger.warning(
                    "queue %r: task %r attempt %d: could not release it: %s",
                    d.queue.name,
                    d.id,
                    d.attempt,
                    describe(exc),
                    extra=task_fields(d.queue.name, d.id, d.attempt),
                )
                return Outcome(d.id, "lost", d.attempt, error=describe(exc))
            if backoff.succeeded():
                logger.info("Redis is back; releasing a task succeeded")
            return outcome

    def release_items_flow(
        self, groups: dict[tuple[Any, Any], list[Any]]
    ) -> Generator[Op, Any, list[tuple[Any, Outcome]]]:
        """Give back what bulk handlers released (``item.release(delay)``): one
        ``release_many`` call per queue and delay, no attempt counted. A call Redis refuses
        leaves their leases to run out (they are delivered again): logged, outcome ``lost``."""
        settled: list[tuple[Any, Outcome]] = []
        for (q, delay), group in groups.items():
            group = self._still_held(group)
            if not group:
                continue
            try:
                outcomes = yield partial(q.release_many, group, delay=delay)
            except Exception as exc:  # their leases run out by themselves: delivered again
                logger.warning(
                    "queue %r: could not give back %d task(s) a bulk handler released: %s",
                    q.name,
                    len(group),
                    describe(exc),
                )
                outcomes = [Outcome(d.id, "lost", d.attempt, error=describe(exc)) for d in group]
            settled += zip(group, outcomes, strict=True)
        return settled

    def release_cooled_flow(
        self, deliveries: list[Any], seconds: float
    ) -> Generator[Op, Any, list[Outcome]]:
        """Give back held deliveries that have not started, of keys a KeyCooldown holds
        (``Cooldowns``): due in ``seconds`` (the cooldown), no attempt counted, their keys held
        as long; one ``release_many`` call per queue. A call Redis refuses leaves their leases
        to run out (they are delivered again): logged, their outcome ``lost``."""
        by_queue: dict[Any, list[Any]] = defaultdict(list)
        for d in deliveries:
            by_queue[d.queue].append(d)
        outcomes: list[Outcome] = []
        for q, group in by_queue.items():
            try:
                outcomes += yield partial(q.release_many, group, delay=seconds, hold=True)
            except Exception as exc:  # their leases run out by themselves: delivered again
                logger.warning(
                    "queue %r: could not give back %d task(s) held for a cooled-down key: %s",
                    q.name,
                    len(group),
                    describe(exc),
                )
                outcomes += [Outcome(d.id, "lost", d.attempt, error=describe(exc)) for d in group]
                continue
            logger.info(
                "queue %r: %d task(s) held for a key that cools down for %g s given back "
                "unstarted (no attempt counted)",
                q.name,
                len(group),
                seconds,
            )
        return outcomes

    @staticmethod
    def keep_flow(held: list[tuple[Any, float]], now_s: float) -> Generator[Op, Any, KeeperRound]:
        """One lease-keeper round over ``held`` (each delivery with when its lease was last
        extended, in the keeper's clock): extend every lease a third of whose time has passed,
        one ``extend_many`` call per queue, and say when the next extension is due. A lost
        lease is reported once; the caller leaves it out of later rounds."""
        result = KeeperRound()
        due: dict[Any, list[Any]] = defaultdict(list)
        for d, extended_at_s in held:
            if d.settled:  # nothing left to keep (the handler may have acked)
                continue
            period_s = d.queue.lease_ms / 3000
            until_s = extended_at_s + period_s - now_s
            if until_s >= KEEPER_TICK_MIN_S:
                result.tick_s = min(result.tick_s, until_s)
                continue
            result.tick_s = min(result.tick_s, period_s)  # extended now (or tried)
            due[d.queue].append(d)
        outage: Exception | None = None
        unextended = 0
        for q, deliveries in due.items():
            if outage is not None:  # the rest would meet it too (each after a timeout, maybe)
                unextended += len(deliveries)
                continue
            lost: set[str] = set()
            try:
                yield partial(q.extend_many, deliveries, q.lease_ms / 1000)
            except LeaseLost as exc:
                lost, cancelled = set(exc.ids), set(exc.cancelled)
                for d in deliveries:
                    if d.id in cancelled:
                        logger.warning(
                            "queue %r: task %r attempt %d was cancelled while its handler ran; "
                            "the handler is told (d.cancelled) and the outcome is 'cancelled'",
                            q.name,
                            d.id,
                            d.attempt,
                            extra=task_fields(q.name, d.id, d.attempt),
                        )
                        result.cancelled.append(d)
                    elif d.id in lost:
                        logger.warning(
                            "queue %r: task %r attempt %d: lease lost while held",
                            q.name,
                            d.id,
                            d.attempt,
                            extra=task_fields(q.name, d.id, d.attempt),
                        )
                    if d.id in lost:
                        result.lost.append(d)
            except Exception as exc:
                if not is_outage(exc):
                    logger.exception(
                        "queue %r: extending %d lease(s) failed", q.name, len(deliveries)
                    )
                else:
                    outage = exc
                    unextended += len(deliveries)
                continue
            result.extended += [d for d in deliveries if d.id not in lost]
        if outage is not None:
            logger.warning(
                "Redis unavailable while extending leases: %s; %d lease(s) not extended this "
                "round, tried again next round",
                describe(outage),
                unextended,
            )
        return result


def timeout_for(d: Any, default_s: float | None) -> float | None:
    """The timeout of one attempt: the task's own (``schedule(..., timeout=)``) wins over the
    consumer's."""
    own: float | None = d.timeout_s
    return default_s if own is None else own


def timeout_error(d: Any, timeout_s: float) -> TaskTimeout:
    """The failure recorded for an attempt that ran past its timeout."""
    return TaskTimeout(f"handler ran past its timeout of {timeout_s:g} s (attempt {d.attempt})")


async def within(awaitable: Awaitable[R], timeout_s: float | None, d: Any) -> R:
    """Await ``awaitable``, cancelling it after ``timeout_s`` (None: no limit) and raising
    TaskTimeout instead. ``asyncio.timeout`` where Python has it (3.11): ``wait_for`` on 3.10
    can swallow a cancellation that arrives as the handler finishes."""
    if timeout_s is None:
        return await awaitable
    try:
        if sys.version_info >= (3, 11):
            async with asyncio.timeout(timeout_s):
                return await awaitable
        return await asyncio.wait_for(awaitable, timeout_s)
    except TimeoutError:  # asyncio.TimeoutError is TimeoutError from 3.11 on
        raise timeout_error(d, timeout_s) from None
    except asyncio.TimeoutError:
        raise timeout_error(d, timeout_s) from None


def _stand_in(error: BaseException, unrecordable: Exception) -> BaseException:
    """An exception to record for a handler error that cannot be recorded as it is: same type
    name (and Unrecoverable if it was), a message saying why, no traceback."""
    base: type[Exception] = Unrecoverable if isinstance(error, Unrecoverable) else Exception
    stand_in: type[Exception] = type(
        type(error).__name__, (base,), {"__module__": type(error).__module__}
    )
    return stand_in(f"<unprintable exception: {describe(unrecordable)}>")
