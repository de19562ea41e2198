"""Charts as plain SVG drawn on the server: no JavaScript library, no CDN.

A chart is a few dozen elements (one polyline per series, one rect per bucket), so drawing it
costs nothing next to the Redis reads behind it, and the page needs no chart code at all. Every
piece of text is escaped; the numbers are formatted by Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from dueq.health import human_duration
from dueq.model import DueHistogram, HistoryPoint

WIDTH, HEIGHT = 720, 216
LEFT, RIGHT, TOP, BOTTOM = 48, 12, 24, 44
#: Where the x axis's time labels stand (under the axis, above the captions).
TICK_Y = HEIGHT - BOTTOM + 14
#: Hours between the due histogram's labels; minutes between the throughput chart's.
HOUR_TICKS = 3
MINUTE_TICKS = 10
#: Series of the throughput chart: (HistoryPoint field, colour).
SERIES = (("acked", "#2e7d32"), ("retried", "#ef6c00"), ("dead", "#c62828"))


def _tick(x: float, label: str) -> str:
    """A time label on the x axis at ``x``, with a short mark."""
    axis = HEIGHT - BOTTOM
    return (
        f'<line x1="{x:.1f}" y1="{axis}" x2="{x:.1f}" y2="{axis + 4}" stroke="#999"/>'
        f'<text x="{x:.1f}" y="{TICK_Y}" text-anchor="middle" class="tick">{escape(label)}</text>'
    )


def _frame(title: str, body: list[str], y_max: int) -> str:
    plot_h = HEIGHT - TOP - BOTTOM
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="11">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>',
        f'<text x="{LEFT}" y="15" font-weight="bold">{escape(title)}</text>',
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + plot_h}" stroke="#999"/>',
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{WIDTH - RIGHT}" y2="{TOP + plot_h}" '
        'stroke="#999"/>',
        f'<text x="{LEFT - 4}" y="{TOP + 8}" text-anchor="end">{y_max}</text>',
        f'<text x="{LEFT - 4}" y="{TOP + plot_h}" text-anchor="end">0</text>',
    ]
    return "".join(parts + body + ["</svg>"])


def throughput(points: Sequence[HistoryPoint], title: str) -> str:
    """Acked, retried and dead tasks per minute, one line each, oldest minute on the left."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    y_max = max([1, *(getattr(p, name) for p in points for name, _ in SERIES)])
    step = plot_w / max(1, len(points) - 1)
    body: list[str] = []
    for i, (name, colour) in enumerate(SERIES):
        xy = " ".join(
            f"{LEFT + j * step:.1f},{TOP + plot_h - getattr(p, name) * plot_h / y_max:.1f}"
            for j, p in enumerate(points)
        )
        total = sum(getattr(p, name) for p in points)
        body.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{xy}"/>')
        x = LEFT + 220 + i * 150
        body.append(f'<rect x="{x}" y="6" width="10" height="10" fill="{colour}"/>')
        body.append(f'<text x="{x + 14}" y="15">{name} ({total} in the hour)</text>')
    body += [
        _tick(LEFT + j * step, p.minute.strftime("%H:%M"))
        for j, p in enumerate(points)
        if p.minute.minute % MINUTE_TICKS == 0
    ]
    if points:
        first, last = points[0].minute, points[-1].minute
        body.append(
            f'<text x="{LEFT}" y="{HEIGHT - 8}">{escape(first.strftime("%H:%M"))} UTC</text>'
        )
        body.append(
            f'<text x="{WIDTH - RIGHT}" y="{HEIGHT - 8}" text-anchor="end">'
            f"{escape(last.strftime('%H:%M'))} UTC</text>"
        )
    return _frame(title, body, y_max)


def due_histogram(hist: DueHistogram, title: str) -> str:
    """Tasks coming due per bucket: an "overdue" bar first, then the buckets, then "later"."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    bars = [hist.overdue, *hist.counts, hist.later]
    y_max = max([1, *bars])
    width = plot_w / len(bars)
    body: list[str] = []
    for i, count in enumerate(bars):
        colour = "#c62828" if i == 0 else "#757575" if i == len(bars) - 1 else "#1565c0"
        h = count * plot_h / y_max
        body.append(
            f'<rect x="{LEFT + i * width + 1:.1f}" y="{TOP + plot_h - h:.1f}" '
            f'width="{max(1.0, width - 2):.1f}" height="{h:.1f}" fill="{colour}">'
            f"<title>{count}</title></rect>"
        )
    bucket_s = hist.bucket.total_seconds()
    span_s = bucket_s * len(hist.counts)
    # hours from now on the x axis: bucket k starts k buckets after now, in bar k + 1
    step_s = HOUR_TICKS * 3600
    body += [
        _tick(LEFT + (1 + at_s / bucket_s) * width, f"+{at_s // 3600:g} h")
        for at_s in (step_s * i for i in range(1, int(span_s // step_s) + 1))
        if at_s < span_s
    ]
    body.append(f'<text x="{LEFT}" y="{HEIGHT - 8}">overdue ({hist.overdue})</text>')
    body.append(
        f'<text x="{LEFT + plot_w / 2:.0f}" y="{HEIGHT - 8}" text-anchor="middle">'
        f"next {human_duration(span_s)} from now, {human_duration(bucket_s)} per bar</text>"
    )
    body.append(
        f'<text x="{WIDTH - RIGHT}" y="{HEIGHT - 8}" text-anchor="end">later ({hist.later})</text>'
    )
    return _frame(title, body, y_max)
