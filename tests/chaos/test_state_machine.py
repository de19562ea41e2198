"""Stateful property test: a real queue on the test Redis against an in-memory model.

It runs on both front ends (``front_end``: ``dueq.Queue``, or ``dueq.AsyncQueue`` driven
through ``make_queue``'s ``Blocking`` wrapper), with the example budget shared between them.

Hypothesis drives schedule / claim / ack / fail / extend / release / cancel (plus reschedule,
dead-letter replay and purge, pause and resume, and the per-key limits) and moves a hand-held
clock, also to exactly a lease deadline or due time and 1 ms before it. Tasks carry a priority
and maybe a limit key. After every step the Redis keys, ``Queue.stats()`` and ``Queue.get()``
must agree with the model: state (each task in exactly one place: the due set of its priority,
the parked set, leased or dead), due time, lease deadline, died-at time, attempt, payload,
number of recorded errors, the event counters, and each key's leased count, rate mark, parked
count and wait time.

Every delivery handed out stays around: one whose lease was lost (expired, reclaimed, acked,
failed, released, cancelled or replaced) must get ``LeaseLost`` from ack/fail/extend/release;
a live one must succeed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import hypothesis.strategies as st
import pytest
import redis
from hypothesis import event, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import dueq
from dueq._util.clock import ms_datetime
from dueq.server import RedisServer

QUEUE = "state-machine"
IDS = ("t0", "t1", "t2", "t3", "t4")  # a small pool, so ids collide
MAX_ATTEMPTS = (1, 2, 3)  # each example draws one; 1 and 2 reach dead sooner
DEAD_MAX_COUNTS = (100_000, 1, 2)  # dead-letter caps: small ones make the trim happen
DEAD_MAX_AGES_MS = (14 * 86_400_000, 4_000)
BACKOFF_MS = 5_000  # the policy's wait after every failed attempt (and expired lease)
LEASE_MS = 10_000  # the queue's default lease
START_MS = 1_800_000_000_000

Delivery = Any  # a dueq.Delivery, or an AsyncDelivery in make_queue's Blocking wrapper

# 130 examples per front end: as long in all as the 300 sync examples it ran before (measured
# on a loaded 2-core machine: 300 sync 34-36 s; 150 sync 17.5 s + 150 async 23 s, as a call
# through redis.asyncio and the Blocking wrapper costs more). One bug is shrunk at a time
# (about a minute or two): shrinking every distinct failure of 50-step runs with a Redis round
# trip per step can take Hypothesis's full 5 minutes.
SETTINGS = settings(
    max_examples=130,
    stateful_step_count=50,
    deadline=None,
    database=None,
    report_multiple_bugs=False,
)

# Durations are whole milliseconds handed to dueq as seconds, so the model's arithmetic is
# exact. Zero is favoured so tasks are often claimable at once; whole seconds make due-time ties.
delays_ms = st.one_of(
    st.just(0), st.integers(0, 10).map(lambda s: s * 1000), st.integers(0, 10_000)
)
leases_ms = st.one_of(st.sampled_from([1, 1000, 3000]), st.integers(1, 20_000))
payloads = st.integers(0, 1000)
priorities = st.sampled_from([0, 0, 5, 9])
limit_keys = st.sampled_from([None, None, "a", "b"])
key_concurrencies = st.sampled_from([None, 1, 2])
key_gaps_ms = st.sampled_from([None, 1000])  # key_rate Rate(1, per=1.0): one claim per key per s
error_kinds = st.sampled_from(["str", "exc", "unrecoverable"])
# Where to put the clock relative to a deadline or due time: 1 ms before, exactly on, after.
offsets_ms = st.one_of(st.sampled_from([-1, 0]), st.integers(0, 3_000))
# After moving the clock, claim at once (with this limit) or not: shortens retry cycles.
claim_after = st.none() | st.integers(1, 5)


#: How long cancel.lua remembers a revoked lease past its deadline.
KEEP_REVOKED_MS = 3_600_000


def names(values: list[bytes | str]) -> set[str]:
    return {v.decode() if isinstance(v, bytes) else v for v in values}


class MsClock:
    """A hand-moved clock holding integer epoch milliseconds (no float drift)."""

    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> float:
        return self.ms / 1000


@dataclass
class ModelTask:
    payload: int
    state: str  # "scheduled" | "leased" | "dead"; a task that is gone is not in the model
    due: int | None  # scheduled: next-attempt ms; leased: due ms of the current delivery
    attempt: int = 0  # deliveries so far
    errors: int = 0  # error records kept (fails and expired leases)
    token: str | None = None  # leased: the live lease token
    deadline: int | None = None  # leased: lease deadline ms
    died_at: int | None = None  # dead: died-at ms
    priority: int = 0
    key: str | None = None
    parked: bool = False  # scheduled, due, and set aside because its key was at a limit
    counted: bool = False  # leased, and counted in its key's leased count (the key had a limit)
    # whether a meta value is stored: a first lease without a counted key has none (claim.lua
    # writes none, lua/include/claims.lua), so get() shows it without a due time
    has_meta: bool = False
    due_shown: bool = True  # leased: whether get() shows the due ms of the current delivery


def build_machine(
    server: RedisServer, make_queue: Callable[..., Any]
) -> type[RuleBasedStateMachine]:
    """The state machine class, bound to the session's redis-server and to a front end
    (``make_queue``: a ``Queue``, or an ``AsyncQueue`` run through ``Blocking``)."""

    class QueueMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.client = server.client()
            with redis.Redis(host="127.0.0.1", port=server.port) as admin:  # the default user
                admin.flushall()
            self.clock = MsClock(START_MS)
            self.max_attempts = MAX_ATTEMPTS[-1]
            self.dead_max_count = DEAD_MAX_COUNTS[0]
            self.dead_max_age_ms = DEAD_MAX_AGES_MS[0]
            self.queue: Any = None  # made by setup, the first step of every example
            self.model: dict[str, ModelTask] = {}
            self.handed_out: list[Delivery] = []  # every delivery, live or stale
            self.tokens: set[str] = set()
            self.deadlines: set[int] = set()  # every claim's deadline: no two claims share one
            self.counters: Counter[str] = Counter()
            self.paused = False  # q.pause(): claims lease nothing
            self.revoked: dict[tuple[str, str], int] = {}  # (id, token) cancelled -> deadline
            self.key_concurrency: int | None = None
            self.key_gap: int | None = None  # ms between two claims of one key
            self.flight: dict[str, int] = {}  # key -> leased tasks (expired ones until reclaimed)
            self.marks: dict[str, int] = {}  # key -> earliest ms its rate admits the next claim
            self.parked_count: dict[str, int] = {}
            self.wait: dict[str, int] = {}  # key -> ms its parked tasks may be claimable again

        def teardown(self) -> None:
            self.client.close()

        def make_queue(self) -> Any:
            return make_queue(
                QUEUE,
                client=self.client,
                retry=dueq.RetryPolicy(max_attempts=self.max_attempts, wait=lambda state: 5.0),
                lease=LEASE_MS / 1000,
                clock=self.clock,
                dead_max_count=self.dead_max_count,
                dead_max_age=self.dead_max_age_ms / 1000,
            )

        # -- model helpers -------------------------------------------------------------------

        @property
        def now(self) -> int:
            return self.clock.ms

        def live(self, d: Delivery) -> bool:
            """A lease is held while its token is the task's and its deadline is after now."""
            t = self.model.get(d.id)
            return (
                t is not None
                and t.state == "leased"
                and t.token == d.token
                and t.deadline is not None
                and t.deadline > self.now
            )

        def ids_where(self, test: Callable[[ModelTask], bool]) -> list[str]:
            return sorted(tid for tid, t in self.model.items() if test(t))

        def model_schedule(
            self,
            tid: str,
            due: int,
            payload: int,
            replace: bool,
            priority: int = 0,
            key: str | None = None,
        ) -> str:
            if tid in self.model and not replace:
                return "existing"
            outcome = "replaced" if tid in self.model else "added"
            old = self.model.get(tid)
            if old is not None:
                self.leave_key(old)
            self.model[tid] = ModelTask(payload, "scheduled", due, priority=priority, key=key)
            self.counters["scheduled"] += 1
            return outcome

        # -- per-key limits (see the prelude of the Lua scripts) ------------------------------

        def key_room(self, key: str, most: int) -> tuple[int, int | None]:
            """How many tasks of ``key`` its limits admit now, and when its rate admits the
            next one if it admits none."""
            if self.key_concurrency is not None:
                most = min(most, self.key_concurrency - self.flight.get(key, 0))
            if most > 0:
                # a mark in the future holds the key even after key_rate is removed: the same
                # mark holds a key in a cooldown (docs/settings.md)
                mark = self.marks.get(key, 0)
                if mark > self.now:
                    return 0, mark
                if self.key_gap is not None:
                    most = min(most, 1)
            return max(most, 0), None

        def unlease(self, t: ModelTask) -> None:
            """The lease of ``t`` ended (acked, failed, released, expired, cancelled,
            replaced): its key's count drops if the lease was counted (its key had a limit)."""
            if not t.counted:
                return
            assert t.key is not None
            key, t.counted = t.key, False
            left = self.flight.get(key, 0) - 1
            if left <= 0:
                self.flight.pop(key, None)
            else:
                self.flight[key] = left
            mark = self.marks.get(key)
            if mark is not None and mark <= self.now:
                del self.marks[key]
            if self.parked_count.get(key, 0) > 0:
                event("keys: a lease ended with tasks of its key parked")
                self.wait[key] = min(self.wait.get(key, self.now), self.now)

        def unpark(self, t: ModelTask) -> None:
            assert t.key is not None
            t.parked = False
            left = self.parked_count.get(t.key, 0) - 1
            if left <= 0:
                self.parked_count.pop(t.key, None)
            else:
                self.parked_count[t.key] = left

        def leave_key(self, t: ModelTask) -> None:
            """The task is cancelled or replaced: its lease ends, or it leaves the parked set."""
            if t.key is None:
                return
            if t.state == "leased":
                self.unlease(t)
            elif t.state == "scheduled" and t.parked:
                self.unpark(t)

        def trim_dead(self) -> None:
            """After a death: drop dead tasks older than the max age, then the oldest (by
            died-at, ties by id) beyond the max count."""
            for tid in self.ids_where(
                lambda t: t.state == "dead" and t.died_at < self.now - self.dead_max_age_ms
            ):
                event("dead letters: trimmed by age")
                del self.model[tid]
            dead = sorted((t.died_at, tid) for tid, t in self.model.items() if t.state == "dead")
            for _, tid in dead[: max(len(dead) - self.dead_max_count, 0)]:
                event("dead letters: trimmed by count")
                del self.model[tid]

        def head_due(self) -> int | None:
            return min(
                (t.due for t in self.model.values() if t.state == "scheduled" and not t.parked),
                default=None,
            )

        def next_due(self) -> int | None:
            """The next due time a claim reports (none while paused): the earliest due task
            or the earliest key wait."""
            if self.paused:
                return None
            times = [x for x in (self.head_due(), min(self.wait.values(), default=None)) if x]
            return min(times, default=None)

        def next_deadline(self) -> int | None:
            return min(
                (t.deadline for t in self.model.values() if t.state == "leased"), default=None
            )

        def lapsed(self, d: Delivery) -> bool:
            """Still the task's lease, but its deadline has come: lost, not yet reclaimed."""
            t = self.model.get(d.id)
            return t is not None and t.token == d.token and not self.live(d)

        def pick_pool(self, data: st.DataObject) -> list[Delivery]:
            """Deliveries to pick from: any, live ones, or lapsed ones (the lease boundary)."""
            pools = {
                "any": self.handed_out,
                "live": [d for d in self.handed_out if self.live(d)],
                "lapsed": [d for d in self.handed_out if self.lapsed(d)],
            }
            choices = [name for name, pool in pools.items() if pool]
            weighted = [*choices, *(["live"] * 2 if "live" in choices else [])]
            return pools[data.draw(st.sampled_from(weighted), label="from")]

        def pick(self, data: st.DataObject) -> Delivery:
            return data.draw(st.sampled_from(self.pick_pool(data)), label="delivery")

        def expect_lost(self, d: Delivery, call: Callable[[], Any], what: str) -> None:
            if self.lapsed(d):
                at_deadline = self.model[d.id].deadline == self.now
                event(f"{what}: lapsed lease refused{' at its deadline' if at_deadline else ''}")
            else:
                event(f"{what}: stale delivery refused")
            with pytest.raises(dueq.LeaseLost) as caught:
                call()
            assert caught.value.ids == [d.id]
            revoked = self.revoked.get((d.id, d.token))
            cancelled = revoked is not None and revoked + KEEP_REVOKED_MS >= self.now
            if cancelled:
                event(f"{what}: cancelled while leased")
            assert isinstance(caught.value, dueq.TaskCancelled) == cancelled

        def has_deliveries(self) -> bool:
            return bool(self.handed_out)

        # -- rules ---------------------------------------------------------------------------

        @initialize(
            max_attempts=st.sampled_from(MAX_ATTEMPTS[::-1]),
            dead_max_count=st.sampled_from(DEAD_MAX_COUNTS),
            dead_max_age_ms=st.sampled_from(DEAD_MAX_AGES_MS),
            seed=st.lists(st.tuples(st.sampled_from(IDS), payloads, limit_keys), max_size=len(IDS)),
            key_concurrency=key_concurrencies,
            key_gap=key_gaps_ms,
        )
        def setup(
            self,
            max_attempts: int,
            dead_max_count: int,
            dead_max_age_ms: int,
            seed: list[tuple[str, int, str | None]],
            key_concurrency: int | None,
            key_gap: int | None,
        ) -> None:
            """Pick the retry policy, dead-letter caps and key limits; start with a few tasks
            due now, so that deliveries come early in an example."""
            self.max_attempts = max_attempts
            self.dead_max_count = dead_max_count
            self.dead_max_age_ms = dead_max_age_ms
            self.queue = self.make_queue()
            self.configure_keys(key_concurrency, key_gap)
            for tid, payload, key in seed:
                assert self.queue.schedule(payload, id=tid, key=key) == tid
                self.model_schedule(tid, self.now, payload, replace=False, key=key)

        @rule(key_concurrency=key_concurrencies, key_gap=key_gaps_ms)
        def configure_keys(self, key_concurrency: int | None, key_gap: int | None) -> None:
            settings = self.queue.configure(
                key_concurrency=key_concurrency or False,
                key_rate=False if key_gap is None else dueq.Rate(1, per=key_gap / 1000),
            )
            assert settings.key_concurrency == key_concurrency
            assert settings.key_rate == (None if key_gap is None else dueq.Rate(1, per=1.0))
            self.key_concurrency, self.key_gap = key_concurrency, key_gap
            if self.key_limited():  # the live leases nobody counted are counted now
                for t in self.model.values():
                    if t.state == "leased" and t.key is not None and not t.counted:
                        event("keys: a lease counted when its key got a limit")
                        t.counted = t.has_meta = True
                        self.flight[t.key] = self.flight.get(t.key, 0) + 1

        def key_limited(self) -> bool:
            """Whether keys have a limit (then a claim counts each lease against its key)."""
            return self.key_concurrency is not None or self.key_gap is not None

        @rule(
            tid=st.sampled_from(IDS),
            delay=delays_ms,
            payload=payloads,
            replace=st.booleans(),
            priority=priorities,
            key=limit_keys,
        )
        def schedule(
            self, tid: str, delay: int, payload: int, replace: bool, priority: int, key: str | None
        ) -> None:
            got = self.queue.schedule(
                payload, id=tid, delay=delay / 1000, replace=replace, priority=priority, key=key
            )
            assert got == tid
            self.model_schedule(tid, self.now + delay, payload, replace, priority, key)

        @rule(
            items=st.lists(
                st.tuples(
                    st.sampled_from(IDS),
                    st.sampled_from(["delay", "at"]),
                    st.integers(-5_000, 10_000),  # ms from now; "at" may be in the past
                    payloads,
                    priorities,
                ),
                min_size=1,
                max_size=3,
            ),
            replace=st.booleans(),
        )
        def schedule_many(self, items: list[tuple[str, str, int, int, int]], replace: bool) -> None:
            tasks = []
            outcome: Counter[str] = Counter()
            for tid, how, ms, payload, priority in items:
                if how == "delay":
                    ms = abs(ms)
                    task = dueq.Task(payload, id=tid, delay=ms / 1000, priority=priority)
                else:
                    at = ms_datetime(self.now + ms)
                    task = dueq.Task(payload, id=tid, at=at, priority=priority)
                    ms = max(ms, 0)  # a past "at" is stored as now (issue 27)
                tasks.append(task)
                made = self.model_schedule(tid, self.now + ms, payload, replace, priority)
                outcome[made] += 1
            result = self.queue.schedule_many(tasks, replace=replace)
            assert result.ids == [item[0] for item in items]
            assert (result.added, result.existing, result.replaced) == (
                outcome["added"],
                outcome["existing"],
                outcome["replaced"],
            )

        @rule(limit=st.integers(1, 5), lease=st.none() | leases_ms)
        def claim(self, limit: int, lease: int | None) -> None:
            self.claim_and_check(limit, lease)

        def claim_and_check(self, limit: int, lease: int | None) -> None:
            now = self.now
            # 1. Expired leases (deadline <= now) count as an attempt: retried or buried.
            died = False
            for t in self.model.values():
                if t.state == "leased" and t.deadline is not None and t.deadline <= now:
                    event("claim: expired lease reclaimed")
                    self.unlease(t)
                    t.errors += 1
                    t.token = t.deadline = None
                    t.has_meta = True
                    self.counters["expired"] += 1
                    if t.attempt >= self.max_attempts:
                        event("claim: expired lease of the last attempt -> dead")
                        t.state, t.due, t.died_at = "dead", None, now
                        self.counters["dead"] += 1
                        died = True
                    else:
                        t.state, t.due = "scheduled", now + BACKOFF_MS
            if died:
                self.trim_dead()
            leased: list[str] = []
            if self.paused:
                event("claim: paused")
            else:
                changed = self.unpark_ready(limit)
                leased = self.lease_or_park(limit, changed)
                for key in changed:  # the claim rewrites these keys' state: past marks go
                    if self.marks.get(key, now + 1) <= now:
                        del self.marks[key]
            batch = self.queue.claim_batch(limit, lease=None if lease is None else lease / 1000)
            got = batch.deliveries
            event(f"claim: {len(got)} delivered")
            assert [d.id for d in got] == leased
            assert batch.now_ms == now
            if got:
                self.lease_in_model(got, lease)
            assert (batch.next_due_ms, batch.next_lease_deadline_ms) == (
                self.next_due(),
                self.next_deadline(),
            )

        def unpark_ready(self, limit: int) -> set[str]:
            """2a. Keys whose wait is over get as many parked tasks back as their limits admit.
            Returns the keys looked at."""
            now = self.now
            ready = sorted((at, key) for key, at in self.wait.items() if at <= now)
            for _, key in ready:
                room, wait_until = self.key_room(key, limit)
                moved = 0
                if room > 0:
                    parked = sorted(
                        (9 - t.priority, t.due, tid)
                        for tid, t in self.model.items()
                        if t.state == "scheduled" and t.parked and t.key == key
                    )[:room]
                    for _, _, tid in parked:
                        self.model[tid].parked = False
                        moved += 1
                        event("keys: a parked task came back")
                left = self.parked_count.get(key, 0) - moved
                if left <= 0 or moved < room:
                    self.parked_count.pop(key, None)
                    del self.wait[key]
                else:
                    self.parked_count[key] = left
                    if wait_until is not None:
                        self.wait[key] = wait_until
                    elif self.key_gap is not None:
                        self.wait[key] = now + self.key_gap
                    elif self.key_concurrency is not None:
                        del self.wait[key]
            return {key for _, key in ready}

        def lease_or_park(self, limit: int, changed: set[str]) -> list[str]:
            """2b. Due tasks by priority, then due time (ties by id); a task whose key is at a
            limit is parked, which makes room for more. Returns the ids leased, in order."""
            now = self.now
            leased: list[str] = []
            while len(leased) < limit:
                taken: list[str] = []
                for p in range(9, -1, -1):
                    room = limit - len(leased) - len(taken)
                    if room <= 0:
                        break
                    taken += [
                        tid
                        for _, tid in sorted(
                            (t.due, tid)
                            for tid, t in self.model.items()
                            if t.state == "scheduled"
                            and not t.parked
                            and t.priority == p
                            and t.due is not None
                            and t.due <= now
                            and tid not in leased
                        )[:room]
                    ]
                if not taken:
                    break
                parked_any = False
                for tid in taken:
                    t = self.model[tid]
                    room, wait_until = (1, None) if t.key is None else self.key_room(t.key, 1)
                    if room < 1:
                        assert t.key is not None
                        event("keys: a due task was parked")
                        t.parked = t.has_meta = True
                        parked_any = True
                        changed.add(t.key)
                        self.parked_count[t.key] = self.parked_count.get(t.key, 0) + 1
                        if wait_until is not None:
                            self.wait[t.key] = min(self.wait.get(t.key, wait_until), wait_until)
                        continue
                    if t.key is not None and self.key_limited():
                        changed.add(t.key)
                        t.counted = True
                        self.flight[t.key] = self.flight.get(t.key, 0) + 1
                        if self.key_gap is not None:
                            self.marks[t.key] = max(self.marks.get(t.key, 0), now) + self.key_gap
                    leased.append(tid)
                if not parked_any:
                    break
            return leased

        def lease_in_model(self, got: list[Delivery], lease: int | None) -> None:
            now = self.now
            token = got[0].token
            assert token not in self.tokens, "a lease token was issued twice"
            self.tokens.add(token)
            deadline = now + (LEASE_MS if lease is None else lease)
            while deadline in self.deadlines:  # another claim's: moved on by 1 ms
                event("claim: a deadline another claim had, moved on")
                deadline += 1
            self.deadlines.add(deadline)
            for d in got:
                t = self.model[d.id]
                assert d.token == token
                assert (d.attempt, d.due_ms, d.payload) == (t.attempt + 1, t.due, t.payload)
                assert (d.lease_deadline_ms, d.claimed_ms) == (deadline, now)
                # a first lease without a counted key: no meta value, so no due time shown
                t.due_shown = t.has_meta or t.attempt > 0 or t.counted
                t.has_meta = t.due_shown
                t.state, t.attempt, t.token, t.deadline = "leased", t.attempt + 1, token, deadline
                self.counters["claimed"] += 1
            self.handed_out += got

        @precondition(has_deliveries)
        @rule(data=st.data())
        def ack(self, data: st.DataObject) -> None:
            self.do_ack(self.pick(data))

        def do_ack(self, d: Delivery) -> None:
            if not self.live(d):
                self.expect_lost(d, d.ack, "ack")
                return
            event("ack: live delivery")
            d.ack()
            self.done_with(d.id)
            self.counters["acked"] += 1

        def done_with(self, tid: str) -> None:
            """An acked task leaves the model (and its key's lease ends)."""
            t = self.model.pop(tid)
            self.unlease(t)

        @precondition(has_deliveries)
        @rule(data=st.data())
        def ack_many(self, data: st.DataObject) -> None:
            ds = data.draw(
                st.lists(
                    st.sampled_from(self.pick_pool(data)),
                    min_size=1,
                    max_size=3,
                    unique_by=lambda d: (d.id, d.token),
                ),
                label="deliveries",
            )
            live = [d for d in ds if self.live(d)]
            lost = [d.id for d in ds if not self.live(d)]
            event(f"ack_many: {len(live)} live, {len(lost)} lost")
            if lost:  # the live ones are still acked
                with pytest.raises(dueq.LeaseLost) as caught:
                    self.queue.ack_many(ds)
                assert caught.value.ids == lost
            else:
                assert self.queue.ack_many(ds) == len(live)
            for d in live:
                self.done_with(d.id)
                self.counters["acked"] += 1

        @precondition(has_deliveries)
        @rule(
            data=st.data(),
            kind=error_kinds,
            retry_in=st.none() | delays_ms,
        )
        def fail(self, data: st.DataObject, kind: str, retry_in: int | None) -> None:
            self.do_fail(self.pick(data), kind, retry_in)

        def do_fail(self, d: Delivery, kind: str, retry_in: int | None) -> None:
            error: BaseException | str = {
                "str": "boom",
                "exc": ValueError("bad value"),
                "unrecoverable": dueq.Unrecoverable("give up"),
            }[kind]
            kwargs = {} if retry_in is None else {"retry_in": retry_in / 1000}
            if not self.live(d):
                self.expect_lost(d, lambda: d.fail(error, **kwargs), "fail")
                return
            t = self.model[d.id]
            assert d.attempt == t.attempt
            outcome = d.fail(error, **kwargs)
            self.unlease(t)
            t.errors += 1
            t.token = t.deadline = None
            t.has_meta = True
            if kind == "unrecoverable" or t.attempt >= self.max_attempts:
                event(f"fail -> dead ({kind}, attempt {t.attempt})")
                t.state, t.due, t.died_at = "dead", None, self.now
                self.counters["dead"] += 1
                self.trim_dead()
                assert (outcome.kind, outcome.at) == ("dead", ms_datetime(self.now))
            else:
                event("fail -> retried")
                t.state = "scheduled"
                t.due = self.now + (BACKOFF_MS if retry_in is None else retry_in)
                self.counters["retried"] += 1
                assert (outcome.kind, outcome.at) == ("retried", ms_datetime(t.due))
            assert (outcome.id, outcome.attempt) == (d.id, t.attempt)

        @precondition(has_deliveries)
        @rule(data=st.data(), seconds=leases_ms)
        def extend(self, data: st.DataObject, seconds: int) -> None:
            self.do_extend(self.pick(data), seconds)

        def do_extend(self, d: Delivery, seconds: int) -> None:
            if not self.live(d):
                self.expect_lost(d, lambda: d.extend(seconds / 1000), "extend")
                return
            event("extend: live delivery")
            deadline = self.now + seconds
            assert d.extend(seconds / 1000) == ms_datetime(deadline)
            assert d.lease_deadline_ms == deadline
            self.model[d.id].deadline = deadline
            self.model[d.id].has_meta = True  # (a first lease's, without its due ms)

        @precondition(has_deliveries)
        @rule(data=st.data(), delay=delays_ms)
        def release(self, data: st.DataObject, delay: int) -> None:
            self.do_release(self.pick(data), delay)

        def do_release(self, d: Delivery, delay: int) -> None:
            if not self.live(d):
                self.expect_lost(d, lambda: d.release(delay / 1000), "release")
                return
            event("release: live delivery")
            t = self.model[d.id]
            outcome = d.release(delay / 1000)
            self.unlease(t)
            t.state, t.due, t.token, t.deadline = "scheduled", self.now + delay, None, None
            t.attempt = max(t.attempt - 1, 0)  # the released delivery does not count
            t.has_meta = True
            self.counters["released"] += 1
            assert (outcome.kind, outcome.at) == ("released", ms_datetime(t.due))

        def has_live_delivery(self) -> bool:
            return any(self.live(d) for d in self.handed_out)

        @precondition(has_live_delivery)
        @rule(
            data=st.data(),
            before=st.booleans(),
            action=st.sampled_from(["ack", "fail", "extend", "release"]),
            kind=error_kinds,
            ms=leases_ms,
        )
        def act_at_the_deadline(
            self, data: st.DataObject, before: bool, action: str, kind: str, ms: int
        ) -> None:
            """Move the clock to a live lease's deadline (the lease is lost: LeaseLost) or 1 ms
            before it (still held), then ack, fail, extend or release that delivery."""
            live = [d for d in self.handed_out if self.live(d)]
            d = data.draw(st.sampled_from(live), label="delivery")
            deadline = self.model[d.id].deadline
            assert deadline is not None
            self.clock.ms = deadline - 1 if before else deadline
            if action == "ack":
                self.do_ack(d)
            elif action == "fail":
                self.do_fail(d, kind, ms)
            elif action == "extend":
                self.do_extend(d, ms)
            else:
                self.do_release(d, ms)

        @rule(tid=st.sampled_from(IDS))
        def cancel(self, tid: str) -> None:
            assert self.queue.cancel(tid) == (tid in self.model)
            t = self.model.pop(tid, None)
            if t is not None:
                self.leave_key(t)
                self.counters["cancelled"] += 1
                # its holder hears "cancelled", also when its lease ran out but was not
                # reclaimed yet (remembered from now then)
                if t.state == "leased" and t.token is not None and t.deadline is not None:
                    self.revoked[(tid, t.token)] = max(t.deadline, self.now)

        @rule(pause=st.booleans())
        def pause_or_resume(self, pause: bool) -> None:
            settings = self.queue.pause() if pause else self.queue.resume()
            event("pause" if pause else "resume")
            self.paused = pause
            assert settings.paused == pause

        @rule(tid=st.sampled_from(IDS), delay=delays_ms)
        def reschedule(self, tid: str, delay: int) -> None:
            t = self.model.get(tid)
            scheduled = t is not None and t.state == "scheduled"
            assert self.queue.reschedule(tid, delay=delay / 1000) == scheduled
            if t is not None and scheduled:
                if t.parked:
                    event("keys: a parked task rescheduled")
                    self.unpark(t)
                t.due = self.now + delay

        @rule(data=st.data(), purge=st.booleans())
        def replay_or_purge_dead(self, data: st.DataObject, purge: bool) -> None:
            dead = self.ids_where(lambda t: t.state == "dead")
            if dead and data.draw(st.integers(0, 3), label="dead id unless 0") > 0:
                tid = data.draw(st.sampled_from(dead), label="id")
            else:
                tid = data.draw(st.sampled_from(IDS), label="id")
            t = self.model.get(tid)
            move = self.queue.dead.purge if purge else self.queue.dead.replay
            if t is None or t.state != "dead":
                with pytest.raises(dueq.TaskNotFound) as caught:
                    move([tid])
                assert caught.value.ids == [tid]
                return
            event(f"dead letters: {'purge' if purge else 'replay'}")
            assert move([tid]) == 1
            if purge:
                del self.model[tid]
                self.counters["purged"] += 1
            else:  # due now, attempts and errors reset
                self.model[tid] = ModelTask(
                    t.payload, "scheduled", self.now, priority=t.priority, key=t.key
                )
                self.counters["replayed"] += 1

        @rule(
            ms=st.one_of(
                st.sampled_from([1, 1000, BACKOFF_MS, LEASE_MS, DEAD_MAX_AGES_MS[1]]),
                st.integers(0, 15_000),
            )
        )
        def advance_clock(self, ms: int) -> None:
            self.clock.ms += ms

        def has_future_due(self) -> bool:
            return bool(self.ids_where(lambda t: t.state == "scheduled" and t.due > self.now))

        @precondition(has_future_due)
        @rule(offset=offsets_ms, claim_limit=claim_after)
        def advance_to_next_due(self, offset: int, claim_limit: int | None) -> None:
            """Move the clock to the next future due time + ``offset`` ms (then maybe claim)."""
            future = self.ids_where(lambda t: t.state == "scheduled" and t.due > self.now)
            self.clock.ms = min(self.model[tid].due for tid in future) + offset
            if claim_limit is not None:
                self.claim_and_check(claim_limit, None)

        def has_unexpired_lease(self) -> bool:
            return bool(self.ids_where(lambda t: t.state == "leased" and t.deadline > self.now))

        @precondition(has_unexpired_lease)
        @rule(data=st.data(), offset=offsets_ms, claim_limit=claim_after)
        def expire_lease(self, data: st.DataObject, offset: int, claim_limit: int | None) -> None:
            """Move the clock to a lease's deadline + ``offset`` ms (on or past it: expired,
            so the next claim reclaims it; -1: still held), then maybe claim."""
            candidates = self.ids_where(lambda t: t.state == "leased" and t.deadline > self.now)
            tid = data.draw(st.sampled_from(candidates), label="lease of")
            deadline = self.model[tid].deadline
            assert deadline is not None
            self.clock.ms = deadline + offset
            if claim_limit is not None:
                self.claim_and_check(claim_limit, None)

        # -- invariants ----------------------------------------------------------------------

        @invariant()
        def queue_matches_model(self) -> None:
            self.check_redis_keys()
            self.check_stats()
            self.check_dead_letters()
            self.check_get()

        def check_redis_keys(self) -> None:
            k = self.queue.keys
            places = [*(f"due:{p}" for p in range(10)), "leased", "dead"]
            zsets = [*k.due_levels, k.leased, k.dead]
            pipe = self.client.pipeline(transaction=False)
            for tid in IDS:
                for key in zsets:
                    pipe.zscore(key, tid)
            for key in zsets:
                pipe.zcard(key)
            for key in (k.tasks, k.meta, k.errors):
                pipe.hkeys(key)
            pipe.zrange(k.parked, 0, -1)
            pipe.hgetall(k.key_state)
            pipe.zrange(k.key_wait, 0, -1, withscores=True)
            reply = pipe.execute()
            n = len(zsets)
            parked = {
                m.rsplit(b"\0", 1)[1][16:].decode(): m.split(b"\0", 1)[0].decode()
                for m in reply[-3]
            }
            for i, tid in enumerate(IDS):
                scores = zip(places, reply[n * i : n * i + n], strict=True)
                present = {name: score for name, score in scores if score is not None}
                t = self.model.get(tid)
                if t is None:
                    assert present == {} and tid not in parked, f"{tid} is gone but in {present}"
                    continue
                if t.state == "scheduled" and t.parked:
                    assert present == {} and parked.get(tid) == t.key, f"{tid}: model {t}"
                    continue
                assert tid not in parked, f"{tid}: model {t}, but parked"
                expected = {"scheduled": t.due, "leased": t.deadline, "dead": t.died_at}[t.state]
                place = f"due:{t.priority}" if t.state == "scheduled" else t.state
                assert present == {place: expected}, f"{tid}: model {t}, redis {present}"
            counts = reply[n * len(IDS) : n * len(IDS) + n]
            tasks, meta, errors = reply[n * len(IDS) + n : n * len(IDS) + n + 3]
            assert sum(counts) + len(parked) == len(self.model), "a stray sorted-set member"
            self.check_key_state(reply[-2], reply[-1])
            assert names(tasks) == set(self.model)
            assert names(meta) <= set(self.model), "meta of a gone task"
            assert names(errors) <= set(self.model), "errors of a gone task"

        def check_key_state(
            self, state: dict[bytes, bytes], wait: list[tuple[bytes, float]]
        ) -> None:
            expected = {}
            for key in {*self.flight, *self.marks, *self.parked_count}:
                mark = self.marks.get(key)
                shown_mark = "" if mark is None else f"{mark:.3f}"
                leased, parked = self.flight.get(key, 0), self.parked_count.get(key, 0)
                expected[key] = f"{leased}|{shown_mark}|{parked}"
            assert {f.decode(): v.decode() for f, v in state.items()} == expected
            assert {key.decode(): score for key, score in wait} == self.wait

        def check_stats(self) -> None:
            stats = self.queue.stats()
            by_state = Counter(t.state for t in self.model.values())
            due_now = len(self.ids_where(lambda t: t.state == "scheduled" and t.due <= self.now))
            assert (stats.scheduled, stats.leased, stats.dead, stats.due_now) == (
                by_state["scheduled"],
                by_state["leased"],
                by_state["dead"],
                due_now,
            )
            assert stats.now == ms_datetime(self.now)
            head = self.head_due()
            assert stats.next_due_at == (None if head is None else ms_datetime(head))
            assert stats.paused == self.paused
            lag_s = (self.now - head) / 1000 if head is not None and head <= self.now else 0.0
            assert stats.oldest_due_lag_s == lag_s
            assert stats.counters == {name: n for name, n in self.counters.items() if n}

        def check_dead_letters(self) -> None:
            dead = sorted((t.died_at, tid) for tid, t in self.model.items() if t.state == "dead")
            listed = self.queue.dead.list(limit=len(IDS))
            assert [info.id for info in listed] == [tid for _, tid in reversed(dead)]
            assert self.queue.dead.count() == len(dead)

        def check_get(self) -> None:
            def at(ms: int | None) -> datetime | None:
                return None if ms is None else ms_datetime(ms)

            for tid in IDS:
                info = self.queue.get(tid)
                t = self.model.get(tid)
                if t is None:
                    assert info is None, f"{tid} is gone but get() says {info}"
                    continue
                assert info is not None, f"{tid} missing, model {t}"
                assert (info.state, info.attempt, info.payload, len(info.errors)) == (
                    t.state,
                    t.attempt,
                    t.payload,
                    t.errors,
                ), f"{tid}: model {t}, get() {info}"
                assert (info.due_at, info.lease_deadline, info.died_at) == (
                    at(t.due if t.state != "leased" or t.due_shown else None),
                    at(t.deadline),
                    at(t.died_at),
                ), f"{tid}: model {t}, get() {info}"

    return QueueMachine


# 130 examples of 50 steps, each step a round trip plus full checks: about 30 s on an idle core,
# several times that on a loaded one (the suite runs 4 workers on 2 cores in CI), so this test
# gets more than the suite's 120 s per test (a timeout mid-run makes Hypothesis report a flaky
# failure).
@pytest.mark.timeout(600)
def test_queue_matches_model(redis_server: RedisServer, make_queue: Callable[..., Any]) -> None:
    run_state_machine_as_test(build_machine(redis_server, make_queue), settings=SETTINGS)
