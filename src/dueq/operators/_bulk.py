"""Bulk handlers: many deliveries of one handler in one call (``BatchSpec``), for both
processors.

A bulk handler's deliveries are held as every other delivery is (their leases kept alive,
each counted in the hold), but they reach the handler runners as *bundles*: a ``Gatherer``
collects them per handler (a named task's function, or the worker's plain handler) until a
bundle has ``max`` of them or its ``linger`` has run out since its first delivery fell due.
The processor sets one timer for the earliest linger end (the threaded one on its scheduler,
the asyncio one on its loop): an idle worker with a linger makes no Redis traffic and no
wake-ups but that timer (no polling).

A bundle runs as one handler call over its items (``dueq.Item``); once the call ends, each
item becomes what a single delivery's handler result is for the settler: ``None`` (acked),
its failure, or a ``Retry`` / ``Release`` verdict, so acks, failures and releases of a call
settle through the same flows (``_settle.Settling``) as single deliveries, in the same
rounds. Per-item rules hold per item: a cancelled item, or one whose queue paused or key
cools, is given back unstarted; a timeout is the call's (the shortest of its items').

Pure bookkeeping: no thread, lock or Redis call here; the processors call it under their
own locks (the threaded one) or on their loop (the asyncio one).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from operator import attrgetter
from typing import Any

from dueq.delivery import DeliveryBase, Item
from dueq.model import BatchSpec


class Retry:
    """An item failed with ``item.fail(error, retry_in=...)``: the settler records ``error``
    with that delay instead of the policy's."""

    __slots__ = ("error", "retry_in")

    def __init__(self, error: BaseException | str, retry_in: Any) -> None:
        self.error = error
        self.retry_in = retry_in


class Release:
    """An item the handler gave back (``item.release(delay)``): released, no attempt
    counted."""

    __slots__ = ("delay",)

    def __init__(self, delay: Any) -> None:
        self.delay = delay


class Bundle:
    """Deliveries of one bulk handler (``group``) for one call."""

    __slots__ = ("deadline_s", "deliveries", "group", "spec")

    def __init__(self, group: Any, spec: BatchSpec, deadline_s: float) -> None:
        self.group = group
        self.spec = spec
        self.deliveries: list[Any] = []
        #: when it runs with what it has (the first delivery's due time + linger)
        self.deadline_s = deadline_s

    @property
    def full(self) -> bool:
        return len(self.deliveries) >= self.spec.max

    def __len__(self) -> int:
        return len(self.deliveries)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.deliveries)

    def __repr__(self) -> str:
        return f"Bundle({len(self.deliveries)} of {self.spec.max})"


#: What a processor asks of its dispatcher for each delivery: None for a delivery that runs
#: alone, else (the bulk handler it goes to, that handler's BatchSpec).
BulkOf = Callable[[Any], "tuple[Any, BatchSpec] | None"]


