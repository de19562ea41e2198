"""Spark writers with a codec: payloads sealed in the executors with the keys of the session's
configuration (``spark.dueq.secretKeys``, ``spark.dueq.activeKey``) or of ``codec=``, read back
by a queue holding the keys, and no plaintext in Redis."""

from __future__ import annotations

import base64
import dataclasses
import os
from collections.abc import Iterator
from typing import Any

import pytest

import dueq

pytest.importorskip("pyspark", reason="pyspark is not installed: pip install 'dueq[spark]'")
pytest.importorskip("cryptography")

from dueq import spark as ds
from dueq._wire.codec import PayloadCodec

K1, K2 = os.urandom(32), os.urandom(32)
MARKER = "spark-marker-9c1e"
BOTH = {"k1": K1, "k2": K2}


def stored_values(r: Any, queue: str) -> bytes:
    """Every field and value of the queue's hashes and every member of its sorted sets."""
    found = []
    for key in r.scan_iter(match=f"dueq:{{{queue}}}:*"):
        kind = r.type(key)
        if kind == b"hash":
            found += [k + b"=" + v for k, v in r.hgetall(key).items()]
        elif kind == b"zset":
            found += r.zrange(key, 0, -1)
    return b"\n".join(found)


def assert_sealed_with_k2(r: Any, queue: str, rows: int) -> None:
    """The queue holds ``rows`` tasks ("0".."<rows - 1>", payload {"secret": MARKER, "n": id})
    sealed with k2, the marker in no stored value, and a queue with k2 reads them."""
    assert MARKER.encode() not in stored_values(r, queue)
    assert r.hget(f"dueq:{{{queue}}}:tasks", "7").count(b"%|k2\n") == 1  # the active key
    q = dueq.Queue(queue, r, codec=dueq.Encrypted(keys={"k2": K2}))
    got = {d.id: d.payload for d in q.claim(limit=rows)}
    assert len(got) == rows and got["42"] == {"secret": MARKER, "n": 42}


@pytest.fixture
def session_keys(spark: Any) -> Iterator[None]:
    """The shared session configured with k1 and k2, k2 active; unset afterwards."""
    listed = ",".join(f"{k}={base64.b64encode(v).decode()}" for k, v in BOTH.items())
    spark.conf.set(ds.KEYS_CONF, listed)
    spark.conf.set(ds.ACTIVE_KEY_CONF, "k2")
    try:
        yield
    finally:
        spark.conf.unset(ds.KEYS_CONF)
        spark.conf.unset(ds.ACTIVE_KEY_CONF)


def test_the_partition_function_seals_each_row_with_the_plans_codec(r, redis_server):
    payloads = PayloadCodec(dueq.Encrypted(keys={"k1": K1}))
    plan = ds.PartitionPlan("sealed-rows", redis_server.url, "now", True, 10, "count")
    plan = dataclasses.replace(plan, payloads=payloads)
    rows = [(f"t{n}", None, None, f'{{"secret":"{MARKER}","n":{n}}}') for n in range(3)]
    counts = ds.schedule_rows(iter(rows), plan)
    assert counts.added == 3
    assert MARKER.encode() not in stored_values(r, "sealed-rows")
    q = dueq.Queue("sealed-rows", r, codec=dueq.Encrypted(keys={"k1": K1}))
    assert q.get("t2").payload == {"secret": MARKER, "n": 2}


def test_schedule_dataframe_seals_in_the_executors_with_the_sessions_keys(
    spark, r, redis_server, session_keys
):
    df = spark.range(100).selectExpr("cast(id as string) as id", f"'{MARKER}' as secret", "id as n")
    result = ds.schedule_dataframe(df, queue="sealed-df", redis_url=redis_server.url, id_col="id")
    assert result.added == 100
    assert_sealed_with_k2(r, "sealed-df", 100)
    assert dueq.Queue("sealed-df", r).get("7").payload.startswith("<encrypted k2, ")


def test_schedule_dataframe_takes_a_codec_and_compression_from_the_driver(spark, r, redis_server):
    pytest.importorskip("zstandard")
    df = spark.range(100).selectExpr(f"concat('{MARKER}', repeat('x', 400)) as secret", "id as n")
    codec = dueq.Encrypted(keys={"k1": K1})
    result = ds.schedule_dataframe(
        df, queue="sealed-arg", redis_url=redis_server.url, codec=codec, compression="auto"
    )
    assert result.added == 100
    raw = stored_values(r, "sealed-arg")
    assert MARKER.encode() not in raw and raw.count(b"%z|k1\n") == 100
    q = dueq.Queue("sealed-arg", r, codec=codec)
    payloads = [d.payload for d in q.claim(limit=100)]
    assert sorted(p["n"] for p in payloads) == list(range(100))
    assert all(p["secret"].startswith(MARKER) for p in payloads)


