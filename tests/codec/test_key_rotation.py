"""Key rotation (``q.rotate_key(to=...)``) on a real Redis, on both front ends and a sharded
queue: every stored payload (each state, kept results) ends on the new key, while consumers
drain; a task changed meanwhile is skipped, not clobbered; an undecryptable one is left as it
was; a stopped rotation resumes from its cursor."""

from __future__ import annotations

import base64
import json
import os
import threading
from datetime import timedelta

import pytest
from durable_support import run_due

import dueq
from dueq._wire.codec import PayloadCodec
from dueq._wire.envelope import decode_named

pytest.importorskip("cryptography")

K0 = os.urandom(32)
K1 = os.urandom(32)
K2 = os.urandom(32)


def old_codec() -> dueq.Encrypted:
    return dueq.Encrypted(keys={"k1": K1}, active="k1")


def both_codec() -> dueq.Encrypted:
    return dueq.Encrypted(keys={"k1": K1, "k2": K2}, active="k2")


def stored_values(r, queue: str) -> dict[tuple[str, str], bytes]:
    """Every task envelope and kept result record of ``queue`` (a plain queue or a shard),
    by (hash, id)."""
    found = {}
    for where in ("tasks", "results"):
        for task_id, raw in r.hgetall(f"dueq:{{{queue}}}:{where}").items():
            found[where, task_id.decode()] = raw
    return found


def assert_all_open_with_k2_alone(r, queue: str) -> int:
    """Every stored value of ``queue`` is sealed with k2 and opens with a codec of k2 alone;
    returns how many were looked at."""
    k2_alone = PayloadCodec(dueq.Encrypted(keys={"k2": K2}, active="k2"))
    values = stored_values(r, queue)
    for (where, task_id), raw in values.items():
        envelope = raw.partition(b"\n")[2] if where == "results" else raw
        assert b"|k1\n" not in envelope, (where, task_id)
        decode_named(envelope, k2_alone, queue, task_id)  # raises if k2 cannot open it
    return len(values)


def test_rotation_reseals_tasks_in_every_state_and_kept_results(make_queue, r, clock):
    old = make_queue(codec=old_codec(), retry=dueq.RetryPolicy(max_attempts=1))
    old.configure(keep_results=timedelta(hours=1), key_concurrency=1)
    old.schedule({"s": "scheduled"}, id="scheduled", delay=60)
    old.schedule({"s": "named"}, id="named", task="send", priority=3)
    old.schedule({"s": "waits"}, id="waiting", after=["scheduled"])
    old.schedule({"s": "keyed-1"}, id="leased", key="tenant")
    old.schedule({"s": "keyed-2"}, id="parked", key="tenant")
    old.schedule({"s": "dies"}, id="dead")
    old.schedule({"s": "done"}, id="done")
    claimed = {d.id: d for d in old.claim(limit=10)}
    assert set(claimed) == {"named", "leased", "dead", "done"}
    claimed["dead"].fail(RuntimeError("boom"))
    claimed["done"].ack(result={"ok": True})
    q = make_queue(codec=both_codec())

    report = q.rotate_key("k2")

    assert (report.resealed, report.skipped, report.undecryptable) == (7, 0, 0)
    assert report.done and report.cursor is None
    assert assert_all_open_with_k2_alone(r, "q") == 7  # 6 tasks and the done result
    new = make_queue(codec=dueq.Encrypted(keys={"k2": K2}, active="k2"))
    assert new.dead.list()[0].payload == {"s": "dies"}
    claimed["leased"].ack()
    clock.advance(61)
    assert {d.id: d.payload["s"] for d in new.claim(limit=10)} == {
        "parked": "keyed-2",
        "scheduled": "scheduled",
    }
    again = q.rotate_key("k2")  # a second walk finds everything on k2
    assert again.already == len(stored_values(r, "q")) and again.resealed == 0


def test_rotation_while_a_consumer_drains_loses_nothing(make_queue, r, clock):
    producer = dueq.Queue("q", r, codec=old_codec(), clock=clock)
    producer.schedule_many([dueq.Task({"n": i}, id=f"t{i}") for i in range(3000)])
    consumer = dueq.Queue("q", r, codec=both_codec(), clock=clock)
    seen: list[int] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def drain() -> None:
        try:
            while not stop.is_set():
                batch = consumer.claim(limit=20)
                for d in batch:
                    seen.append(d.payload["n"])
                    d.ack()
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    worker = threading.Thread(target=drain)
    worker.start()
    try:
        report = make_queue(codec=both_codec()).rotate_key("k2", batch=100)
    finally:
        stop.set()
        worker.join()
    assert not errors
    assert report.undecryptable == 0 and report.batches > 1
    assert report.resealed + report.skipped <= 3000
    rest = make_queue(codec=dueq.Encrypted(keys={"k2": K2}, active="k2"))
    while batch := rest.claim(limit=500):
        for d in batch:
            seen.append(d.payload["n"])
            d.ack()
    assert sorted(seen) == list(range(3000))  # none lost, none undecryptable (none dead)
    assert rest.dead.count() == 0


