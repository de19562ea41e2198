"""Opening a queue by name opens a sharded one as it is stored: ``dueq.discovery``, the CLI
(``redis+cluster://`` URLs), the Prometheus collector and the dashboard address the logical
queue, with counts summed over its shards, on a real local Redis Cluster of 3 primaries."""

from __future__ import annotations

import itertools
import json
import signal
import warnings
from typing import Any

import pytest
from cli_worker_support import start_worker, wait_for
from click.testing import CliRunner, Result
from internals_support import shards, spark_source
from redis.cluster import RedisCluster

import dueq
from dueq import discovery
from dueq._wire.keys import layout_key
from dueq.cli import cli
from dueq.metrics import QueueCollector, new_registry
from dueq.server import RedisServer

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # Starlette's one-time warning about httpx on import
    from starlette.testclient import TestClient

from dueq.dashboard import create_app

shard_names = shards.shard_names
WAIT_S = 60
_names = itertools.count()


def fresh(prefix: str = "op") -> str:
    return f"{prefix}{next(_names)}"


@pytest.fixture
def url(cluster_nodes: list[RedisServer]) -> str:
    return f"redis+cluster://127.0.0.1:{cluster_nodes[1].port}"


def run(url: str, *args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env={"DUEQ_REDIS_URL": url, "COLUMNS": "200"})


