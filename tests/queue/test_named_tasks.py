"""Named tasks (issue 28): ``@q.task`` registers a function by name, ``fn.schedule(**args)`` and
``q.schedule(args, task=name)`` schedule it, and a worker without a handler dispatches by name.
Contract tests run on both front ends (``make_queue``)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import redis
from async_support import Blocking
from counting_support import calls
from waiting_support import wait_for

import dueq
from dueq._util.clock import ms_datetime
from dueq._wire.envelope import (
    MAX_TASK_NAME_CHARS,
    TraceContext,
    decode_named,
    encode_envelope,
    trace_context_of,
)
from dueq.named import dispatcher

TRACE = TraceContext("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "k=v")


def _target(q: Any) -> Any:
    """The queue behind a test's queue (``make_queue`` wraps an AsyncQueue in ``Blocking``)."""
    return object.__getattribute__(q, "_target") if isinstance(q, Blocking) else q


def run_worker(q: Any, until: Callable[[], Any], handler: Any = None) -> None:
    """Run a ``Worker`` (or an ``AsyncWorker`` on the test's loop) on ``q`` until ``until()``."""
    target = _target(q)
    if isinstance(target, dueq.Queue):
        worker = dueq.Worker(target, handler, concurrency=2)
        thread = threading.Thread(target=worker.run)
        thread.start()
        try:
            wait_for(until, "the worker to get there")
        finally:
            worker.stop()
            thread.join(30)
        return
    loop = object.__getattribute__(q, "_loop")

    async def main() -> None:
        worker = dueq.AsyncWorker(target, handler, concurrency=2, handle_signals=False)
        running = asyncio.ensure_future(worker.run())
        try:
            for _ in range(1500):  # 30 s at most
                if until():
                    return
                await asyncio.sleep(0.02)
            raise AssertionError("timed out waiting for the worker")
        finally:
            worker.stop()
            await running

    loop.run_until_complete(main())


@pytest.fixture
def observer(r: redis.Redis, clock: Any) -> Callable[[str], dueq.Queue]:
    """A blocking queue over the same data, to watch what a worker does from the test."""
    return lambda name="q": dueq.Queue(name, r, clock=clock)


def test_a_worker_without_a_handler_runs_each_named_task_with_its_payload_as_arguments(
    make_queue: Any, observer: Any
) -> None:
    q = make_queue("q")
    calls: list[tuple[str, Any]] = []

    @q.task(name="send_welcome")
    def send_welcome(to: str, name: str = "") -> dict[str, str]:
        calls.append(("send_welcome", (to, name)))
        return {"sent": to}

    @q.task
    async def notify(user: int) -> None:
        await asyncio.sleep(0)
        calls.append(("notify", user))

    assert send_welcome.name == "send_welcome" and q.tasks["send_welcome"] is not None
    assert notify.name.endswith(
        "test_named_tasks.test_a_worker_without_a_handler_runs_each_"
        "named_task_with_its_payload_as_arguments.<locals>.notify"
    )
    assert send_welcome("direct") == {"sent": "direct"}  # calling it calls the function
    calls.clear()
    first = send_welcome.schedule(to="a@b.c", name="Ada")
    second = q.schedule({"to": "x@y.z"}, task="send_welcome")
    third = notify.schedule(user=7)
    assert observer().get(first).task_name == "send_welcome"
    assert observer().get(third).payload == {"user": 7}
    run_worker(q, lambda: observer().stats().scheduled == 0 and len(calls) == 3)
    assert sorted(calls, key=str) == sorted(
        [("send_welcome", ("a@b.c", "Ada")), ("send_welcome", ("x@y.z", "")), ("notify", 7)],
        key=str,
    )
    assert all(observer().get(t) is None for t in (first, second, third))  # acked


def test_the_dispatcher_returns_the_functions_value(make_queue: Any) -> None:
    q = make_queue("q")

    @q.task(name="add")
    def add(a: int, b: int) -> int:
        return a + b

    add.schedule(a=2, b=3)
    [d] = q.claim()
    assert d.task_name == "add"
    assert dispatcher([_target(q)], None, on_loop=False)(_target(d)) == 5