def test_a_task_changed_during_rotation_is_skipped_not_clobbered(make_queue, r):
    make_queue(codec=old_codec()).schedule_many(
        [dueq.Task({"n": i}, id=f"t{i}") for i in range(10)]
    )
    writer = dueq.Queue("q", r, codec=both_codec())

    def kms(key_id: str) -> bytes | None:
        if key_id == "k1":  # first asked while re-sealing: after the read, before the write
            writer.schedule({"n": "replaced"}, id="t3", replace=True)
            writer.cancel("t5")
        return {"k1": K1, "k2": K2}.get(key_id)

    q = make_queue(codec=dueq.Encrypted(keys=kms, active="k2"))
    report = q.rotate_key("k2")

    assert (report.resealed, report.skipped) == (8, 2)
    assert r.hget("dueq:{q}:tasks", "t5") is None  # not written back
    assert q.get("t3").payload == {"n": "replaced"}
    assert assert_all_open_with_k2_alone(r, "q") == 9


def test_an_undecryptable_task_is_left_as_it_was_and_reported(make_queue, r):
    make_queue(codec=dueq.Encrypted(keys={"k0": K0}, active="k0")).schedule({"x": 0}, id="lost")
    make_queue(codec=old_codec()).schedule({"x": 1}, id="fine")
    before = r.hget("dueq:{q}:tasks", "lost")

    report = make_queue(codec=both_codec()).rotate_key("k2")

    assert (report.resealed, report.undecryptable) == (1, 1)
    assert report.undecryptable_ids == ("lost",)
    assert r.hget("dueq:{q}:tasks", "lost") == before


def test_a_stopped_rotation_resumes_from_its_cursor(make_queue, r):
    make_queue(codec=old_codec()).schedule_many(
        [dueq.Task({"n": i}, id=f"t{i}") for i in range(600)]
    )
    q = make_queue(codec=both_codec())
    reports: list[dueq.KeyRotation] = []

    def crash_after_one(report: dueq.KeyRotation) -> None:
        reports.append(report)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        q.rotate_key("k2", batch=100, progress=crash_after_one)
    [first] = reports
    assert first.cursor is not None and first.cursor.startswith("tasks:")
    rest = q.rotate_key("k2", batch=100, cursor=first.cursor)
    assert rest.done and first.resealed + rest.resealed + rest.already >= 600
    assert assert_all_open_with_k2_alone(r, "q") == 600


def test_rotation_needs_a_codec_that_knows_the_target_key(make_queue):
    with pytest.raises(dueq.ConfigurationError, match="no codec"):
        make_queue().rotate_key("k2")
    with pytest.raises(dueq.ConfigurationError, match="knows no key 'k9'"):
        make_queue(codec=both_codec()).rotate_key("k9")
    with pytest.raises(dueq.InvalidTaskError, match="cursor"):
        make_queue(codec=both_codec()).rotate_key("k2", cursor="nowhere:1")


def test_a_sharded_queue_rotates_every_shard(make_queue, r):
    make_queue("sq", shards=3, codec=old_codec()).schedule_many(
        [dueq.Task({"n": i}, id=f"t{i}") for i in range(90)]
    )
    q = make_queue("sq", shards=3, codec=both_codec())
    cursors: list[str | None] = []

    report = q.rotate_key("k2", batch=10, progress=lambda rep: cursors.append(rep.cursor))

    assert (report.resealed, report.undecryptable) == (90, 0) and report.done
    assert cursors[-1] is None and all(c is not None for c in cursors[:-1])
    assert sum(assert_all_open_with_k2_alone(r, name) for name in q.shard_names) == 90
    new = make_queue("sq", shards=3, codec=dueq.Encrypted(keys={"k2": K2}, active="k2"))
    claimed = []
    while batch := new.claim(limit=100):
        claimed += batch
    assert sorted(d.payload["n"] for d in claimed) == list(range(90))


def test_rotation_reseals_cron_definitions_their_occurrences_and_kept_result_values(
    make_queue, r, clock
):
    old = make_queue(codec=old_codec())
    old.configure(keep_results=timedelta(hours=1))
    old.cron.add("minutely", "* * * * *", payload={"c": "cron"})
    old.schedule({"s": "done"}, id="done")
    clock.advance(60)
    claimed = {d.id.startswith("cron:"): d for d in old.claim(limit=10)}
    claimed[True].ack(result={"fired": 1})
    claimed[False].ack(result={"ok": True})

    report = make_queue(codec=both_codec()).rotate_key("k2")

    assert report.done and report.undecryptable == 0
    sealed = json.loads(r.hget("dueq:{q}:cron", "minutely"))["payload"]
    assert base64.b64decode(sealed[1:]).startswith(b"%|k2\n")  # "\udc25<base64 of the body>"
    new = make_queue(codec=dueq.Encrypted(keys={"k2": K2}, active="k2"))
    assert new.cron.get("minutely").payload == {"c": "cron"}
    assert new.get("done").result == {"ok": True}
    assert new.get(claimed[True].id).result == {"fired": 1}
    for _ in range(2):  # the pending occurrence, re-sealed; then one made from the definition
        clock.advance(60)
        [d] = new.claim()
        assert d.id.startswith("cron:minutely:") and d.payload == {"c": "cron"}
        d.ack()


