"""Queue-wide rate limits (``q.configure(rate=dueq.Rate(n, per=s))``), enforced by the claim
script across every consumer: at most n claims in any window of ``per`` seconds."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from fairness_support import MODES, fairness_param
from paths_support import FIXTURES

import dueq
from dueq.server import RedisServer


@pytest.fixture(params=MODES)
def make_queue(make_queue: Callable[..., Any], request: pytest.FixtureRequest) -> Any:
    """The module's queues with fairness off and on (fairness_support)."""
    return fairness_param(make_queue, request)


CHILD = FIXTURES / "worker_process.py"
BOUND_S = 60.0


def test_a_rate_leases_at_most_n_per_window_and_says_when_the_next_slot_opens(
    make_queue: Callable[..., Any], clock: Any
) -> None:
    q = make_queue("r")
    q.configure(rate=dueq.Rate(5, per=1.0))
    q.schedule_many(dueq.Task({"i": i}, id=f"t{i}") for i in range(20))
    assert len(q.claim(100)) == 5
    batch = q.claim_batch(100)
    assert batch.deliveries == []  # the window is full
    assert batch.next_due_ms == round(clock.now * 1000) + 1000  # when its oldest claim leaves
    clock.advance(0.999)
    assert q.claim(100) == []
    clock.advance(0.001)
    assert len(q.claim(100)) == 5


def test_the_window_slides_claim_by_claim(make_queue: Callable[..., Any], clock: Any) -> None:
    q = make_queue("r")
    q.configure(rate=dueq.Rate(4, per=1.0))
    q.schedule_many(dueq.Task({"i": i}) for i in range(20))
    assert len(q.claim(2)) == 2  # at 0.0 s
    clock.advance(0.5)
    assert len(q.claim(100)) == 2  # at 0.5 s: 2 + 2 in the window
    clock.advance(0.5)
    assert len(q.claim(100)) == 2  # at 1.0 s the first two left; the 0.5 s ones still count
    clock.advance(0.5)
    assert len(q.claim(100)) == 2


def test_the_window_keeps_one_entry_per_claim_not_per_task(
    make_queue: Callable[..., Any], r: redis.Redis, clock: Any
) -> None:
    q = make_queue("r")
    q.configure(rate=dueq.Rate(1000, per=1.0))
    q.schedule_many(dueq.Task({"i": i}) for i in range(900))
    assert len(q.claim(300)) == 300
    assert len(q.claim(500)) == 500
    assert r.zcard(q.keys.rate) == 2  # the window's work and memory grow with claims
    assert len(q.claim(500)) == 100  # 200 slots left in the window: the last 100 due go
    assert "rate_in_window" not in q.stats().counters  # bookkeeping, not a counter


def test_a_window_written_one_entry_per_task_still_counts_each(
    make_queue: Callable[..., Any], r: redis.Redis, clock: Any
) -> None:
    q = make_queue("r")
    q.configure(rate=dueq.Rate(6, per=1.0))
    q.schedule_many(dueq.Task({"i": i}) for i in range(10))
    now_ms = round(clock.now * 1000)
    r.zadd(q.keys.rate, {f"1@old:{i}": now_ms for i in range(1, 6)})  # as dueq wrote it before
    assert len(q.claim(10)) == 1
    clock.advance(1.0)
    assert len(q.claim(10)) == 6


@pytest.mark.parametrize("kept_sum", [None, b"not a number", b"-3", b"1.5", b"1"])
def test_a_lost_or_wrong_running_sum_is_recounted_from_the_window(
    make_queue: Callable[..., Any], r: redis.Redis, clock: Any, kept_sum: bytes | None
) -> None:
    q = make_queue("r")
    q.configure(rate=dueq.Rate(10, per=1.0))
    q.schedule_many(dueq.Task({"i": i}) for i in range(20))
    assert len(q.claim(4)) == 4
    assert len(q.claim(3)) == 3
    if kept_sum is None:
        r.hdel(q.keys.stats, "rate_in_window")
    else:
        r.hset(q.keys.stats, "rate_in_window", kept_sum)
    # 7 in the window: a sum that is missing, unreadable or below one per entry is recounted
    assert len(q.claim(10)) == 3


