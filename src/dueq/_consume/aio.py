"""``AsyncQueue.deliveries``: an ``async for`` iterator of deliveries, each the moment it is due.

The same loop as the threaded consumer (``_consume.threads``), on the caller's event loop with no
threads of its own: both drive one ``ClaimRules`` (``dueq._consume.rules``: what to claim, what a
reply means, the log lines) and one wake listener flow (``_consume.wake.wake_flow``), and only do
the I/O and the waiting themselves:

1. claim as many due tasks as there are free slots (``max_in_flight`` minus the deliveries
   yielded and not yet acked, failed or released, or whose lease has run out);
2. yield them;
3. sleep exactly until the next due time or lease deadline the claim script returned
   (counted from when the claim was sent, so the next claim reaches Redis at that time:
   ``ClaimRules.next_claim_s``, plus ``ClaimRules.margin_ms``; capped by ``heartbeat``; the
   last ms spun, as the loop's timers wake whole ms late: ``wait_until``), until a wake
   message says an earlier task was scheduled (``redis.asyncio`` Pub/Sub), or, when less
   than a quarter of the hold was free, until settled deliveries have freed a quarter of it
   (``Held.refill``: a claim worth its round trip).

Redis outages are logged and retried with backoff; the iterator never raises for them. Other
errors (authentication, a Redis older than 6.2) end it with that error. Leaving the loop
(``break``, an exception, ``aclose()``) releases the deliveries claimed but not yet yielded,
so their attempt does not count.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING, Any, Protocol

import reactivex
from reactivex import Observable, abc
from reactivex.disposable import Disposable

from dueq._consume.prefetch import AUTO_LOW, Prefetch
from dueq._consume.rules import ClaimedBatch, ClaimRules, release_failed
from dueq._consume.wake import WakeOp, WakeSubscription, close_failed, wake_flow
from dueq._util.aio import cancel_pending
from dueq._util.clock import Duration, positive_duration_ms
from dueq.delivery import AsyncDelivery, SettleHook
from dueq.exceptions import ConfigurationError

if TYPE_CHECKING:
    import redis.asyncio
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster


class AwaitsClaims(Protocol):
    """What an asyncio consumer needs of its queue (``AsyncQueue`` has it): its name and
    client, what to subscribe to for wakes, and the claim call (each awaited)."""

    @property
    def name(self) -> str: ...

    @property
    def redis(self) -> redis.asyncio.Redis | AsyncRedisCluster: ...

    async def wake_subscription(self) -> WakeSubscription: ...

    def woken(self, channel: str | None) -> None: ...

    async def claim_batch(self, limit: int) -> ClaimedBatch: ...


#: Most seconds spent closing the wake subscription when the iterator ends.
CLOSE_S = 1.0


#: Running ``observe`` subscriptions (see ``observe``).
_PUMPS: set[asyncio.Task[None]] = set()


def call_on_loop(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    """Call ``fn(*args)`` on ``loop``: at once when called from that loop, else as soon as the
    loop gets to it (``call_soon_threadsafe``), so it is safe from any thread."""
    try:
        here = asyncio.get_running_loop() is loop
    except RuntimeError:
        here = False
    if here:
        fn(*args)
    else:
        loop.call_soon_threadsafe(fn, *args)


async def wait_event(event: asyncio.Event, timeout_s: float | None) -> bool:
    """Wait until ``event`` is set (True) or ``timeout_s`` passes (False; None: no limit).

    Not ``asyncio.wait_for``: on Python 3.10 and 3.11 it swallows a cancellation that arrives
    as the event is set, so a disposed consumer would go on claiming (seen in a test).
    ``asyncio.wait`` never swallows one.
    """
    if event.is_set():
        return True
    waiter = asyncio.ensure_future(event.wait())
    try:
        done, _ = await asyncio.wait({waiter}, timeout=timeout_s)
    finally:
        waiter.cancel()
    return bool(done)


#: ms a timer's wake may come after its time even when not rounded up: Linux's default timer
#: slack (50 µs) and the loop's turn to run.
WAKE_LATE_MS = 0.1


def epoll_ms(whole_ms: int) -> int:
    """The ms ``epoll.poll`` waits when given ``whole_ms * 1e-3`` seconds (as the selector
    does): the float is taken to ns and then to ms, each rounded up, so a whole ms whose float
    is a hair above it (``9 * 1e-3`` is ``0.009000000000000001``) becomes one ms more."""
    return math.ceil(math.ceil(whole_ms * 1e-3 * 1e9) / 1e6)


#: ms before the target at which the last timer of a wait starts at the latest (``wait_until``):
#: a wait longer than this first sleeps until at least ``FIRST_PART_CUSHION_MS`` earlier.
LAST_PART_MS = 3.1

#: ms the first timer of a long wait ends before its last one would: the loop may reach its
#: select up to a ms after the timer was set (the rest is then rounded up to a whole ms), and
#: that whole ms may be rounded up once more (``epoll_ms``).
FIRST_PART_CUSHION_MS = 2.0


def timer_part_s(wait_s: float) -> float:
    """How much of a wait of ``wait_s`` seconds to spend on the event loop's timer
    (``wait_until``): whole ms, at least ``WAKE_LATE_MS`` under the wait, and one ms fewer
    when that whole ms would be rounded up twice (``epoll_ms``), so that the selector's
    rounding cannot take the timer past the end of the wait; 0 when that leaves none (a wait
    under 1.1 ms, or none at all). The rest of the wait (0.1 to 2.1 ms, under 1.1 ms for
    eight waits in nine) is spun."""
    whole_ms = math.floor(wait_s * 1000 - WAKE_LATE_MS)
    if whole_ms > 0 and epoll_ms(whole_ms) > whole_ms:
        whole_ms -= 1
    return whole_ms / 1000 if whole_ms > 0 else 0.0


async def wait_until(event: asyncio.Event, target_s: float) -> bool:
    """Wait until ``event`` is set (True) or the loop's clock reaches ``target_s`` (False),
    punctually: to a few µs past ``target_s``, not whole ms.

    An asyncio timer wakes up to 2 ms late (measured: a claim loop sleeping until each due
    time was 0-2 ms late, p99 3 ms of lag). The loop waits for its next timer in the
    selector, and ``selectors.EpollSelector.select`` rounds the timeout up to a whole ms
    (``math.ceil(timeout * 1e3) * 1e-3``); ``epoll.poll`` then turns that float into ms
    again, rounding up once more, and for about one whole ms in nine the float is a hair
    above it (``9 * 1e-3`` is ``0.009000000000000001``: 9,000,001 ns, so 10 ms): those
    waits are rounded up twice, and a wait of 8.3 ms ends after 10 ms. So the timer is set
    only for a whole number of ms under the target, one that is rounded up once, to itself
    (``timer_part_s``): it ends by the target. That holds when the loop selects as soon as the
    timer is set; when it first runs other callbacks (a claim's handlers and acks), it selects
    on the rest of the timer, rounded up to whole ms again: the wake comes as much later as
    the loop was busy (up to a ms), and whole ms can be rounded up twice (measured on a
    2-core VM: 12% of an ``AsyncWorker``'s waits, tasks 10 ms apart, ended 0.3-1.2 ms late).
    So a wait longer than ``LAST_PART_MS`` first sleeps until ``FIRST_PART_CUSHION_MS``
    before its last timer would end, and sets that last one on waking, when the loop has
    nothing else to do. The last 0.1 to 2.1 ms are spun: the loop is yielded to
    (``asyncio.sleep(0)``: other tasks, and I/O polled with a zero timeout, run between two
    turns) until its clock reaches the target. ``event`` set during any part ends the wait
    on the next turn (a wake message, a settle); a cancellation ends it at once."""
    loop = asyncio.get_running_loop()
    while True:
        wait_s = target_s - loop.time()
        if wait_s * 1000 > LAST_PART_MS:
            timer_s = timer_part_s(wait_s - FIRST_PART_CUSHION_MS / 1000)
        else:
            timer_s = timer_part_s(wait_s)
        if timer_s <= 0:
            break
        if await wait_event(event, timer_s):
            return True
        if wait_s * 1000 <= LAST_PART_MS:
            break
    while not event.is_set():
        if loop.time() >= target_s:
            return False
        await asyncio.sleep(0)
    return True


async def deliveries(
    queue: AwaitsClaims,
    *,
    max_in_flight: int | str = 64,
    wake: bool = True,
    heartbeat: Duration = 5.0,
    prefetch_low: int = AUTO_LOW,
    stopping: Callable[[], bool] = lambda: False,
    poke: asyncio.Event | None = None,
) -> AsyncGenerator[AsyncDelivery, None]:
    """The iterator behind ``AsyncQueue.deliveries``; see the module docstring. It ends when
    ``stopping()`` says so (``observe``'s disposal; checked before each claim, and whenever
    ``poke`` is set: see ``_claims``)."""
    claims = _claims(
        queue,
        max_in_flight=max_in_flight,
        wake=wake,
        heartbeat=heartbeat,
        prefetch_low=prefetch_low,
        stopping=stopping,
        poke=poke,
    )
    unyielded: deque[AsyncDelivery] = deque()
    try:
        async for batch in claims:
            unyielded = deque(batch)
            while unyielded:
                yield unyielded.popleft()
    finally:
        await claims.aclose()  # stops the wake listener
        for d in unyielded:  # claimed, never handed out: give back without counting
            await _release(d)


async def _claims(
    queue: AwaitsClaims,
    *,
    max_in_flight: int | str,
    wake: bool,
    heartbeat: Duration,
    prefetch_low: int,
    stopping: Callable[[], bool] = lambda: False,
    poke: asyncio.Event | None = None,
) -> AsyncGenerator[list[AsyncDelivery], None]:
    """The claim loop: each claim as a list (maybe empty while the queue is idle: the caller
    never sees an empty one from ``deliveries``), resumed once the caller took it; it ends
    when ``stopping()`` says so (checked before each claim). ``poke`` (the event its waits
    end on; a new one if not given) lets a disposer end a wait as well as cancel it: a cancel
    lost in the client would leave the loop asleep until its next claim time (a heartbeat,
    an hour in a test: issue 37)."""
    rules: ClaimRules[AsyncDelivery] = ClaimRules(
        queue.name,
        Prefetch.parse(max_in_flight, low=prefetch_low),
        positive_duration_ms(heartbeat, "heartbeat"),
    )
    poke = asyncio.Event() if poke is None else poke
    loop = asyncio.get_running_loop()

    def settled(delivery: AsyncDelivery) -> None:
        if rules.settled(delivery):  # room the loop waits for
            poke.set()

    def settled_many(deliveries: list[AsyncDelivery]) -> None:
        if rules.settled_many(deliveries):
            poke.set()

    hook = SettleHook(settled, settled_many)  # (an ack of a batch calls it once)

    listening = True  # (cleared before the listener is cancelled: see ``_listen``)
    listener = asyncio.create_task(_listen(queue, poke.set, lambda: listening)) if wake else None
    try:
        while not stopping():
            poke.clear()
            sent_s = loop.time()
            try:
                batch = await queue.claim_batch(rules.to_claim(sent_s))
            except Exception as exc:  # the rules decide: an outage's backoff, or the end
                backoff_ms = rules.failed(exc)
                if backoff_ms is None:
                    raise
                await asyncio.sleep(backoff_ms / 1000)
                continue
            replied_s, wait_ms = loop.time(), rules.claimed(batch, hook)
            clock_ms = batch.now_ms + batch.now_fraction_ms
            next_s = rules.next_claim_s(sent_s, replied_s, wait_ms, clock_ms)
            if next_s > sent_s:  # a wait, timed to the µs: not a hair before the due time
                next_s += rules.margin_ms() / 1000
            if batch.deliveries:
                yield batch.deliveries  # (the caller's time with them counts in the wait)
            if next_s > loop.time() and not poke.is_set():
                await wait_until(poke, next_s)
    finally:
        if listener is not None:  # bounded: releases must come before the leases run out
            listening = False
            listener.cancel()
            await asyncio.wait({listener}, timeout=CLOSE_S)


def consume(
    queue: AwaitsClaims,
    on_claimed: Callable[[list[AsyncDelivery]], None],
    on_error: Callable[[Exception], None],
    *,
    max_in_flight: int | str = 64,
    wake: bool = True,
    heartbeat: Duration = 5.0,
    prefetch_low: int = AUTO_LOW,
) -> ClaimLoop:
    """``AsyncWorker``'s source: the claim loop as a task on the running loop, each claim
    handed to ``on_claimed`` whole (no observable, no per-delivery hop between them); an
    error that ends it goes to ``on_error``. Disposing stops it: a flag checked before each
    claim, and a cancel of the task."""
    stopped = False
    poke = asyncio.Event()
    claims = _claims(
        queue,
        max_in_flight=max_in_flight,
        wake=wake,
        heartbeat=heartbeat,
        prefetch_low=prefetch_low,
        stopping=lambda: stopped,
        poke=poke,
    )

    async def pump() -> None:
        try:
            async for batch in claims:
                on_claimed(batch)  # (a claim under way when disposed is handed over too)
        except asyncio.CancelledError:
            raise  # disposed
        except Exception as exc:  # not an outage (those are waited out): the source ends
            on_error(exc)
        finally:
            await claims.aclose()

    def stop() -> None:
        # the flag as well as the cancel: a cancel can be lost (seen in a test: the loop went
        # on claiming, and the closing processor releasing each claim, hundreds of times;
        # most likely swallowed inside the client as a reply arrived)
        nonlocal stopped
        stopped = True
        poke.set()  # (a sleeping loop wakes to see the flag)
        task.cancel()

    loop = asyncio.get_running_loop()
    task = loop.create_task(pump())
    _PUMPS.add(task)  # the loop holds tasks weakly
    task.add_done_callback(_PUMPS.discard)
    return ClaimLoop(lambda: call_on_loop(loop, stop), task)


class ClaimLoop(Disposable):
    """What ``consume`` returns: disposing stops the claim loop; ``task`` ends once it has
    (``AsyncWorker`` awaits it, so that no claim is under way when it releases what it
    holds)."""

    def __init__(self, dispose: Callable[[], None], task: asyncio.Task[None]) -> None:
        super().__init__(dispose)
        self.task = task


async def _release(d: AsyncDelivery) -> None:
    try:
        await d.release()
    except Exception as exc:  # its lease runs out instead and it comes again
        release_failed(d.queue.name, d, exc)


def observe(
    queue: AwaitsClaims,
    *,
    max_in_flight: int | str,
    wake: bool,
    heartbeat: Duration,
    prefetch_low: int = AUTO_LOW,
) -> Observable[AsyncDelivery]:
    """The observable behind ``AsyncQueue.observe``: each subscription runs ``deliveries()``
    as a task on the loop it is subscribed from and emits there; disposing cancels the task
    (which releases what was claimed and not yet emitted). Subscribing outside a running loop
    is an ``on_error`` (ConfigurationError)."""
    Prefetch.parse(max_in_flight, low=prefetch_low)  # refused here, not when subscribed
    positive_duration_ms(heartbeat, "heartbeat")

    def subscribe(
        observer: abc.ObserverBase[AsyncDelivery], _scheduler: abc.SchedulerBase | None = None
    ) -> abc.DisposableBase:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise ConfigurationError(
                f"AsyncQueue {queue.name!r}: subscribe to observe() from a coroutine on the event "
                "loop it should run on (or use a sync dueq.Queue for a threaded consumer)"
            ) from None

        stopped = False
        poke = asyncio.Event()

        async def pump() -> None:
            it = deliveries(
                queue,
                max_in_flight=max_in_flight,
                wake=wake,
                heartbeat=heartbeat,
                prefetch_low=prefetch_low,
                stopping=lambda: stopped,  # should a cancel be swallowed in the client
                poke=poke,  # (set on disposal: a sleeping loop wakes to see the flag)
            )
            try:
                async for d in it:
                    if stopped:  # disposed while this one was being claimed: give it back
                        await _release(d)
                        break
                    observer.on_next(d)
            except asyncio.CancelledError:
                raise  # disposed
            except Exception as exc:  # not an outage (those are waited out): end the stream
                observer.on_error(exc)
            finally:
                await it.aclose()  # releases what was claimed and not yet emitted

        task = loop.create_task(pump())
        _PUMPS.add(task)  # the loop holds tasks weakly; a dropped subscription must still end
        task.add_done_callback(_PUMPS.discard)

        def stop() -> None:
            poke.set()
            task.cancel()

        def dispose() -> None:
            nonlocal stopped
            stopped = True
            call_on_loop(loop, stop)

        return Disposable(dispose)

    return reactivex.create(subscribe)


async def _listen(
    queue: AwaitsClaims, on_wake: Callable[[], None], listening: Callable[[], bool] = lambda: True
) -> None:
    """Call ``on_wake()`` for each message on the queue's wake channel until cancelled.

    After every (re)subscription it wakes the consumer once, in case something was scheduled
    while it was not listening; a lost message costs at most one heartbeat.

    It ends when cancelled whatever redis-py does with the cancellation. A cancel can be lost
    inside redis-py's read: ``Connection.read_response`` returns "no message" for the
    TimeoutError of its own ``timeout=`` (made by ``asyncio.timeout`` from a cancel), and a
    cancel lost there leaves the task "cancelling" with nothing raised, so a loop that only
    waited for the CancelledError read on for ever and ``asyncio.run`` never returned (issue
    37: about one async test run in 5 on Redis 6.2; aioredis #1424 is the same family). So
    before each
    step it looks at the task's pending cancellation (``Task.cancelling``, Python 3.11+) and
    at its owner's ``listening()`` (cleared before the cancel, for Python 3.10), and ends.
    """
    flow = wake_flow(queue.name)
    opened: Any = None  # the subscription open now: closed when the listener ends
    this = asyncio.current_task()
    try:
        step = next(flow)
        while True:
            if not listening() or cancel_pending(this):
                raise asyncio.CancelledError  # swallowed in the client: end as cancelled
            reply: Any = None
            try:
                if step.op is WakeOp.SUBSCRIPTION:
                    reply = await queue.wake_subscription()
                elif step.op is WakeOp.PUBSUB:
                    reply = opened = queue.redis.pubsub(ignore_subscribe_messages=True)
                elif step.op is WakeOp.CALL:
                    reply = await getattr(step.pubsub, step.method)(*step.args, **step.kwargs)
                elif step.op is WakeOp.WAKE:
                    queue.woken(step.channel)
                    on_wake()
                elif step.op is WakeOp.CLOSE:
                    await _close(step.pubsub)
                    opened = None
                else:
                    await asyncio.sleep(step.delay_s)
            except Exception as exc:  # the flow decides (an outage, or the end)
                step = flow.throw(exc)
            else:
                step = flow.send(reply)
    except StopIteration:
        pass  # the flow ended (an error that is not an outage; logged there)
    finally:
        flow.close()
        await _close(opened)


async def _close(pubsub: Any) -> None:
    """Close a subscription, waiting at most CLOSE_S (closing a connection whose read was
    cancelled can wait on the server otherwise)."""
    if pubsub is not None:
        try:
            await asyncio.wait_for(pubsub.aclose(), CLOSE_S)
        except (Exception, asyncio.CancelledError):  # broken or slow to close: let it go
            close_failed()
