"""Issue 31: the per-task path of a worker makes no calls it need not (exact call counts, the
same under any load; the bench's CPU figures move with the machine's)."""

from __future__ import annotations

from typing import Any

import redis
from counting_support import calls
from internals_support import emit

import dueq
from dueq.delivery import SettleHook
from dueq.model import Outcome, settled_outcome
from dueq.named import dispatcher


class _Seen:
    def __init__(self) -> None:
        self.values: list[Any] = []
        self.ended = 0

    def on_next(self, value: Any) -> None:
        self.values.append(value)

    def on_error(self, error: Exception) -> None:
        self.ended += 1

    def on_completed(self) -> None:
        self.ended += 1


def test_emitting_a_round_of_outcomes_costs_the_observer_calls_and_a_few_more() -> None:
    emitter: emit.SerialEmitter[int] = emit.SerialEmitter()
    seen = _Seen()
    emitter.attach(seen)  # type: ignore[arg-type]
    n = 200
    made = calls(lambda: emitter.on_next(*range(n)))
    assert seen.values == list(range(n))
    assert made <= 2 * n + 20  # observer.on_next and its list append per value, no more
    emitter.on_next(n)
    emitter.on_completed()
    emitter.on_next(n + 1)  # nothing after the end
    emitter.on_error(RuntimeError("late"))
    assert seen.values == [*range(n + 1)]
    assert seen.ended == 1


def test_a_plain_task_reaches_the_handler_through_one_dispatcher_call(r: redis.Redis) -> None:
    q = dueq.Queue("cost", r)
    q.schedule({"a": 1})
    [d] = q.claim(1)
    got: list[Any] = []
    dispatch = dispatcher([q], got.append, on_loop=False)
    assert calls(lambda: dispatch(d)) == 2  # the dispatcher, the handler (list.append)
    assert got == [d]


def test_the_outcome_an_ack_emits_is_the_dataclass_outcome() -> None:
    fast = settled_outcome("t1", "acked", 3)
    assert type(fast) is Outcome
    assert fast == Outcome("t1", "acked", 3)
    assert hash(fast) == hash(Outcome("t1", "acked", 3))
    assert repr(fast) == repr(Outcome("t1", "acked", 3))
    assert (fast.id, fast.kind, fast.attempt, fast.at, fast.error) == ("t1", "acked", 3, None, None)


def test_deliveries_acked_together_reach_their_consumers_hook_in_one_call(
    r: redis.Redis,
) -> None:
    q = dueq.Queue("cost", r)
    q.schedule_many(dueq.Task({"i": i}) for i in range(5))
    claimed = q.claim(5)
    alone: list[Any] = []
    batches: list[list[Any]] = []
    hook = SettleHook(alone.append, batches.append)
    for d in claimed:
        d.on_settled = hook
    assert q.ack_many(claimed) == 5
    assert batches == [claimed]
    assert alone == []
    assert all(d.settled and d.outcome is None and d.on_settled is None for d in claimed)
    q.schedule({"i": 5})
    [single] = q.claim(1)
    single.on_settled = hook
    single.fail(RuntimeError("no"))  # settled alone: the hook's one-delivery call
    assert alone == [single]
