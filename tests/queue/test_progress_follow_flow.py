"""The follower's flow (``q.progress``), driven by hand against real Redis with the
subscription's messages scripted, so a message can be lost or repeated on purpose: a gap in
the seqs is filled from the kept history, a repeated entry is yielded once, and the task's id
on the ended channel ends the follow."""

from __future__ import annotations

import struct
from typing import Any

from internals_support import follow

import dueq


def _message(channel: str, data: bytes) -> dict[str, Any]:
    return {"type": "message", "channel": channel.encode(), "data": data, "pattern": None}


def _entry(task_id: str, line: str) -> bytes:
    raw = task_id.encode()
    return struct.pack(">H", len(raw)) + raw + line.encode()


def _one(step: Any) -> Any:
    return (yield step)


def test_a_lost_message_is_filled_from_the_history_and_a_repeat_is_yielded_once(r):
    q = dueq.Queue("q", r)
    q.schedule({"n": 1}, id="t1")
    (d,) = q.claim()
    d.progress("a")
    keys = q.keys
    script: list[Any] = [
        {"type": "subscribe", "channel": keys.progress.encode(), "data": 1},
        {"type": "subscribe", "channel": keys.ended.encode(), "data": 2},
    ]
    emitted: list[int] = []
    reads = 0

    def read() -> Any:
        nonlocal reads
        reads += 1
        if script:
            return script.pop(0)
        if reads == 3:  # live now: two entries written, only the second heard
            d.progress("b")
            d.progress("c")
            return _message(keys.progress, _entry("t1", '3\t1\t"c"'))
        if reads == 4:  # the lost one, late: already yielded from the history
            return _message(keys.progress, _entry("t1", '2\t1\t"b"'))
        if reads == 5:  # another task's entry: not this follower's
            return _message(keys.progress, _entry("t2", '4\t1\t"x"'))
        return _message(keys.ended, _entry("t1", ""))  # the task's end

    flow = q.progress_follow_flow("t1", timeout=30)
    step = next(flow)
    try:
        while True:
            if isinstance(step, follow.FollowStep):
                reply = None
                if step.op is follow.FollowOp.READ:
                    reply = read()
                elif step.op is follow.FollowOp.EMIT:
                    emitted.append(step.entry.seq)
                step = flow.send(reply)
            else:
                step = flow.send(q.drive(_one(step)))
    except StopIteration:
        pass
    assert emitted == [1, 2, 3]
    assert reads == 6


def test_the_end_of_a_follow_is_not_held_up_by_a_busy_channel(r):
    """After its look finds the task gone, a follower reads what is still on its way for a
    bounded time, however many other tasks' entries keep coming."""
    q = dueq.Queue("q", r)
    keys = q.keys
    now = [0.0]
    script = [
        {"type": "subscribe", "channel": keys.progress.encode(), "data": 1},
        {"type": "subscribe", "channel": keys.ended.encode(), "data": 2},
    ]
    reads = 0

    def read() -> Any:
        nonlocal reads
        reads += 1
        now[0] += 0.01  # every read takes 10 ms: another task's entry comes each time
        if script:
            return script.pop(0)
        assert reads < 100, "the drain did not end"
        return _message(keys.progress, _entry("other", '1\t1\t"x"'))

    flow = q.progress_follow_flow("gone", timeout=30, monotonic=lambda: now[0])
    step = next(flow)
    try:
        while True:
            reply = None
            if isinstance(step, follow.FollowStep):
                if step.op is follow.FollowOp.READ:
                    reply = read()
            else:
                reply = q.drive(_one(step))
            step = flow.send(reply)
    except StopIteration:
        pass
    assert reads <= 10
