"""Wake messages on sharded Pub/Sub: on Redis >= 7.0 the scripts SPUBLISH and both consumers
SSUBSCRIBE (so a Cluster keeps each message on its slot's nodes); a script whose ACL user may
not SPUBLISH falls back to PUBLISH. The wake itself (a sleeping consumer claims at once) is
tested with the consumers: test_observe, test_pause, test_async_consumer, test_shards."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis
from conftest import async_mirror
from waiting_support import wait_for

import dueq
from dueq._consume.wake import (
    POLL_S,
    SHARDED_POLL_S,
    WakeOp,
    WakeSubscription,
    check_subscribed,
    read_call,
    sharded_pubsub,
    wake_flow,
)
from dueq.server import RedisServer


def calls(admin: redis.Redis, command: str) -> int:
    """How many times the server ran ``command`` (INFO commandstats), 0 if never."""
    stats = admin.info("commandstats").get(f"cmdstat_{command}")
    return int(stats["calls"]) if stats else 0


def test_scripts_wake_consumers_by_spublish_on_redis_7(r: redis.Redis, admin: redis.Redis) -> None:
    q = dueq.Queue("spub", r)
    admin.config_resetstat()
    q.schedule("x", id="x")  # earlier than the (empty) head: a wake
    q.pause()  # a settings change: a wake
    assert calls(admin, "spublish") == 2
    assert calls(admin, "publish") == 0


def test_the_sync_consumer_listens_by_ssubscribe(r: redis.Redis, admin: redis.Redis) -> None:
    q = dueq.Queue("ssub", r)
    sub = q.observe(heartbeat=3600).subscribe()
    try:
        wait_for(lambda: admin.pubsub_shardnumsub(q.keys.wake)[0][1] == 1, "the subscription")
        assert admin.pubsub_numsub(q.keys.wake)[0][1] == 0
    finally:
        sub.dispose()


def test_the_async_consumer_listens_by_ssubscribe(r: redis.Redis, admin: redis.Redis) -> None:
    async def main() -> None:
        client = async_mirror(r)
        q = dueq.AsyncQueue("assub", client)
        it = q.deliveries(heartbeat=3600)
        waiting = asyncio.ensure_future(it.__anext__())
        for _ in range(1500):  # 30 s
            if admin.pubsub_shardnumsub(q.keys.wake)[0][1] == 1:
                break
            await asyncio.sleep(0.02)
        assert admin.pubsub_shardnumsub(q.keys.wake)[0][1] == 1
        assert admin.pubsub_numsub(q.keys.wake)[0][1] == 0
        await q.schedule("now", id="now")  # the wake brings it (asleep for an hour otherwise)
        d = await asyncio.wait_for(waiting, 30)
        assert d.id == "now"
        await d.ack()
        await it.aclose()
        await client.aclose()

    asyncio.run(main())


@pytest.fixture
def no_spublish(redis_server: RedisServer, admin: redis.Redis) -> Iterator[redis.Redis]:
    """A user that may do everything but SPUBLISH (an ACL written before dueq used it)."""
    admin.acl_setuser(
        "old-acl",
        enabled=True,
        passwords=["+old-acl-pw"],
        keys=["*"],
        channels=["*"],
        commands=["+@all", "-spublish"],
    )
    client = redis.Redis.from_url(redis_server.url, username="old-acl", password="old-acl-pw")
    yield client
    client.close()
    admin.acl_deluser("old-acl")


def test_a_script_whose_user_may_not_spublish_publishes_the_classic_way(
    no_spublish: redis.Redis, admin: redis.Redis
) -> None:
    q = dueq.Queue("fallback", no_spublish)
    pubsub = admin.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(q.keys.wake)
    try:
        admin.config_resetstat()
        q.schedule("x", id="x")
        message = wait_for(lambda: pubsub.get_message(timeout=0.1), "the classic wake")
        assert message["type"] == "message"
        assert calls(admin, "publish") == 1
        assert q.get("x") is not None  # the refused SPUBLISH failed nothing
    finally:
        pubsub.close()


def test_the_listener_reads_a_cluster_subscription_node_by_node() -> None:
    class ClusterLike:
        def get_sharded_message(self) -> None: ...

    class Plain: ...

    sharded = WakeSubscription(("a", "b"), sharded=True)
    classic = WakeSubscription(("a",), sharded=False)
    assert read_call(ClusterLike(), sharded) == (
        "get_sharded_message",
        {"ignore_subscribe_messages": True, "timeout": SHARDED_POLL_S},
    )
    assert read_call(Plain(), sharded) == ("get_message", {"timeout": POLL_S})
    assert read_call(ClusterLike(), classic) == ("get_message", {"timeout": POLL_S})


@pytest.mark.parametrize(
    ("version", "sharded"), [((6, 2), False), ((7, 0), True), ((7, 2), True), (None, True)]
)
def test_ssubscribe_is_used_from_redis_7(version: tuple[int, int] | None, sharded: bool) -> None:
    assert sharded_pubsub(version) is sharded


def test_a_cluster_subscription_left_without_nodes_counts_as_an_outage() -> None:
    class ClusterLike:
        def __init__(self) -> None:
            self.node_pubsub_mapping: dict[str, object] = {}

        def get_sharded_message(self) -> None: ...

    sharded = WakeSubscription(("a",), sharded=True)
    with pytest.raises(redis.ConnectionError, match="holds no node"):
        check_subscribed(ClusterLike(), sharded)  # reading it would return at once, forever
    live = ClusterLike()
    live.node_pubsub_mapping = {"127.0.0.1:7000": object()}
    check_subscribed(live, sharded)
    check_subscribed(ClusterLike(), WakeSubscription(("a",), sharded=False))


def test_the_wake_flow_backs_off_on_an_outage_and_stops_on_anything_else(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # the listener's decisions, shared by the thread and the asyncio task: no I/O of its own
    flow = wake_flow("flow")
    assert next(flow).op is WakeOp.SUBSCRIPTION
    with caplog.at_level("DEBUG", logger="dueq.wake"):
        step = flow.throw(redis.ConnectionError("gone"))
        assert step.op is WakeOp.SLEEP and step.delay_s > 0  # no pubsub yet: nothing to close
        assert next(flow).op is WakeOp.SUBSCRIPTION  # subscribes again after the backoff
        assert next(flow).op is WakeOp.PUBSUB
        with pytest.raises(StopIteration):  # not an outage: the listener stops
            flow.throw(ValueError("a bug"))
    lines = [(rec.levelname, rec.getMessage()) for rec in caplog.records]
    assert lines[0][0] == "DEBUG"
    assert lines[0][1].startswith("queue 'flow': wake channel down (ConnectionError: gone)")
    assert lines[1] == ("ERROR", "queue 'flow': wake listener stopped")
