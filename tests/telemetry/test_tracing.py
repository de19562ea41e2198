"""OpenTelemetry tracing (the ``otel`` extra) against a real Redis: the creation context stored
with a task, the consumer's span per attempt linked to it, on the threaded and the asyncio
processors; spans read back from the SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from conftest import async_mirror
from internals_support import look_again_for_tracer
from internals_support import tracing as _tracing
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.util._once import Once

import dueq
from dueq._wire.envelope import TaskOptions, decode_delivery, encode_envelope
from dueq._wire.keys import QueueKeys
from dueq._wire.scripts import assemble, read_include
from dueq.server import RedisServer

WAIT_S = 30  # an upper bound for what takes milliseconds, never a measurement
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """A tracer provider for this test only (the API allows one per process: the globals are
    put back afterwards, as opentelemetry's own test utilities do)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    saved = (trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE)
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace.set_tracer_provider(provider)
    look_again_for_tracer()  # dueq looks again now, not within RECHECK_S
    yield exporter
    trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE = saved
    look_again_for_tracer()
    provider.shutdown()


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def wait_for(condition: Callable[[], Any], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def stored(r: redis.Redis, task_id: str, queue: str = "q") -> bytes:
    value = r.hget(QueueKeys.for_queue(queue).tasks, task_id)
    assert isinstance(value, bytes)
    return value


def run_threaded(q: dueq.Queue, handler: Any, outcomes: int) -> list[dueq.Outcome]:
    """Run ``process`` on ``q`` until ``outcomes`` outcomes came; dispose."""
    got: list[dueq.Outcome] = []
    done = threading.Event()

    def on_next(o: dueq.Outcome) -> None:
        got.append(o)
        if len(got) >= outcomes:
            done.set()

    stream = q.observe().pipe(dueq.operators.process(handler, 2))
    sub = stream.subscribe(on_next=on_next)
    try:
        assert done.wait(WAIT_S), got
    finally:
        sub.dispose()
    return got


def run_async(server: RedisServer, name: str, body: Callable[[dueq.AsyncQueue], Any]) -> Any:
    """Run ``body(queue)`` on a fresh loop (the test asks for ``r``: a flushed server)."""

    async def main() -> Any:
        client = async_mirror(server.client())
        try:
            return await body(dueq.AsyncQueue(name, client, retry=fast_retry()))
        finally:
            await client.aclose()

    return asyncio.run(main())


async def process_async(q: dueq.AsyncQueue, handler: Any, outcomes: int) -> list[dueq.Outcome]:
    got: list[dueq.Outcome] = []
    changed = asyncio.Event()

    def on_next(o: dueq.Outcome) -> None:
        got.append(o)
        changed.set()

    stream = q.observe().pipe(dueq.operators.process(handler, 2))
    sub = stream.subscribe(on_next=on_next)
    try:
        async with asyncio.timeout(WAIT_S):
            while len(got) < outcomes:
                changed.clear()
                await changed.wait()
    finally:
        sub.dispose()
        await asyncio.sleep(0.1)  # let the disposed claim loop stop before the client closes
    return got


def fast_retry() -> dueq.RetryPolicy:
    return dueq.RetryPolicy(max_attempts=3, wait=lambda state: 0.0)


def check_consumer_span(span: ReadableSpan, producer: ReadableSpan, task_id: str) -> None:
    """``span`` is a process span of ``task_id`` linked to ``producer`` per the conventions."""
    assert span.kind is SpanKind.CONSUMER
    assert span.parent is None  # a root: the creation context is a link, not a parent
    assert [(link.context.trace_id, link.context.span_id) for link in span.links] == [
        (producer.context.trace_id, producer.context.span_id)
    ]
    attributes = dict(span.attributes or {})
    assert attributes["messaging.system"] == "dueq"
    assert attributes["messaging.destination.name"] == "q"
    assert attributes["messaging.operation.type"] == "process"
    assert attributes["messaging.operation.name"] == "process"
    assert attributes["messaging.message.id"] == task_id
    assert attributes["messaging.client.id"]  # the worker id the lease names


# -- producer: what schedule stores --------------------------------------------------------


def test_schedule_inside_a_span_stores_its_send_spans_context_in_the_envelope(
    make_queue: Callable[..., Any], r: redis.Redis, spans: InMemorySpanExporter
) -> None:
    q = make_queue()
    with trace.get_tracer("app").start_as_current_span("request") as request:
        q.schedule({"to": "a"}, id="t1")
    [send] = named(spans, "send q")
    assert send.kind is SpanKind.PRODUCER
    assert send.parent == request.get_span_context()
    attributes = dict(send.attributes or {})
    assert attributes["messaging.system"] == "dueq"
    assert attributes["messaging.destination.name"] == "q"
    assert attributes["messaging.operation.type"] == "send"
    assert attributes["messaging.message.id"] == "t1"
    assert "messaging.batch.message_count" not in attributes
    ctx = send.context
    traceparent = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"
    assert stored(r, "t1") == b"1:~" + traceparent.encode() + b'\n{"to":"a"}'
    [d] = q.claim(1)
    assert d.trace_context == dueq.TraceContext(traceparent, None)
    assert d.payload == {"to": "a"}


def test_a_batch_is_one_send_span_whose_context_every_task_stores(
    make_queue: Callable[..., Any], r: redis.Redis, spans: InMemorySpanExporter
) -> None:
    q = make_queue()
    with trace.get_tracer("app").start_as_current_span("request"):
        q.schedule_many(dueq.Task(i, id=f"t{i}", priority=i % 2) for i in range(3))
    [send] = named(spans, "send q")
    assert dict(send.attributes or {})["messaging.batch.message_count"] == 3
    assert "messaging.message.id" not in dict(send.attributes or {})
    contexts = {d.trace_context for d in q.claim(10)}
    assert len(contexts) == 1
    [context] = contexts
    assert context is not None and f"{send.context.span_id:016x}" in context.traceparent


def test_a_failed_schedule_ends_its_send_span_with_error(
    make_queue: Callable[..., Any], spans: InMemorySpanExporter
) -> None:
    q = make_queue()
    with (
        trace.get_tracer("app").start_as_current_span("request"),
        pytest.raises(dueq.PayloadError),
    ):
        q.schedule({"bad": {1, 2}})
    [send] = named(spans, "send q")
    assert send.status.status_code is StatusCode.ERROR
    assert dict(send.attributes or {})["error.type"] == "dueq.exceptions.PayloadError"


def test_a_task_scheduled_outside_any_span_stores_no_trace_and_its_span_has_no_link(
    r: redis.Redis, spans: InMemorySpanExporter
) -> None:
    q = dueq.Queue("q", r)
    q.schedule({"a": 1}, id="plain")
    q.schedule({"a": 1}, id="opt", priority=1)
    assert stored(r, "plain") == b'1:{"a":1}'  # byte-identical to an untraced dueq
    assert stored(r, "opt") == b'2:1|||\n{"a":1}'
    assert named(spans, "send q") == []
    run_threaded(q, lambda d: None, 2)
    processed = named(spans, "process q")
    assert len(processed) == 2
    assert all(not s.links for s in processed)


def test_without_a_tracer_provider_the_current_context_is_stored_as_it_is(
    make_queue: Callable[..., Any], r: redis.Redis
) -> None:
    assert _tracing.tracer() is None  # only the API: no provider set
    q = make_queue()
    remote = trace.SpanContext(
        0x4BF92F3577B34DA6A3CE929D0E0E4736,
        0x00F067AA0BA902B7,
        is_remote=True,
        trace_flags=trace.TraceFlags(1),
        trace_state=trace.TraceState([("vendor", "v1"), ("other", "x y")]),
    )
    with trace.use_span(trace.NonRecordingSpan(remote)):
        q.schedule({}, id="t")
    line = b"~" + TRACEPARENT.encode() + b" vendor=v1,other=x y\n"
    assert stored(r, "t") == b"1:" + line + b"{}"
    [d] = q.claim(1)
    assert d.trace_context == dueq.TraceContext(TRACEPARENT, "vendor=v1,other=x y")
    assert d.trace_context.headers() == {
        "traceparent": TRACEPARENT,
        "tracestate": "vendor=v1,other=x y",
    }


def test_a_tracer_provider_set_after_the_first_look_is_used_within_recheck_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_tracing, "RECHECK_S", 3600.0)
    monkeypatch.setattr(_tracing, "_cache", (None, None, 0.0))
    assert _tracing.tracer() is None  # no provider: not asked again for RECHECK_S
    saved = (trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE)
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace.set_tracer_provider(TracerProvider())
    try:
        assert _tracing.tracer() is None
        seen, _, _ = _tracing._cache
        monkeypatch.setattr(_tracing, "_cache", (seen, None, 0.0))  # RECHECK_S has passed
        assert _tracing.tracer() is not None
    finally:
        trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE = saved


def test_a_trace_adds_57_bytes_to_a_task() -> None:
    """The measured cost of tracing in Redis: one head line, "~" + traceparent + newline."""
    line = dueq.TraceContext(TRACEPARENT).line()
    for options in (TaskOptions(), TaskOptions(3, "k", 5000, 4)):
        plain = encode_envelope({"to": "a"}, 1000, options)
        traced = encode_envelope({"to": "a"}, 1000, options, line)
        assert len(traced) - len(plain) == 57


def test_a_tracestate_too_long_to_keep_is_dropped_and_the_traceparent_kept() -> None:
    state = ",".join(f"k{i}=" + "v" * 20 for i in range(30))  # over 512 characters
    assert dueq.TraceContext(TRACEPARENT, state).line() == b"~" + TRACEPARENT.encode() + b"\n"


def test_the_stored_context_survives_retry_release_expiry_replay_and_reschedule(
    make_queue: Callable[..., Any], clock: Any, spans: InMemorySpanExporter
) -> None:
    q = make_queue(lease=5)
    with trace.get_tracer("app").start_as_current_span("request"):
        q.schedule({"n": 1}, id="t", priority=2, key="k")
    [d] = q.claim(1)
    context = d.trace_context
    assert context is not None
    d.fail(ValueError("boom"), retry_in=0)  # retried
    [d] = q.claim(1)
    assert d.trace_context == context
    d.release()  # released
    [d] = q.claim(1)
    assert d.trace_context == context
    clock.advance(6)  # its lease expires: reclaimed
    assert q.claim(0) == []
    clock.advance(10)
    [d] = q.claim(1)
    assert d.trace_context == context
    d.fail(dueq.Unrecoverable("dead"))
    assert q.dead.replay(["t"]) == 1  # replayed
    assert q.reschedule("t", delay=1)  # rescheduled (no replace)
    clock.advance(2)
    [d] = q.claim(1)
    assert (d.trace_context, d.payload, d.priority, d.key) == (context, {"n": 1}, 2, "k")


# -- Lua and Python read the same head ------------------------------------------------------


LUA_PROBE = """-- the probe
-- @include levels

local p, attempts, key = task_options(ARGV[1])
return {p, attempts or -1, key or '', task_key(ARGV[1]) or ''}
"""


@pytest.mark.parametrize(
    "options",
    [
        TaskOptions(),
        TaskOptions(priority=4),
        TaskOptions(key="tenant|7 ~x"),
        TaskOptions(7, "k", 2500, 9),
        TaskOptions(0, None, None, 2),
    ],
    ids=["none", "priority", "key", "all", "attempts"],
)
@pytest.mark.parametrize("tracestate", [None, "a=1,b=2 3"], ids=["parent", "state"])
def test_the_lua_and_python_parsers_agree_on_traced_tasks(
    r: redis.Redis, options: TaskOptions, tracestate: str | None
) -> None:
    line = dueq.TraceContext(TRACEPARENT, tracestate).line()
    envelope = encode_envelope({"x": "~00-\n"}, 1000, options, line)
    payload, read, context = decode_delivery(envelope)
    assert (payload, read, context) == (
        {"x": "~00-\n"},
        options,
        dueq.TraceContext(TRACEPARENT, tracestate),
    )
    reply = r.eval(assemble(LUA_PROBE, "probe", read_include), 0, envelope)
    expected_key = (options.key or "").encode()
    assert reply == [
        options.priority,
        options.max_attempts or -1,
        expected_key,
        expected_key,
    ]


def test_a_payload_search_reads_past_the_trace_line(
    r: redis.Redis, spans: InMemorySpanExporter
) -> None:
    q = dueq.Queue("q", r)
    with trace.get_tracer("app").start_as_current_span("request"):
        q.schedule({"to": "bob"}, id="plain")
        q.schedule({"to": "bob"}, id="opt", key="k")
    assert {t.id for t in q.list_tasks("scheduled", grep="bob").tasks} == {"plain", "opt"}
    assert q.list_tasks("scheduled", grep="~00-").tasks == []  # the trace is not payload
    assert q.get("opt") is not None and q.get("opt").payload == {"to": "bob"}  # type: ignore[union-attr]


# -- consumers: one span per attempt, linked ------------------------------------------------


@pytest.mark.parametrize("kind", ["thread", "async def"])
def test_the_threaded_processors_span_links_to_the_producer_and_parents_the_handlers(
    r: redis.Redis, spans: InMemorySpanExporter, kind: str
) -> None:
    q = dueq.Queue("q", r, retry=fast_retry())
    app = trace.get_tracer("app")
    with app.start_as_current_span("request"):
        q.schedule({"to": "a"}, id="t1")

    def handle(d: dueq.Delivery) -> None:
        with app.start_as_current_span("handler work"):
            pass

    async def handle_async(d: dueq.Delivery) -> None:
        await asyncio.sleep(0)
        handle(d)

    run_threaded(q, handle if kind == "thread" else handle_async, 1)
    [send] = named(spans, "send q")
    [process] = named(spans, "process q")
    check_consumer_span(process, send, "t1")
    assert dict(process.attributes or {})["messaging.dueq.message.attempt"] == 1
    assert process.status.status_code is StatusCode.UNSET
    [work] = named(spans, "handler work")
    assert work.parent == process.context


@pytest.mark.parametrize("kind", ["async def", "sync in the pool"])
def test_the_async_processors_span_links_to_the_producer_and_parents_the_handlers(
    redis_server: RedisServer, r: redis.Redis, spans: InMemorySpanExporter, kind: str
) -> None:
    app = trace.get_tracer("app")

    def work(d: Any) -> None:
        with app.start_as_current_span("handler work"):
            pass

    async def handle(d: dueq.AsyncDelivery) -> None:
        await asyncio.sleep(0)
        work(d)

    async def body(q: dueq.AsyncQueue) -> None:
        with app.start_as_current_span("request"):
            await q.schedule({"to": "a"}, id="t1")
        await process_async(q, handle if kind == "async def" else work, 1)

    run_async(redis_server, "q", body)
    [send] = named(spans, "send q")
    [process] = named(spans, "process q")
    check_consumer_span(process, send, "t1")
    [work_span] = named(spans, "handler work")
    assert work_span.parent == process.context


def test_every_attempt_has_its_own_span_linked_to_the_same_producer_and_failures_are_errors(
    r: redis.Redis, spans: InMemorySpanExporter
) -> None:
    q = dueq.Queue("q", r, retry=fast_retry())
    with trace.get_tracer("app").start_as_current_span("request"):
        q.schedule({}, id="t1")

    def handle(d: dueq.Delivery) -> None:
        if d.attempt == 1:
            raise ValueError("smtp timeout")

    outcomes = run_threaded(q, handle, 2)
    assert [(o.kind, o.attempt) for o in outcomes] == [("retried", 1), ("acked", 2)]
    [send] = named(spans, "send q")
    first, second = sorted(
        named(spans, "process q"),
        key=lambda s: dict(s.attributes or {})["messaging.dueq.message.attempt"],
    )
    for span in (first, second):
        check_consumer_span(span, send, "t1")
    assert first.context.trace_id != second.context.trace_id  # each attempt its own trace
    assert first.status.status_code is StatusCode.ERROR
    assert dict(first.attributes or {})["error.type"] == "ValueError"
    [event] = first.events
    assert event.name == "exception"
    assert dict(event.attributes or {})["exception.message"] == "smtp timeout"
    assert second.status.status_code is StatusCode.UNSET


def test_an_async_handlers_failure_is_an_error_span(
    redis_server: RedisServer, r: redis.Redis, spans: InMemorySpanExporter
) -> None:
    async def handle(d: dueq.AsyncDelivery) -> None:
        raise KeyError("nope")

    async def body(q: dueq.AsyncQueue) -> None:
        await q.schedule({}, id="t1")
        await process_async(q, handle, 1)

    run_async(redis_server, "q", body)
    [span, *_] = named(spans, "process q")
    assert span.status.status_code is StatusCode.ERROR
    assert dict(span.attributes or {})["error.type"] == "KeyError"


def test_a_threaded_handler_past_its_timeout_ends_its_span_with_the_timeout(
    r: redis.Redis, spans: InMemorySpanExporter
) -> None:
    q = dueq.Queue("q", r, retry=dueq.RetryPolicy(max_attempts=1))
    q.schedule({}, id="slow", timeout=0.05)
    outcomes = run_threaded(q, lambda d: time.sleep(0.5), 1)
    assert outcomes[0].kind == "dead"
    [span] = named(spans, "process q")  # ended by the keeper, before the handler returned
    assert span.status.status_code is StatusCode.ERROR
    assert dict(span.attributes or {})["error.type"] == "dueq.exceptions.TaskTimeout"


def test_an_async_handler_past_its_timeout_ends_its_span_with_the_timeout(
    redis_server: RedisServer, r: redis.Redis, spans: InMemorySpanExporter
) -> None:
    async def handle(d: dueq.AsyncDelivery) -> None:
        await asyncio.sleep(WAIT_S)

    async def body(q: dueq.AsyncQueue) -> None:
        await q.schedule({}, id="slow", timeout=0.05, max_attempts=1)
        await process_async(q, handle, 1)

    run_async(redis_server, "q", body)
    [span] = named(spans, "process q")
    assert dict(span.attributes or {})["error.type"] == "dueq.exceptions.TaskTimeout"


@pytest.mark.parametrize(
    "line",
    [
        b"~zz-not-a-traceparent",
        b"~00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # an all-zero trace id
        b"~" + TRACEPARENT.encode() + b" \xff\xfe",
        b"~",
    ],
    ids=["garbage", "zero-trace-id", "not-ascii", "empty"],
)
def test_a_corrupt_trace_line_in_redis_is_ignored_and_the_task_still_runs(
    r: redis.Redis, spans: InMemorySpanExporter, line: bytes
) -> None:
    q = dueq.Queue("q", r)
    q.schedule({"a": 1}, id="t")
    r.hset(QueueKeys.for_queue("q").tasks, "t", b"1:" + line + b'\n{"a":1}')
    seen: list[Any] = []
    outcomes = run_threaded(q, lambda d: seen.append((d.payload, d.trace_context)), 1)
    assert outcomes[0].kind == "acked"
    assert seen[0][0] == {"a": 1}
    [span] = named(spans, "process q")
    assert span.links == ()
    assert span.status.status_code is StatusCode.UNSET


def test_dueq_works_without_opentelemetry(redis_server: RedisServer, r: redis.Redis) -> None:
    """A process where ``import opentelemetry`` fails schedules, claims and processes."""
    kw = r.connection_pool.connection_kwargs
    code = f"""
import sys, json, threading
sys.modules["opentelemetry"] = None  # the import fails: as if the extra were not installed
import redis, dueq
from internals_support import tracing as _tracing
assert _tracing.trace is None and _tracing.tracer() is None and _tracing.producer("q") is None
client = redis.Redis(host={kw.get("host", "127.0.0.1")!r}, port={kw["port"]})
q = dueq.Queue("bare", client)
q.schedule({{"a": 1}}, id="t")
assert client.hget(q.keys.tasks, "t") == b'1:{{"a":1}}'
done = threading.Event()
seen = []
def handle(d):
    seen.append((d.payload, d.trace_context))
sub = q.observe().pipe(dueq.operators.process(handle)).subscribe(
    on_next=lambda o: done.set())
assert done.wait(30)
sub.dispose()
print(json.dumps(seen))
"""
    if kw.get("ssl_ca_certs") or kw.get("username"):
        pytest.skip("the subprocess connects without TLS or ACL credentials")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [[{"a": 1}, None]]


class Exploding(SpanProcessor):
    """A span processor with a bug: every span start raises."""

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        raise RuntimeError("exporter bug")


def test_a_failing_span_processor_never_fails_a_schedule_or_a_delivery(
    r: redis.Redis, spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    provider.add_span_processor(Exploding())
    q = dueq.Queue("q", r)
    with caplog.at_level("WARNING", logger="dueq._util.tracing"):
        context = trace.set_span_in_context(
            trace.NonRecordingSpan(
                trace.SpanContext(1, 2, is_remote=True, trace_flags=trace.TraceFlags(1))
            )
        )
        token = otel_context.attach(context)
        try:
            q.schedule({"a": 1}, id="t")  # its send span cannot start: untraced
        finally:
            otel_context.detach(token)
        assert stored(r, "t") == b'1:{"a":1}'
        outcomes = run_threaded(q, lambda d: None, 1)
    assert outcomes[0].kind == "acked"
    assert "OpenTelemetry tracing failed" in caplog.text


def test_no_span_attribute_or_event_of_a_sealed_task_holds_its_payload(r, spans):
    pytest.importorskip("cryptography")
    marker = "PLAINTEXT-" + os.urandom(6).hex()
    q = dueq.Queue("q", r, codec=dueq.Encrypted(keys={"k1": os.urandom(32)}), retry=fast_retry())
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("request"):
        q.schedule({"card": marker}, id="t1")

    def handler(d: dueq.Delivery) -> None:
        assert d.payload == {"card": marker}
        raise RuntimeError("card declined")

    run_threaded(q, handler, 3)
    finished = spans.get_finished_spans()
    assert named(spans, "send q") and len(named(spans, "process q")) == 3
    shown = json.dumps(
        [
            [s.name, dict(s.attributes or {}), s.status.description]
            + [[e.name, dict(e.attributes or {})] for e in s.events]
            for s in finished
        ],
        default=repr,
    )
    assert "card declined" in shown and marker not in shown