def _first_failure(observer: Any, tid: str) -> Callable[[], bool]:
    """True once the task's first attempt has failed (retried or dead)."""
    return lambda: bool((info := observer().get(tid)) and info.errors)


def test_a_name_no_worker_knows_goes_dead_at_once_with_unknown_task_naming_it(
    make_queue: Any, observer: Any
) -> None:
    q = make_queue("q", retry=dueq.RetryPolicy(max_attempts=5, wait=lambda state: 0.0))
    tid = q.schedule({"to": "a"}, task="no_such_task")
    run_worker(q, _first_failure(observer, tid))
    info = observer().get(tid)
    assert info.state == "dead" and info.task_name == "no_such_task" and info.attempt == 1
    assert [e.type for e in info.errors] == ["UnknownTask"]
    assert "'no_such_task'" in info.errors[-1].message


def test_arguments_that_do_not_bind_at_run_time_go_dead_at_once_naming_the_nearest_parameter(
    make_queue: Any, observer: Any
) -> None:
    q = make_queue("q")
    ran: list[Any] = []

    @q.task(name="add")
    def add(x: int, y: int = 0) -> int:
        ran.append((x, y))
        return x + y

    # a producer that does not have the function schedules by name, unchecked
    tid = observer().schedule({"x": 1, "yy": 2}, task="add")
    run_worker(q, _first_failure(observer, tid))
    info = observer().get(tid)
    assert (info.state, info.attempt) == ("dead", 1) and ran == []
    [error] = info.errors
    assert error.type == "InvalidArguments"
    assert "'yy'" in error.message and "did you mean 'y'?" in error.message


def test_a_type_error_raised_inside_the_function_is_an_ordinary_failure_and_retried(
    make_queue: Any, observer: Any
) -> None:
    q = make_queue("q")

    @q.task(name="broken")
    def broken(x: int) -> int:
        return x + "1"  # type: ignore[operator]  # the bug under test

    tid = broken.schedule(x=1)
    run_worker(q, _first_failure(observer, tid))
    info = observer().get(tid)
    assert info.state == "scheduled" and [e.type for e in info.errors] == ["TypeError"]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_return_value_that_is_not_json_sends_a_named_task_dead_at_once(
    make_queue: Any, observer: Any, kind: str
) -> None:
    q = make_queue("q")
    if kind == "sync":

        @q.task(name="returns")
        def returns() -> Any:
            return {1, 2}

    else:

        @q.task(name="returns")
        async def returns() -> Any:  # (the async front end awaits it on its loop)
            return {1, 2}

    tid = returns.schedule()
    run_worker(q, _first_failure(observer, tid))
    info = observer().get(tid)
    assert (info.state, info.attempt) == ("dead", 1)
    [error] = info.errors
    assert error.type == "Unrecoverable"
    assert "'returns'" in error.message and "not JSON" in error.message


def test_a_context_task_sees_its_own_delivery_and_is_scheduled_with_its_arguments_only(
    make_queue: Any, observer: Any, clock: Any, front_end: str
) -> None:
    q = make_queue("q")
    seen: dict[str, Any] = {}

    @q.task(name="ctx_sync", context=True, max_attempts=4)
    def ctx_sync(ctx: dueq.TaskContext, n: int) -> int:
        seen["sync"] = (ctx.id, ctx.attempt, ctx.max_attempts, ctx.queue, ctx.due_at, n)
        seen["sync_more"] = (ctx.task_name, ctx.cancelled, ctx.lease_deadline > ctx.due_at)
        if front_end == "sync":
            seen["extended"] = ctx.extend(60)
        return n

    @q.task(name="ctx_async", context=True)
    async def ctx_async(ctx: dueq.TaskContext, /, n: int) -> int:
        seen["async"] = (ctx.id, ctx.attempt, ctx.max_attempts, ctx.queue, n)
        if front_end == "async":
            seen["extended"] = await ctx.extend(60)
        return n

    with pytest.raises(dueq.InvalidTaskError, match="missing a required argument: 'n'"):
        ctx_sync.schedule()
    with pytest.raises(dueq.InvalidTaskError, match="unexpected keyword argument 'ctx'"):
        ctx_sync.schedule(ctx=1, n=1)
    first = ctx_sync.schedule(n=1, id="first")
    second = ctx_async.schedule(n=2, id="second")
    assert observer().get(first).payload == {"n": 1}
    due = observer().get(first).due_at
    run_worker(q, lambda: observer().stats().scheduled == 0 and len(seen) == 4)
    assert seen["sync"] == (first, 1, 4, "q", due, 1)
    assert seen["sync_more"] == ("ctx_sync", False, True)
    assert seen["async"] == (second, 1, 3, "q", 2)  # the queue's retry policy: 3
    assert seen["extended"] == ms_datetime(round((clock.now + 60) * 1000))
    assert observer().stats().dead == 0


