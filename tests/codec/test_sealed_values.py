"""Values other than the payload that carry user data, sealed with the queue's codec on both
front ends: kept handler results (keep_results), durable step results and outcome events.
Each is bound to its queue and task (a step result to its position too), a DUMP of every key
shows none of them, and one no key opens reads as UndecryptableTask where it is used, as a
marker where it is shown."""

from __future__ import annotations

import json
import os
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from codec_support import read_events, values_of_queue
from durable_support import run_due

import dueq
from dueq._wire.codec import SEALED_VALUE_MARK, SealedMarker

pytest.importorskip("cryptography")
pytest.importorskip("zstandard")

K1 = os.urandom(32)
K2 = os.urandom(32)


def one_key(key_id: str = "k1", key: bytes = K1) -> dueq.Encrypted:
    return dueq.Encrypted(keys={key_id: key}, active=key_id)


def since(clock) -> datetime:
    return datetime.fromtimestamp(clock.now - 1, tz=timezone.utc)


def test_a_kept_result_round_trips_through_get_and_wait_and_is_sealed_in_redis(make_queue, r):
    q = make_queue(codec=one_key(), compression="auto")
    q.configure(keep_results=3600)
    q.schedule({"n": 1}, id="t1")
    [d] = q.claim()
    d.ack({"secret": "RESULT-MARKER", "rows": list(range(50))})
    expected = {"secret": "RESULT-MARKER", "rows": list(range(50))}
    assert q.get("t1").result == expected
    assert q.wait("t1", timeout=5).result == expected
    record = r.hget("dueq:{q}:results", "t1")
    assert b"RESULT-MARKER" not in record
    head = json.loads(record.partition(b"\n")[0])
    assert head["result"].startswith(SEALED_VALUE_MARK)


def test_a_result_no_key_opens_shows_as_a_marker_and_wait_raises_undecryptable(make_queue):
    q = make_queue(codec=one_key())
    q.configure(keep_results=3600)
    q.schedule({"n": 1}, id="t1")
    [d] = q.claim()
    d.ack({"secret": "s"})
    for reader in (make_queue(codec=one_key("k2", K2)), make_queue()):
        info = reader.get("t1")
        assert info.state == "done"
        assert isinstance(info.result, SealedMarker)
        assert info.result.startswith("<encrypted k1, ")
        with pytest.raises(dueq.UndecryptableTask, match="result of task 't1'"):
            reader.wait("t1", timeout=5)


def test_a_result_copied_onto_another_task_fails_authentication(make_queue, r):
    q = make_queue(codec=one_key())
    q.configure(keep_results=3600)
    q.schedule({"n": 1}, id="a")
    q.schedule({"n": 2}, id="b")
    for d in q.claim(limit=2):
        d.ack({"of": d.id})
    r.hset("dueq:{q}:results", "b", r.hget("dueq:{q}:results", "a"))
    assert q.get("a").result == {"of": "a"}
    shown = q.get("b").result
    assert isinstance(shown, SealedMarker) and "authentication" in str(shown.error)


def test_results_of_a_queue_without_a_codec_stay_plain_json(make_queue, r):
    q = make_queue()
    q.configure(keep_results=3600)
    q.schedule({"n": 1}, id="t1")
    [d] = q.claim()
    d.ack({"plain": "yes"})
    assert b'"result":{"plain":"yes"}' in r.hget("dueq:{q}:results", "t1")
    assert q.wait("t1", timeout=5).result == {"plain": "yes"}


def durable_task(q):
    @q.task(name="steps", durable=True)
    def steps(ctx: dueq.StepContext, n: int, marker: str) -> str:
        a = ctx.step("a", lambda: {"step": "a", "secret": marker[::-1]})
        b = ctx.step("b", lambda: [a["secret"][::-1], n])
        if ctx.delivery.attempt == 1:
            raise RuntimeError("retry after the steps")
        return f"done {b[1]}"

    return steps


def test_step_results_are_sealed_per_position_and_later_runs_read_them(make_queue, r, clock):

    q = make_queue(codec=one_key())
    q.configure(keep_results=3600)
    steps = durable_task(q)
    tid = steps.schedule(n=7, marker="STEP-MARKER")
    (first,) = run_due(q)
    assert isinstance(first.error, RuntimeError)
    log = b"".join(r.hvals("dueq:{q}:steps"))
    assert log and b"STEP-MARKER" not in log and b"REKRAM-PETS" not in log
    assert [s.result for s in q.get(tid).steps] == [
        {"step": "a", "secret": "REKRAM-PETS"},
        ["STEP-MARKER", 7],
    ]
    clock.advance(60)
    (second,) = run_due(q)
    assert second.value == "done 7"
    kept = q.get(tid)  # the finished record keeps the log, sealed as it was
    assert [s.result for s in kept.steps][1] == ["STEP-MARKER", 7]
    assert b"STEP-MARKER" not in r.hget("dueq:{q}:results", tid)


