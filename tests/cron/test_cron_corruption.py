"""Cron with corrupted data in Redis: one bad definition or state never holds back the others.

Values are corrupted by hand with HSET, as an operator's typo or a faulty tool would; the
claims, lists and repairs then go through the public API on a real Redis.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dueq
from dueq.cron.flows import occurrence_id

EVERY_SECOND = "* * * * * *"
GOOD_SPEC = {"expr": EVERY_SECOND, "tz": "UTC", "missed": "latest", "max_missed": 10}


def slot_id(name: str, clock: Any) -> str:
    """The id of ``name``'s occurrence at the clock's current second."""
    return occurrence_id(name, round(clock.now) * 1000)


def runs(q: dueq.Queue) -> list[str]:
    """Claim and ack everything due; the ids run."""
    delivered = q.claim(limit=1000)
    for d in delivered:
        d.ack()
    return sorted(d.id for d in delivered)


def two_every_second(make_queue: Callable[..., dueq.Queue]) -> dueq.Queue:
    q = make_queue()
    assert q.cron.add("good", EVERY_SECOND, payload={"who": "good"}) == "added"
    assert q.cron.add("bad", EVERY_SECOND, payload={"who": "bad"}) == "added"
    q.schedule({"plain": True}, id="plain", delay=1)
    return q


CORRUPT_STATES: list[str | bytes] = [
    "garbage",
    "",
    "|",
    "||",
    "1800000001000|",
    "1800000001000|1800000000000",
    "|1800000000000|cron:bad:20270115T080001Z",
    "abc|def|cron:bad:20270115T080001Z",
    "99999999999999999999|1|cron:bad:20270115T080001Z",  # far beyond any datetime
    "1800000001000|99999999999999999999|cron:bad:20270115T080001Z",
    "-1800000001000|1|cron:bad:20270115T080001Z",
    "1.8e12|1|cron:bad:20270115T080001Z",
    "1800000001000|1|plain",  # the pending id names an ordinary task
    "1800000001000|1|cron:good:20270115T080001Z",  # ... or another definition's occurrence
    b"\xff\xfe|\x00|\x80",
    "1800000001000|1|cron:bad:x\n|2|3",
]


@pytest.mark.parametrize("state", CORRUPT_STATES)
def test_a_corrupted_state_never_holds_back_the_other_occurrences_of_its_batch(
    make_queue, r, clock, caplog, state
):
    q = two_every_second(make_queue)
    r.hset(q.keys.cron_state, "bad", state)
    good_runs = 0
    for second in range(6):
        clock.advance(1)
        ran = runs(q)  # never raises
        assert slot_id("good", clock) in ran
        good_runs += 1
        # The broken definition's own occurrence runs too, and the first claim rebuilds its
        # schedule from its definition, from the next slot after now: no slot fires twice.
        assert slot_id("bad", clock) in ran
        assert ("plain" in ran) == (second == 0)
    assert "schedule state" in caplog.text and "'bad'" in caplog.text
    assert good_runs == 6
    assert q.stats().leased == 0
    bad = q.cron.get("bad")
    assert bad is not None and bad.problem is None  # repaired by the claim
    assert bad.next_at == datetime.fromtimestamp(clock.now + 1, timezone.utc)


@pytest.mark.parametrize("state", CORRUPT_STATES)
def test_list_and_get_report_a_corrupted_state_instead_of_raising(make_queue, r, state):
    q = two_every_second(make_queue)
    r.hset(q.keys.cron_state, "bad", state)
    listed = q.cron.list()
    assert [d.name for d in listed] == ["bad", "good"]
    bad, good = listed
    assert bad.problem is not None and "schedule state" in bad.problem
    assert (bad.expr, bad.payload) == (EVERY_SECOND, {"who": "bad"})  # the definition is fine
    assert good.problem is None and good.next_at is not None
    assert q.cron.get("bad") == bad


def test_a_missing_state_is_reported_and_rebuilt_by_the_next_claim(make_queue, r, clock):
    q = two_every_second(make_queue)
    r.hdel(q.keys.cron_state, "bad")
    bad = q.cron.get("bad")
    assert bad is not None and bad.problem is not None and "no schedule state" in bad.problem
    clock.advance(1)
    assert slot_id("bad", clock) in runs(q)
    clock.advance(1)
    assert slot_id("bad", clock) in runs(q)
    bad = q.cron.get("bad")
    assert bad is not None and bad.problem is None


def test_a_rebuilt_state_never_fires_an_earlier_slot_again(make_queue, r, clock):
    """A retry of an old occurrence claimed while the state is corrupt rebuilds the schedule
    from now, not from its own slot: the slots after it already ran."""
    q = make_queue(retry=dueq.RetryPolicy(max_attempts=3, wait=lambda s: 5.0))
    q.cron.add("n", EVERY_SECOND)
    clock.advance(1)
    (old,) = q.claim()
    old.fail(RuntimeError("retry in 5 s"))
    fired = [old.id]
    for _ in range(4):
        clock.advance(1)
        fired += runs(q)
    r.hset(q.keys.cron_state, "n", "garbage")
    clock.advance(1)  # the retry of the first slot is due now, with this second's slot
    ran = runs(q)
    assert sorted(ran) == sorted([old.id, slot_id("n", clock)])
    fired += ran
    for _ in range(3):
        clock.advance(1)
        fired += runs(q)
    assert len(fired) == len(set(fired)) + 1  # only the retried slot ran twice
    assert fired.count(old.id) == 2


BAD_DEFINITIONS: list[str | bytes] = [
    "{not json",
    "",
    b"\xff\xfe",
    "5",
    "null",
    "[]",
    '"* * * * * *"',
    json.dumps({"expr": EVERY_SECOND}),  # fields missing
    json.dumps({**GOOD_SPEC, "expr": 5, "payload": None}),
    json.dumps({**GOOD_SPEC, "expr": "61 * * * *", "payload": None}),
    json.dumps({**GOOD_SPEC, "expr": "0 0 31 2 *", "payload": None}),  # never fires
    json.dumps({**GOOD_SPEC, "tz": "Mars/Olympus", "payload": None}),
    json.dumps({**GOOD_SPEC, "tz": ["UTC"], "payload": None}),
    json.dumps({**GOOD_SPEC, "missed": "sometimes", "payload": None}),
    json.dumps({**GOOD_SPEC, "max_missed": 1e300, "payload": None}),
    json.dumps({**GOOD_SPEC, "max_missed": 10**30, "payload": None}),
    json.dumps({**GOOD_SPEC, "max_missed": "10", "payload": None}),
    json.dumps({**GOOD_SPEC, "max_missed": True, "payload": None}),
    json.dumps({**GOOD_SPEC, "missed": "all", "max_missed": 0, "payload": None}),
    '{"expr":"* * * * * *","tz":"UTC","missed":"latest","max_missed":10,"payload":NaN}',
    '{"expr":"* * * * * *","tz":"UTC","missed":"latest","max_missed":1' + "0" * 5000 + "}",
    "[" * 100_000 + "]" * 100_000,
]


@pytest.mark.parametrize("definition", BAD_DEFINITIONS, ids=lambda d: repr(d)[:40])
def test_a_corrupted_definition_runs_its_occurrence_once_and_never_blocks_others(
    make_queue, r, clock, caplog, definition
):
    q = two_every_second(make_queue)
    r.hset(q.keys.cron, "bad", definition)
    clock.advance(1)
    with caplog.at_level(logging.ERROR, logger="dueq.cron"):
        ran = runs(q)
    bad_slot = slot_id("bad", clock)
    # Delivered once as an ordinary task with the payload it was scheduled with ...
    assert sorted(ran) == sorted([bad_slot, slot_id("good", clock), "plain"])
    assert "'bad'" in caplog.text and "definition" in caplog.text
    for _ in range(4):  # ... and its schedule is not advanced; the good one goes on
        clock.advance(1)
        assert runs(q) == [slot_id("good", clock)]
    listed = q.cron.list()
    assert [d.name for d in listed] == ["bad", "good"]
    assert listed[0].problem is not None and "definition" in listed[0].problem
    assert listed[1].problem is None
    assert q.cron.get("bad") == listed[0]
    # Adding it again with replace=True repairs it.
    assert q.cron.add("bad", EVERY_SECOND, payload={"who": "bad"}, replace=True) == "replaced"
    clock.advance(1)
    assert runs(q) == sorted([slot_id("bad", clock), slot_id("good", clock)])


def test_the_claim_time_keeper_logs_on_the_dueq_cron_logger(make_queue, r, clock, caplog):
    """Users configure cron logging by the name ``dueq.cron.flows``; the keeper is a private module
    (``dueq.cron._keeper``) but keeps logging there."""
    q = two_every_second(make_queue)
    r.hset(q.keys.cron, "bad", "{not json")
    clock.advance(1)
    with caplog.at_level(logging.ERROR, logger="dueq.cron"):
        runs(q)
    assert {rec.name for rec in caplog.records if "'bad'" in rec.getMessage()} == {"dueq.cron"}


def test_a_broken_definition_can_be_removed(make_queue, r, clock):
    q = two_every_second(make_queue)
    r.hset(q.keys.cron, "bad", "{not json")
    assert q.cron.remove("bad")
    assert [d.name for d in q.cron.list()] == ["good"]
    clock.advance(1)
    assert runs(q) == sorted([slot_id("good", clock), "plain"])


def test_a_definition_name_that_is_not_utf8_is_listed_with_its_problem(make_queue, r):
    q = two_every_second(make_queue)
    r.hset(q.keys.cron, b"\xffname", json.dumps({**GOOD_SPEC, "payload": None}))
    listed = q.cron.list()
    assert [d.name for d in listed] == ["\\xffname", "bad", "good"]
    assert listed[0].problem is not None and "UTF-8" in listed[0].problem


@pytest.mark.parametrize("state", ["1800000001000|1|plain", "1800000001000|1|cron:good:x"])
def test_a_state_naming_another_task_never_withdraws_it(make_queue, r, clock, state):
    q = two_every_second(make_queue)
    good_pending = occurrence_id("good", round(clock.now + 1) * 1000)
    r.hset(q.keys.cron_state, "bad", state)
    assert q.cron.remove("bad")
    assert q.get("plain") is not None
    assert q.get(good_pending) is not None
    r.hset(q.keys.cron_state, "good", state.replace("cron:good:x", "plain"))
    # The same definition again repairs the state instead of trusting it.
    assert q.cron.add("good", EVERY_SECOND, payload={"who": "good"}) == "restored"
    assert q.cron.add("good", EVERY_SECOND, payload={"who": "good"}, replace=True) == "unchanged"
    assert q.get("plain") is not None


def test_a_cron_key_of_the_wrong_type_is_a_cron_error(make_queue, r, clock):
    q = two_every_second(make_queue)
    r.delete(q.keys.cron)
    r.set(q.keys.cron, "not a hash")
    for call in (
        q.cron.list,
        lambda: q.cron.get("good"),
        lambda: q.cron.add("other", EVERY_SECOND),
        lambda: q.cron.remove("good"),
    ):
        with pytest.raises(dueq.CronError, match="wrong type"):
            call()
    clock.advance(1)
    assert "plain" in [d.id for d in q.claim()]  # ordinary tasks still run


# -- property: random corruption never crashes a claim or blocks others ------------------------

JSON_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=False),
    st.text(max_size=20),
)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)
FIELD_VALUES = st.one_of(
    JSON_VALUES,
    st.sampled_from(
        [EVERY_SECOND, "@hourly", "61 * * * *", "UTC", "Mars/Olympus", "all", "skip", 0, 1001]
    ),
)


@st.composite
def corrupt_definitions(draw: st.DrawFn) -> str | bytes:
    kind = draw(st.sampled_from(["bytes", "text", "json", "field", "missing"]))
    if kind == "bytes":
        return draw(st.binary(max_size=40))
    if kind == "text":
        return draw(st.text(max_size=40))
    if kind == "json":
        return json.dumps(draw(JSON_VALUES))
    spec: dict[str, Any] = {**GOOD_SPEC, "payload": None}
    field = draw(st.sampled_from(sorted(spec)))
    if kind == "missing":
        del spec[field]
    else:
        spec[field] = draw(FIELD_VALUES)
    return json.dumps(spec)


STATE_PIECES = st.sampled_from(
    [
        "|",
        "||",
        "",
        "1800000001000",
        "1800000000000",
        "-1",
        "1.5",
        "1e20",
        "99999999999999999999",
        "cron:bad:20270115T080001Z",
        "cron:good:20270115T080001Z",
        "plain",
        "abc",
        "\n",
        "\xff",
    ]
)
CORRUPT_STATE_VALUES = st.one_of(
    st.lists(STATE_PIECES, max_size=6).map("".join),
    st.binary(max_size=30),
    st.text(max_size=30),
    st.integers().map(str),
)


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    definition=st.none() | corrupt_definitions(),
    state=st.none() | CORRUPT_STATE_VALUES,
    delete_state=st.booleans(),
)
def test_random_corruption_never_crashes_a_claim_or_blocks_other_tasks(
    make_queue, r, admin, clock, definition, state, delete_state
):
    admin.flushall()
    q = two_every_second(make_queue)
    if definition is not None:
        r.hset(q.keys.cron, "bad", definition)
    if delete_state:
        r.hdel(q.keys.cron_state, "bad")
    elif state is not None:
        r.hset(q.keys.cron_state, "bad", state)
    for second in range(3):
        clock.advance(1)
        ran = runs(q)  # never raises
        assert slot_id("good", clock) in ran
        assert ("plain" in ran) == (second == 0)
        for read in (q.cron.list, lambda: [q.cron.get("bad"), q.cron.get("good")]):
            try:
                found = read()
            except dueq.CronError:
                continue
            assert all(d is None or isinstance(d, dueq.CronDefinition) for d in found)
    assert q.stats().leased == 0
    assert q.cron.remove("bad")
    clock.advance(1)
    assert runs(q) == [slot_id("good", clock)]


@pytest.mark.parametrize(
    "odd_id",
    [
        "cron:good:99991231T235959Z",  # the last slot a datetime can show
        "cron:good:19000101T000000Z",  # before 1970
        "cron:good:00010101T000000Z",
        "cron:bad:99991231T235959Z",
    ],
)
def test_tasks_named_like_odd_occurrences_run_without_blocking_the_batch(make_queue, clock, odd_id):
    q = two_every_second(make_queue)
    q.schedule({"odd": True}, id=odd_id, delay=1)
    clock.advance(1)
    ran = runs(q)
    assert sorted(ran) == sorted([odd_id, "plain", slot_id("good", clock), slot_id("bad", clock)])
    clock.advance(1)
    assert runs(q) == sorted([slot_id("bad", clock), slot_id("good", clock)])
    assert all(d.problem is None for d in q.cron.list())
