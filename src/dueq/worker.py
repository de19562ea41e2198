"""``Worker``: a blocking loop that runs a handler on one or more queues until told to stop.

It is ``observe`` + ``operators.process`` with an operator's life cycle: SIGINT or SIGTERM (or
``stop()``) ends claiming, running handlers get ``grace`` seconds to finish, and deliveries
that have not started are released for other workers (their attempt does not count). A second
signal cuts the grace period short.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections import Counter
from collections.abc import Iterable
from types import FrameType
from typing import Any

import reactivex
from reactivex import Observer

from .checks import whole_number
from .clock import Duration, duration_ms, positive_duration_ms
from .exceptions import ConfigurationError
from .observe import MAX_IN_FLIGHT
from .operators import MAX_CONCURRENCY
from .operators._process import Handler, Processor
from .queue import Queue
from .task import Outcome

logger = logging.getLogger(__name__)

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: How often the run loop looks for a signal or ``stop()``.
STOP_POLL_S = 0.1


class Worker:
    """Runs ``handler`` on deliveries of ``queues`` with ``concurrency`` handlers at a time.

    ``max_in_flight`` bounds the deliveries held per queue (running plus waiting, their leases
    kept alive; default four times the concurrency, like Celery's prefetch). ``outcomes``
    counts what became of them (acked, retried, dead, released, lost).
    """

    def __init__(
        self,
        queues: Queue | Iterable[Queue],
        handler: Handler,
        *,
        concurrency: int = 8,
        max_in_flight: int | None = None,
        grace: Duration = 30.0,
        heartbeat: Duration = 5.0,
    ) -> None:
        self.queues = [queues] if isinstance(queues, Queue) else list(queues)
        if not self.queues or not all(isinstance(q, Queue) for q in self.queues):
            raise ConfigurationError("Worker needs a dueq.Queue or a non-empty list of them")
        if not callable(handler):
            raise ConfigurationError(f"handler must be callable, got {handler!r}")
        whole_number(concurrency, "concurrency", low=1, high=MAX_CONCURRENCY)
        self.handler = handler
        self.concurrency = concurrency
        self.max_in_flight = 4 * concurrency if max_in_flight is None else max_in_flight
        whole_number(self.max_in_flight, "max_in_flight", low=1, high=MAX_IN_FLIGHT)
        self.grace_s = duration_ms(grace, "grace", error=ConfigurationError) / 1000
        positive_duration_ms(heartbeat, "heartbeat")  # refused here, not when run() starts
        self.heartbeat = heartbeat
        self.outcomes: Counter[str] = Counter()
        self._stop = threading.Event()
        self._hurry = threading.Event()
        self._signalled = False  # a SIGINT/SIGTERM arrived (see _on_signal)
        self._error: Exception | None = None

    def stop(self) -> None:
        """Ask ``run`` to stop (safe from any thread or a signal handler)."""
        if self._stop.is_set():
            self._hurry.set()
        self._stop.set()

    def run(self) -> None:
        """Process tasks until ``stop()``, SIGINT or SIGTERM; then shut down cleanly.

        Raises the error that ended a delivery stream, if one did (Redis outages do not).
        """
        source = reactivex.merge(
            *(
                q.observe(max_in_flight=self.max_in_flight, heartbeat=self.heartbeat)
                for q in self.queues
            )
        )
        processor = Processor(self.handler, self.concurrency)
        previous = self._install_signal_handlers()
        names = ", ".join(q.name for q in self.queues)
        logger.info("worker started on %s with concurrency %d", names, self.concurrency)
        processor.subscribe(source, Observer(self._count, self._failed))
        try:
            while not self._stop.wait(STOP_POLL_S):
                if self._signalled:  # set by the signal handler, which takes no lock
                    self.stop()
            logger.info(
                "worker stopping: no new tasks; %.1f s grace for running ones", self.grace_s
            )
            processor.close(self.grace_s, hurry=self._hurry)
        finally:
            self._restore_signal_handlers(previous)
        logger.info("worker stopped: %s", dict(self.outcomes))
        if self._error is not None:
            raise self._error

    def _count(self, outcome: Outcome) -> None:
        self.outcomes[outcome.kind] += 1

    def _failed(self, error: Exception) -> None:
        self._error = error
        self._stop.set()

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        """Runs on the main thread between two bytecodes, possibly while that thread holds
        ``self._stop``'s internal lock inside ``Event.wait``: so it must not set that event
        (``Event.set`` takes the same non-reentrant lock and would deadlock). It records the
        signal; the run loop acts on it within STOP_POLL_S. ``_hurry`` is safe to set here:
        the main thread never waits on it."""
        if self._stop.is_set() or self._signalled:
            logger.warning(
                "second %s: not waiting for running handlers", signal.Signals(signum).name
            )
            self._hurry.set()
        self._signalled = True

    def _install_signal_handlers(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}  # signals are only delivered to the main thread; use stop()
        previous: dict[int, Any] = {sig: signal.getsignal(sig) for sig in _SIGNALS}
        for sig in _SIGNALS:
            signal.signal(sig, self._on_signal)
        return previous

    @staticmethod
    def _restore_signal_handlers(previous: dict[int, Any]) -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
