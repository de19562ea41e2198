"""OpenTelemetry tracing of producers and consumers (the ``otel`` extra), written once for both
front ends and both processors.

What it does, following the OpenTelemetry semantic conventions for messaging spans:

- **Creation context.** ``schedule``/``schedule_many`` called while a valid span context is
  current store a W3C trace context with each task (a trace line in the envelope head, see
  ``envelope``). With a tracer provider set (the SDK), the call is wrapped in one span
  ``send <queue>`` of kind PRODUCER (``messaging.operation.type`` "send"), and *its* context
  is the one stored, so the link a consumer makes always goes from a CONSUMER to a PRODUCER
  span, as the conventions ask. Without a provider (only the API installed, a context arriving
  from elsewhere) the current context itself is stored: it still propagates.
  A task scheduled outside any span stores nothing and starts no trace: dueq is a library, not
  an auto-instrumentation, and a root span per schedule (cron runs, scripts) would add bytes
  and traces nobody asked for.
- **One span per attempt.** The consumer runs each handler inside a span ``process <queue>``
  of kind CONSUMER that is a new root *linked* to the stored context (a message may wait
  hours and be tried many times: each attempt is its own trace; the conventions make the link
  a requirement and the parent optional). The span is current while the handler runs, so the
  handler's own spans are its children. A handler that raises (or runs past its timeout) ends
  it with status ERROR, the exception recorded and ``error.type`` set.
- **Costs.** Without opentelemetry installed the import below fails once and every function
  returns at its first line. With the API but no SDK (no tracer provider) a consumer pays one
  check per delivery (``tracer()``: a clock read and a cached answer) and a producer one
  context lookup per ``schedule_many`` call; nothing else happens.

A stored context that is unreadable (corrupted in Redis) is ignored when the envelope is read:
the task runs, unlinked.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dueq._version import __version__
from dueq._wire.envelope import TraceContext

if TYPE_CHECKING:
    from dueq.delivery import DeliveryBase

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
except ImportError:  # the otel extra is not installed: tracing is off
    trace = None  # type: ignore[assignment]

logger = logging.getLogger("dueq._tracing")

__all__ = [
    "SYSTEM",
    "ProducerSpan",
    "end_attempt",
    "producer",
    "start_attempt",
    "start_call",
    "tracer",
]

#: ``messaging.system`` of every span dueq makes.
SYSTEM = "dueq"
_SCOPE = "dueq"
#: While no tracer provider is set, how often ``tracer()`` looks again (s): the API's lookup
#: reads the environment when none is set (a microsecond or two), too much per delivery.
RECHECK_S = 1.0
#: (the provider last seen, its tracer or None, monotonic time of the next look when None)
_cache: tuple[object, Any, float] = (None, None, 0.0)
_end_lock = threading.Lock()
_warned = False


def _trouble(error: Exception) -> None:
    """Tracing itself failed (a span processor or exporter raised): the task goes on
    untraced. Logged as a warning once per process, then at debug level."""
    global _warned
    level, _warned = (logging.DEBUG if _warned else logging.WARNING), True
    logger.log(level, "OpenTelemetry tracing failed; going on without it: %r", error)


def tracer() -> Any:
    """dueq's tracer when a tracer provider is set (the SDK, or any real one), else None.

    This is what an untraced consumer pays per delivery: without a provider, a clock read
    (the API is asked again every ``RECHECK_S``, so a provider set later is used within that
    time); with one, the API's global provider compared with the one last seen."""
    global _cache
    if trace is None:
        return None
    seen, found, recheck_at = _cache
    if found is None and time.monotonic() < recheck_at:
        return None
    provider = trace.get_tracer_provider()
    if provider is not seen:
        if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
            found = None
        else:
            found = provider.get_tracer(_SCOPE, __version__)
    _cache = (provider, found, time.monotonic() + RECHECK_S)
    return found


def _context_of(span_context: Any) -> TraceContext:
    state = span_context.trace_state
    return TraceContext(
        f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-"
        f"{span_context.trace_flags:02x}",
        state.to_header() if state else None,
    )


class ProducerSpan:
    """What ``schedule_many`` stores with its tasks (``line``), and the ``send`` span around
    it when a tracer provider is set (``span``, else None)."""

    __slots__ = ("line", "span")

    def __init__(self, line: bytes, span: Any) -> None:
        self.line = line
        self.span = span

    def sent(self, ids: list[str]) -> None:
        """The tasks are stored: name them on the span and end it."""
        span = self.span
        if span is None:
            return
        try:
            if len(ids) == 1:
                span.set_attribute("messaging.message.id", ids[0])
            else:
                span.set_attribute("messaging.batch.message_count", len(ids))
            span.end()
        except Exception as exc:  # a span processor's bug: the tasks are scheduled all the same
            _trouble(exc)

    def failed(self, error: BaseException) -> None:
        """Scheduling raised ``error``: end the span with it."""
        if self.span is None:
            return
        try:
            _record(self.span, error)
            self.span.end()
        except Exception as exc:  # a span processor's bug: the caller gets ``error`` anyway
            _trouble(exc)


