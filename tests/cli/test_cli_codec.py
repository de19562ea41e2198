"""Commands that schedule or run tasks with a codec: ``dueq worker`` and ``dueq schedule`` seal
and open payloads with the keys of DUEQ_KEYS (a worker holding the key is the point; the
views' rule, markers unless ``--decrypt``, is not theirs) and take ``--compression``."""

from __future__ import annotations

import base64
import json
import os
import sys
from typing import Any

import pytest
from cli_worker_support import WAIT_S, start_worker, wait_for
from paths_support import FIXTURES

import dueq

pytest.importorskip("cryptography")

K1 = os.urandom(32)
SECRET = "SECRET-7d2a41"


def keys_env(**keys: bytes) -> str:
    return ",".join(f"{k}={base64.b64encode(v).decode()}" for k, v in keys.items())


def sealed_queue(r: Any, name: str = "jobs") -> dueq.Queue:
    return dueq.Queue(name, r, codec=dueq.Encrypted(keys={"k1": K1}))


def test_a_worker_with_dueq_keys_opens_sealed_payloads_and_seals_its_results(
    r: Any, redis_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = sealed_queue(r)
    q.configure(keep_results=3600)
    q.schedule_many(dueq.Task({"token": SECRET, "n": n}, id=f"t{n}") for n in range(5))
    monkeypatch.setenv("DUEQ_KEYS", keys_env(k1=K1))
    child = start_worker(redis_server, "jobs", "cli_handlers:echo_payload")
    try:
        wait_for(lambda: r.llen("payloads") == 5, "five handled tasks")
        wait_for(lambda: q.stats().counters.get("acked", 0) == 5, "five acks")
    finally:
        child.terminate()
        _out, err = child.communicate(timeout=WAIT_S)
    seen = sorted(json.loads(p)["n"] for p in r.lrange("payloads", 0, -1))
    assert seen == [0, 1, 2, 3, 4]
    assert "payloads sealed with key k1" in err
    assert SECRET not in err
    assert q.get("t3").result == {"echo": {"token": SECRET, "n": 3}}
    for raw in r.hvals("dueq:{jobs}:results"):
        assert SECRET.encode() not in raw


def test_a_worker_without_keys_sends_sealed_tasks_dead_with_one_clear_line_each(
    r: Any, redis_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = sealed_queue(r)
    q.schedule({"token": SECRET}, id="locked")
    monkeypatch.delenv("DUEQ_KEYS", raising=False)
    child = start_worker(redis_server, "jobs", "cli_handlers:echo_payload")
    try:
        wait_for(lambda: q.dead.count() == 1, "the sealed task to go dead")
    finally:
        child.terminate()
        _out, err = child.communicate(timeout=WAIT_S)
    [line] = [ln for ln in err.splitlines() if "'locked'" in ln]
    assert "cannot be decrypted" in line and "UndecryptableTask" in line
    assert "DUEQ_KEYS" in line and "replay it once the key is configured" in line
    assert "Traceback" not in err and SECRET not in err
    assert r.llen("payloads") == 0
    info = q.get("locked")
    assert info.errors[-1].type == "UndecryptableTask" and info.payload == {"token": SECRET}


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_schedule_with_dueq_keys_seals_the_payload(
    invoke: Any, r: Any, monkeypatch: pytest.MonkeyPatch, compression: str | None
) -> None:
    if compression is not None:
        pytest.importorskip("zstandard")
    monkeypatch.setenv("DUEQ_KEYS", keys_env(k1=K1))
    payload = json.dumps({"token": SECRET, "pad": "x" * 400})
    extra = ["--compression", compression] if compression else []
    result = invoke("schedule", "jobs", payload, "--id", "s1", *extra)
    assert result.exit_code == 0, result.output
    stored = r.hget("dueq:{jobs}:tasks", "s1")
    assert SECRET.encode() not in stored
    assert (b"%z|k1\n" if compression else b"%|k1\n") in stored
    assert sealed_queue(r).get("s1").payload == json.loads(payload)


def test_schedule_with_compression_alone_compresses_without_encrypting(
    invoke: Any, r: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("zstandard")
    monkeypatch.delenv("DUEQ_KEYS", raising=False)
    payload = json.dumps({"pad": "y" * 1000})
    result = invoke("schedule", "jobs", payload, "--id", "c1", "--compression", "auto")
    assert result.exit_code == 0, result.output
    stored = r.hget("dueq:{jobs}:tasks", "c1")
    assert b"%z|\n" in stored and len(stored) < 400
    assert dueq.Queue("jobs", r).get("c1").payload == {"pad": "y" * 1000}


@pytest.mark.parametrize(
    # json:dumps: an importable handler, so that the keys are what is checked next
    "command",
    [("schedule", "jobs", "{}"), ("worker", "jobs", "json:dumps")],
)
def test_a_malformed_dueq_keys_is_one_line_before_connecting(
    invoke: Any, monkeypatch: pytest.MonkeyPatch, command: tuple[str, ...]
) -> None:
    monkeypatch.setenv("DUEQ_KEYS", "k1=not-base64!")
    result = invoke(*command, url="redis://127.0.0.1:1/0")
    assert result.exit_code == 1, result.output
    [line] = result.output.strip().splitlines()
    assert "DUEQ_KEYS key 'k1' is not base64" in line


def test_worker_of_a_queue_object_refuses_compression(
    invoke: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(FIXTURES)  # where cli_handlers lives
    monkeypatch.setattr(sys, "path", list(sys.path))
    result = invoke("worker", "cli_handlers:named_queue", "--compression", "zstd")
    assert result.exit_code == 2
    assert "--compression" in result.output
