"""Which queues a Redis database holds, found from their key names.

A queue has no registry entry of its own: it exists while any of its keys does. So finding
"every queue" is an incremental SCAN for ``dueq:{*}:*`` keys whose suffix is one a queue has
(``KEY_SUFFIXES``); anything else under the prefix (a key by hand, a name that is not a valid
queue name) is skipped. The CLI (``dueq stats``, ``dueq metrics``) and the Prometheus collector
both use this, so they agree on what a queue is.

Sharded queues (``dueq.sharding.flows``) are listed once, under their logical name: the same SCAN
finds each one's layout key ``dueq:{<name>#}:shards``, and a queue ``<name>#<i>[.<k>]`` whose
``<name>`` has one is a shard of it, not a queue of its own. ``open_queue`` (and
``open_async_queue``) open a queue by name the way it is stored: they read the recorded shard
count (one GET, ``shard_count``) and pass it as ``shards=``, so the CLI, the Prometheus
collector and the dashboard address the logical queue and never a shard by accident.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import redis

from dueq._util.checks import whole_number, with_driver_info
from dueq._wire.keys import PREFIX, QueueKeys, layout_key, validate_queue_name
from dueq.exceptions import ConfigurationError, DueqError
from dueq.queue import Queue
from dueq.registry import WorkerInfo, merge_workers
from dueq.sharding.layout import MAX_SHARDS, LayoutRecord

if TYPE_CHECKING:
    from dueq.async_queue import AsyncQueue

__all__ = [
    "CLUSTER_SCHEMES",
    "KEY_SUFFIXES",
    "async_queue_exists",
    "async_queue_names",
    "async_shard_count",
    "client_for_url",
    "cluster_node_url",
    "discover_workers",
    "open_async_queue",
    "open_queue",
    "queue_exists",
    "queue_names",
    "queue_of_key",
    "shard_count",
    "stored_queue_names",
]

#: What follows ``dueq:{<queue>}:`` in the name of each key a queue has.
KEY_SUFFIXES = frozenset(
    key.removeprefix("dueq:{x}:")
    for key in QueueKeys.for_queue("x").names()
    if key.startswith("dueq:{x}:")
)
#: URL schemes that name one node of a Redis Cluster (``redis+cluster://host:port``).
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
#: Keys asked for per SCAN call.
SCAN_COUNT = 1000


def cluster_node_url(url: str) -> str | None:
    """For a ``redis+cluster://`` (``rediss+cluster://``) URL, the ``redis://`` (``rediss://``)
    URL of the node it names, for redis-py's ``RedisCluster.from_url``; None for any other."""
    scheme = url.partition("://")[0].lower()
    if scheme not in CLUSTER_SCHEMES:
        return None
    return scheme.removesuffix("+cluster") + url[len(scheme) :]


def client_for_url(url: str, **options: Any) -> Any:
    """A blocking client for ``url``: a ``RedisCluster`` for ``redis+cluster://`` (and
    ``rediss+cluster://``), else ``redis.Redis.from_url`` (``redis://``, ``rediss://``,
    ``unix://``); ``options`` go to either (e.g. ``socket_connect_timeout``). For code that
    gets a URL and may meet a sharded queue (Spark executors, the CLI)."""
    import redis
    from redis.cluster import RedisCluster

    node_url = cluster_node_url(url)
    if node_url is not None:
        return RedisCluster.from_url(node_url, **options)
    return redis.Redis.from_url(url, **with_driver_info(options))


def queue_of_key(key: bytes | str) -> str | None:
    """The queue whose key this is, or None for a key no dueq queue has (``dueq:{}:x``,
    ``dueq:{a}b:c``, a name that is not UTF-8 or not a valid queue name, an unknown suffix)."""
    try:
        name = key.decode("utf-8") if isinstance(key, bytes) else key
    except UnicodeDecodeError:
        return None
    start = f"{PREFIX}:{{"
    if not name.startswith(start):
        return None
    queue, close, suffix = name[len(start) :].partition("}:")
    if not close or suffix not in KEY_SUFFIXES:
        return None
    try:
        return validate_queue_name(queue)
    except ConfigurationError:
        return None


def layout_of_key(key: bytes | str) -> str | None:
    """The sharded queue whose layout key (``dueq:{<name>#}:shards``) this is, else None."""
    try:
        name = key.decode("utf-8") if isinstance(key, bytes) else key
    except UnicodeDecodeError:
        return None
    start, end = f"{PREFIX}:{{", "#}:shards"
    if not (name.startswith(start) and name.endswith(end)):
        return None
    try:
        return validate_queue_name(name[len(start) : -len(end)])
    except ConfigurationError:
        return None


def _logical_names(keys: Iterable[bytes | str]) -> list[str]:
    """Sorted queue names of these keys, each sharded queue once under its logical name."""
    queues: set[str] = set()
    sharded: set[str] = set()
    for key in keys:
        if (queue := queue_of_key(key)) is not None:
            queues.add(queue)
        elif (logical := layout_of_key(key)) is not None:
            sharded.add(logical)
    plain = {q for q in queues if "#" not in q or q.partition("#")[0] not in sharded}
    return sorted(plain | sharded)


def _count_of(name: str, recorded: bytes | str | None) -> int:
    """The shard count a layout key's value records (the new count while a reshard runs:
    ``LayoutRecord``); 1 for none."""
    if recorded is None:
        return 1
    return LayoutRecord.parse(name, recorded).count


