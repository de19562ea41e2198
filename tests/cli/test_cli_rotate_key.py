"""``dueq rotate-key``: re-seals a queue's payloads with the key --to, keys from DUEQ_KEYS,
with a progress line per batch, the counts, and an exit code that says whether the old key
may go."""

from __future__ import annotations

import base64
import json
import os

import pytest

import dueq

pytest.importorskip("cryptography")

K1 = os.urandom(32)
K2 = os.urandom(32)
K0 = os.urandom(32)


def listed(**keys: bytes) -> str:
    return ",".join(f"{k}={base64.b64encode(v).decode()}" for k, v in keys.items())


@pytest.fixture
def sealed_with_k1(r):
    q = dueq.Queue("mail", r, codec=dueq.Encrypted(keys={"k1": K1}, active="k1"))
    q.schedule_many([dueq.Task({"n": i}, id=f"t{i}") for i in range(1000)])
    return q


def test_rotate_key_prints_progress_and_counts_and_every_task_is_on_the_new_key(
    invoke, r, sealed_with_k1, monkeypatch
):
    monkeypatch.setenv("DUEQ_KEYS", listed(k1=K1, k2=K2))
    result = invoke("rotate-key", "mail", "--to", "k2", "--batch", "100")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    progress = [line for line in lines if line.startswith("batch ")]
    assert len(progress) >= 2 and "cursor tasks:" in progress[0]
    assert progress[-1].endswith("cursor done")
    assert lines[-1] == (
        "queue 'mail' on key k2: 1000 re-sealed, 0 skipped (changed meanwhile), "
        "0 already on k2, 0 undecryptable, 0 not encrypted"
    )
    k2_alone = dueq.Queue("mail", r, codec=dueq.Encrypted(keys={"k2": K2}, active="k2"))
    assert len(k2_alone.claim(limit=1000)) == 1000


def test_rotate_key_json_and_an_undecryptable_task_exits_1_with_its_id(
    invoke, r, sealed_with_k1, monkeypatch
):
    stray = dueq.Queue("mail", r, codec=dueq.Encrypted(keys={"k0": K0}, active="k0"))
    stray.schedule({"x": 1}, id="stray")
    monkeypatch.setenv("DUEQ_KEYS", listed(k1=K1, k2=K2))
    result = invoke("rotate-key", "mail", "--to", "k2", "--json")
    assert result.exit_code == 1
    report = json.loads(result.output)
    assert (report["resealed"], report["undecryptable"]) == (1000, 1)
    assert report["undecryptable_ids"] == ["stray"] and report["done"] is True


def test_rotate_key_refuses_a_target_key_dueq_keys_does_not_list(
    invoke, sealed_with_k1, monkeypatch
):
    monkeypatch.setenv("DUEQ_KEYS", listed(k1=K1))
    result = invoke("rotate-key", "mail", "--to", "k2")
    assert result.exit_code == 1 and "k2" in result.output