def _key_list(keys: dict[str, bytes]) -> str:
    return ",".join(f"{k}={base64.b64encode(v).decode()}" for k, v in keys.items())


def _write(df: Any, queue: str, url: str, **options: str) -> None:
    df.write.format("dueq").mode("append").options(queue=queue, redis_url=url, **options).save()


def test_the_data_source_seals_in_the_tasks_with_the_sessions_keys(
    spark, r, redis_server, session_keys
):
    pytest.importorskip("pyspark.sql.datasource")
    df = spark.range(50).selectExpr("cast(id as string) as id", f"'{MARKER}' as secret", "id as n")
    _write(df, "sealed-src", redis_server.url, id_col="id")
    assert_sealed_with_k2(r, "sealed-src", 50)


def test_the_data_source_takes_keys_and_compression_as_options_before_the_session(
    spark, r, redis_server, session_keys
):
    pytest.importorskip("pyspark.sql.datasource")
    pytest.importorskip("zstandard")
    df = spark.range(40).selectExpr(f"concat('{MARKER}', repeat('x', 400)) as secret", "id as n")
    options = {"secretKeys": _key_list({"k1": K1}), "compression": "zstd"}
    _write(df, "sealed-src-opt", redis_server.url, **options)
    raw = stored_values(r, "sealed-src-opt")
    assert MARKER.encode() not in raw and raw.count(b"%z|k1\n") == 40
    q = dueq.Queue("sealed-src-opt", r, codec=dueq.Encrypted(keys={"k1": K1}))
    payloads = [d.payload for d in q.claim(limit=40)]
    assert sorted(p["n"] for p in payloads) == list(range(40))


def test_the_data_source_option_active_key_picks_among_the_sessions_keys(
    spark, r, redis_server, session_keys
):
    pytest.importorskip("pyspark.sql.datasource")
    df = spark.range(5).selectExpr("cast(id as string) as id", f"'{MARKER}' as secret")
    _write(df, "sealed-src-active", redis_server.url, id_col="id", activeKey="k1")
    assert r.hget("dueq:{sealed-src-active}:tasks", "3").count(b"%|k1\n") == 1


def test_the_data_source_compresses_without_keys_with_the_option_compression(
    spark, r, redis_server
):
    pytest.importorskip("pyspark.sql.datasource")
    pytest.importorskip("zstandard")
    df = spark.range(20).selectExpr(f"concat('{MARKER}', repeat('x', 400)) as secret", "id as n")
    _write(df, "zstd-src", redis_server.url, compression="zstd")
    raw = stored_values(r, "zstd-src")
    assert raw.count(b"%z|\n") == 20
    assert len(dueq.Queue("zstd-src", r).claim(limit=20)) == 20


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"compression": "lz4"}, r'^option compression must be "zstd" or "auto", got \'lz4\''),
        ({"secretKeys": "k1"}, r"^option secretKeys"),
        ({"secretKeys": "k1=AAAA"}, r"^key 'k1' must be 32 bytes"),
        ({"secretKeys": _key_list({"k1": K1}), "activeKey": "k9"}, r"active key 'k9'"),
    ],
)
def test_bad_codec_options_of_the_data_source_are_configuration_errors(options, message):
    pytest.importorskip("pyspark.sql.datasource")
    from internals_support import spark_source
    from pyspark.sql import types as T

    schema = T.StructType([T.StructField("secret", T.StringType())])
    given = {"queue": "q", "redis_url": "redis://localhost", **options}
    with pytest.raises(dueq.ConfigurationError, match=message) as caught:
        spark_source()._write_setup(given, schema)
    assert base64.b64encode(K1).decode() not in str(caught.value)  # never a key


def test_a_bad_codec_option_fails_the_write_before_any_task_runs(spark, r, redis_server):
    pytest.importorskip("pyspark.sql.datasource")
    df = spark.range(3).selectExpr("id as n")
    with pytest.raises(Exception, match="option compression must be"):
        _write(df, "bad-codec-src", redis_server.url, compression="lz4")
    assert not list(r.scan_iter(match="dueq:{bad-codec-src}:*"))


