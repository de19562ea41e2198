"""``dueq demo``: dueq's whole job in one command, on an embedded Redis.

Sources (``demo_sources``) schedule a few hundred tasks due over the next seconds; two
workers (``observe`` + ``process``) run a handler that times out now and then and crashes on
poison tasks; the view (``demo_view``) shows tasks moving from scheduled to leased to acked,
retried or dead. It ends when the queue has drained, with a summary.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import secrets
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import click
import tenacity
from reactivex.abc import DisposableBase

from dueq.cli.bars import state_counts
from dueq.cli.connection import Connection, RedisTarget
from dueq.cli.dashboard import Background, dashboard_module
from dueq.cli.demo_board import Board
from dueq.cli.demo_sources import Source, demo_sources, handle
from dueq.cli.demo_view import LiveView, PlainView, delays_line
from dueq.cli.errors import Settings
from dueq.cli.options import seconds_option
from dueq.cli.output import console
from dueq.model import QueueStats
from dueq.operators import process
from dueq.queue import Queue
from dueq.retry import RetryPolicy

#: Retries come 0.5 s, 1 s, 2 s, 4 s after a failure (plus up to 0.1 s of jitter); the fifth
#: failure is final.
DEMO_RETRY = RetryPolicy(
    max_attempts=5,
    wait=tenacity.wait_exponential(multiplier=0.5, max=8) + tenacity.wait_random(0, 0.1),
)
TICK_S = 0.1


def _run_source(source: Source, q: Queue, board: Board) -> None:
    try:
        source.run(q, board)
    except Exception as exc:  # a source that fails is shown; the demo goes on without it
        board.source_failed(source.name, exc)


def _start_workers(q: Queue, board: Board, workers: int, concurrency: int) -> list[DisposableBase]:
    subscriptions = []
    for i in range(1, workers + 1):
        name = f"worker-{i}"
        outcomes = q.observe(max_in_flight=4 * concurrency).pipe(process(handle, concurrency))
        subscriptions.append(
            outcomes.subscribe(
                on_next=functools.partial(board.outcome, name),
                on_error=functools.partial(board.worker_failed, name),
            )
        )
    return subscriptions


@contextlib.contextmanager
def _library_log_to(path: Path) -> Iterator[None]:
    """Send dueq's log records to ``path`` (not over the view) while the block runs."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    log = logging.getLogger("dueq")
    saved = log.propagate, log.level
    log.addHandler(handler)
    log.propagate, log.level = False, logging.INFO
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.propagate, log.level = saved
        handler.close()


def _drained(board: Board, stats: QueueStats) -> bool:
    return board.sources_done() and stats.scheduled == 0 and stats.leased == 0


def _run(
    q: Queue,
    board: Board,
    sources: list[Source],
    view: LiveView | PlainView,
    workers: int,
    concurrency: int,
    timeout: float,
) -> bool:
    """Start workers and sources, update the view until the queue drains; True if it did,
    False if it had not drained ``timeout`` seconds after the last source finished (or
    failed, or was left out for a start past ``board.start_timeout_s``), and in any case
    after ``board.start_timeout_s + 2 * timeout`` (a source that never finishes)."""
    for source in sources:
        board.source(source.name, "starting")
    subscriptions = _start_workers(q, board, workers, concurrency)
    for source in sources:
        threading.Thread(target=_run_source, args=(source, q, board), daemon=True).start()
    sources_done_at: float | None = None
    limit_s = board.start_timeout_s + 2 * timeout
    try:
        with view as screen:
            while board.elapsed() < limit_s and (
                sources_done_at is None or board.elapsed() - sources_done_at < timeout
            ):
                board.leave_out_late()
                stats = q.stats()
                screen.update(stats)
                if _drained(board, stats):
                    return True
                if sources_done_at is None and board.sources_done():
                    sources_done_at = board.elapsed()
                time.sleep(TICK_S)
        return False
    finally:
        for subscription in subscriptions:
            subscription.dispose()


def _summary(q: Queue, board: Board, conn: Connection, finished: bool) -> tuple[list[str], int]:
    """The closing lines, and how many scheduled tasks did not end acked or dead."""
    stats = q.stats()
    counts = state_counts(stats)
    scheduled = stats.counters.get("scheduled", 0)
    # Occurrences a removed cron definition no longer needs are cancelled, not lost.
    withdrawn = stats.counters.get("cancelled", 0) + stats.counters.get("cron_skipped", 0)
    unsettled = scheduled - counts["acked"] - counts["dead"] - withdrawn
    sources, _, _ = board.snapshot()
    by_source = ", ".join(f"{name} {s.added}" for name, s in sources.items())
    verdict = "finished" if finished else "stopped before the queue drained"
    lines = [
        "",
        f"dueq demo {verdict} in {board.elapsed():.1f} s (queue {q.name!r})",
        f"  scheduled  {scheduled:>5}  {by_source}",
        f"  acked      {counts['acked']:>5}",
        f"  dead       {counts['dead']:>5}",
        f"  retried    {counts['retried']:>5}  failed attempts that were tried again later",
        f"  withdrawn  {withdrawn:>5}  pending cron occurrences of a removed schedule",
        f"  unsettled  {unsettled:>5}  scheduled - acked - dead - withdrawn: lost or pending",
        f"  {delays_line(board)}",
    ]
    for info in q.dead.list(limit=5):
        last = info.errors[-1] if info.errors else None
        error = f"{last.type}: {last.message}" if last else "?"
        lines.append(f"  dead: {info.id} after {info.attempt} attempts, last error {error}")
    lines += [f"  note: {name} {s.status}" for name, s in sources.items() if s.failed]
    if conn.embedded:
        lines.append("The embedded Redis is gone now. To keep the queue and look around with")
        lines.append("'dueq stats' and 'dueq dead', run: dueq demo --redis-url redis://HOST:6379/0")
    else:
        lines.append(f"Look around: dueq stats {q.name} --redis-url {conn.shown}")
        lines.append(f"             dueq dead list {q.name} --redis-url {conn.shown}")
    return lines, unsettled


