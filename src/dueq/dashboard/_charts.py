"""Figures drawn or exposed on the server: the SVG charts and the Prometheus ``/metrics``.

The charts are SVG (``_svg``), so the pages need no script to draw them; ``/metrics`` is the
text of ``dueq.metrics.QueueCollector`` over the shown queues (the ``metrics`` extra).
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from dueq.dashboard import _svg
from dueq.dashboard._context import Context, Unreadable
from dueq.dashboard._guard import HttpProblem
from dueq.dashboard._reads import HISTOGRAM_BUCKET, HISTOGRAM_BUCKETS, sum_history


@dataclass(frozen=True)
class Charts:
    """The chart and metrics endpoints over the shared context."""

    ctx: Context

    async def throughput_svg(self, request: Request) -> Response:
        only = request.query_params.get("queue")
        names = [(await self.ctx.known_queue(only)).name] if only else await self.ctx.names()
        found = await self.ctx.each_queue(names, lambda q: q.history(60))
        histories = [h for h in found.values() if not isinstance(h, Unreadable)]
        title = f"queue {only}" if only else f"{len(names)} queues"
        svg = _svg.throughput(sum_history(histories), f"per minute, {title}")
        return Response(svg, media_type="image/svg+xml")

    async def due_svg(self, request: Request) -> Response:
        q = await self.ctx.known_queue(request.query_params.get("queue"))
        hist = await q.due_histogram(HISTOGRAM_BUCKET, HISTOGRAM_BUCKETS)
        return Response(_svg.due_histogram(hist, f"queue {q.name}"), media_type="image/svg+xml")

    async def metrics(self, request: Request) -> Response:
        try:
            from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

            from dueq.metrics import QueueCollector
        except ImportError as exc:
            raise HttpProblem(501, f"{exc}: pip install 'dueq[metrics]'") from None
        registry = CollectorRegistry()
        registry.register(QueueCollector(self.ctx.sync(), list(self.ctx.settings.queues) or None))
        text = await run_in_threadpool(generate_latest, registry)
        return Response(text, media_type=CONTENT_TYPE_LATEST)
