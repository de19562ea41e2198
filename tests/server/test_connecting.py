"""``Queue.from_url`` and ``AsyncQueue.from_url`` (issue 27): a client and a queue in one call,
the queue owning (and closing) the client it made; docs/connecting.md runs as written."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
import redis
import redis.asyncio
from paths_support import DOCS
from waiting_support import wait_for

import dueq


def connection_ids(admin: redis.Redis) -> set[int]:
    return {int(c["id"]) for c in admin.client_list()}


def build(front_end: str, *args: Any, **kwargs: Any) -> Any:
    kind = dueq.Queue if front_end == "sync" else dueq.AsyncQueue
    return kind.from_url(*args, **kwargs)


def test_from_url_builds_a_queue_with_the_constructor_options_on_a_client_it_closes(
    front_end, redis_server, admin, clock
):
    before = connection_ids(admin)
    q = build(
        front_end,
        redis_server.url,
        "from-url",
        lease=7,
        clock=clock,
        client_options={"socket_timeout": 9},
    )
    wanted = redis.Redis if front_end == "sync" else redis.asyncio.Redis
    assert isinstance(q.redis, wanted)
    assert q.redis.connection_pool.connection_kwargs["socket_timeout"] == 9
    assert (q.name, q.clock, q.lease_ms, q.owns_client) == ("from-url", clock, 7000, True)

    async def use_async() -> Any:
        await q.schedule({"n": 1}, id="t", delay=5)
        info = await q.get("t")
        opened = connection_ids(admin) - before
        await q.aclose()
        return info, opened

    if front_end == "sync":
        q.schedule({"n": 1}, id="t", delay=5)
        info, opened = q.get("t"), connection_ids(admin) - before
        q.close()
    else:
        info, opened = asyncio.run(use_async())
    assert info.payload == {"n": 1}
    assert info.due_at.timestamp() == clock() + 5
    assert opened  # the queue's own connection(s) ...
    wait_for(lambda: not opened & connection_ids(admin), "the queue to close its client")


def test_closing_a_queue_leaves_a_client_the_caller_passed_in_open(r, redis_server):
    q = dueq.Queue("mine", r)
    assert not q.owns_client
    q.close()
    assert r.ping()

    async def run() -> None:
        client = redis.asyncio.Redis.from_url(redis_server.url)
        aq = dueq.AsyncQueue("mine", client)
        await aq.aclose()
        assert await client.ping()
        await client.aclose()

    asyncio.run(run())


def test_a_queue_made_by_from_url_closes_its_client_at_the_end_of_a_with_block(redis_server, admin):
    before = connection_ids(admin)
    with dueq.Queue.from_url(redis_server.url, "w") as q:
        q.schedule("x")
        opened = connection_ids(admin) - before
    assert opened
    wait_for(lambda: not opened & connection_ids(admin), "the client to close")

    async def run() -> set[int]:
        async with dueq.AsyncQueue.from_url(redis_server.url, "w") as q:
            await q.schedule("x")
            return connection_ids(admin) - before

    opened = asyncio.run(run())
    assert opened
    wait_for(lambda: not opened & connection_ids(admin), "the client to close")


@pytest.mark.parametrize("url", ["http://127.0.0.1:6379/0", "not a url"])
def test_from_url_refuses_a_url_redis_cannot_use_with_a_configuration_error(front_end, url):
    with pytest.raises(dueq.ConfigurationError, match="Redis URL"):
        build(front_end, url, "q")


def test_from_url_refuses_a_bad_queue_option_like_the_constructor(front_end, redis_server):
    with pytest.raises(dueq.ConfigurationError):
        build(front_end, redis_server.url, "q", lease=-1)
    with pytest.raises(TypeError):
        build(front_end, redis_server.url, "q", socket_timeout=5)  # a client option


def test_the_connecting_page_examples_run_as_written(redis_server):
    page = DOCS / "connecting.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    assert len(blocks) == 3
    for block in blocks:
        exec(compile(block, str(page), "exec"), {"REDIS_URL": redis_server.url})
