"""Costly things a test process starts once (a JVM: the SparkSession, a Spark Connect server),
outside every test's timeout and within a bound of their own, failing one test, not fifty.

pytest-timeout's timer (120 s a test, pyproject) runs from the start of a test's
``pytest_runtest_protocol`` to its end, fixture set-up included. A session fixture that starts
a JVM inside it on a busy 2-core machine could pass the 120 s: that test failed with a
timeout, and pytest kept the set-up's error and raised it again for every later test of the
fixture: about 50 Spark tests failed with the same traceback in one run of scripts/test.

So a ``SlowStart`` is begun by conftest's own wrapper of ``pytest_runtest_protocol``, which
runs around pytest-timeout's (``tryfirst``): before the first test that names its fixture,
before that test's timer starts, bounded by an alarm of its own (``bound_s``). A start
that failed or ran out of time is remembered: the first test that asks for it fails with the
reason, in one line; every later one is skipped with a line naming that test. Fixtures that
use one are function-scoped (``get`` per test), since pytest replays a session fixture's
set-up error to every test.
"""

from __future__ import annotations

import gc
import signal
import time
import warnings
from collections.abc import Callable
from typing import Any

import pytest

__all__ = ["REGISTRY", "SlowStart"]


class SlowStart:
    """``start()`` run once, for at most ``bound_s``: its value, or the reason it has none."""

    def __init__(self, what: str, start: Callable[[], Any], bound_s: float) -> None:
        self.what = what
        self.bound_s = bound_s
        self._start = start
        self._begun = False
        self.value: Any = None
        self.reason: str | None = None
        self.seconds: float | None = None
        #: the node id of the test that failed with the reason (later ones skip naming it)
        self.failed_in: str | None = None
        #: why a value that started is unusable (``broken``)
        self.spoilt: str | None = None

    def begin(self) -> None:
        """Start it, unless already begun (whatever came of it); never raises."""
        if self._begun:
            return
        self._begun = True
        outcome: dict[str, Any] = {}

        def out_of_time(signum: int, frame: Any) -> None:
            raise _OutOfTime

        # In this (the main) thread, bounded by an alarm: a SparkSession made on another
        # thread does not find the data sources pyspark discovers (pyspark_dueq's).
        began = time.monotonic()
        previous = signal.signal(signal.SIGALRM, out_of_time)
        signal.setitimer(signal.ITIMER_REAL, self.bound_s)
        try:
            outcome["value"] = self._start()
        except _OutOfTime:
            outcome["late"] = True
        except KeyboardInterrupt:  # the user's, not the start's
            raise
        # anything (pytest.fail and skip included, both BaseException) is the reason
        except BaseException as exc:
            outcome["error"] = exc
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        self.seconds = time.monotonic() - began
        if outcome.get("late"):
            self.reason = f"not started within its bound of {self.bound_s:g} s"
        elif "error" in outcome:
            exc = outcome.pop("error")
            self.reason = " ".join(f"{type(exc).__name__}: {exc}".split())
            # What the failed start left open goes now, not in a later test's teardown (where
            # filterwarnings=error makes its ResourceWarning that test's error): pyspark keeps
            # a gateway that exited with its stdin pipe open, held by the traceback's frames.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ResourceWarning)
                del exc
                gc.collect()
        else:
            self.value = outcome["value"]

    def broken(self, why: str) -> None:
        """It started, but a test left it unusable: the later tests skip saying ``why``."""
        self.spoilt = why

    def get(self, nodeid: str) -> Any:
        """The value; or fail this test with the reason (the first to ask), or skip it
        naming the test that failed."""
        self.begin()  # begun by conftest's hook already; here for a caller without it
        if self.spoilt is not None:
            pytest.skip(f"{self.what} is unusable: {self.spoilt}")
        if self.reason is None:
            return self.value
        if self.failed_in is None:
            self.failed_in = nodeid
            pytest.fail(
                f"{self.what} did not start ({self.seconds:.1f} s): {self.reason}", pytrace=False
            )
        pytest.skip(f"{self.what} did not start: the reason is in {self.failed_in}")

    def stop(self, stopper: Callable[[Any], None]) -> None:
        """``stopper(value)`` if it started; then it may be begun again (a module's server)."""
        value, self.value = self.value, None
        self._begun, self.reason, self.failed_in, self.spoilt = False, None, None, None
        if value is not None:
            stopper(value)


class _OutOfTime(BaseException):
    """The alarm of ``SlowStart.begin``: its start ran past its bound."""


#: Fixture name -> its SlowStart: conftest begins the ones a test names before its timer.
REGISTRY: dict[str, SlowStart] = {}