def test_a_context_task_needs_a_first_parameter_to_receive_it(make_queue: Any) -> None:
    q = make_queue("q")
    with pytest.raises(dueq.ConfigurationError, match="context=True"):

        @q.task(name="no_room", context=True)
        def no_room(*, n: int) -> None: ...


def test_the_dispatcher_hands_a_context_task_its_context_first(make_queue: Any) -> None:
    q = make_queue("q")

    @q.task(name="who")
    def plain(n: int) -> int:
        return n

    @q.task(name="who_ctx", context=True)
    def with_ctx(ctx: dueq.TaskContext, n: int) -> tuple[str, int]:
        return (ctx.id, n)

    q.schedule({"n": 5}, task="who_ctx", id="c1")
    [d] = q.claim()
    assert dispatcher([_target(q)], None, on_loop=False)(_target(d)) == ("c1", 5)
    assert with_ctx(dueq.TaskContext(_target(d)), 3) == ("c1", 3)  # a call is the function's


def test_a_plain_task_on_a_worker_without_a_handler_fails_with_unknown_task(
    make_queue: Any, observer: Any
) -> None:
    q = make_queue("q")
    tid = q.schedule({"plain": True}, max_attempts=1)
    run_worker(q, lambda: observer().stats().dead == 1)
    [error] = observer().get(tid).errors
    assert error.type == "UnknownTask" and "no handler" in error.message


def test_plain_tasks_go_to_the_handler_and_named_ones_to_their_function(
    make_queue: Any, observer: Any
) -> None:
    q = make_queue("q")
    seen: list[Any] = []

    @q.task(name="named")
    def named(n: int) -> None:
        seen.append(("named", n))

    def handler(d: Any) -> None:
        assert d.task_name is None
        seen.append(("plain", d.payload))

    q.schedule({"n": 1}, task="named")
    q.schedule({"p": 2})
    named.schedule(n=3)
    run_worker(q, lambda: len(seen) == 3, handler=handler)
    assert sorted(seen, key=str) == sorted(
        [("named", 1), ("plain", {"p": 2}), ("named", 3)], key=str
    )
    assert observer().stats().dead == 0


def test_arguments_the_signature_refuses_are_refused_before_anything_is_written(
    make_queue: Any, r: redis.Redis
) -> None:
    q = make_queue("q")

    @q.task(name="send_welcome")
    def send_welcome(to: str, name: str = "") -> None: ...

    before = r.dbsize()
    with pytest.raises(dueq.InvalidTaskError, match="missing a required argument: 'to'"):
        send_welcome.schedule(name="Ada")
    with pytest.raises(dueq.InvalidTaskError, match="unexpected keyword argument 'cc'"):
        send_welcome.schedule(to="a", cc="b")
    with pytest.raises(dueq.InvalidTaskError, match=r"'nmae'.*did you mean 'name'\?"):
        send_welcome.schedule(to="a", nmae="Ada")
    with pytest.raises(dueq.InvalidTaskError, match=r"'too'.*did you mean 'to'\?") as typo:
        send_welcome.schedule(too="a")  # (named before the missing 'to' it explains)
    assert isinstance(typo.value, dueq.InvalidArguments)
    with pytest.raises(dueq.InvalidTaskError, match=r"send_welcome.*missing"):
        q.schedule({}, task="send_welcome")
    with pytest.raises(dueq.InvalidTaskError, match="dict of its arguments"):
        q.schedule(["a"], task="send_welcome")
    with pytest.raises(dueq.InvalidTaskError, match="dict of its arguments"):
        q.schedule("a", task="not_registered_here")
    with pytest.raises(dueq.PayloadError):  # JSON cannot carry it: refused as for any payload
        send_welcome.schedule(to={1, 2})
    # a batch with one bad task writes none of it
    good = send_welcome.task({"to": "a"})
    with pytest.raises(dueq.InvalidTaskError, match="task 1"):
        q.schedule_many([good, dueq.Task({"nope": 1}, task="send_welcome")])
    assert r.dbsize() == before


