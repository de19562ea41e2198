"""Stateful property test: a real queue on the test Redis against an in-memory model.

It runs on both front ends (``front_end``: ``dueq.Queue``, or ``dueq.AsyncQueue`` driven
through ``make_queue``'s ``Blocking`` wrapper), with the example budget shared between them.

Hypothesis drives schedule / claim / ack / fail / extend / release / cancel (plus reschedule,
dead-letter replay and purge) and moves a hand-held clock, also to exactly a lease deadline or
due time and 1 ms before it. After every step the Redis keys, ``Queue.stats()`` and
``Queue.get()`` must agree with the model: state, due time, lease deadline, died-at time,
attempt, payload, number of recorded errors and the event counters.

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
from dueq.clock import ms_datetime
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
error_kinds = st.sampled_from(["str", "exc", "unrecoverable"])
# Where to put the clock relative to a deadline or due time: 1 ms before, exactly on, after.
offsets_ms = st.one_of(st.sampled_from([-1, 0]), st.integers(0, 3_000))
# After moving the clock, claim at once (with this limit) or not: shortens retry cycles.
claim_after = st.none() | st.integers(1, 5)


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
            self.counters: Counter[str] = Counter()

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

        def model_schedule(self, tid: str, due: int, payload: int, replace: bool) -> str:
            if tid in self.model and not replace:
                return "existing"
            outcome = "replaced" if tid in self.model else "added"
            self.model[tid] = ModelTask(payload, "scheduled", due)
            self.counters["scheduled"] += 1
            return outcome

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

        def next_due(self) -> int | None:
            return min((t.due for t in self.model.values() if t.state == "scheduled"), default=None)

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

        def has_deliveries(self) -> bool:
            return bool(self.handed_out)

        # -- rules ---------------------------------------------------------------------------

        @initialize(
            max_attempts=st.sampled_from(MAX_ATTEMPTS[::-1]),
            dead_max_count=st.sampled_from(DEAD_MAX_COUNTS),
            dead_max_age_ms=st.sampled_from(DEAD_MAX_AGES_MS),
            seed=st.lists(st.tuples(st.sampled_from(IDS), payloads), max_size=len(IDS)),
        )
        def setup(
            self,
            max_attempts: int,
            dead_max_count: int,
            dead_max_age_ms: int,
            seed: list[tuple[str, int]],
        ) -> None:
            """Pick the retry policy and dead-letter caps; start with a few tasks due now, so
            that deliveries come early in an example."""
            self.max_attempts = max_attempts
            self.dead_max_count = dead_max_count
            self.dead_max_age_ms = dead_max_age_ms
            self.queue = self.make_queue()
            for tid, payload in seed:
                assert self.queue.schedule(payload, id=tid) == tid
                self.model_schedule(tid, self.now, payload, replace=False)

        @rule(tid=st.sampled_from(IDS), delay=delays_ms, payload=payloads, replace=st.booleans())
        def schedule(self, tid: str, delay: int, payload: int, replace: bool) -> None:
            assert self.queue.schedule(payload, id=tid, delay=delay / 1000, replace=replace) == tid
            self.model_schedule(tid, self.now + delay, payload, replace)

        @rule(
            items=st.lists(
                st.tuples(
                    st.sampled_from(IDS),
                    st.sampled_from(["delay", "at"]),
                    st.integers(-5_000, 10_000),  # ms from now; "at" may be in the past
                    payloads,
                ),
                min_size=1,
                max_size=3,
            ),
            replace=st.booleans(),
        )
        def schedule_many(self, items: list[tuple[str, str, int, int]], replace: bool) -> None:
            tasks = []
            outcome: Counter[str] = Counter()
            for tid, how, ms, payload in items:
                if how == "delay":
                    ms = abs(ms)
                    tasks.append(dueq.Task(payload, id=tid, delay=ms / 1000))
                else:
                    tasks.append(dueq.Task(payload, id=tid, at=ms_datetime(self.now + ms)))
                outcome[self.model_schedule(tid, self.now + ms, payload, replace)] += 1
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
                    t.errors += 1
                    t.token = t.deadline = None
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
            # 2. Up to `limit` due tasks, earliest first (ties by id, as Redis orders them).
            due = sorted(
                (t.due, tid)
                for tid, t in self.model.items()
                if t.state == "scheduled" and t.due is not None and t.due <= now
            )[:limit]
            batch = self.queue.claim_batch(limit, lease=None if lease is None else lease / 1000)
            got = batch.deliveries
            event(f"claim: {len(got)} delivered")
            assert [d.id for d in got] == [tid for _, tid in due]
            assert batch.now_ms == now
            if got:
                self.lease_in_model(got, lease)
            assert (batch.next_due_ms, batch.next_lease_deadline_ms) == (
                self.next_due(),
                self.next_deadline(),
            )

        def lease_in_model(self, got: list[Delivery], lease: int | None) -> None:
            now = self.now
            token = got[0].token
            assert token not in self.tokens, "a lease token was issued twice"
            self.tokens.add(token)
            deadline = now + (LEASE_MS if lease is None else lease)
            for d in got:
                t = self.model[d.id]
                assert d.token == token
                assert (d.attempt, d.due_ms, d.payload) == (t.attempt + 1, t.due, t.payload)
                assert (d.lease_deadline_ms, d.claimed_ms) == (deadline, now)
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
            del self.model[d.id]
            self.counters["acked"] += 1

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
                del self.model[d.id]
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
            t.errors += 1
            t.token = t.deadline = None
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
            t.state, t.due, t.token, t.deadline = "scheduled", self.now + delay, None, None
            t.attempt = max(t.attempt - 1, 0)  # the released delivery does not count
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
            if self.model.pop(tid, None) is not None:
                self.counters["cancelled"] += 1

        @rule(tid=st.sampled_from(IDS), delay=delays_ms)
        def reschedule(self, tid: str, delay: int) -> None:
            t = self.model.get(tid)
            scheduled = t is not None and t.state == "scheduled"
            assert self.queue.reschedule(tid, delay=delay / 1000) == scheduled
            if t is not None and scheduled:
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
                self.model[tid] = ModelTask(t.payload, "scheduled", self.now)
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
            pipe = self.client.pipeline(transaction=False)
            for tid in IDS:
                pipe.zscore(k.due, tid)
                pipe.zscore(k.leased, tid)
                pipe.zscore(k.dead, tid)
            for key in (k.due, k.leased, k.dead):
                pipe.zcard(key)
            for key in (k.tasks, k.meta, k.errors):
                pipe.hkeys(key)
            reply = pipe.execute()
            for i, tid in enumerate(IDS):
                scores = zip(("scheduled", "leased", "dead"), reply[3 * i : 3 * i + 3], strict=True)
                present = {name: score for name, score in scores if score is not None}
                t = self.model.get(tid)
                if t is None:
                    assert present == {}, f"{tid} is gone but still in {present}"
                    continue
                expected = {"scheduled": t.due, "leased": t.deadline, "dead": t.died_at}[t.state]
                assert present == {t.state: expected}, f"{tid}: model {t}, redis {present}"
            n_due, n_leased, n_dead, tasks, meta, errors = reply[3 * len(IDS) :]
            assert n_due + n_leased + n_dead == len(self.model), "a stray sorted-set member"
            assert names(tasks) == set(self.model)
            assert names(meta) <= set(self.model), "meta of a gone task"
            assert names(errors) <= set(self.model), "errors of a gone task"

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
            head = self.next_due()
            assert stats.next_due_at == (None if head is None else ms_datetime(head))
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
                    at(t.due),
                    at(t.deadline),
                    at(t.died_at),
                ), f"{tid}: model {t}, get() {info}"

    return QueueMachine


def test_queue_matches_model(redis_server: RedisServer, make_queue: Callable[..., Any]) -> None:
    run_state_machine_as_test(build_machine(redis_server, make_queue), settings=SETTINGS)