def test_a_step_result_moved_to_another_position_or_unopened_is_refused(make_queue, r, clock):

    q = make_queue(codec=one_key())
    steps = durable_task(q)
    tid = steps.schedule(n=1, marker="S")
    run_due(q)
    (field,) = r.hkeys("dueq:{q}:steps")
    first, second = r.hget("dueq:{q}:steps", field).split(b"\n")
    r_a = first[first.index(b'"r":') :]
    swapped = second[: second.index(b'"r":')] + r_a
    r.hset("dueq:{q}:steps", field, first + b"\n" + swapped)
    shown = q.get(tid).steps[1].result
    assert isinstance(shown, SealedMarker) and "step 1 result" in str(shown.error)
    clock.advance(60)
    (run,) = run_due(q)  # the run reads its log: a typed error, not a wrong value
    assert isinstance(run.error, dueq.UndecryptableTask)
    assert q.get(tid).errors[-1].type == "UndecryptableTask"


def test_events_carry_sealed_payloads_and_results_that_the_queues_reader_opens(make_queue, clock):
    q = make_queue(codec=one_key())
    q.configure(events=timedelta(hours=1), keep_results=3600)
    q.schedule({"secret": "P"}, id="t1", priority=3)
    [d] = q.claim()
    d.ack({"secret": "R"})
    [ev] = read_events(q, 1, since(clock))
    assert ev.kind == "acked" and ev.undecryptable is None
    assert ev.task.payload == {"secret": "P"} and ev.task.priority == 3
    assert ev.result == {"secret": "R"}
    [shown] = read_events(make_queue(codec=one_key("k2", K2)), 1, since(clock))
    assert isinstance(shown.undecryptable, dueq.UndecryptableTask)
    assert shown.task.payload.startswith("<encrypted k1, ")
    assert shown.result.startswith("<encrypted k1, ")
    assert shown.to_json()["payload"].startswith("<encrypted k1, ")


def test_a_dump_of_every_key_shows_no_marker_result_step_result_or_event(
    make_queue, r, admin, clock, uncompressed_dumps
):

    def markers_in_dump(q) -> set[str]:
        q.configure(events=timedelta(hours=1), keep_results=3600)
        markers = [uuid.uuid4().hex for _ in range(200)]
        q.schedule_many([dueq.Task({"secret": m}, id=f"t{i}") for i, m in enumerate(markers[:100])])
        claimed = q.claim(limit=100)
        for d in claimed[:80]:
            d.ack({"secret": markers[100 + int(d.id[1:])]})
        for d in claimed[80:]:
            d.fail(dueq.Unrecoverable("to dead"))
        step_markers = [uuid.uuid4().hex for _ in range(10)]
        steps = durable_task(q)
        for m in step_markers:  # the marker is in the payload too, sealed as payloads are
            steps.schedule(n=1, marker=m)
        run_due(q)  # each run commits both steps, then fails: the logs stay
        markers += [m[::-1] for m in step_markers]  # what the steps returned
        dumps = b"".join(r.dump(key) for key in r.scan_iter(match="dueq:{q}:*"))
        return {m for m in markers if m.encode() in dumps}

    plain = make_queue()
    # the scan sees plaintext where there is some: 100 payloads, 80 results, 10 step runs
    assert len(markers_in_dump(plain)) == 190
    admin.flushall()
    sealed = make_queue(codec=one_key(), compression="auto")
    assert markers_in_dump(sealed) == set()


def test_signal_payloads_are_sealed_for_their_task_and_the_waiting_run_reads_them(
    make_queue, r, clock
):
    q = make_queue(codec=one_key())
    q.configure(keep_results=3600)

    @q.task(name="waiter", durable=True)
    def waiter(ctx: dueq.StepContext) -> list:
        return [ctx.wait_for("go", timeout=3600), ctx.wait_for("go", timeout=3600)]

    tid = waiter.schedule()
    q.signal(tid, "go", {"secret": "SIGNAL-BEFORE"})  # pending when the wait starts
    run_due(q)  # takes it, then waits for the second: handed back
    q.signal(tid, "go", {"secret": "SIGNAL-DURING"})  # taken by the next run
    assert not any(b"SIGNAL-" in v for v in values_of_queue(r, q.name))
    (ran,) = run_due(q)
    assert ran.value == [{"secret": "SIGNAL-BEFORE"}, {"secret": "SIGNAL-DURING"}]
    assert [s.result for s in q.get(tid).steps] == ran.value  # the key's holder reads them
    stranger = make_queue(name=q.name)
    assert all(str(s.result).startswith("<encrypted k1, ") for s in stranger.get(tid).steps)


def test_a_signal_payload_moved_to_another_task_is_refused(make_queue, r):
    q = make_queue(codec=one_key(), retry=dueq.RetryPolicy(max_attempts=1))

    @q.task(name="waiter", durable=True)
    def waiter(ctx: dueq.StepContext) -> object:
        return ctx.wait_for("go", timeout=3600)

    mine, theirs = waiter.schedule(), waiter.schedule()
    q.signal(mine, "go", {"amount": 1})
    q.signal(theirs, "go", {"amount": 1_000_000})
    steps = "dueq:{q}:steps"
    r.hset(steps, f"{mine}\0s".encode(), r.hget(steps, f"{theirs}\0s".encode()))
    runs = {ran.id: ran for ran in run_due(q)}
    assert isinstance(runs[mine].error, dueq.UndecryptableTask)
    assert runs[theirs].value == {"amount": 1_000_000}