def parsed(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def seeded(cluster: RedisCluster) -> dueq.Queue:
    """A 3-shard queue with 30 scheduled tasks (ids t0..t29) and 4 dead ones (x0..x3)."""
    q = dueq.Queue(fresh(), cluster, shards=3, retry=dueq.RetryPolicy(max_attempts=1))
    q.schedule_many(dueq.Task({"n": i}, id=f"t{i}", delay=3600) for i in range(30))
    q.schedule_many(dueq.Task({"x": i}, id=f"x{i}") for i in range(4))
    for d in q.claim(limit=10):
        d.fail(ValueError(f"bad {d.id}"))
    return q


def test_discovery_lists_a_sharded_queue_once_by_its_logical_name(cluster: RedisCluster) -> None:
    q = seeded(cluster)
    plain = dueq.Queue(fresh("plain#"), cluster)  # a plain queue may have '#' in its name
    plain.schedule("p")
    names = discovery.queue_names(cluster)
    assert q.name in names and plain.name in names
    assert not set(shard_names(q.name, 3)) & set(names)
    assert discovery.shard_count(cluster, q.name) == 3
    assert discovery.shard_count(cluster, plain.name) == 1
    assert discovery.shard_count(cluster, fresh()) == 1  # unknown: a plain queue
    opened = discovery.open_queue(cluster, q.name)
    assert opened.shard_count == 3 and opened.stats().scheduled == 30  # type: ignore[attr-defined]
    assert type(discovery.open_queue(cluster, plain.name)) is dueq.Queue


def test_a_recorded_shard_count_that_is_not_a_number_is_a_configuration_error(
    cluster: RedisCluster,
) -> None:
    name = fresh()
    cluster.set(layout_key(name), "three")
    try:
        with pytest.raises(dueq.ConfigurationError, match="not a count of 1 to 256"):
            discovery.open_queue(cluster, name)
    finally:
        cluster.delete(layout_key(name))  # the module's other tests list every queue


def test_stats_json_on_a_cluster_shows_the_logical_queue_with_summed_counts(
    cluster: RedisCluster, url: str
) -> None:
    q = seeded(cluster)
    doc = parsed(run(url, "stats", "--json"))
    rows = {row["queue"]: row for row in doc["queues"]}
    assert not set(shard_names(q.name, 3)) & set(rows)
    assert (rows[q.name]["scheduled"], rows[q.name]["dead"]) == (30, 4)
    (one,) = parsed(run(url, "stats", q.name, "--json"))["queues"]
    assert (one["queue"], one["scheduled"], one["dead"]) == (q.name, 30, 4)


def test_list_and_dead_list_json_on_a_cluster_list_every_shard(
    cluster: RedisCluster, url: str
) -> None:
    q = seeded(cluster)
    listed = parsed(run(url, "list", q.name, "--json", "--limit", "100"))
    assert sorted(t["id"] for t in listed["tasks"]) == sorted(f"t{i}" for i in range(30))
    assert listed["next_cursor"] is None
    dead = parsed(run(url, "dead", "list", q.name, "--json"))
    assert dead["total"] == 4
    assert sorted(t["id"] for t in dead["tasks"]) == ["x0", "x1", "x2", "x3"]
    (shown,) = parsed(run(url, "show", q.name, "t7", "--json"))["tasks"]
    assert shown["payload"] == {"n": 7} and shown["queue"] == q.name


def test_pause_resume_and_cancel_on_a_cluster_reach_every_shard(
    cluster: RedisCluster, url: str
) -> None:
    q = seeded(cluster)
    assert run(url, "pause", q.name).exit_code == 0
    assert all(dueq.Queue(s, cluster).settings().paused for s in q.shard_names)  # type: ignore[attr-defined]
    assert run(url, "resume", q.name).exit_code == 0
    assert not any(dueq.Queue(s, cluster).settings().paused for s in q.shard_names)  # type: ignore[attr-defined]
    assert run(url, "cancel", q.name, "t3", "--yes").exit_code == 0
    assert q.get("t3") is None and q.stats().scheduled == 29


def test_a_command_on_a_queue_that_does_not_exist_still_says_so(url: str) -> None:
    result = run(url, "stats", fresh(), "--json")
    assert result.exit_code == 1 and "no queue named" in result.stderr


def test_dueq_worker_drains_a_sharded_queue_on_a_cluster(cluster: RedisCluster, url: str) -> None:
    q = dueq.Queue(fresh(), cluster, shards=3)
    ids = q.schedule_many(dueq.Task({"n": i}, id=f"w{i}") for i in range(60)).ids
    cluster.delete("handled")
    child = start_worker(url, q.name, "cli_handlers:record")
    try:
        wait_for(lambda: q.stats().counters.get("acked", 0) == 60, "60 acks")
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=WAIT_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, err
    assert out == "" and err.count("worker stopped: {'acked': 60}") == 1, err
    handled = sorted(x.decode() for x in cluster.lrange("handled", 0, -1))
    assert handled == sorted(f"{i}:1" for i in ids)
    assert q.stats().scheduled == 0


def test_the_collector_exports_the_logical_queue_with_summed_counts(
    cluster: RedisCluster,
) -> None:
    q = seeded(cluster)
    registry = new_registry(process=False)
    registry.register(QueueCollector(cluster))
    tasks = {
        (s.labels["queue"], s.labels["state"]): s.value
        for family in registry.collect()
        for s in family.samples
        if s.name == "dueq_tasks"
    }
    queues = {queue for queue, _ in tasks}
    assert q.name in queues and not set(shard_names(q.name, 3)) & queues
    assert (tasks[q.name, "delayed"], tasks[q.name, "dead"]) == (30, 4)


def test_the_dashboard_overview_shows_the_logical_queue_with_summed_counts(
    cluster: RedisCluster, url: str
) -> None:
    q = seeded(cluster)
    with TestClient(create_app(url), base_url="http://127.0.0.1") as client:
        data = client.get("/api/overview").json()
        assert not set(shard_names(q.name, 3)) & set(data["queues"])
        row = data["queues"][q.name]
        assert (row["scheduled"], row["dead"]) == (30, 4)
        page = client.get("/api/queue", params={"queue": q.name})
        assert page.status_code == 200, page.text


# -- a plain queue over a sharded one -----------------------------------------------------------


def test_a_plain_queue_over_a_sharded_queue_refuses_to_schedule_or_claim(
    cluster: RedisCluster,
) -> None:
    q = seeded(cluster)
    plain = dueq.Queue(q.name, cluster)
    with pytest.raises(dueq.ConfigurationError, match="is a sharded queue \\(3 shards"):
        plain.schedule("lost")
    with pytest.raises(dueq.ConfigurationError, match="Open it with shards=3"):
        dueq.Queue(q.name, cluster).claim(limit=1)
    assert q.stats().scheduled == 30  # nothing was written under the plain queue's keys
    assert not cluster.exists(*dueq.Queue(q.name, cluster).keys.due_levels)


def test_an_async_plain_queue_over_a_sharded_queue_refuses_too(
    cluster_nodes: list[RedisServer], cluster: RedisCluster
) -> None:
    import redis.asyncio.cluster

    q = seeded(cluster)

    async def main() -> None:
        client = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=cluster_nodes[0].port)
        try:
            with pytest.raises(dueq.ConfigurationError, match="is a sharded queue"):
                await dueq.AsyncQueue(q.name, client).schedule("lost")
        finally:
            await client.aclose()

    import asyncio

    asyncio.run(main())


def test_a_plain_queue_checks_for_a_sharded_one_once_per_object(r: Any) -> None:
    def gets() -> int:
        return int(r.info("commandstats").get("cmdstat_get", {}).get("calls", 0))

    q = dueq.Queue(fresh(), r)
    before = gets()
    for i in range(5):
        q.schedule(i)
    q.claim(limit=5)
    assert gets() - before == 1
    shard = dueq.Queue(fresh() + "#0", r)  # a shard's name: never sharded itself
    before = gets()
    shard.schedule("x")
    assert gets() == before