def test_row_ids_with_a_codec_are_keyed_by_the_active_key_not_a_plain_hash():
    payload = f'{{"email":"{MARKER}@example.com"}}'.encode()
    plain = ds.row_id(0, 0, payload)
    k1 = dueq.Encrypted(keys=BOTH, active="k1")
    k1_again = dueq.Encrypted(keys={"k1": K1})
    k2 = dueq.Encrypted(keys=BOTH, active="k2")
    keyed = ds.row_id(0, 0, payload, codec=k1)
    assert keyed != plain and len(keyed) == 32
    assert ds.row_id(0, 0, payload, codec=k1_again) == keyed  # the same key: the same id
    assert ds.row_id(0, 0, payload, codec=k2) not in (keyed, plain)  # another active key
    assert ds.row_id(0, 0, payload, codec=None) == plain


def test_the_partition_function_gives_rows_without_id_keyed_ids_with_a_codec(r, redis_server):
    codec = dueq.Encrypted(keys={"k1": K1})
    plan = ds.PartitionPlan("keyed-ids", redis_server.url, "now", False, 10, "count")
    plan = dataclasses.replace(plan, payloads=PayloadCodec(codec))
    payload = f'{{"email":"{MARKER}@example.com"}}'
    counts = ds.schedule_rows(iter([(None, None, None, payload)]), plan)
    assert counts.added == 1
    ids = {i.decode() for i in r.zrange("dueq:{keyed-ids}:due", 0, -1)}
    assert ids == {ds.row_id(0, 0, payload.encode(), codec=codec)}
    assert ds.row_id(0, 0, payload.encode()) not in ids


def test_schedule_dataframe_without_id_col_keys_its_ids_and_reruns_add_nothing(
    spark, r, redis_server, session_keys
):
    df = spark.range(10).selectExpr(f"concat('{MARKER}', cast(id as string)) as email")
    first = ds.schedule_dataframe(df, queue="keyed-df", redis_url=redis_server.url)
    again = ds.schedule_dataframe(df, queue="keyed-df", redis_url=redis_server.url)
    assert (first.added, again.added, again.existing) == (10, 0, 10)
    ids = {i.decode() for i in r.zrange("dueq:{keyed-df}:due", 0, -1)}
    unkeyed = ds.row_id(0, 0, f'{{"email":"{MARKER}3"}}'.encode())
    assert unkeyed not in ids
    active = dueq.Encrypted(keys=BOTH, active="k2")
    assert ds.row_id(0, 0, f'{{"email":"{MARKER}3"}}'.encode(), codec=active) in ids


def test_the_stream_writer_seals_in_the_tasks_with_the_sessions_keys(
    spark, r, redis_server, session_keys, tmp_path
):
    pytest.importorskip("pyspark.sql.datasource")
    source = tmp_path / "in"
    source.mkdir()
    rows = [f'{{"id":"{n}","secret":"{MARKER}","n":{n}}}' for n in range(50)]
    (source / "part-0.json").write_text("\n".join(rows) + "\n")
    query = (
        spark.readStream.schema("id string, secret string, n long")
        .json(str(source))
        .writeStream.format("dueq")
        .options(queue="sealed-stream", redis_url=redis_server.url, id_col="id")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert_sealed_with_k2(r, "sealed-stream", 50)


def test_row_ids_keyed_by_a_key_callable_match_those_of_the_same_key_listed():
    payload = b'{"n":1}'
    asked: list[str] = []

    def kms(key_id: str) -> bytes | None:
        asked.append(key_id)
        return BOTH.get(key_id)

    from_kms = dueq.Encrypted(keys=kms, active="k2")
    listed = dueq.Encrypted(keys=BOTH, active="k2")
    assert ds.row_id(0, 0, payload, codec=from_kms) == ds.row_id(0, 0, payload, codec=listed)
    assert ds.row_id(0, 0, b'{"n":2}', codec=from_kms) != ds.row_id(0, 0, payload, codec=listed)
    assert asked == ["k2"]  # the derived key is made once


def test_the_data_source_without_id_col_gives_the_keyed_ids_schedule_dataframe_gives(
    spark, r, redis_server, session_keys
):
    pytest.importorskip("pyspark.sql.datasource")
    df = spark.range(5).selectExpr(f"concat('{MARKER}', cast(id as string)) as email")
    _write(df, "keyed-src", redis_server.url)
    ids = {i.decode() for i in r.zrange("dueq:{keyed-src}:due", 0, -1)}
    active = dueq.Encrypted(keys=BOTH, active="k2")
    expected = {
        ds.row_id(0, 0, f'{{"email":"{MARKER}{n}"}}'.encode(), codec=active) for n in range(5)
    }
    assert ids == expected