def producer(queue_name: str) -> ProducerSpan | None:
    """The creation context for tasks scheduled now, or None outside any span (or without
    opentelemetry): see the module docstring."""
    if trace is None:
        return None
    current = trace.get_current_span()
    if not current.get_span_context().is_valid:
        return None
    found = tracer()
    if found is None:
        return ProducerSpan(_context_of(current.get_span_context()).line(), None)
    try:
        span = found.start_span(
            f"send {queue_name}",
            kind=trace.SpanKind.PRODUCER,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.destination.name": queue_name,
                "messaging.operation.type": "send",
                "messaging.operation.name": "send",
            },
        )
    except Exception as exc:  # a span processor's bug: schedule untraced rather than fail
        _trouble(exc)
        return None
    return ProducerSpan(_context_of(span.get_span_context()).line(), span)


def _link(stored: TraceContext | None) -> list[Any]:
    """The link to a stored creation context ([] when there is none, or it is not valid)."""
    if stored is None:
        return []
    # imported here, once a tracer is set: a worker that traces nothing never needs it
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    span_context = trace.get_current_span(
        TraceContextTextMapPropagator().extract(stored.headers())
    ).get_span_context()
    return [trace.Link(span_context)] if span_context.is_valid else []


class AttemptSpan:
    """The span of one attempt and the context token that makes it current."""

    __slots__ = ("_token", "ended", "span")

    def __init__(self, span: Any) -> None:
        self.span = span
        self._token: Any = None
        self.ended = False

    def enter(self) -> None:
        """Make the span current in this thread (or task) while the handler runs."""
        self._token = otel_context.attach(trace.set_span_in_context(self.span))

    def leave(self) -> None:
        """Undo ``enter`` (in the same thread or task)."""
        if self._token is not None:
            otel_context.detach(self._token)
            self._token = None


def start_attempt(d: DeliveryBase) -> AttemptSpan | None:
    """Start the span of this attempt of ``d`` (None when no tracer provider is set)."""
    found = tracer()
    if found is None:
        return None
    name = d.queue_name
    holder = d.token.partition("@")[2]
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": name,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.message.id": d.id,
        "messaging.dueq.message.attempt": d.attempt,
    }
    if holder:
        attributes["messaging.client.id"] = holder
    try:
        span = found.start_span(
            f"process {name}",
            context=otel_context.Context(),  # a root: the creation context is a link
            kind=trace.SpanKind.CONSUMER,
            links=_link(d.trace_context),
            attributes=attributes,
        )
    except Exception as exc:  # a span processor's bug: run the handler untraced
        _trouble(exc)
        return None
    return AttemptSpan(span)


def start_call(deliveries: Sequence[DeliveryBase]) -> AttemptSpan | None:
    """Start the span of one bulk handler call over ``deliveries`` (None when no tracer
    provider is set): one span for the call, with a link to each item's creation context."""
    found = tracer()
    if found is None or not deliveries:
        return None
    name = deliveries[0].queue_name
    links: list[Any] = []
    for d in deliveries:
        links += _link(d.trace_context)
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": name,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.batch.message_count": len(deliveries),
    }
    try:
        span = found.start_span(
            f"process {name}",
            context=otel_context.Context(),  # a root: the items' creation contexts are links
            kind=trace.SpanKind.CONSUMER,
            links=links,
            attributes=attributes,
        )
    except Exception as exc:  # a span processor's bug: run the handler untraced
        _trouble(exc)
        return None
    return AttemptSpan(span)


def end_attempt(attempt: AttemptSpan | None, error: BaseException | None) -> None:
    """End the span of an attempt, with ``error`` if the handler failed; the first call wins
    (a threaded handler past its timeout is ended by the lease keeper, and again when it
    returns)."""
    if attempt is None:
        return
    with _end_lock:
        if attempt.ended:
            return
        attempt.ended = True
    try:
        if error is not None:
            _record(attempt.span, error)
        attempt.span.end()
    except Exception as exc:  # a span processor's bug must not stop settling the delivery
        _trouble(exc)


def _record(span: Any, error: BaseException) -> None:
    kind = type(error)
    module = kind.__module__
    name = kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"
    span.set_attribute("error.type", name)
    span.record_exception(error)
    span.set_status(trace.Status(trace.StatusCode.ERROR, f"{kind.__name__}: {error}"[:200]))