def test_spark_writes_to_a_sharded_queue_on_one_redis_reach_its_shards(r: Any) -> None:
    pytest.importorskip("pyspark")
    from pyspark.sql import types as T

    from dueq import spark

    DueqDataSource = spark_source().DueqDataSource

    dueq.Queue("sparked", r, shards=3).schedule("x", id="x")
    url = f"redis://127.0.0.1:{r.connection_pool.connection_kwargs['port']}/0"
    options = {"queue": "sparked", "redis_url": url, "id_col": "id"}
    schema = T.StructType([T.StructField("id", T.StringType()), T.StructField("n", T.LongType())])
    shards = DueqDataSource(options).streamWriter(schema, False).names  # stages per shard
    assert shards == list(shard_names("sparked", 3))
    setup = spark_source()._write_setup(options, schema)
    counts = spark.schedule_rows([("y", None, None, '{"n": 1}')], setup.plan)  # batch writes
    assert (counts.added, counts.existing) == (1, 0)
    again = spark.schedule_rows([("y", None, None, '{"n": 1}')], setup.plan)
    assert (again.added, again.existing) == (0, 1)
    q = dueq.Queue("sparked", r, shards=3)
    assert q.stats().scheduled == 2 and q.get("y") is not None


def expected_per_shard(q: dueq.Queue) -> dict[str, tuple[int, int]]:
    """(scheduled, dead) of each shard of a ``seeded`` queue, from where its ids live."""
    names = shard_names(q.name, 3)
    found = {name: [0, 0] for name in names}
    for i in range(30):
        found[names[dueq.shard_of(f"t{i}", 3)]][0] += 1
    for i in range(4):
        found[names[dueq.shard_of(f"x{i}", 3)]][1] += 1
    return {name: (s, d) for name, (s, d) in found.items()}


def test_stats_of_a_sharded_queue_break_its_counts_down_by_shard(cluster: RedisCluster) -> None:
    q = seeded(cluster)
    s = q.stats()
    assert [part.shard for part in s.shards] == list(shard_names(q.name, 3))
    assert {p.shard: (p.scheduled, p.dead) for p in s.shards} == expected_per_shard(q)
    assert sum(p.scheduled for p in s.shards) == s.scheduled == 30
    assert dueq.Queue(fresh(), cluster).stats().shards == ()  # a plain queue has none


def test_dueq_stats_shows_each_shard_of_a_sharded_queue(cluster: RedisCluster, url: str) -> None:
    q = seeded(cluster)
    (one,) = parsed(run(url, "stats", q.name, "--json"))["queues"]
    assert {p["shard"]: (p["scheduled"], p["dead"]) for p in one["shards"]} == (
        expected_per_shard(q)
    )
    table = run(url, "stats", q.name)
    assert table.exit_code == 0, table.output
    assert f"shards of '{q.name}'" in table.output
    for name, (scheduled, dead) in expected_per_shard(q).items():
        (line,) = [line for line in table.output.splitlines() if f" {name} " in line]
        cells = [cell.strip() for cell in line.split("│")]
        at = cells.index(name)  # shard, scheduled, due now, waiting, leased, dead, ...
        assert (cells[at + 1], cells[at + 5]) == (str(scheduled), str(dead)), line


def test_the_collector_exports_each_shards_tasks_with_a_shard_label(cluster: RedisCluster) -> None:
    q = seeded(cluster)
    registry = new_registry(process=False)
    registry.register(QueueCollector(cluster))
    tasks = {
        (s.labels["shard"], s.labels["state"]): s.value
        for family in registry.collect()
        for s in family.samples
        if s.name == "dueq_shard_tasks" and s.labels["queue"] == q.name
    }
    expected = expected_per_shard(q)
    assert {shard for shard, _ in tasks} == set(expected)
    for name, (scheduled, dead) in expected.items():
        assert (tasks[name, "delayed"], tasks[name, "dead"]) == (scheduled, dead)


def test_the_dashboards_queue_page_shows_each_shard(cluster: RedisCluster, url: str) -> None:
    q = seeded(cluster)
    with TestClient(create_app(url), base_url="http://127.0.0.1") as client:
        page = client.get("/queue", params={"queue": q.name})
    assert page.status_code == 200, page.text
    shards = page.text[page.text.index('<div id="shards">') :]
    for name, (scheduled, dead) in expected_per_shard(q).items():
        row = shards[shards.index(f"<td>{name}</td>") :].split("</tr>")[0]
        cells = [c.split(">")[-1] for c in row.split("</td>")[:-1]]
        assert (cells[1], cells[4]) == (str(scheduled), str(dead)), row


def test_dueq_events_and_the_dashboard_show_a_sharded_queues_latest_events(
    cluster: RedisCluster, url: str
) -> None:
    q = dueq.Queue(fresh(), cluster, shards=3)
    q.configure(events=3600)
    ids = [f"e{i}" for i in range(12)]
    assert len({q.shard(i).name for i in ids}) == 3  # events on every shard
    q.schedule_many(dueq.Task({"n": i}, id=i) for i in ids)
    while claimed := q.claim(limit=12):
        q.ack_many(claimed)
    shown = run(url, "events", q.name, "--json", "--count", "20")
    assert shown.exit_code == 0, shown.output
    events = [json.loads(line) for line in shown.stdout.splitlines()]
    assert sorted(ev["task_id"] for ev in events) == sorted(ids)
    with TestClient(create_app(url), base_url="http://127.0.0.1") as client:
        page = client.get("/queue", params={"queue": q.name})
    assert page.status_code == 200 and all(f">{i}<" in page.text for i in ids), page.text[-3000:]
