"""Serialised emission to one observer without holding a lock while its code runs.

Outcomes come from several threads (the settler, releases on a closer thread, the stream's own
thread) and an observer must see one call at a time, in order. Holding a lock around
``on_next`` is the classic deadlock: the subscriber may dispose from inside it (``take(5)``),
which releases deliveries and emits again, on this thread or on one the disposal waits for.
So calls go through a queue: whoever finds nobody emitting drains it, outside the lock;
everyone else, including a reentrant call from inside ``on_next``, only enqueues and returns.
(RxPY's ``synchronized`` and serialised observers solve the same problem with a reentrant
lock; the queue also never makes one producer wait for another's subscriber.)
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any, Generic, TypeVar

from reactivex import abc

logger = logging.getLogger("dueq.operators")

T = TypeVar("T")


class SerialEmitter(Generic[T]):
    """Calls ``observer`` one at a time and in order, from whichever thread drains first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: deque[tuple[str, Any]] = deque()
        self._emitting = False
        self._observer: abc.ObserverBase[T] | None = None
        self._stopped = False  # on_error or on_completed went out: nothing more does
        # an on_error or on_completed waits in _calls (or went out): a batch taken from now
        # on stops the stream (a flag, not a look at each call of each batch)
        self._ends_queued = False

    def attach(self, observer: abc.ObserverBase[T]) -> None:
        self._observer = observer

    def on_next(self, *values: T) -> None:
        if values:
            self._push([("on_next", values)])  # (one entry per batch: no tuple per value)

    def on_error(self, error: Exception) -> None:
        self._push([("on_error", error)], end=True)

    def on_completed(self) -> None:
        self._push([("on_completed", None)], end=True)

    def _push(self, calls: list[tuple[str, Any]], *, end: bool = False) -> None:
        with self._lock:
            self._calls.extend(calls)
            self._ends_queued = self._ends_queued or end
            if self._emitting:
                return  # the thread emitting now (maybe this one, further up) delivers them
            self._emitting = True
        while True:
            with self._lock:  # take every call queued now: one lock round per batch
                if not self._calls:
                    self._emitting = False
                    return
                calls = list(self._calls)
                self._calls.clear()
                observer = None if self._stopped else self._observer
                if self._ends_queued:
                    self._stopped = True  # (calls after it in this batch are dropped below)
            if observer is None:
                continue
            for name, value in calls:
                try:
                    if name == "on_next":  # a batch of values
                        on_next = observer.on_next
                        for v in value:
                            on_next(v)
                    elif name == "on_completed":
                        observer.on_completed()
                    else:
                        observer.on_error(value)
                except Exception:  # the subscriber's own bug; reactivex has detached it
                    logger.exception("outcome subscriber raised; outcomes are no longer emitted")
                    with self._lock:
                        self._stopped = True
                    break
                if name != "on_next":
                    break  # nothing goes out after on_error or on_completed
