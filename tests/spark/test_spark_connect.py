"""dueq from a Spark Connect session: the ``dueq`` data source works, the helpers that need a
SparkContext say so.

A Connect client has no SparkContext and no accumulators: it sends plans over gRPC to a server
that runs them. The data source needs neither (its counts travel in commit messages and every
part of it runs in the server's Python workers), so ``df.write.format("dueq")``,
``writeStream.format("dueq")`` and ``spark.read.format("dueq")`` work from Connect;
``schedule_dataframe`` (and so ``foreach_batch``) counts with an accumulator and refuses a
Connect DataFrame with ``ConfigurationError``.

The server is a real Spark Connect server (``SparkConnectServer`` through ``spark-submit``,
``local[2,4]``, the jar pyspark bundles) in its own JVM, on a free loopback port with a bearer
token; one per module, shared by its tests. The client talks to it with
``pyspark.sql.connect.session.SparkSession`` directly, which leaves no trace in this process
(``SparkSession.builder.remote(...)`` would set ``SPARK_CONNECT_MODE_ENABLED`` for the whole
process, and refuses to start while the classic session of the other Spark tests is up), so
this file runs before, after or between the classic Spark tests. The DataFrames are built
with SQL expressions, not ``pyspark.sql.functions``, which build classic columns in a
process without that variable.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import slow_start_support

import dueq
from dueq.exceptions import ConfigurationError

pytest.importorskip("pyarrow", reason="the data source needs pyarrow: pip install 'dueq[spark]'")
pytest.importorskip("pyspark.sql.datasource", reason="the data source needs pyspark >= 4.0")
pytest.importorskip(
    "pyspark.sql.connect.session",
    reason="the Spark Connect client needs grpcio, pandas and friends: pip install 'dueq[spark]'",
)

from pyspark.errors import AnalysisException, PythonException, StreamingQueryException
from pyspark.find_spark_home import _find_spark_home
from pyspark.sql.connect.session import SparkSession as ConnectSession
from spark_support import run_to_end, staging_keys, stream_files

from dueq import spark as ds
from dueq.server import free_port

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
START_TIMEOUT_S = 180
#: The whole start (the server listening and a session on it): its own bound
#: (``slow_start_support``).
CONNECT_START_S = 600.0


def wait_until_listening(server: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the Spark Connect server exited ({server.returncode}):\n{tail}")
        with socket.socket() as sock:
            sock.settimeout(0.5)
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.25)
    raise RuntimeError(
        f"the Spark Connect server did not listen within {START_TIMEOUT_S} s; see {log}"
    )


def _start_connect() -> tuple[Any, subprocess.Popen[bytes]]:
    """A local Spark Connect server (its own JVM) and a session on it."""
    port, token = free_port(), uuid.uuid4().hex
    log = Path(tempfile.mkdtemp(prefix="dueq-spark-connect-")) / "server.log"
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SPARK_REMOTE", "SPARK_LOCAL_REMOTE", "SPARK_CONNECT_MODE_ENABLED")
    }
    # The server's Python workers must run this interpreter, where dueq is installed.
    env.update(PYSPARK_PYTHON=sys.executable, SPARK_CONNECT_AUTHENTICATE_TOKEN=token)
    command = [os.path.join(_find_spark_home(), "bin", "spark-submit"), "--class", SERVER_CLASS]
    command += ["--master", "local[2,4]"]
    for key, value in {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.session.timeZone": "UTC",
    }.items():
        command += ["--conf", f"{key}={value}"]
    with log.open("wb") as out:
        server = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until_listening(server, port, log)
        session = ConnectSession.builder.remote(f"sc://localhost:{port}/;token={token}").create()
    except BaseException:  # (the alarm of its bound too): no server left behind
        _stop_server(server)
        raise
    return session, server


def _stop_server(server: subprocess.Popen[bytes]) -> None:
    server.terminate()
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def _stop_connect(started: tuple[Any, subprocess.Popen[bytes]]) -> None:
    session, server = started
    try:
        session.stop()
    finally:
        _stop_server(server)


#: The module's Connect server, started before the first test that asks for it, outside that
#: test's 120 s timeout and within a bound of its own (``slow_start_support``, as the SparkSession):
#: a slow start on a busy machine fails one test with its reason, the others skip naming it.
CONNECT = slow_start_support.REGISTRY.setdefault(
    "connect",
    slow_start_support.SlowStart("the Spark Connect server", _start_connect, CONNECT_START_S),
)


@pytest.fixture(scope="module", autouse=True)
def _connect_server_stops_with_the_module() -> Iterator[None]:
    yield
    CONNECT.stop(_stop_connect)


@pytest.fixture
def connect(request: pytest.FixtureRequest) -> Any:
    """A Spark Connect session on a local Connect server of its own (its own JVM), one per
    module (``CONNECT``)."""
    return CONNECT.get(request.node.nodeid)[0]


def reminders(spark: Any, rows: int) -> Any:
    return spark.range(rows, numPartitions=2).selectExpr(
        "concat('user-', id) AS user",
        "CAST(1900000000 + id AS TIMESTAMP) AS send_at",
        "id AS n",
    )


def write(df: Any, queue: str, url: str, **options: str) -> None:
    df.write.format("dueq").mode("append").options(queue=queue, redis_url=url, **options).save()


def test_the_session_is_a_spark_connect_session_without_a_spark_context(connect):
    assert type(connect).__module__ == "pyspark.sql.connect.session"
    with pytest.raises(AttributeError, match="JVM_ATTRIBUTE_NOT_SUPPORTED"):
        connect.sparkContext  # noqa: B018


def test_batch_write_from_connect_is_found_without_registering_and_idempotent(
    connect, r, redis_server
):
    df = reminders(connect, 2000)
    write(df, "cx", redis_server.url, id_col="user", at_col="send_at")
    write(df.repartition(3), "cx", redis_server.url, id_col="user", at_col="send_at")
    assert r.zcard("dueq:{cx}:due") == r.hlen("dueq:{cx}:tasks") == 2000
    q = dueq.Queue("cx", r)
    task = q.get("user-7")
    assert task.payload == {"n": 7}
    assert task.due_at is not None and task.due_at.timestamp() == 1_900_000_007


def test_register_works_with_a_connect_session(connect, r, redis_server):
    ds.register(connect)  # spark.dataSource.register(DueqDataSource), sent to the server
    write(reminders(connect, 10), "registered", redis_server.url, id_col="user")
    assert r.zcard("dueq:{registered}:due") == 10


def test_read_from_connect_returns_the_tasks_in_several_partitions(connect, r, redis_server):
    write(reminders(connect, 3000), "readme", redis_server.url, id_col="user", at_col="send_at")
    df = (
        connect.read.format("dueq")
        .options(queue="readme", redis_url=redis_server.url, state="scheduled", partitions="3")
        .load()
    )
    partitions = df.selectExpr("spark_partition_id() AS p").distinct().count()
    rows = df.collect()
    assert partitions == 3
    assert len(rows) == 3000 and len({row.id for row in rows}) == 3000
    first = min(rows, key=lambda row: row.due_at)
    assert (first.id, first.state, json.loads(first.payload)) == ("user-0", "scheduled", {"n": 0})


def test_read_tasks_works_from_connect(connect, r, redis_server):
    write(reminders(connect, 50), "helper-read", redis_server.url, id_col="user")
    df = ds.read_tasks(connect, queue="helper-read", redis_url=redis_server.url, state="scheduled")
    assert sorted(row.id for row in df.collect()) == sorted(f"user-{i}" for i in range(50))


def test_bad_rows_and_bad_options_from_connect_fail_naming_them(connect, redis_server):
    nulls = connect.range(3).selectExpr("CAST(NULL AS STRING) AS user")
    with pytest.raises(PythonException, match=r"InvalidTaskError: dueq bad row: .*id is null"):
        write(nulls, "bad", redis_server.url, id_col="user", on_bad_row="raise")
    with pytest.raises(
        AnalysisException, match="ConfigurationError: id_col 'nope' is not a column"
    ):
        write(nulls, "bad", redis_server.url, id_col="nope")


def test_schedule_dataframe_refuses_a_connect_dataframe_naming_the_data_source(
    connect, r, redis_server
):
    with pytest.raises(ConfigurationError, match=r"classic SparkSession.*format\('dueq'\)"):
        ds.schedule_dataframe(reminders(connect, 5), queue="h", redis_url=redis_server.url)
    assert r.zcard("dueq:{h}:due") == 0


def start_stream(connect: Any, source: Path, checkpoint: Path) -> Any:
    stream = connect.readStream.schema("id string, at string, v long").json(str(source))
    return stream.writeStream.option("checkpointLocation", str(checkpoint)).trigger(
        availableNow=True
    )


def test_a_stream_from_connect_replayed_after_its_tasks_were_acked_schedules_nothing(
    connect, r, redis_server, tmp_path, clock
):
    stream_files(tmp_path / "in")
    checkpoint = tmp_path / "checkpoint"

    def run() -> None:
        writer = start_stream(connect, tmp_path / "in", checkpoint).format("dueq")
        writer.options(queue="cxs", redis_url=redis_server.url, id_col="id", at_col="at")
        writer.start().awaitTermination()

    run_to_end(run)
    q = dueq.Queue("cxs", r, clock=clock)
    assert q.stats().scheduled == 300
    clock.advance(1_900_000_000 - clock())  # past 2030-01-01 09:00: every task is due
    acked = 0
    while deliveries := q.claim(limit=1000):
        acked += q.ack_many(deliveries)
    assert acked == 300
    (checkpoint / "commits" / "0").unlink()  # the driver "died" after the sink committed
    (checkpoint / "commits" / ".0.crc").unlink(missing_ok=True)
    run()
    assert (checkpoint / "commits" / "0").exists()  # Spark did replay batch 0
    assert q.stats().scheduled == 0
    assert staging_keys(r, "cxs") == []


def test_foreach_batch_from_connect_fails_the_stream_with_the_configuration_error(
    connect, r, redis_server, tmp_path
):
    stream_files(tmp_path / "in", files=1, rows=5)
    function = ds.foreach_batch(queue="fb", redis_url=redis_server.url, id_col="id", at_col="at")
    query = start_stream(connect, tmp_path / "in", tmp_path / "checkpoint").foreachBatch(function)
    with pytest.raises(StreamingQueryException, match="ConfigurationError: schedule_dataframe"):
        run_to_end(lambda: query.start().awaitTermination())
    assert r.zcard("dueq:{fb}:due") == 0


def test_an_events_stream_from_connect_reads_each_outcome_once_and_resumes(
    connect, r, redis_server, tmp_path
):
    q = dueq.Queue("cxev", r)
    q.configure(events=3600)

    def outcomes(prefix: str) -> None:
        q.schedule_many(dueq.Task({"n": i}, id=f"{prefix}-{i}") for i in range(5))
        for d in q.claim(limit=5):
            d.ack()

    def run() -> None:
        events = connect.readStream.format("dueq").options(
            queue="cxev", redis_url=redis_server.url, events="earliest", maxEventsPerTrigger="3"
        )
        writer = events.load().writeStream.format("parquet").option("path", str(tmp_path / "out"))
        writer.option("checkpointLocation", str(tmp_path / "checkpoint"))
        run_to_end(lambda: writer.trigger(availableNow=True).start().awaitTermination())

    outcomes("a")
    run()
    outcomes("b")
    run()
    rows = connect.read.parquet(str(tmp_path / "out")).collect()
    stream = [entry_id.decode() for entry_id, _ in r.xrange("dueq:{cxev}:events")]
    assert sorted(row.event_id for row in rows) == stream
    assert len(stream) == 10
