"""The threaded runner of ``process``: only as many handler threads take work as help, and
finished results reach the settler in batches without waiting on a slow handler.

These drive ``_ThreadRunner`` directly with stand-in deliveries (no Redis is involved: the
runner only calls the handler and the processor's callbacks) and a CPU clock the test
chooses, so "the process was busy" and "the handlers wait" are decided by the test, not by
how loaded the machine is.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from internals_support import process

FLUSH_MAX = process.FLUSH_MAX
LONG_HANDLER_S = process.LONG_HANDLER_S
RAMP_DOWN_ABOVE = process.RAMP_DOWN_ABOVE
RAMP_UP_BELOW = process.RAMP_UP_BELOW
Ramp = process.Ramp
_ThreadRunner = process._ThreadRunner


WAIT_S = 10.0


class Item:
    """A stand-in delivery (the runner only hands it to the handler and the callbacks)."""

    def __init__(self, n: int) -> None:
        self.id = str(n)


class Harness:
    """A runner with recording callbacks; ``peak`` is the most handlers that ran at once."""

    def __init__(
        self,
        handler: Callable[[Any], Any],
        concurrency: int,
        cpu_clock: Callable[[], float],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.peak = 0
        self.handed_over: list[list[Any]] = []
        self.settled: list[str] = []

        def counted(d: Any) -> Any:
            with self.lock:
                self.running += 1
                self.peak = max(self.peak, self.running)
            try:
                return handler(d)
            finally:
                with self.lock:
                    self.running -= 1

        def hand_over(results: list[Any]) -> None:
            with self.lock:
                self.handed_over.append(results)
                self.settled += [d.id for d, _ in results]

        self.runner = _ThreadRunner(
            counted,
            concurrency,
            lambda d: True,  # begin
            lambda d, error: True,  # finished: settle it
            hand_over,
            lambda d: None,  # unstarted
            None,
            cpu_clock=cpu_clock,
            clock=clock,
        )
        self.runner.start()

    def submit(self, n: int, start: int = 0) -> None:
        for i in range(start, start + n):
            self.runner.submit(Item(i))  # type: ignore[arg-type]

    def wait_settled(self, n: int) -> None:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.settled) >= n:
                    return
            time.sleep(0.001)
        raise AssertionError(f"{len(self.settled)} of {n} results reached the settler")

    def stop(self) -> None:
        self.runner.stop()


def busy_clock() -> float:
    """A CPU clock that says the process used a whole CPU all along."""
    return time.monotonic()


def idle_clock() -> float:
    """A CPU clock that says the process used no CPU at all (its handlers wait)."""
    return 0.0


def slow_clock() -> float:
    """A clock at a tenth of real speed, for the runner (windows, handlers' ages) and as a CPU
    clock that says the process used a whole CPU all along: on a loaded machine the OS may
    leave a thread waiting 20 ms or more, which on a real clock makes a 2 ms handler a long
    one (``LONG_HANDLER_S``), and every running handler long adds a thread."""
    return time.monotonic() / 10


def test_handlers_that_never_wait_run_on_one_thread_although_concurrency_allows_eight() -> None:
    # short handlers, with deliveries waiting for a dozen monitor windows: with the process
    # busy, extra threads would only queue for the GIL (one probe for handlers outside the
    # GIL may add a second thread for a window)
    h = Harness(lambda d: time.sleep(0.002), 8, slow_clock, slow_clock)
    try:
        h.submit(600)
        h.wait_settled(600)
    finally:
        h.stop()
    assert h.peak <= 2
    assert h.runner.active == 1


def test_handlers_that_wait_get_more_threads_but_never_more_than_the_concurrency() -> None:
    h = Harness(lambda d: time.sleep(0.005), 4, idle_clock)
    try:
        h.submit(200)
        h.wait_settled(200)
    finally:
        h.stop()
    assert h.peak == 4
    assert h.runner.active == 4


def test_handlers_that_wait_for_each_other_all_get_a_thread_when_submitted_at_once() -> None:
    # the claim of a whole hold at once, to an idle runner (its monitor asleep): the monitor
    # must stay awake while deliveries wait, whoever of it and the first thread runs first
    for _ in range(5):
        together = threading.Barrier(4)
        h = Harness(lambda d, b=together: b.wait(WAIT_S), 4, busy_clock)
        try:
            time.sleep(0.02)  # every thread parked, the monitor asleep
            h.runner.submit_many([Item(i) for i in range(4)])  # type: ignore[list-item]
            h.wait_settled(4)
        finally:
            together.abort()
            h.stop()
        assert h.peak == 4


def test_a_long_handler_never_holds_up_the_rest_even_when_the_process_is_busy() -> None:
    release = threading.Event()

    def handle(d: Any) -> None:
        if d.id == "0":
            release.wait(WAIT_S)

    h = Harness(handle, 2, busy_clock)
    try:
        h.submit(1)
        time.sleep(LONG_HANDLER_S)  # the first one is running (and runs long) ...
        h.submit(20, start=1)
        h.wait_settled(20)  # ... and the rest still get through on a second thread
        assert "0" not in h.settled
        release.set()
        h.wait_settled(21)
    finally:
        release.set()
        h.stop()
    assert h.peak == 2


def test_a_finished_result_reaches_the_settler_while_the_thread_runs_a_slow_handler() -> None:
    release = threading.Event()
    h = Harness(lambda d: d.id == "1" and release.wait(WAIT_S), 1, busy_clock)
    try:
        h.submit(2)  # "0" finishes at once; "1" then blocks the only thread
        h.wait_settled(1)
        assert h.settled == ["0"]
    finally:
        release.set()
        h.stop()


def test_quick_results_reach_the_settler_in_batches_in_order() -> None:
    # one handler thread, so the order is the one given: with concurrency 8 a probe may run a
    # second thread for a window (and a loaded machine's 20 ms waits made handlers look long on
    # a real clock, adding more), which reordered results now and then
    h = Harness(lambda d: None, 1, slow_clock, slow_clock)
    try:
        h.submit(2000)
        h.wait_settled(2000)
    finally:
        h.stop()
    assert h.settled == [str(i) for i in range(2000)]  # one thread: in the order given
    assert len(h.handed_over) < 2000 / 4  # not one hand-over (settler wake-up) per task
    assert max(len(batch) for batch in h.handed_over) <= FLUSH_MAX


def test_stop_lets_the_threads_finish_what_waits_and_hand_over_every_result() -> None:
    h = Harness(lambda d: time.sleep(0.001), 3, idle_clock)
    h.submit(50)
    h.stop()
    h.wait_settled(50)
    # the monitor starts a thread only when the ramp first lets that many work: once it has
    # exited no more start, and the started ones are the ones to join
    h.runner._monitor.join(WAIT_S)
    assert not h.runner._monitor.is_alive()
    started = [thread for thread in h.runner._threads if thread.ident is not None]
    assert started
    for thread in started:
        thread.join(WAIT_S)
        assert not thread.is_alive()


@pytest.mark.parametrize(
    ("share", "all_long", "expected"),
    [
        (RAMP_UP_BELOW / 2, False, 4),  # the handlers wait: one more
        (1.0, True, 4),  # every running handler is long: one more, however busy
        ((RAMP_DOWN_ABOVE + 1) / 2, False, 2),  # busy, taking turns at the GIL: one fewer
        ((RAMP_UP_BELOW + RAMP_DOWN_ABOVE) / 2, False, 3),  # in between: as it is
    ],
)
def test_the_ramp_adds_a_thread_when_handlers_wait_and_retires_one_when_they_take_turns(
    share: float, all_long: bool, expected: int
) -> None:
    ramp = Ramp(8, cores=2)
    ramp.active = 3
    assert ramp.step(share, all_long, now_s=0.0) == expected


def test_the_ramp_never_leaves_one_to_the_concurrency() -> None:
    ramp = Ramp(4, cores=2)
    for now_s in range(10):
        ramp.step(0.0, False, float(now_s))
    assert ramp.active == 4
    for now_s in range(10, 20):
        ramp.step(0.95, False, float(now_s))  # busy: down, a probe now and then, down again
    assert ramp.active in (1, 2)
    for now_s in range(100, 140):
        ramp.step(0.95, False, now_s / 100)
    assert ramp.active >= 1


def test_the_ramp_probes_for_handlers_outside_the_gil_and_backs_off_when_there_are_none() -> None:
    gil_bound = Ramp(8, cores=4)
    actives = [gil_bound.step(1.0, False, i * 0.01) for i in range(200)]  # 2 s of windows
    assert max(actives) == 2  # a probe ...
    probes = sum(1 for a, b in itertools.pairwise([1, *actives]) if b > a)
    assert 1 <= probes <= 3  # ... taken back, and tried again ever more rarely
    assert actives[-1] == 1
    assert actives.count(2) <= probes

    outside_gil = Ramp(8, cores=4)  # each thread keeps a CPU busy: grow to the cores
    for i in range(20):
        outside_gil.step(outside_gil.active * 1.0, False, i * 0.01)
    assert outside_gil.active == 4


def test_the_runner_starts_one_handler_thread_until_the_ramp_lets_more_work() -> None:
    """A worker's first task waits for no thread start but its own: the other threads of
    ``concurrency`` start when the ramp first lets them take work."""
    h = Harness(lambda d: None, 8, busy_clock)
    try:
        h.submit(3)
        h.wait_settled(3)
        started = [t for t in h.runner._threads if t.ident is not None]
    finally:
        h.stop()
    assert len(started) == 1


def test_threads_the_ramp_admits_are_started_and_take_work() -> None:
    h = Harness(lambda d: time.sleep(0.005), 3, idle_clock)
    try:
        h.submit(100)
        h.wait_settled(100)
        started = [t for t in h.runner._threads if t.ident is not None]
    finally:
        h.stop()
    assert h.peak == 3
    assert len(started) == 3
