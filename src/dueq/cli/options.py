"""Option shapes several commands share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click


def seconds_option(
    flag: str, default: float | None, help: str, *, low: float = 0.0
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A ``--flag SECONDS`` option: a float of at least ``low``, its default shown."""
    return click.option(
        flag,
        type=click.FloatRange(min=low),
        default=default,
        show_default=default is not None,
        metavar="SECONDS",
        help=help,
    )


def replication_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--wait-replicas N`` and ``--wait-timeout SECONDS``, passed to ``dueq.Queue``."""
    command = seconds_option(
        "--wait-timeout",
        1.0,
        "With --wait-replicas: how long a change waits for the replicas.",
        low=0.001,
    )(command)
    return click.option(
        "--wait-replicas",
        type=click.IntRange(0, 100),
        default=0,
        show_default=True,
        metavar="N",
        help="Wait until N replicas have each change that must survive a failover (Redis "
        "WAIT); schedule fails when fewer confirm, a worker logs it.",
    )(command)


def shards_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--shards N``: the queue's expected shard count, passed to ``discovery.open_queue``."""
    return click.option(
        "--shards",
        type=click.IntRange(1, 256),
        metavar="N",
        help="The queue's shard count (a sharded queue on a Redis Cluster). By default it is "
        "read from Redis; give it when this may run before any producer recorded it. A "
        "different recorded count is refused.",
    )(command)