def test_a_name_registered_elsewhere_is_scheduled_by_name_without_the_function(
    make_queue: Any,
) -> None:
    producer = make_queue("q")
    tid = producer.schedule({"any": ["thing"]}, task="defined.in.another.service", delay=5)
    info = producer.get(tid)
    assert info.task_name == "defined.in.another.service" and info.payload == {"any": ["thing"]}


def test_decorator_options_are_the_defaults_of_each_task_and_schedule_overrides_them(
    make_queue: Any,
) -> None:
    q = make_queue("q")

    @q.task(name="mail", max_attempts=5, timeout=30, priority=3, key="tenant:1")
    def mail(to: str) -> None: ...

    info = q.get(mail.schedule(to="a", delay=60))
    assert (info.max_attempts, info.timeout, info.priority, info.key) == (
        5,
        timedelta(seconds=30),
        3,
        "tenant:1",
    )
    assert q.get(mail.schedule(to="b", id="fixed")).id == "fixed"
    info = q.get(mail.schedule(to="c", max_attempts=2, priority=9, key="tenant:2"))
    assert (info.max_attempts, info.priority, info.key) == (2, 9, "tenant:2")
    with pytest.raises(dueq.InvalidTaskError, match="priority"):
        q.task(name="bad", priority=12)(lambda: None)


def test_a_parameter_named_like_an_option_is_scheduled_through_schedule_args(
    make_queue: Any,
) -> None:
    q = make_queue("q")

    @q.task(name="store")
    def store(key: str, timeout: int = 5) -> None: ...

    assert store.shadowed == ["key", "timeout"]
    with pytest.raises(dueq.InvalidTaskError, match=r"schedule_args"):
        store.schedule(key="k")  # ambiguous: the option or the argument?
    info = q.get(store.schedule_args({"key": "k", "timeout": 1}, key="tenant", delay=5))
    assert info.payload == {"key": "k", "timeout": 1} and info.key == "tenant"
    assert info.timeout is None
    with pytest.raises(dueq.InvalidTaskError, match="missing a required argument: 'key'"):
        store.schedule_args({}, key="tenant")


@pytest.mark.parametrize(
    "name",
    ["", "with space", "new\nline", "é", "-starts-with-dash", "x" * (MAX_TASK_NAME_CHARS + 1)],
)
def test_a_task_name_outside_its_limits_is_refused_with_invalid_task_error(
    make_queue: Any, name: str, r: redis.Redis
) -> None:
    q = make_queue("q")
    with pytest.raises(dueq.InvalidTaskError, match="task name"):
        q.task(name=name)(lambda: None)
    with pytest.raises(dueq.InvalidTaskError, match="task name"):
        q.schedule({}, task=name)
    assert r.dbsize() == 0 and dict(q.tasks) == {}


def test_the_longest_allowed_name_and_a_default_locals_name_work(make_queue: Any) -> None:
    q = make_queue("q")
    longest = "a" * MAX_TASK_NAME_CHARS
    assert q.get(q.schedule({}, task=longest)).task_name == longest

    def inner() -> None: ...

    registered = q.task(inner)
    assert "<locals>" in registered.name and q.get(registered.schedule()).task_name == (
        registered.name
    )


def test_two_functions_under_one_name_are_refused(make_queue: Any) -> None:
    q = make_queue("q")
    q.task(name="one")(lambda: None)
    with pytest.raises(dueq.ConfigurationError, match="already has a task named 'one'"):
        q.task(name="one")(lambda: 1)


def test_positional_only_parameters_are_refused_at_decoration(make_queue: Any) -> None:
    q = make_queue("q")

    def f(a: int, /) -> None: ...

    with pytest.raises(dueq.ConfigurationError, match="positional-only"):
        q.task(f)


