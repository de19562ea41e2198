"""``dueq pause``, ``dueq resume`` and ``dueq configure``: a queue's settings in Redis.

Thin commands over ``Queue.pause``, ``resume`` and ``configure``: the library validates and
writes; these parse the command line and print the settings that result. A queue may be
configured (or paused) before anything was scheduled on it.
"""

from __future__ import annotations

from typing import Literal

import click

from ..exceptions import ConfigurationError
from ..queue import Queue
from ..task import QueueSettings, Rate
from .connection import RedisTarget, redis_options
from .output import console, safe, seconds


def _show(queue: str, settings: QueueSettings) -> None:
    done = settings.remember_done
    console().print(
        f"queue {safe(repr(queue))}: {'paused' if settings.paused else 'running'}; "
        f"rate {settings.rate or 'off'}; "
        f"remember_done {seconds(done.total_seconds()) if done else 'off'}"
    )


def _rate(text: str | None) -> Rate | Literal[False] | None:
    """``--rate N/SECONDS`` (``20/1``, ``100/0.5``) or ``off``; None when not given."""
    if text is None:
        return None
    if text == "off":
        return False
    n, sep, per = text.partition("/")
    try:
        return Rate(int(n), per=float(per) if sep else 1.0)
    except (ValueError, ConfigurationError) as exc:
        raise click.BadParameter(
            f"{text!r} is not N/SECONDS (e.g. 20/1) or off: {exc}", param_hint="--rate"
        ) from None


@click.command()
@click.argument("queue")
@redis_options
def pause(queue: str, target: RedisTarget) -> None:
    """Stop every worker of QUEUE from taking tasks (scheduling goes on; leases that run out
    are still taken back). Tasks already taken are not affected."""
    _show(queue, Queue(queue, target.open().client).pause())


@click.command()
@click.argument("queue")
@redis_options
def resume(queue: str, target: RedisTarget) -> None:
    """Let the workers of QUEUE take tasks again (they are woken at once)."""
    _show(queue, Queue(queue, target.open().client).resume())


@click.command()
@click.argument("queue")
@click.option(
    "--remember-done",
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    help="Remember acked ids this long, so scheduling one again counts it as existing "
    "(0: off). Applies to every producer and worker of QUEUE.",
)
@click.option(
    "--rate",
    metavar="N/SECONDS|off",
    help="At most N tasks taken per SECONDS by all workers of QUEUE together (20/1: 20 per "
    "second); off removes the limit.",
)
@click.option("--paused/--running", default=None, help="Pause or resume QUEUE.")
@redis_options
def configure(
    queue: str,
    remember_done: float | None,
    rate: str | None,
    paused: bool | None,
    target: RedisTarget,
) -> None:
    """Show or change the settings of QUEUE, kept in Redis for every producer and worker."""
    limit = _rate(rate)  # a usage error before connecting
    q = Queue(queue, target.open().client)
    if remember_done is None and paused is None and limit is None:
        _show(queue, q.settings())
        return
    _show(queue, q.configure(paused=paused, remember_done=remember_done, rate=limit))
