"""An asyncio event loop on a virtual clock, for tests of an asyncio consumer's timing.

Timers (``asyncio.sleep``, ``asyncio.wait`` timeouts, ``call_at``) fire at their exact virtual
time and take no real time: when the loop would block until its next timer, its clock jumps to
that timer instead. Real I/O (the test's Redis) still runs for real: the loop polls its sockets
first and only jumps when none is ready. While nothing but I/O is pending (no timer), it blocks
on the sockets as any loop does. A turn of the loop with callbacks ready and no I/O takes
``TURN_S`` (10 µs) of virtual time, so a coroutine spinning until the clock reaches a time
(``asyncio.sleep(0)`` in a loop) gets there.

The clock jumps only when the loop has nothing ready to run, so the order of a coroutine's steps
is kept; what a test must not do is keep a timer pending while it waits for Redis (a timeout
around the whole run, a socket timeout on the client): the clock would jump to it as soon as a
reply is a moment late. The threaded consumer's tests use reactivex's ``TestScheduler`` the
same way.
"""

from __future__ import annotations

import asyncio
import math
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def epoll_rounded_s(timeout_s: float) -> float:
    """How long a real loop's wait for a timer ``timeout_s`` away lasts on Linux (CPython
    3.11): ``selectors.EpollSelector.select`` rounds the timeout up to whole ms, and
    ``epoll.poll`` rounds that float up to ns and then to ms once more."""
    selector_s = math.ceil(timeout_s * 1e3) * 1e-3
    return math.ceil(math.ceil(selector_s * 1e9) / 1e6) / 1e3


#: Virtual seconds a turn of the loop takes when it has callbacks ready and no I/O: a loop that
#: spins (``asyncio.sleep(0)`` until its clock reaches a time, ``dueq._consume.aio``) would
#: otherwise never see its clock move.
TURN_S = 1e-5


class _Clock:
    def __init__(self, start_s: float) -> None:
        self.now_s = start_s


class _JumpingSelector(selectors.DefaultSelector):
    """A selector whose wait for a timer is a jump of the virtual clock."""

    def __init__(self, clock: _Clock, epoll_rounding: bool) -> None:
        super().__init__()
        self._clock = clock
        self._epoll_rounding = epoll_rounding

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:  # no timer: block on I/O alone
            return super().select(None)
        ready = super().select(0)
        if not ready:  # nothing to read or write: the next timer is due, or a turn is spent
            if timeout > 0 and self._epoll_rounding:
                timeout = epoll_rounded_s(timeout)
            self._clock.now_s += timeout if timeout > 0 else TURN_S
        return ready


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose ``time()`` is a virtual clock starting at ``start_s``; with
    ``epoll_rounding``, a wait for a timer lasts as long as a real loop's on Linux
    (``epoll_rounded_s``: up to 2 ms past the timer), else exactly until it."""

    def __init__(self, start_s: float, epoll_rounding: bool = False) -> None:
        self._virtual = _Clock(start_s)
        super().__init__(_JumpingSelector(self._virtual, epoll_rounding))
        # a timer is run once the clock is within this of it: above the float spacing of
        # epoch seconds (2.4e-7), so a jump by the remaining timeout always reaches it
        self._clock_resolution = 1e-6

    def time(self) -> float:
        return self._virtual.now_s

    def spend(self, seconds: float) -> None:
        """Take ``seconds`` of the loop's time, as a callback that runs that long does."""
        self._virtual.now_s += seconds


def run_virtual(coro: Coroutine[Any, Any, T], start_s: float, *, epoll_rounding: bool = False) -> T:
    """Run ``coro`` to its end on a new ``VirtualTimeLoop`` (as ``asyncio.run`` does on a
    real one: tasks left over are cancelled, async generators closed, the loop closed)."""
    loop = VirtualTimeLoop(start_s, epoll_rounding)
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(coro)
    finally:
        try:
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()
