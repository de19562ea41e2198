"""``dueq reshard QUEUE --to M``: the CLI over ``q.reshard`` (tests/sharding/test_reshard.py)."""

from __future__ import annotations

import json
from typing import Any

import dueq
from dueq._wire.keys import layout_key


def test_reshard_moves_a_sharded_queue_to_the_new_count_and_says_so(r: Any, invoke: Any) -> None:
    q = dueq.Queue("cli-rs", r, shards=3)
    q.schedule_many([dueq.Task(n, id=f"t{n}", delay=60) for n in range(50)])
    result = invoke("reshard", "cli-rs", "--to", "5")
    assert result.exit_code == 0, result.output
    assert "queue 'cli-rs' has 5 shards" in result.output
    assert r.get(layout_key("cli-rs")) == b"5"
    assert q.stats().scheduled == 50
    out = invoke("reshard", "cli-rs", "--to", "2", "--json")
    assert out.exit_code == 0, out.output
    report = json.loads(out.output)
    assert (report["from_shards"], report["to_shards"], report["done"]) == (5, 2, True)


def test_reshard_refuses_a_queue_with_per_key_limits_with_the_reason(r: Any, invoke: Any) -> None:
    q = dueq.Queue("cli-rs-keys", r, shards=2)
    q.configure(key_concurrency=3)
    result = invoke("reshard", "cli-rs-keys", "--to", "3")
    assert result.exit_code != 0
    assert "per-key limits" in result.output
    assert r.get(layout_key("cli-rs-keys")) == b"2"


def test_stats_says_a_reshard_runs_beside_the_shards_of_both_layouts(r: Any, invoke: Any) -> None:
    q = dueq.Queue("cli-rs-stats", r, shards=2)
    q.schedule_many([dueq.Task(n, id=f"t{n}") for n in range(20)])
    q.drive(q._core.resharder().start_flow(3))  # started (a mover that stopped there)
    shown = invoke("stats", "cli-rs-stats")
    assert shown.exit_code == 0, shown.output
    assert "resharding 2>3" in shown.output
    assert q.reshard(3).done
    assert q.stats().resharding is None
    assert "resharding" not in invoke("stats", "cli-rs-stats").output
