"""The settler records a round's failures of one queue in one ``fail_many`` call (issue 41):
a bulk call that fails many items costs one script call for them, not one each. The settle
flows are shared by both consumers; this drives them with the threaded driver on a real
queue."""

from __future__ import annotations

from typing import Any

import redis
from counting_support import script_calls

import dueq
from dueq.operators._bulk import Release, Retry
from dueq.operators._settle import Cooldowns, Pending, Settling, run_flow


class Settler(Settling):
    """The settle rules with every delivery held and no outage to wait out."""

    def __init__(self) -> None:
        self.cooldowns = Cooldowns()

    def _holds(self, d: Any) -> bool:
        return True

    def _pause(self, delay_s: float) -> Any:
        return lambda: None

    def _giving_up(self) -> bool:
        return False


def test_a_rounds_failures_are_recorded_in_one_script_call_with_each_items_own_delay(
    r: redis.Redis, admin: redis.Redis
) -> None:
    q = dueq.Queue("settle", r, retry=dueq.RetryPolicy(max_attempts=3, wait=lambda s: 30.0))
    q.schedule_many(dueq.Task({"n": n}, id=f"t{n}") for n in range(62))
    warm = q.claim(limit=2)  # (the first call of a script loads it: not counted below)
    q.fail_many([(warm[0], "warm")])
    q.release_many([warm[1]], delay=60)
    batch = q.claim(limit=60)
    errors: list[Any] = [RuntimeError(f"item {d.id}") for d in batch[:50]]
    errors += [Retry("soon", 5) for _ in batch[50:55]]
    errors += [Release(60) for _ in batch[55:]]
    before = script_calls(admin)
    settled = run_flow(
        Settler().settle_flow(list(zip(batch, errors, strict=True)), Pending(), final=False)
    )
    assert script_calls(admin) - before == 2  # one fail_many for 55, one release_many for 5
    kinds = sorted({o.kind for _, o in settled})
    assert kinds == ["released", "retried"] and len(settled) == 60
    now_ms = q.stats().now.timestamp() * 1000
    soon = q.get(batch[50].id)
    assert soon.errors[-1].message == "soon"
    assert abs(soon.due_at.timestamp() * 1000 - (now_ms + 5000)) < 1000
    assert q.get(batch[0].id).errors[-1].message == f"item {batch[0].id}"
    assert q.get(batch[59].id).errors == []  # released: no attempt counted
