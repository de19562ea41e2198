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
