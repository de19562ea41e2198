"""The AOF of a Redis that holds a sealed queue (issue 42): every file under its AOF folder,
both the commands as they were appended and the base a rewrite makes, holds no plaintext of
1,000 marker payloads, nor of the results, durable step results, progress bodies, signals,
cron payload and outcome events made from them; the same scan of a plain queue's AOF finds
them all, so the scan is shown to see plaintext where there is some."""

from __future__ import annotations

import os
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from durable_support import run_due

import dueq
from dueq.server import RedisServer

pytest.importorskip("cryptography")

TASKS = 1000
STEP_TASKS = 10


def aof_bytes(server: RedisServer) -> bytes:
    """Every file under the server's AOF folder (Redis 7: appendonlydir/, base and
    increments; older: one appendonly.aof), concatenated."""
    files = [p for p in Path(server.dir).rglob("*") if p.is_file() and "aof" in p.name]
    assert files, f"no AOF file under {server.dir}"
    return b"".join(p.read_bytes() for p in files)


def rewrite_aof(client) -> None:
    """BGREWRITEAOF, waited for: the base file then holds the dataset as it is now."""
    client.bgrewriteaof()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        info = client.info("persistence")
        if not info["aof_rewrite_in_progress"] and not info["aof_rewrite_scheduled"]:
            return
        time.sleep(0.05)
    raise AssertionError("BGREWRITEAOF did not finish in 30 s")


def fill(q: dueq.Queue) -> list[str]:
    """1,000 marker payloads (800 acked with a marker result, 200 dead, 20 with a marker
    progress body), durable tasks whose steps return markers and that hold a marker signal,
    and a cron definition of a marker payload, with outcome events and kept results on; the
    markers."""
    q.configure(events=timedelta(hours=1), keep_results=3600)
    markers = [uuid.uuid4().hex for _ in range(2 * TASKS)]
    cron_marker, progress_markers = uuid.uuid4().hex, {}
    q.cron.add("nightly", "0 3 * * *", payload={"secret": cron_marker})  # its next occurrence
    q.schedule_many(dueq.Task({"secret": m}, id=f"t{i}") for i, m in enumerate(markers[:TASKS]))
    while claimed := q.claim(limit=250):
        for d in claimed:
            n = int(d.id[1:])
            if n % 50 == 1:  # progress entries: history, channel and events
                d.progress({"secret": progress_markers.setdefault(n, uuid.uuid4().hex)})
            if n % 5 == 0:
                d.fail(dueq.Unrecoverable("to dead"))
            else:
                d.ack({"secret": markers[TASKS + n]})
    markers = [m for i, m in enumerate(markers) if i < TASKS or (i - TASKS) % 5]

    @q.task(name="steps", durable=True)
    def steps(ctx: dueq.StepContext, marker: str) -> None:
        ctx.step("a", lambda: {"secret": marker[::-1]})
        raise RuntimeError("retry after the step: its result stays in the log")

    step_markers = [uuid.uuid4().hex for _ in range(STEP_TASKS)]
    signal_markers = [uuid.uuid4().hex for _ in range(STEP_TASKS)]
    for m, signal in zip(step_markers, signal_markers, strict=True):
        task_id = steps.schedule(marker=m)  # the marker is in the payload too, sealed as ever
        q.signal(task_id, "go", {"secret": signal})  # held by the task: it waits for none
    assert len(run_due(q)) == STEP_TASKS
    # what the steps returned, and the progress, signal and cron payloads
    written = [*progress_markers.values(), *signal_markers, cron_marker]
    return markers + [m[::-1] for m in step_markers] + written


def markers_in_aof(codec: dueq.Encrypted | None) -> tuple[set[str], set[str], set[str]]:
    """The markers written, and those found in the AOF as appended and after a rewrite (its
    base: an RDB without LZF, so that plaintext would show byte for byte)."""
    with RedisServer(appendonly=True, extra_args=["--rdbcompression", "no"]) as server:
        client = server.client()
        try:
            markers = fill(dueq.Queue("aof", client, codec=codec))
            appended = aof_bytes(server)
            rewrite_aof(client)
            rewritten = aof_bytes(server)
        finally:
            client.close()
    return (
        set(markers),
        {m for m in markers if m.encode() in appended},
        {m for m in markers if m.encode() in rewritten},
    )


@pytest.mark.slow
def test_the_aof_of_a_sealed_queue_holds_no_marker_payload_result_step_result_or_event():
    written, appended, rewritten = markers_in_aof(None)
    # 1,000 payloads, 800 results, 10 step results, 20 progress bodies, 10 signals and a cron
    # payload, all in plain sight (after the rewrite too: kept results, dead tasks, step logs,
    # progress histories, held signals, the definition, and events that carry payloads)
    assert len(written) == TASKS + 800 + 2 * STEP_TASKS + 20 + 1
    assert appended == written and rewritten == written
    sealed = dueq.Encrypted(keys={"k1": os.urandom(32)}, active="k1")
    written, appended, rewritten = markers_in_aof(sealed)
    assert len(written) == TASKS + 800 + 2 * STEP_TASKS + 20 + 1
    assert appended == set() and rewritten == set()
