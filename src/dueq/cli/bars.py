"""What the demo's view and ``dueq top`` both draw: tasks per state as coloured bars, and
small bar charts of counts (per-minute rates, the due-time histogram)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table
from rich.text import Text

from dueq.model import QueueStats

#: The states shown, the colour of each, and what it means.
STATES = (
    ("scheduled", "cyan", "waiting in the due set: new, or retrying after a delay"),
    ("leased", "yellow", "held by a worker, running"),
    ("acked", "green", "done and removed"),
    ("retried", "magenta", "failed attempts, due again after a growing delay"),
    ("dead", "red", "out of attempts: in the dead-letter queue"),
)
STYLES = {state: style for state, style, _ in STATES}
BAR_WIDTH = 30
#: Eighths of a block, for one-line charts (a count of 0 shows as a blank).
SPARKS = " ▁▂▃▄▅▆▇█"


def state_counts(stats: QueueStats) -> dict[str, int]:
    """Tasks in each state now (scheduled, leased, dead) and so far (acked, retried)."""
    return {
        "scheduled": stats.scheduled,
        "leased": stats.leased,
        "acked": stats.counters.get("acked", 0),
        "retried": stats.counters.get("retried", 0),
        "dead": stats.dead,
    }


def bar(count: int, total: int, width: int = BAR_WIDTH) -> str:
    """``count`` of ``total`` as a run of blocks, ``width`` long for the whole."""
    return "█" * round(width * min(count / max(total, 1), 1.0))


def state_table(counts: dict[str, int], total: int, *, meanings: bool = True) -> Table:
    """One row per state: its name in its colour, the count, a bar of it against ``total``,
    and (``meanings``) what the state means."""
    table = Table(box=None, padding=(0, 1), show_header=False)
    for state, style, meaning in STATES:
        row = [
            Text(state, style=style),
            Text(f"{counts[state]:>5}"),
            Text(f"{bar(counts[state], total):<{BAR_WIDTH}}", style=style),
        ]
        table.add_row(*row, *([Text(meaning, style="dim")] if meanings else []))
    return table


def sparkline(counts: Sequence[int]) -> str:
    """One character per count, as tall as the count against the largest."""
    top = max(counts, default=0)
    if top <= 0:
        return " " * len(counts)
    return "".join(SPARKS[0 if n <= 0 else max(1, round(8 * n / top))] for n in counts)