class Gatherer:
    """Open bundles per bulk handler, filled as deliveries arrive (see the module docstring)."""

    def __init__(self, bulk_of: BulkOf, plain: tuple[Any, BatchSpec] | None = None) -> None:
        self.bulk_of = bulk_of
        #: what ``bulk_of`` gives every plain payload task (no ``task_name``), when it gives
        #: them all one handler (a worker's ``batch=``): a claim of plain tasks only is then
        #: split into bundles without a Python step per delivery
        self.plain = plain
        self._open: dict[Any, Bundle] = {}

    def __bool__(self) -> bool:
        return bool(self._open)

    def sort(self, deliveries: list[Any], now_s: float) -> tuple[list[Any], list[Bundle]]:
        """Split arriving ``deliveries`` into those that run alone and the bundles now ready
        (full, or with no linger); the rest wait in open bundles."""
        single: list[Any] = []
        ready: list[Bundle] = []
        bulk_of, open_ = self.bulk_of, self._open
        plain = self.plain
        if plain is not None and deliveries:
            names = list(map(_task_name, deliveries))  # (in C)
            if names.count(None) == len(names):  # plain tasks only: one handler's bundles
                self._fill(plain[0], plain[1], deliveries, now_s, ready)
                deliveries = []
        for d in deliveries:
            found = bulk_of(d)
            if found is None:
                single.append(d)
                continue
            group, spec = found
            bundle = open_.get(group)
            if bundle is None:
                linger_s = spec.linger_s
                deadline_s = now_s + max(linger_s - late_s(d), 0.0) if linger_s else now_s
                bundle = open_[group] = Bundle(group, spec, deadline_s)
            members = bundle.deliveries
            members.append(d)
            if len(members) >= spec.max:  # full (Bundle.full, inline: a call less per task)
                ready.append(open_.pop(group))
        for group, bundle in list(self._open.items()):
            if bundle.deadline_s <= now_s:  # no linger (or already over): runs now
                ready.append(self._open.pop(group))
        return single, ready

    def _fill(
        self, group: Any, spec: BatchSpec, deliveries: list[Any], now_s: float, ready: list[Bundle]
    ) -> None:
        """Add ``deliveries`` (all of ``group``) to its open bundle in slices: each bundle
        filled to ``max`` goes to ``ready``, the rest stays open (as the loop of ``sort``
        does one delivery at a time)."""
        start, n = 0, len(deliveries)
        while start < n:
            bundle = self._open.get(group)
            if bundle is None:
                d = deliveries[start]
                linger_s = spec.linger_s
                deadline_s = now_s + max(linger_s - late_s(d), 0.0) if linger_s else now_s
                bundle = self._open[group] = Bundle(group, spec, deadline_s)
            room = spec.max - len(bundle.deliveries)
            bundle.deliveries += deliveries[start : start + room]
            start += room
            if len(bundle.deliveries) >= spec.max:
                ready.append(self._open.pop(group))

    def next_deadline_s(self) -> float | None:
        """When the earliest open bundle runs with what it has (None: none open)."""
        return min((b.deadline_s for b in self._open.values()), default=None)

    def expired(self, now_s: float) -> list[Bundle]:
        """The open bundles whose linger has run out by ``now_s``, closed."""
        ready = [b for b in self._open.values() if b.deadline_s <= now_s]
        for b in ready:
            del self._open[b.group]
        return ready

    def drain(self) -> list[Any]:
        """Every delivery still gathering (the processor closes)."""
        taken = [d for b in self._open.values() for d in b.deliveries]
        self._open.clear()
        return taken

    def take(self, which: Callable[[Any], bool]) -> list[Any]:
        """The gathering deliveries ``which`` chooses, taken out of their bundles."""
        taken: list[Any] = []
        for group, bundle in list(self._open.items()):
            chosen = [d for d in bundle.deliveries if which(d)]
            if chosen:
                taken += chosen
                bundle.deliveries = [d for d in bundle.deliveries if not which(d)]
                if not bundle.deliveries:
                    del self._open[group]
        return taken


def take_from(bundle: Bundle, which: Callable[[Any], bool]) -> list[Any]:
    """The deliveries of a bundle waiting for a runner that ``which`` chooses, taken out."""
    chosen = [d for d in bundle.deliveries if which(d)]
    if chosen:
        bundle.deliveries = [d for d in bundle.deliveries if not which(d)]
    return chosen


def unbundled(units: Any) -> list[Any]:
    """The deliveries of work waiting for a runner (deliveries, and bundles of them)."""
    out: list[Any] = []
    for u in units:
        if type(u) is Bundle:
            out += u.deliveries
        else:
            out.append(u)
    return out


def take_units(units: Any, which: Callable[[Any], bool]) -> tuple[list[Any], list[Any]]:
    """Take the deliveries ``which`` chooses out of work waiting for a runner: (taken, the
    work left, bundles emptied dropped)."""
    taken: list[Any] = []
    left: list[Any] = []
    for u in units:
        if type(u) is Bundle:
            taken += take_from(u, which)
            if u.deliveries:
                left.append(u)
        elif which(u):
            taken.append(u)
        else:
            left.append(u)
    return taken, left


#: A delivery's task name (``DeliveryBase.task_name``), for ``map``.
_task_name = attrgetter("task_name")


def late_s(d: Any) -> float:
    """How long before its claim a delivery fell due (its queue's clock), so that a linger
    counts from the due time, not from the claim."""
    return float(max(d.claimed_ms - d.due_ms, 0)) / 1000


def verdicts(items: list[Item], error: BaseException | None) -> list[tuple[Any, Any]]:
    """What each item of a finished call is for the settler: the delivery with None (acked),
    its failure (a ``Retry`` when ``retry_in`` was given), or a ``Release``. ``error``: what
    the call raised, the failure of every item without a verdict."""
    out: list[tuple[Any, Any]] = []
    for item in items:
        d: DeliveryBase = item.delivery
        if item.error is not None:
            failure = item.error
            out.append((d, failure if item.retry_in is None else Retry(failure, item.retry_in)))
        elif item.release_delay is not None:
            out.append((d, Release(item.release_delay)))
        else:
            out.append((d, error))
    return out
