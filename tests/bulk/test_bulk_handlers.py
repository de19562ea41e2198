"""Bulk handlers (issue 41): a handler that takes many tasks in one call as ``dueq.Item``s, with
an outcome per item. Contract tests on both front ends (``make_queue``), each on a plain queue
and on a queue of 3 shards, run by the front end's real worker (``bulk_support.run_worker``);
what became of each task is read back through a plain ``Queue`` of the same name."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import redis
from bulk_support import run_worker

import dueq


@pytest.fixture(params=["plain", "shards"])
def pair(
    request: pytest.FixtureRequest, make_queue: Callable[..., Any], r: redis.Redis, clock: Any
) -> Callable[..., tuple[Any, dueq.Queue]]:
    """``pair(name, **kwargs)``: the test's queue, and a plain ``Queue`` of the same name that
    reads it (from any thread, while the worker runs)."""

    def make(name: str = "bulk", **kwargs: Any) -> tuple[Any, dueq.Queue]:
        if request.param == "shards":
            kwargs.setdefault("shards", 3)
        q = make_queue(name, **kwargs)
        shards = {"shards": kwargs["shards"]} if "shards" in kwargs else {}
        view = dueq.Queue(name, r, clock=clock, **shards)
        return q, view

    return make


def ended(view: dueq.Queue, ids: list[str]) -> Callable[[], bool]:
    """True once none of ``ids`` is due or leased any more (acked, dead, or waiting to retry
    at a later time of the manual clock)."""

    def check() -> bool:
        infos = [view.get(i) for i in ids]
        return all(
            info is None or info.state == "dead" or (info.state == "scheduled" and info.attempt)
            for info in infos
        )

    return check


def test_a_named_bulk_handler_gets_its_due_tasks_in_calls_of_at_most_max_and_acks_them_all(
    pair: Any,
) -> None:
    q, view = pair()
    calls: list[list[str]] = []

    @q.task(name="notify", batch=dueq.BatchSpec(max=50))
    def notify(items: list[dueq.Item]) -> None:
        assert all(isinstance(i, dueq.Item) for i in items)
        calls.append([i.payload["user"] for i in items])

    ids = [q.schedule_many([notify.task({"user": f"u{n}"}) for n in range(180)])]
    ids = [tid for batch in ids for tid in batch.ids]
    worker = run_worker(q, lambda: view.stats().due_now == 0 and view.stats().leased == 0)
    assert sorted(u for call in calls for u in call) == sorted(f"u{n}" for n in range(180))
    assert max(len(c) for c in calls) <= 50
    assert len(calls) < 180 / 4  # many per call, not one each
    assert worker.outcomes["acked"] == 180
    assert all(view.get(i) is None for i in ids)


def test_each_item_settles_as_its_verdict_says_failed_released_result_or_acked(
    pair: Any, clock: Any
) -> None:
    q, view = pair(retry=dueq.RetryPolicy(max_attempts=3, wait=lambda s: 30.0))
    q.configure(keep_results=timedelta(hours=1))

    @q.task(name="mixed", batch=dueq.BatchSpec(max=100))
    def mixed(items: list[dueq.Item]) -> None:
        for i in items:
            what = i.payload["what"]
            if what == "fail":
                i.fail(ConnectionError("provider said 503"))
            elif what == "fail_soon":
                i.fail("try again soon", retry_in=5)
            elif what == "release":
                i.release(delay=60)
            elif what == "result":
                i.result({"sent": i.payload["n"]})

    kinds = ["fail", "fail_soon", "release", "result", "plain"]
    tids = {k: mixed.schedule(what=k, n=n) for n, k in enumerate(kinds)}
    # nothing due first, then nothing leased: read the other way round, a task of a shard not
    # claimed yet passes the first check and is claimed before the second
    run_worker(
        q,
        lambda: (
            view.stats().due_now == 0 and all(view.get(t).state != "leased" for t in tids.values())
        ),
    )
    now_ms = clock() * 1000
    failed = view.get(tids["fail"])
    assert failed.state == "scheduled" and failed.attempt == 1
    assert failed.errors[-1].type.endswith("ConnectionError")
    assert failed.due_at.timestamp() * 1000 == pytest.approx(now_ms + 30_000, abs=1000)
    soon = view.get(tids["fail_soon"])
    assert soon.state == "scheduled" and soon.errors[-1].message == "try again soon"
    assert soon.due_at.timestamp() * 1000 == pytest.approx(now_ms + 5_000, abs=1000)
    released = view.get(tids["release"])
    assert released.state == "scheduled" and released.errors == []  # no attempt counted
    assert released.due_at.timestamp() * 1000 == pytest.approx(now_ms + 60_000, abs=1000)
    assert view.get(tids["result"]).result == {"sent": 3}
    assert view.get(tids["plain"]).state == "done"


def test_a_raise_fails_every_item_without_a_verdict_and_keeps_the_verdicts_given(
    pair: Any,
) -> None:
    q, view = pair()

    @q.task(name="half", batch=dueq.BatchSpec(max=100))
    def half(items: list[dueq.Item]) -> None:
        for i in items:
            if i.payload["n"] == 0:
                i.release(delay=60)
            elif i.payload["n"] == 1:
                i.result("a result does not save it from the raise")
        raise TimeoutError("the provider timed out")

    tids = [half.schedule(n=n, id=f"t{n}") for n in range(4)]
    worker = run_worker(q, ended(view, tids[1:]))
    assert view.get("t0").state == "scheduled" and view.get("t0").errors == []
    for tid in tids[1:]:
        info = view.get(tid)
        assert info.state == "scheduled" and info.attempt == 1
        assert info.errors[-1].type == "TimeoutError"
    assert worker.outcomes["retried"] == 3 and worker.outcomes["released"] == 1


def test_an_item_out_of_attempts_goes_dead_alone_and_an_unrecoverable_one_at_once(
    pair: Any, clock: Any
) -> None:
    q, view = pair(retry=dueq.RetryPolicy(max_attempts=2, wait=lambda s: 1.0))

    @q.task(name="flaky", batch=dueq.BatchSpec(max=100))
    def flaky(items: list[dueq.Item]) -> None:
        for i in items:
            if i.payload["bad"] == "always":
                i.fail(RuntimeError("still broken"))
            elif i.payload["bad"] == "never":
                i.fail(dueq.Unrecoverable("no such user"))

    tids = {b: flaky.schedule(bad=b) for b in ("always", "never", "fine")}
    run_worker(q, ended(view, list(tids.values())))
    assert view.get(tids["never"]).state == "dead"  # at once: no retry fixes it
    assert view.get(tids["always"]).state == "scheduled"
    assert view.get(tids["fine"]) is None
    clock.advance(5)
    run_worker(q, lambda: view.get(tids["always"]).state == "dead")
    assert view.get(tids["always"]).attempt == 2  # dead after its own two attempts


def test_a_plain_bulk_handler_on_a_worker_takes_the_plain_payload_tasks(pair: Any) -> None:
    q, view = pair()
    seen: list[int] = []
    sizes: list[int] = []

    def handle_many(items: list[dueq.Item]) -> None:
        sizes.append(len(items))
        seen.extend(i.payload["n"] for i in items)

    for n in range(35):
        q.schedule({"n": n})
    run_worker(
        q,
        lambda: view.stats().due_now == 0 and view.stats().leased == 0,
        handle_many,
        batch=dueq.BatchSpec(max=10),
    )
    assert sorted(seen) == list(range(35))
    assert max(sizes) <= 10, sizes


def test_a_linger_holds_a_partial_call_of_a_plain_bulk_handler_for_tasks_due_within_it(
    pair: Any,
) -> None:
    q, view = pair()
    calls: list[int] = []

    def handle_many(items: list[dueq.Item]) -> None:
        calls.append(len(items))

    def later() -> None:  # the second seven once the first seven are held by the worker
        deadline = time.monotonic() + 20
        while view.stats().leased < 7 and time.monotonic() < deadline:
            time.sleep(0.01)
        view.schedule_many([dueq.Task({"n": n}) for n in range(7)])

    for n in range(7):
        q.schedule({"n": n})
    threading.Thread(target=later).start()
    spec = dueq.BatchSpec(max=10, linger=timedelta(seconds=2))
    run_worker(q, lambda: sum(calls) == 14, handle_many, batch=spec)
    # a full call of ten once the second seven arrived within the linger, then the last four
    # when their linger (counted from the second seven's due time) ends
    assert calls == [10, 4], calls


def test_a_linger_holds_a_partial_call_for_tasks_due_within_it(pair: Any) -> None:
    q, view = pair()
    calls: list[int] = []

    # a full call runs at once: the 2 s linger is only how long a partial one may wait
    @q.task(name="linger", batch=dueq.BatchSpec(max=10, linger=timedelta(seconds=2)))
    def linger(items: list[dueq.Item]) -> None:
        calls.append(len(items))

    def later() -> None:  # the second five once the first five are held by the worker
        deadline = time.monotonic() + 20
        while view.stats().leased < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        view.schedule_many([dueq.Task({"n": n}, task="linger") for n in range(5)])

    for n in range(5):
        linger.schedule(n=n)
    threading.Thread(target=later).start()
    run_worker(q, lambda: sum(calls) == 10)
    assert calls == [10]  # one call: the second five arrived within the first's linger


def test_an_async_bulk_handler_runs_on_the_front_end_worker(pair: Any) -> None:
    q, view = pair()
    seen: list[str] = []

    @q.task(name="anotify", batch=dueq.BatchSpec(max=20))
    async def anotify(items: list[dueq.Item]) -> None:
        await asyncio.sleep(0)
        seen.extend(i.id for i in items)
        if items[0].attempt == 1:
            items[0].fail("first one fails")

    for n in range(40):
        anotify.schedule(n=n)
    worker = run_worker(q, lambda: len(seen) == 40 and view.stats().leased == 0)
    assert worker.outcomes["acked"] == 38 and worker.outcomes["retried"] == 2


def test_a_bulk_handler_that_returns_a_value_ends_its_items_dead_saying_how_to_give_results(
    pair: Any,
) -> None:
    q, view = pair()

    @q.task(name="returns", batch=dueq.BatchSpec(max=10))
    def returns(items: list[dueq.Item]) -> list[int]:
        return [1] * len(items)

    tid = returns.schedule(n=1)
    run_worker(q, lambda: view.get(tid) is not None and view.get(tid).state == "dead")
    assert "item.result(value)" in view.get(tid).errors[-1].message


def test_batch_settings_that_cannot_work_are_refused_at_once(r: redis.Redis) -> None:
    q = dueq.Queue("bulk-bad", r)
    with pytest.raises(dueq.ConfigurationError, match="BatchSpec max"):
        dueq.BatchSpec(max=0)
    with pytest.raises(dueq.ConfigurationError, match="at most 60 s"):
        dueq.BatchSpec(max=10, linger=120)
    with pytest.raises(dueq.ConfigurationError, match="durable"):
        q.task(name="d", durable=True, batch=dueq.BatchSpec())(lambda ctx: None)
    with pytest.raises(dueq.ConfigurationError, match="BatchSpec"):
        q.task(name="b", batch="nightly")(lambda items: None)  # type: ignore[arg-type]
    with pytest.raises(dueq.ConfigurationError, match="give the handler"):
        dueq.Worker(q, batch=dueq.BatchSpec())
    item = dueq.Item(_Delivered())  # type: ignore[arg-type]  # (an Item records verdicts only)
    item.fail("once")
    with pytest.raises(dueq.ConfigurationError, match="one verdict"):
        item.release()


class _Delivered:
    """What an Item reads of its delivery for its own checks (it calls no queue)."""

    id = "t"
    attempt = 1
    result = None


def test_per_key_limits_hold_for_the_items_of_bulk_calls(pair: Any) -> None:
    q, view = pair()
    if view.shard_count > 1:
        pytest.skip("per-key limits are refused on sharded queues (docs/sharding.md)")
    q.configure(key_concurrency=1)
    per_call: list[dict[str, int]] = []

    @q.task(name="keyed", batch=dueq.BatchSpec(max=100))
    def keyed(items: list[dueq.Item]) -> None:
        counts: dict[str, int] = {}
        for i in items:
            counts[i.key or ""] = counts.get(i.key or "", 0) + 1
        per_call.append(counts)

    for n in range(30):
        keyed.schedule(n=n, key=f"tenant-{n % 3}")
    run_worker(q, lambda: view.stats().due_now == 0 and view.stats().leased == 0, timeout_s=30)
    assert sum(sum(c.values()) for c in per_call) == 30
    assert all(v == 1 for c in per_call for v in c.values())  # one lease per key at a time


def test_a_bulk_call_past_its_items_timeout_fails_every_item_with_task_timeout(
    pair: Any,
) -> None:
    q, view = pair()
    release = threading.Event()

    @q.task(name="slow", batch=dueq.BatchSpec(max=10))
    def slow(items: list[dueq.Item]) -> None:
        release.wait(5)  # (a sync handler thread cannot be stopped: it is abandoned)

    tids = [slow.schedule(n=n, timeout=0.2) for n in range(3)]
    try:
        run_worker(q, ended(view, tids))
    finally:
        release.set()
    for tid in tids:
        info = view.get(tid)
        assert info.state == "scheduled" and info.errors[-1].type.endswith("TaskTimeout"), info


def test_a_plain_async_bulk_handler_runs_on_either_worker(pair: Any) -> None:
    q, view = pair()
    seen: list[int] = []

    async def handle_many(items: list[dueq.Item]) -> None:
        await asyncio.sleep(0)
        seen.extend(i.payload["n"] for i in items)
        for i in items:
            if i.payload["n"] == 3 and i.attempt == 1:
                i.fail("three fails once")

    for n in range(25):
        q.schedule({"n": n})
    worker = run_worker(
        q,
        lambda: len(seen) == 25 and view.stats().leased == 0,
        handle_many,
        batch=dueq.BatchSpec(max=10),
    )
    assert sorted(seen) == list(range(25))
    assert worker.outcomes["acked"] == 24 and worker.outcomes["retried"] == 1