def test_every_consumer_shares_one_rate(make_queue: Callable[..., Any], clock: Any) -> None:
    a, b = make_queue("r"), make_queue("r")
    a.configure(rate=dueq.Rate(3, per=1.0))
    a.schedule_many(dueq.Task({"i": i}) for i in range(10))
    assert len(a.claim(2)) + len(b.claim(2)) + len(a.claim(2)) == 3


def test_removing_the_rate_lets_claims_take_everything_due(
    make_queue: Callable[..., Any],
) -> None:
    q = make_queue("r")
    q.configure(rate=dueq.Rate(1, per=60))
    q.schedule_many(dueq.Task({"i": i}) for i in range(10))
    assert len(q.claim(100)) == 1
    assert q.configure(rate=False).rate is None
    assert len(q.claim(100)) == 9
    assert q.stats().settings.rate is None


def test_the_rate_is_shown_by_settings_and_stats(make_queue: Callable[..., Any]) -> None:
    q = make_queue("r")
    q.configure(rate=dueq.Rate(100, per=0.5))
    assert q.settings().rate == dueq.Rate(100, per=0.5)
    assert str(q.stats().settings.rate) == "100/0.5s"


@pytest.mark.parametrize(
    "args",
    [(0,), (-1,), (2.5,), (True,), (10**7,), (1, 0), (1, -1), (1, float("nan")), (1, "1s")],
)
def test_a_bad_rate_is_a_configuration_error(args: tuple[Any, ...]) -> None:
    with pytest.raises(dueq.ConfigurationError):
        dueq.Rate(*args)


def test_configure_refuses_what_is_not_a_rate_before_writing(
    make_queue: Callable[..., Any], r: redis.Redis
) -> None:
    q = make_queue("r")
    for bad in (5, "5/1s", True, (5, 1.0)):
        with pytest.raises(dueq.ConfigurationError, match="rate"):
            q.configure(rate=bad)
    assert r.hkeys(q.keys.config) in ([], [b"fairness"])  # (fairness_param's)


def test_a_corrupted_rate_setting_is_logged_and_claims_go_on(
    make_queue: Callable[..., Any], r: redis.Redis
) -> None:
    q = make_queue("r")
    q.schedule_many(dueq.Task({"i": i}) for i in range(3))
    r.hset(q.keys.config, "rate", "lots")
    assert q.settings().rate is None
    assert len(q.claim(100)) == 3


@pytest.mark.parametrize(
    ("shards", "front_end"), [(1, "sync"), (1, "async"), (3, "sync"), (3, "async")]
)
def test_a_rate_of_20_per_second_holds_in_every_window_across_three_processes(
    r: redis.Redis, redis_server: RedisServer, shards: int, front_end: str
) -> None:
    q = dueq.Queue("w", r, shards=shards)  # the queue worker_process.py consumes
    q.configure(rate=dueq.Rate(20, per=1.0))  # on 3 shards: 7 + 7 + 6, one share each
    q.schedule_many(dueq.Task({"i": i}, id=f"t{i}") for i in range(70))
    command = [sys.executable, str(CHILD), "--url", redis_server.url, "--sleep", "0"]
    command += ["--log-claimed", "--lease", "30", "--shards", str(shards)]
    command += ["--front-end", front_end]
    children = [subprocess.Popen(command, stderr=subprocess.DEVNULL) for _ in range(3)]
    try:
        deadline = time.monotonic() + BOUND_S
        while r.llen("claimed") < 70 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        for child in children:
            child.send_signal(signal.SIGTERM)
        for child in children:
            child.wait(30)
    claimed = sorted(int(x) for x in r.lrange("claimed", 0, -1))
    assert len(claimed) == 70
    most = max(sum(1 for c in claimed if t <= c < t + 1000) for t in claimed)
    assert most == 20  # every 1 s window (by the server clock) holds at most 20, and is used
    outcomes = [json.loads(x) for x in r.lrange("exited", 0, -1)]
    assert sum(o.get("acked", 0) for o in outcomes) == 70
