"""The adaptive prefetch bound (``max_in_flight="auto"``): grows while deliveries settle fast,
shrinks when they wait, never leaves its bounds; driven in virtual time (plain numbers)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis
from internals_support import consume, prefetch

import dueq

AUTO_HIGH = prefetch.AUTO_HIGH
GROWTH = prefetch.GROWTH
HOLD_S = prefetch.HOLD_S
MIN_WINDOW_S = prefetch.MIN_WINDOW_S
REFILL_SHARE = prefetch.REFILL_SHARE
WINDOW_S = prefetch.WINDOW_S
Held = prefetch.Held
Prefetch = prefetch.Prefetch


WAIT_S = 30


def settle_at_rate(p: Prefetch, now_s: float, rate: float, windows: int) -> float:
    """Report ``rate`` settlements per second for ``windows`` estimate windows."""
    for _ in range(windows):
        p.settled(round(rate * WINDOW_S))
        now_s += WINDOW_S
        p.update(now_s)
    return now_s


def test_fast_settling_grows_the_bound_fourfold_per_window_up_to_high() -> None:
    p = Prefetch.parse("auto", low=16)
    now_s = 1000.0
    p.update(now_s)
    limits = []
    for _ in range(5):
        now_s = settle_at_rate(p, now_s, rate=100_000, windows=1)
        limits.append(p.limit)
    assert limits == [64, 256, 1024, 1024, 1024]  # within 3 windows; never above AUTO_HIGH
    assert p.limit == AUTO_HIGH


def test_slow_settling_shrinks_the_bound_to_low_and_never_below() -> None:
    p = Prefetch.parse("auto", low=16)
    now_s = settle_at_rate(p, 1000.0, rate=100_000, windows=10)
    assert p.limit == AUTO_HIGH
    settle_at_rate(p, now_s, rate=8, windows=3)  # 8 handlers of 1 s each
    assert p.limit == 16


def test_the_bound_holds_what_the_handlers_settle_in_the_hold_time() -> None:
    p = Prefetch.parse("auto", low=16)
    now_s = settle_at_rate(p, 1000.0, rate=100_000, windows=10)
    settle_at_rate(p, now_s, rate=2000, windows=3)
    assert p.limit == round(2000 * HOLD_S)


def test_an_idle_queue_falls_back_to_low_and_a_burst_ramps_up_again() -> None:
    p = Prefetch.parse("auto", low=16)
    now_s = settle_at_rate(p, 1000.0, rate=100_000, windows=10)
    now_s = settle_at_rate(p, now_s, rate=0, windows=1)
    assert p.limit == 16
    settle_at_rate(p, now_s, rate=100_000, windows=3)
    assert p.limit == AUTO_HIGH


def test_a_hold_settled_whole_before_the_window_ends_grows_at_once_up_to_high() -> None:
    p = Prefetch.parse("auto", low=16)
    now_s = 1000.0
    p.update(now_s)
    limits = []
    for _ in range(5):  # each claim's worth settled in 2 ms: a turnover ends the window early
        p.settled(p.limit)
        now_s += 2 * MIN_WINDOW_S
        limits.append(p.update(now_s))
    assert limits == [16 * GROWTH, 16 * GROWTH**2, AUTO_HIGH, AUTO_HIGH, AUTO_HIGH]
    assert now_s - 1000.0 < WINDOW_S  # all of it within one ordinary window


def test_a_turnover_faster_than_the_shortest_window_waits_for_it() -> None:
    p = Prefetch.parse("auto", low=16)
    p.update(1000.0)
    p.settled(16)
    assert p.update(1000.0 + MIN_WINDOW_S / 2) == 16  # too short to estimate a rate from
    assert p.update(1000.0 + MIN_WINDOW_S) == 16 * GROWTH


def test_a_partial_turnover_waits_for_the_whole_window_and_may_shrink() -> None:
    p = Prefetch.parse("auto", low=16)
    now_s = settle_at_rate(p, 1000.0, rate=100_000, windows=10)
    assert p.limit == AUTO_HIGH
    p.settled(AUTO_HIGH - 1)  # not a whole hold: no early estimate
    assert p.update(now_s + WINDOW_S / 2) == AUTO_HIGH
    assert p.update(now_s + 1.0) == round((AUTO_HIGH - 1) / 1.0 * HOLD_S)  # ~1k/s: shrinks


def test_a_fixed_bound_never_moves_and_bad_bounds_are_refused() -> None:
    p = Prefetch.parse(64)
    settle_at_rate(p, 1000.0, rate=100_000, windows=10)
    assert p.limit == 64
    for bad in ("fast", 0, -1, 10**9, 2.5, True):
        with pytest.raises(dueq.ConfigurationError):
            Prefetch.parse(bad)  # type: ignore[arg-type]


def test_auto_never_holds_more_than_its_bound_against_real_redis(r: redis.Redis) -> None:
    q = dueq.Queue("pf", r, lease=30)
    q.schedule_many(dueq.Task({"i": i}) for i in range(3000))
    held: set[str] = set()
    most = 0
    lock = threading.Lock()
    done = threading.Event()
    acked = 0

    def on_next(d: dueq.Delivery) -> None:
        nonlocal most, acked
        with lock:
            held.add(d.id)
            most = max(most, len(held))
        d.ack()
        with lock:
            held.discard(d.id)
            acked += 1
            if acked == 3000:
                done.set()

    sub = q.observe(max_in_flight="auto", wake=False).subscribe(on_next=on_next)
    assert done.wait(WAIT_S)
    sub.dispose()
    assert 0 < most <= AUTO_HIGH


def test_auto_with_slow_handlers_holds_no_more_than_low(r: redis.Redis) -> None:
    q = dueq.Queue("pf-slow", r, lease=30)
    q.schedule_many(dueq.Task({"i": i}) for i in range(200))
    got: list[dueq.Delivery] = []
    sub = q.observe(max_in_flight="auto", wake=False).subscribe(on_next=got.append)
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:  # nothing settles: the bound stays at low
        time.sleep(0.05)
    sub.dispose()
    assert len(got) == 16 and q.stats().leased == 16


def wait_for_count(got: list[dueq.Delivery], n: int) -> None:
    """Wait (up to WAIT_S) until ``got`` holds ``n`` deliveries."""
    deadline = time.monotonic() + WAIT_S
    while len(got) < n and time.monotonic() < deadline:
        time.sleep(0.01)


class _D:
    """A stand-in delivery for ``Held`` (it reads only the lease deadline)."""

    lease_deadline_ms = 10**15


def test_a_hold_with_less_than_a_quarter_free_counts_as_full() -> None:
    held: Held[Any] = Held(Prefetch.parse(16))
    held.add([_D() for _ in range(13)], now_ms=0)  # 3 free of 16: not worth a claim
    assert held.full and not held.refill and held.free(0.0) == 3
    fewer: Held[Any] = Held(Prefetch.parse(16))
    fewer.add([_D() for _ in range(12)], now_ms=0)  # 4 free: a claim worth making
    assert not fewer.full and fewer.refill


def test_a_full_hold_asks_for_a_claim_only_once_a_quarter_of_it_is_free() -> None:
    held: Held[Any] = Held(Prefetch.parse(16))
    ds = [_D() for _ in range(16)]
    held.add(ds, now_ms=0)
    assert held.full and not held.refill
    for n, d in enumerate(ds[: 16 // REFILL_SHARE], 1):
        held.settled(d)
        assert held.refill == (n == 16 // REFILL_SHARE)  # 4 free: a claim worth making
    tiny: Held[Any] = Held(Prefetch.parse(2))  # a bound under REFILL_SHARE: one free slot
    pair = [_D(), _D()]
    tiny.add(pair, now_ms=0)
    tiny.settled(pair[0])
    assert tiny.refill


def test_a_consumer_with_a_full_hold_claims_again_when_a_quarter_is_free_not_at_each_ack(
    r: redis.Redis,
) -> None:
    q = dueq.Queue("pf-refill", r, lease=30)
    q.schedule_many(dueq.Task({"i": i}) for i in range(100))
    got: list[dueq.Delivery] = []
    sub = q.observe(max_in_flight=8, wake=False).subscribe(on_next=got.append)
    try:
        wait_for_count(got, 8)
        assert len(got) == 8
        got[0].ack()  # one free slot: not worth a claim yet
        time.sleep(0.3)
        assert len(got) == 8
        got[1].ack()  # two free (a quarter of 8): claim
        wait_for_count(got, 10)
        assert len(got) == 10 and q.stats().leased == 8
    finally:
        sub.dispose()


def test_a_consumer_does_not_claim_the_last_few_slots_right_after_a_big_claim(
    r: redis.Redis,
) -> None:
    q = dueq.Queue("pf-tail", r, lease=30)
    q.schedule_many(dueq.Task({"i": i}) for i in range(1100))
    got: list[dueq.Delivery] = []
    sub = q.observe(max_in_flight=1024, wake=False).subscribe(on_next=got.append)
    try:
        wait_for_count(got, 1000)
        time.sleep(0.3)
        # one claim leases at most 1,000; the 24 slots left are not worth a round trip
        assert len(got) == 1000 and q.stats().leased == 1000
        for d in got[: 1024 // REFILL_SHARE - 24]:  # 256 free now: claim the rest
            d.ack()
        wait_for_count(got, 1100)
        assert len(got) == 1100
    finally:
        sub.dispose()


def test_on_a_fair_queue_the_auto_bound_holds_at_most_fair_high_and_goes_back_after() -> None:
    p = Prefetch.parse("auto", low=16)
    now_s = settle_at_rate(p, 1000.0, 1_000_000, 10)
    assert p.limit == AUTO_HIGH
    p.fair(True)  # a claim's reply said the queue is fair
    assert p.limit == prefetch.FAIR_HIGH
    now_s = settle_at_rate(p, now_s, 1_000_000, 10)
    assert p.limit == prefetch.FAIR_HIGH
    p.fair(False)  # fairness turned off
    settle_at_rate(p, now_s, 1_000_000, 10)
    assert p.limit == AUTO_HIGH
    fixed = Prefetch.parse(1000)
    fixed.fair(True)
    assert fixed.limit == 1000  # a number the user chose is kept
    big_low = Prefetch.parse("auto", low=400)
    big_low.fair(True)
    assert big_low.high == 400  # never below twice the concurrency


def test_a_claim_of_a_fair_queue_says_so(r: redis.Redis) -> None:
    q = dueq.Queue("prefetch-fair", r)
    assert q.claim_batch(1).fair is False
    q.configure(fairness="key")
    assert q.claim_batch(1).fair is True
    q.configure(paused=True)
    batch = q.claim_batch(1)
    assert (batch.paused, batch.fair) == (True, True)


def test_a_workers_auto_bound_grows_past_one_claim_to_worker_high() -> None:
    """A Worker's own handlers take each claim whole: its bound may hold several claims, so the
    next claim goes out while the handlers still work through the last one."""
    p = Prefetch.parse("auto", low=16, high=prefetch.WORKER_HIGH)
    settle_at_rate(p, 1000.0, rate=100_000, windows=10)  # 10,000 settled in HOLD_S
    assert p.limit == prefetch.WORKER_HIGH
    assert prefetch.WORKER_HIGH >= 4 * consume.MAX_CLAIM
    slow = Prefetch.parse("auto", low=16, high=prefetch.WORKER_HIGH)
    now_s = settle_at_rate(slow, 1000.0, rate=100_000, windows=10)
    settle_at_rate(slow, now_s, rate=8, windows=3)  # slow handlers: back to low, as ever
    assert slow.limit == 16
    assert Prefetch.parse("auto", low=16).high == AUTO_HIGH  # observe() keeps its bound