def test_rotation_reseals_the_sealed_error_messages_of_kept_results(make_queue, r, clock):
    def sealing(keys: dict[str, bytes], active: str) -> dueq.Encrypted:
        return dueq.Encrypted(keys=keys, active=active, errors=True)

    old = make_queue(codec=sealing({"k1": K1}, "k1"), retry=dueq.RetryPolicy(wait=lambda s: 1))
    old.configure(keep_results=timedelta(hours=1))
    old.schedule({"s": "flaky"}, id="flaky")
    [d] = old.claim()
    d.fail(RuntimeError("secret-message"))
    clock.advance(2)
    [d] = old.claim()
    d.ack()
    record = r.hget("dueq:{q}:results", "flaky")
    assert b"secret-message" not in record and b'"errors":[' in record

    report = make_queue(codec=sealing({"k1": K1, "k2": K2}, "k2")).rotate_key("k2")

    assert report.resealed == 1 and report.undecryptable == 0
    new = make_queue(codec=sealing({"k2": K2}, "k2"))
    [error] = new.get("flaky").errors
    assert error.type == "RuntimeError" and error.message == "secret-message"


def test_rotation_reseals_step_results_and_error_histories_of_running_and_finished_tasks(
    make_queue, r, clock
):
    def sealing(keys: dict[str, bytes], active: str) -> dueq.Encrypted:
        return dueq.Encrypted(keys=keys, active=active, errors=True)

    def durable(q):
        @q.task(name="steps", durable=True)
        def steps(ctx: dueq.StepContext, n: int) -> list:
            a = ctx.step("a", lambda: {"secret": f"STEP-{n}"})
            if ctx.delivery.attempt == 1:
                raise RuntimeError(f"ERROR-{n}")
            return [a["secret"], ctx.delivery.attempt]

        return steps

    old = make_queue(codec=sealing({"k1": K1}, "k1"), retry=dueq.RetryPolicy(wait=lambda s: 30))
    old.configure(keep_results=timedelta(hours=1))
    steps = durable(old)
    finished, running = steps.schedule(n=1), steps.schedule(n=2, delay=100)
    run_due(old)  # "finished" fails after its step, then runs to its end
    clock.advance(31)
    assert [ran.value for ran in run_due(old)] == [["STEP-1", 2]]
    clock.advance(70)
    run_due(old)  # "running" fails after its step: it keeps a step log and an error history
    assert old.get(running).errors[0].message == "ERROR-2"

    report = make_queue(codec=sealing({"k1": K1, "k2": K2}, "k2")).rotate_key("k2")

    assert report.done and report.undecryptable == 0
    # the finished record (envelope, result, error, log); the running one's envelope, log, errors
    assert report.resealed == 4
    new = make_queue(codec=sealing({"k2": K2}, "k2"))
    durable(new)
    done = new.get(finished)
    assert done.result == ["STEP-1", 2] and done.errors[0].message == "ERROR-1"
    assert done.steps[0].result == {"secret": "STEP-1"}
    assert new.get(running).steps[0].result == {"secret": "STEP-2"}
    clock.advance(31)
    assert [ran.value for ran in run_due(new)] == [["STEP-2", 2]]  # its log opens with k2


def test_rotation_reseals_signals_held_and_taken(make_queue, clock):
    def waiting(q):
        @q.task(name="waiter", durable=True)
        def waiter(ctx: dueq.StepContext) -> list:
            return [ctx.wait_for("go", timeout=3600), ctx.wait_for("go", timeout=3600)]

        return waiter

    old = make_queue(codec=old_codec())
    tid = waiting(old).schedule()
    old.signal(tid, "go", {"n": "taken"})
    run_due(old)  # takes the first (into the wait's record), waits for the second
    old.signal(tid, "go", {"n": "held"})  # held by the task until its next run

    report = make_queue(codec=both_codec()).rotate_key("k2")

    assert report.done and report.undecryptable == 0
    assert report.resealed == 3  # the envelope, the step log, the held signals
    new = make_queue(codec=dueq.Encrypted(keys={"k2": K2}, active="k2"))
    waiting(new)
    (ran,) = run_due(new)
    assert ran.value == [{"n": "taken"}, {"n": "held"}]