def test_the_task_map_is_read_only(make_queue: Any) -> None:
    q = make_queue("q")
    with pytest.raises(TypeError):
        q.tasks["x"] = None


# -- the envelope ---------------------------------------------------------------------------


def test_a_task_without_a_name_is_stored_exactly_as_before(make_queue: Any, r: redis.Redis):
    q = make_queue("q")
    tid = q.schedule({"to": "a"})
    assert r.hget(_target(q).keys.tasks, tid) == b'1:{"to":"a"}'
    assert encode_envelope({"to": "a"}, 100) == b'1:{"to":"a"}'


def test_the_name_is_one_head_line_before_the_payload_with_the_trace_after_it() -> None:
    named = encode_envelope({"to": "a"}, 100, task_name="send_welcome")
    assert named == b'1:~@send_welcome\n{"to":"a"}'
    traced = encode_envelope({"to": "a"}, 100, trace=TRACE.line(), task_name="send_welcome")
    assert (
        traced == b"1:~@send_welcome 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        b' k=v\n{"to":"a"}'
    )
    assert decode_named(traced) == ({"to": "a"}, dueq.TaskOptions(), TRACE, "send_welcome")
    assert decode_named(named)[2:] == (None, "send_welcome")


@pytest.mark.parametrize("trace", [b"", TRACE.line()])
def test_a_reader_that_knows_only_trace_lines_reads_a_named_tasks_payload(trace: bytes) -> None:
    """What readers before named tasks did (envelope.py before issue 28): a head line starting
    with ``~`` is a trace line, read with trace_context_of (None when unreadable), then JSON."""
    stored = encode_envelope({"to": "a"}, 100, trace=trace, task_name="send_welcome")
    body = stored[2:]
    assert body.startswith(b"~")
    line, _, payload = body.partition(b"\n")
    assert trace_context_of(line[1:]) is None  # an unreadable trace: never costs the task
    assert json.loads(payload) == {"to": "a"}


def test_list_tasks_grep_reads_the_payload_of_a_named_traced_task(make_queue: Any) -> None:
    q = make_queue("q")
    tid = q.schedule({"to": "needle"}, task="send_welcome")
    assert [t.id for t in q.list_tasks("scheduled", grep="needle").tasks] == [tid]
    assert q.list_tasks("scheduled", grep="send_welcome").tasks == []  # the name is no payload


def test_a_stored_name_that_is_unreadable_sends_the_task_to_dead_at_claim(
    make_queue: Any, r: redis.Redis
) -> None:
    q = make_queue("q")
    tid = q.schedule({"to": "a"}, task="send_welcome")
    r.hset(_target(q).keys.tasks, tid, b'1:~@-bad\xff\n{"to":"a"}')
    assert q.claim() == []
    [error] = q.get(tid).errors
    assert error.type == "PayloadError" and "task name" in error.message


def test_a_sharded_queue_dispatches_named_tasks_from_every_shard(
    make_queue: Any, r: redis.Redis, clock: Any
) -> None:
    q = make_queue("sq", shards=2)
    seen: list[int] = []

    @q.task(name="count")
    def count(n: int) -> None:
        seen.append(n)

    for n in range(8):
        count.schedule(n=n, id=f"t{n}")
    run_worker(q, lambda: len(seen) == 8)
    assert sorted(seen) == list(range(8))
    assert dueq.Queue("sq", r, clock=clock, shards=2).stats().dead == 0


def test_a_named_task_schedules_with_every_option_queue_schedule_takes(
    make_queue: Any, clock: Any
) -> None:
    q = make_queue("q")
    q.configure(keep_results=3600)

    @q.task(name="mail")
    def mail(to: str) -> None: ...

    @q.task(name="store")
    def store(key: str) -> None: ...

    parent = q.schedule({"p": 1}, id="parent")
    child = mail.schedule(
        to="a",
        id="child",
        expires=timedelta(minutes=10),
        batch="b1",
        after=[parent],
        after_policy="run",
    )
    info = q.get(child)
    assert info.state == "waiting" and info.task_name == "mail"
    assert info.expires_at is not None
    assert info.expires_at.timestamp() == pytest.approx(clock() + 600)
    assert q.batch("b1").total == 1
    for n in range(3):  # each call moves the debounced task to that call + 5 s
        store.schedule_args(
            {"key": f"k{n}"}, id="deb", debounce=timedelta(seconds=5), max_wait=60, batch="b2"
        )
        clock.advance(2)
    assert q.get("deb").due_at.timestamp() == pytest.approx(clock() - 2 + 5)
    assert q.get("deb").payload == {"key": "k2"} and q.batch("b2").total == 1
    with pytest.raises(dueq.InvalidTaskError, match="max_wait"):
        mail.schedule(to="x", max_wait=5)  # checked where Queue.schedule checks it
    # the many-variant row carries them too
    row = mail.task({"to": "r"}, id="row", batch="b1", after=["child"], expires=30)
    assert q.schedule_many([row]).added == 1
    assert q.get("row").state == "waiting" and q.batch("b1").total == 2


