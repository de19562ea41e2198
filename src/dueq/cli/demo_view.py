"""The demo's screen: a live view on a terminal, plain periodic lines elsewhere, a summary."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from dueq.cli.bars import state_counts, state_table
from dueq.cli.demo_board import Board, Event
from dueq.model import QueueStats

EVENT_STYLES = {"retried": "magenta", "dead": "bold red", "source": "blue", "error": "bold red"}
TAIL = 10
PLAIN_EVERY_S = 1.0


def delays_line(board: Board) -> str:
    means = board.mean_delays()
    if not means:
        return "retry delay after a failed attempt: none yet"
    shown = ", ".join(f"#{attempt} {mean:.2f} s" for attempt, mean in means)
    return f"retry delay after a failed attempt: {shown}"


def _event_text(e: Event) -> Text:
    line = Text(f"{e.t:6.1f}s ", no_wrap=True, overflow="ellipsis")
    line.append(f"{e.kind:<8}", style=EVENT_STYLES.get(e.kind, ""))
    line.append(f" {e.text}")
    return line


def render(board: Board, stats: QueueStats, title: str) -> RenderableType:
    """One frame: sources, counts per state with bars, retry delays, the latest events."""
    sources, _, events = board.snapshot()
    counts = state_counts(stats)
    total = max(stats.counters.get("scheduled", 0), 1)
    head = Text(f"{title} · {board.elapsed():.1f} s", style="bold")
    src = Table.grid(padding=(0, 2))
    for name, source in sources.items():
        src.add_row(Text(name, style="blue"), Text(source.status))
    table = state_table(counts, total)
    tail = [_event_text(e) for e in events[-TAIL:]] or [Text("no failures yet", style="dim")]
    return Group(head, src, Text(""), table, Text(""), Text(delays_line(board)), *tail)


class LiveView:
    """Redraws ``render`` in place on a terminal."""

    def __init__(self, out: Console, board: Board, title: str) -> None:
        self.board, self.title = board, title
        self.live = Live(console=out, auto_refresh=False, redirect_stderr=False)

    def __enter__(self) -> LiveView:
        self.live.__enter__()
        return self

    def update(self, stats: QueueStats) -> None:
        self.live.update(render(self.board, stats, self.title), refresh=True)

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.live.__exit__(kind, exc, tb)


class PlainView:
    """For logs and pipes: each event as a line, and the counts once a second."""

    def __init__(self, out: Console, board: Board, title: str) -> None:
        self.out, self.board = out, board
        self.printed = 0
        self.next_counts = 0.0
        out.print(title)

    def __enter__(self) -> PlainView:
        return self

    def update(self, stats: QueueStats) -> None:
        _, _, events = self.board.snapshot()
        for e in events[self.printed :]:
            self.out.print(_event_text(e), soft_wrap=True)
        self.printed = len(events)
        now = self.board.elapsed()
        if now >= self.next_counts:
            counts = " ".join(f"{k}={v}" for k, v in state_counts(stats).items())
            self.out.print(f"{now:6.1f}s counts   {counts}")
            self.next_counts = now + PLAIN_EVERY_S

    def __exit__(self, *_: object) -> None:
        return None