@click.command()
@click.option("--redis-url", metavar="URL", help="Use this Redis instead of an embedded one.")
@click.option("--embedded", is_flag=True, help="Use a throwaway local redis-server (the default).")
@click.option(
    "--tasks",
    type=click.IntRange(1, 100_000),
    default=300,
    show_default=True,
    help="Order tasks to schedule (Spark adds a fifth as many).",
)
@seconds_option("--spread", 10.0, "The orders come due over this many seconds.")
@click.option(
    "--spark/--no-spark",
    default=True,
    show_default=True,
    help="Also schedule tasks from a Spark DataFrame (when pyspark is installed).",
)
@click.option("--workers", type=click.IntRange(1, 16), default=2, show_default=True)
@click.option(
    "--concurrency",
    type=click.IntRange(1, 64),
    default=4,
    show_default=True,
    help="Handler threads per worker.",
)
@seconds_option(
    "--timeout",
    55.0,
    "Stop if the queue has not drained this long after the last source finished.",
    low=1,
)
@seconds_option(
    "--start-timeout",
    120.0,
    "Leave out a source (Spark) that has not started by then, with a note.",
    low=1,
)
@click.option("--seed", type=int, help="Seed for which tasks fail (default: random).")
@click.option(
    "--dashboard",
    "dashboard_port",
    is_flag=False,
    flag_value=8080,
    type=click.IntRange(1, 65535),
    default=None,
    metavar="[PORT]",
    help="Also serve the web dashboard on http://127.0.0.1:PORT/ (default 8080).",
)
def demo(
    redis_url: str | None,
    embedded: bool,
    tasks: int,
    spread: float,
    spark: bool,
    workers: int,
    concurrency: int,
    timeout: float,
    start_timeout: float,
    seed: int | None,
    dashboard_port: int | None,
) -> None:
    """Watch dueq schedule, run, retry and bury a few hundred tasks (under a minute).

    Tasks come due over the next seconds; workers run a handler that times out on some
    attempts (retried after 0.5 s, 1 s, 2 s, 4 s) and crashes on poison tasks (dead after 5
    attempts). Exit code 0 when every task ended acked or dead.
    """
    settings = click.get_current_context().find_object(Settings)
    if settings is not None and settings.redis_url is not None:  # dueq --redis-url URL demo
        if redis_url is not None and redis_url != settings.redis_url:
            raise click.UsageError("--redis-url given twice, with different URLs")
        redis_url = settings.redis_url
    embedded = embedded or (settings is not None and settings.embedded)
    if redis_url is not None and embedded:
        raise click.UsageError("--redis-url and --embedded exclude each other")
    conn = RedisTarget(redis_url or "", embedded=redis_url is None).open()
    q = Queue(f"demo-{secrets.token_hex(3)}", conn.client, retry=DEMO_RETRY, lease=5.0)
    board = Board(start_timeout_s=start_timeout)
    logs = Path(tempfile.mkdtemp(prefix="dueq-demo-"))
    sources = demo_sources(tasks, spread, seed, spark, conn.url, logs)
    out = console()
    where = f"{'embedded at ' if conn.embedded else ''}{conn.shown}"
    title = f"dueq demo · queue {q.name} · Redis {where} · logs in {logs}"
    board_site = None
    if dashboard_port is not None:
        d = dashboard_module()
        app = d.create_app(conn.url, d.DashboardSettings(queues=(q.name,)))
        board_site = Background(app, "127.0.0.1", dashboard_port).start()
        click.get_current_context().call_on_close(board_site.stop)
        title += f" · dashboard {board_site.url}"
    view = LiveView(out, board, title) if out.is_terminal else PlainView(out, board, title)
    with _library_log_to(logs / "dueq.log"):
        finished = _run(q, board, sources, view, workers, concurrency, timeout)
    lines, unsettled = _summary(q, board, conn, finished)
    for line in lines:
        out.print(line, soft_wrap=True)
    if board_site is not None:
        out.print(f"Dashboard: {board_site.url}", soft_wrap=True)
        if out.is_terminal:  # keep the queue and its dashboard to look at
            out.print("Press Ctrl-C to stop it.", soft_wrap=True)
            with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how it ends
                while board_site.thread.is_alive():
                    time.sleep(0.2)
    if not finished or unsettled:
        raise click.exceptions.Exit(1)
