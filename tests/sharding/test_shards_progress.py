"""Progress on a sharded queue (issue 39): a delivery writes its entries on its own shard,
and ``q.progress(task_id)`` of the logical queue follows the shard that holds the id, on both
front ends."""

from __future__ import annotations

from progress_support import Follower
from waiting_support import wait_for


def test_a_sharded_queue_writes_and_follows_progress_on_the_tasks_shard(make_queue, r, front_end):
    q = make_queue(shards=3, clock=None)
    ids = [f"t{i}" for i in range(12)]
    for task_id in ids:
        q.schedule({"id": task_id}, id=task_id)
    deliveries = {d.id: d for d in q.claim(20)}
    assert sorted(deliveries) == sorted(ids)
    shards = {q.shard(task_id).name for task_id in ids}
    assert len(shards) == 3  # the ids span every shard
    for task_id, d in deliveries.items():
        assert d.progress({"of": task_id}) == 1
        shard = q.shard(task_id)
        assert d.queue_name == shard.name
        assert r.hget(shard.keys.steps, task_id + "\0p") is not None  # on its own shard
    for task_id in ids:
        (entry,) = q.progress(task_id, timeout=0.2)
        assert (entry.task_id, entry.seq, entry.body) == (task_id, 1, {"of": task_id})
    # a live follower of one task, routed by its id
    follower = Follower(front_end, r, "t5", shards=3, timeout=10)
    wait_for(lambda: follower.seqs == [1], "the history")
    deliveries["t5"].progress("live")
    wait_for(lambda: follower.seqs == [1, 2], "the live entry")
    deliveries["t5"].ack()
    assert follower.join() == [1, 2]
