"""Encrypted payloads on the command line: ``list``, ``show``, ``dead list`` and ``dead show``
show the marker (``<encrypted k1, N B>``) even when DUEQ_KEYS holds the key, and open them only
with ``--decrypt``."""

from __future__ import annotations

import base64
import json
import os
from typing import Any

import pytest

import dueq

pytest.importorskip("cryptography")

K1 = os.urandom(32)
SECRET = "SECRET-4f1c9e"


@pytest.fixture
def sealed(r: Any) -> dueq.Queue:
    """Queue "jobs" sealed with k1: t-due (scheduled) and t-dead (dead), both carrying SECRET."""
    q = dueq.Queue(
        "jobs",
        r,
        codec=dueq.Encrypted(keys={"k1": K1}),
        retry=dueq.RetryPolicy(max_attempts=1),
    )
    q.schedule({"token": SECRET}, id="t-dead")
    [d] = q.claim()
    d.fail(ValueError("no mailbox"))
    q.schedule({"token": SECRET}, id="t-due", delay=3600)
    return q


@pytest.fixture
def with_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DUEQ_KEYS", f"k1={base64.b64encode(K1).decode()}")


COMMANDS = [
    ("list", "jobs"),
    ("list", "jobs", "--state", "dead"),
    ("show", "jobs", "t-due", "t-dead"),
    ("dead", "list", "jobs"),
    ("dead", "show", "jobs", "t-dead"),
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
@pytest.mark.parametrize("as_json", [False, True], ids=["table", "json"])
def test_payload_commands_show_the_marker_even_when_the_keys_are_in_the_environment(
    invoke: Any, sealed: Any, with_keys: None, command: tuple[str, ...], as_json: bool
) -> None:
    result = invoke(*command, *(["--json"] if as_json else []))
    assert result.exit_code == 0, result.output
    assert SECRET not in result.output
    if as_json:
        tasks = json.loads(result.stdout)["tasks"]
        assert tasks and all(t["payload"].startswith("<encrypted k1, ") for t in tasks)
    elif command[-1] != "dead" and command[:2] != ("dead", "list"):  # a dead table: no payload
        assert "<encrypted k1," in result.output


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_decrypt_opens_the_payloads_with_the_keys_of_dueq_keys(
    invoke: Any, sealed: Any, with_keys: None, command: tuple[str, ...]
) -> None:
    result = invoke(*command, "--decrypt", "--json")
    assert result.exit_code == 0, result.output
    tasks = json.loads(result.stdout)["tasks"]
    assert tasks and all(t["payload"] == {"token": SECRET} for t in tasks)


def test_show_decrypt_prints_the_opened_payload(invoke: Any, sealed: Any, with_keys: None) -> None:
    result = invoke("show", "jobs", "t-due", "--decrypt")
    assert result.exit_code == 0, result.output
    assert SECRET in result.output and "<encrypted" not in result.output


def test_decrypt_without_dueq_keys_fails_in_one_clear_line(
    invoke: Any, sealed: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DUEQ_KEYS", raising=False)
    result = invoke("show", "jobs", "t-due", "--decrypt")
    assert result.exit_code == 1
    [line] = result.output.strip().splitlines()
    assert line.startswith("error: --decrypt opens payloads with the keys in DUEQ_KEYS")
    assert SECRET not in result.output


def test_decrypt_with_other_keys_still_shows_the_marker(
    invoke: Any, sealed: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DUEQ_KEYS", f"k2={base64.b64encode(os.urandom(32)).decode()}")
    result = invoke("show", "jobs", "t-due", "--decrypt", "--json")
    assert result.exit_code == 0, result.output
    [task] = json.loads(result.stdout)["tasks"]
    assert task["payload"].startswith("<encrypted k1, ")


def test_dashboard_decrypt_without_dueq_keys_is_refused_before_serving(
    invoke: Any, sealed: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("starlette")
    monkeypatch.delenv("DUEQ_KEYS", raising=False)
    result = invoke("dashboard", "--decrypt", "--port", "0")
    assert result.exit_code == 2
    [line] = result.output.strip().splitlines()
    assert "decrypt setting opens payloads with the keys in DUEQ_KEYS" in line
