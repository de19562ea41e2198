"""``dueq schedule --batch`` and ``dueq batches`` (issue 30)."""

from __future__ import annotations

import json

import dueq


def test_schedule_batch_then_batches_lists_the_counts(invoke, r):
    assert invoke("schedule", "imports", '{"row": 1}', "--id", "r1", "--batch", "b1").exit_code == 0
    assert invoke("schedule", "imports", '{"row": 2}', "--id", "r2", "--batch", "b1").exit_code == 0
    q = dueq.Queue("imports", r)
    (d,) = q.claim(limit=1)
    d.ack()
    q.close_batch("b1")
    shown = invoke("batches", "imports")
    assert shown.exit_code == 0, shown.output
    assert "b1" in shown.output and "closed" in shown.output
    data = json.loads(invoke("batches", "imports", "b1", "--json").output)
    (b1,) = data["batches"]
    assert (b1["total"], b1["acked"], b1["pending"], b1["closed"]) == (2, 1, 1, True)
    assert json.loads(invoke("batches", "imports", "nope", "--json").output)["batches"] == []


def test_schedule_after_waits_for_the_parent(invoke, r):
    assert invoke("schedule", "deps", '"p"', "--id", "p").exit_code == 0
    made = invoke("schedule", "deps", '"c"', "--id", "c", "--after", "p", "--after-policy", "run")
    assert made.exit_code == 0, made.output
    q = dueq.Queue("deps", r)
    assert q.get("c").state == "waiting"
    shown = invoke("list", "deps", "--state", "waiting")
    assert shown.exit_code == 0 and "c" in shown.output
    (d,) = q.claim()
    d.ack()
    assert q.get("c").state == "scheduled"


def test_batches_of_a_sharded_queue_add_up_its_shards_parts(invoke, r):
    q = dueq.Queue("sharded-imports", r, shards=3)
    q.schedule_many([dueq.Task(n, id=f"r{n}") for n in range(12)], batch="b1")
    made = invoke("schedule", "sharded-imports", '{"row": 99}', "--id", "r99", "--batch", "b1")
    assert made.exit_code == 0, made.output
    for d in q.claim(limit=5):
        d.ack()
    q.close_batch("b1")
    data = json.loads(invoke("batches", "sharded-imports", "b1", "--json").output)
    (b1,) = data["batches"]
    assert (b1["total"], b1["acked"], b1["pending"], b1["closed"]) == (13, 5, 8, True)
    shown = invoke("batches", "sharded-imports")
    assert shown.exit_code == 0 and "b1" in shown.output and "closed" in shown.output
