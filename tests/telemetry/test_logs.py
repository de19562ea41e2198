"""Log lines name the worker; ``dueq worker --log-format json`` writes one JSON object a line."""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
import time

import pytest
from cli_worker_support import WAIT_S, start_worker, wait_for

import dueq
from dueq import worker_id
from dueq.logs import JsonFormatter, WorkerFilter, task_fields


def test_the_worker_id_names_host_and_pid_and_stays_the_same():
    wid = worker_id()
    host, pid, rand = wid.split(":")
    assert host and pid == str(os.getpid()) and re.fullmatch(r"[0-9a-f]{8}", rand)
    assert worker_id() == wid


def test_dueq_worker_log_format_json_writes_one_parsable_object_per_line(r, redis_server):
    q = dueq.Queue("j", r)
    q.schedule({"n": 1}, id="good")
    q.schedule({"fail": True}, id="bad")
    child = start_worker(
        redis_server, "j", "cli_handlers:record", "--max-attempts", "1", "--log-format", "json"
    )
    try:
        wait_for(lambda: q.dead.count() == 1 and q.stats().leased == 0, "the dead task")
        child.terminate()
        out, err = child.communicate(timeout=WAIT_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, err
    entries = [json.loads(line) for line in err.splitlines()]
    assert len(entries) >= 3  # banner, started, the dead task, stopping, stopped
    workers = {e["worker"] for e in entries}
    assert len(workers) == 1 and workers.pop().split(":")[1] == str(child.pid)
    assert {"time", "level", "logger", "message"} <= set(entries[0])
    assert any("'bad'" in e["message"] and e["level"] == "ERROR" for e in entries)
    assert entries[0]["queue"] == "j"
    assert out == ""  # the stop summary is one JSON log line too, not a stdout line
    [stopped] = [e["message"] for e in entries if e["message"].startswith("worker stopped")]
    assert "'acked': 1" in stopped and "'dead': 1" in stopped, stopped


def test_text_log_lines_of_the_worker_name_it(r, redis_server):
    q = dueq.Queue("t", r)
    q.schedule({"fail": True}, id="bad")
    child = start_worker(redis_server, "t", "cli_handlers:record", "--max-attempts", "1")
    try:
        wait_for(lambda: q.dead.count() == 1, "the dead task")
        child.terminate()
        _, err = child.communicate(timeout=WAIT_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    logged = [line for line in err.splitlines() if " INFO " in line or " ERROR " in line]
    assert any("'bad'" in line for line in logged), err
    assert all(f":{child.pid}:" in line for line in logged), err


def record(**extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("dueq.x", logging.ERROR, __file__, 1, "task %r: %s", ("a", "b"), None)
    for name, value in extra.items():
        setattr(rec, name, value)
    return rec


def test_json_lines_carry_task_fields_exceptions_and_escape_terminal_controls():
    try:
        raise ValueError("boom \x1b[2J")
    except ValueError:
        exc_info = sys.exc_info()
    rec = record(**task_fields("emails", "t\x1b]0;x\x07", 3), odd={1, 2})
    rec.exc_info = exc_info
    WorkerFilter().filter(rec)
    line = JsonFormatter(redact=lambda s: s.replace("secret", "***")).format(rec)
    assert "\x1b" not in line and "\n" not in line and line.isascii()
    entry = json.loads(line)
    assert entry["queue"] == "emails" and entry["task_id"] == "t\x1b]0;x\x07"
    assert entry["attempt"] == 3 and entry["worker"] == worker_id()
    assert entry["odd"] == "{1, 2}"
    assert "ValueError: boom" in entry["exception"]
    assert entry["message"] == "task 'a': b"


def test_json_lines_mask_secrets_in_every_field():
    rec = record(url="redis://u:hunter2@h")
    rec.msg, rec.args = "cannot reach %s", ("redis://u:hunter2@h",)
    entry = json.loads(JsonFormatter(redact=lambda s: s.replace("hunter2", "***")).format(rec))
    assert "hunter2" not in json.dumps(entry)
    assert entry["url"] == "redis://u:***@h"


def test_json_log_lines_about_a_task_carry_its_queue_id_and_attempt(r, redis_server):
    q = dueq.Queue("f", r)
    q.schedule({"fail": True}, id="bad")
    child = start_worker(
        redis_server, "f", "cli_handlers:record", "--max-attempts", "1", "--log-format", "json"
    )
    try:
        wait_for(lambda: q.dead.count() == 1 and q.stats().leased == 0, "the dead task")
        child.terminate()
        _, err = child.communicate(timeout=WAIT_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    about_bad = [e for e in map(json.loads, err.splitlines()) if "'bad'" in e["message"]]
    assert about_bad
    assert all((e["queue"], e["task_id"], e["attempt"]) == ("f", "bad", 1) for e in about_bad)


def test_no_log_line_of_a_failing_sealed_task_holds_its_payload(r, caplog):
    """A sealed task that fails, retries, goes dead, and one that no key opens: every record
    dueq logs (message, arguments, extra fields, traceback) is free of the payload's text."""
    pytest.importorskip("cryptography")
    marker = "PLAINTEXT-" + os.urandom(6).hex()
    codec = dueq.Encrypted(keys={"k1": os.urandom(32)})
    retry = dueq.RetryPolicy(max_attempts=2, wait=lambda state: 0.0)
    q = dueq.Queue("sealed", r, codec=codec, retry=retry)
    q.schedule({"card": marker}, id="fails")
    stranger = dueq.Encrypted(keys={"k9": os.urandom(32)})
    dueq.Queue("sealed", r, codec=stranger).schedule({"card": marker}, id="no-key")

    def handler(d: dueq.Delivery) -> None:
        raise RuntimeError("card declined")  # a message that does not quote the payload

    worker = dueq.Worker(q, handler, concurrency=2)
    caplog.set_level(logging.DEBUG)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + WAIT_S
    try:
        while q.dead.count() < 2:
            assert time.monotonic() < deadline, "both tasks should end dead"
            time.sleep(0.02)
    finally:
        worker.stop()
        thread.join(WAIT_S)
    lines = [
        caplog.text,
        *(json.dumps(vars(rec), default=repr) for rec in caplog.records),
    ]
    assert any("card declined" in line for line in lines)  # the failures were logged
    assert any("no-key" in line for line in lines)  # and the undecryptable task
    assert not [line for line in lines if marker in line]