def test_named_task_options_are_exactly_queue_schedule_options() -> None:
    """Every option ``Queue.schedule`` takes (but the payload and the name) is an option of
    ``fn.schedule``/``schedule_args`` on both front ends, and of ``fn.task`` (bar ``replace``,
    which belongs to the call): a new option cannot be left out again."""
    import inspect

    from dueq.named import OPTION_NAMES, AsyncTaskFunction, TaskFunction

    def keywords(fn: Any) -> set[str]:
        return {
            p.name
            for p in inspect.signature(fn).parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY
        }

    queue_options = keywords(dueq.Queue.schedule) - {"task"}
    assert keywords(dueq.AsyncQueue.schedule) - {"task"} == queue_options
    assert set(OPTION_NAMES) == queue_options
    for fn in (
        TaskFunction.schedule,
        TaskFunction.schedule_args,
        AsyncTaskFunction.schedule,
        AsyncTaskFunction.schedule_args,
    ):
        assert keywords(fn) == queue_options, fn.__qualname__
    assert keywords(TaskFunction.task) == queue_options - {"replace"}


def test_a_named_envelope_decodes_in_place_with_no_more_calls_than_a_plain_one() -> None:
    """Issue 31: a worker of named tasks decodes one per delivery; after its name has been read
    once, it takes the plain envelope's fast path (the JSON read in place after the name line),
    and malformed or traced ones still take the general path that reports them."""
    payload = {"k": "R", "tid": 7, "payload": "x" * 100}
    named = encode_envelope(payload, 1000, task_name="bench_task")
    plain = encode_envelope(payload, 1000)
    assert decode_named(named) == (payload, dueq.TaskOptions(), None, "bench_task")
    assert calls(lambda: decode_named(named)) <= calls(lambda: decode_named(plain)) + 1
    traced = encode_envelope(payload, 1000, trace=TRACE.line(), task_name="bench_task")
    assert decode_named(traced) == (payload, dueq.TaskOptions(), TRACE, "bench_task")
    with pytest.raises(dueq.PayloadError):
        decode_named(b"1:~@bench_task\n{not json")
    with pytest.raises(dueq.PayloadError):
        decode_named(b"1:~@bench_task")  # no payload after the name
    assert decode_named(b'1:~@bench_task\n {"a": 1} ')[0] == {"a": 1}  # white space: json.loads


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"k": [value]}
    return value


@pytest.mark.parametrize(
    ("value", "is_json"),
    [
        (float("nan"), False),
        (float("inf"), False),
        ({"a": [1, {"b": object()}]}, False),
        ((1, 2), True),  # JSON encodes a tuple as a list
        ({1: "a"}, True),  # and an int key as a string
        (_nested(12), True),  # deeper than the quick walk looks: the encoder judges
        ({"x": 1.5, "y": [True, None, "s"]}, True),
    ],
)
def test_the_dispatcher_refuses_exactly_the_return_values_json_cannot_encode(
    make_queue: Any, value: Any, is_json: bool
) -> None:
    q = make_queue("q")

    @q.task(name="returns")
    def returns() -> Any:
        return value

    returns.schedule()
    [d] = q.claim()
    run = dispatcher([_target(q)], None, on_loop=False)
    if is_json:
        assert run(_target(d)) is value
    else:
        with pytest.raises(dueq.Unrecoverable, match="returned a value that is not JSON"):
            run(_target(d))