def stored_queue_names(client: Any, name: str) -> list[str]:
    """The plain queues that hold queue ``name``'s tasks: ``name`` itself, or the shards of a
    sharded queue in shard order (each a queue of its own keys). One GET."""
    if "#" in name:
        return [name]
    recorded = client.get(layout_key(name))
    record = None if recorded is None else LayoutRecord.parse(name, recorded)
    if record is None or (record.count == 1 and record.former is None):
        return [name]
    return list(record.names(name))


def shard_count(client: Any, name: str) -> int:
    """How many shards queue ``name`` has, as recorded in Redis (1: a plain queue, or none
    recorded). One GET; ConfigurationError if the record is not a count."""
    if "#" in name:  # a shard, or a plain queue: no sharded queue has '#' in its name
        return 1
    return _count_of(name, client.get(layout_key(name)))


async def async_shard_count(client: Any, name: str) -> int:
    """As ``shard_count``, on a ``redis.asyncio`` client."""
    if "#" in name:
        return 1
    return _count_of(name, await client.get(layout_key(name)))


def open_queue(client: Any, name: str, *, shards: int | None = None, **settings: Any) -> Queue:
    """``Queue(name, client, shards=N, **settings)`` with the N recorded in Redis: the logical
    queue for a sharded one, the plain queue otherwise.

    ``shards``: the N the caller expects. A queue that has no N recorded yet (new, or plain)
    is opened with it, so a worker started before the first producer still serves every shard
    (a plain queue that holds tasks is refused at the first use, as by ``Queue(shards=N)``);
    a queue recorded with another N is refused now with ConfigurationError."""
    n = _expected(name, shards, shard_count(client, name))
    return Queue(name, client, shards=n, **settings)


async def open_async_queue(
    client: Any, name: str, *, shards: int | None = None, **settings: Any
) -> AsyncQueue:
    """As ``open_queue``, an ``AsyncQueue`` on a ``redis.asyncio`` client."""
    from dueq.async_queue import AsyncQueue  # here: a threaded worker's start never loads it

    n = _expected(name, shards, await async_shard_count(client, name))
    return AsyncQueue(name, client, shards=n, **settings)


def _expected(name: str, shards: int | None, recorded: int) -> int:
    """The shard count to open ``name`` with: ``recorded`` unless the caller expects one
    (checked like ``Queue(shards=)``), which must then agree with a recorded one."""
    if shards is None:
        return recorded
    whole_number(shards, "shards", low=1, high=MAX_SHARDS)
    if recorded != 1 and recorded != shards:
        raise ConfigurationError(
            f"queue {name!r} has {recorded} shards in Redis ({layout_key(name)}), not {shards}: "
            f"open it with shards={recorded}"
        )
    return shards


def queue_names(client: Any) -> list[str]:
    """Sorted names of the queues with any key in this database (a blocking redis-py client).

    SCAN is incremental, so this never blocks Redis, but it walks the whole keyspace: call it
    once per scrape or refresh, not per task. redis-py's NoPermissionError propagates when this
    user may not SCAN (name the queues instead).
    """
    return _logical_names(client.scan_iter(match=f"{PREFIX}:{{*}}:*", count=SCAN_COUNT))


async def async_queue_names(client: Any) -> list[str]:
    """As ``queue_names``, on a ``redis.asyncio`` client (the dashboard's)."""
    keys = [key async for key in client.scan_iter(match=f"{PREFIX}:{{*}}:*", count=SCAN_COUNT)]
    return _logical_names(keys)


def _exist_keys(name: str) -> tuple[list[str], str | None]:
    """The keys whose existence makes queue ``name`` exist: each of its own (every suffix of
    ``KEY_SUFFIXES``, so ``queue_names`` and ``queue_exists`` agree), and the layout key of a
    sharded queue (another slot: a call of its own), None for a name with ``#``."""
    own = QueueKeys.for_queue(name).names()
    return own, (None if "#" in name else layout_key(name))


def queue_exists(client: Any, name: str) -> bool:
    """Whether queue ``name`` exists: any of its keys is in Redis (tasks, dead tasks, counters,
    settings, cron definitions, live workers; for a sharded queue, its recorded layout). The
    one rule for "is there such a queue" that ``queue_names`` lists by: a command that would
    otherwise create a queue by naming it (a typo, ``pause shpo``) asks this first. At most
    two EXISTS calls; ConfigurationError for a name no queue can have."""
    own, layout = _exist_keys(name)
    if client.exists(*own):
        return True
    return layout is not None and bool(client.exists(layout))


async def async_queue_exists(client: Any, name: str) -> bool:
    """As ``queue_exists``, on a ``redis.asyncio`` client."""
    own, layout = _exist_keys(name)
    if await client.exists(*own):
        return True
    return layout is not None and bool(await client.exists(layout))


def discover_workers(client: Any, names: Iterable[str] = ()) -> list[WorkerInfo]:
    """The live workers of the queues ``names`` (every queue in this database when empty; a
    blocking redis-py client), one entry per process (its most recent beat), sorted by worker
    id: the one rule the CLI, the dashboard and the metrics use. A queue this user may not
    read is left out (its workers may show through another). Walks the keyspace when no names
    are given: for a refresh or a scrape, not per task."""
    found: list[list[WorkerInfo]] = []
    for name in list(names) or queue_names(client):
        try:
            found.append(open_queue(client, name).workers())
        except (redis.exceptions.NoPermissionError, DueqError):  # one queue never fails all
            continue
    return merge_workers(found)
