"""Run a module's contract tests with fairness on as well as off: its ``make_queue`` fixture
overridden by ``fairness_param`` (the flow-control tests must hold on a fair queue exactly)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

#: The fixture's two parameters.
MODES = ["fairness-off", "fairness-on"]


def fairness_param(make_queue: Callable[..., Any], request: pytest.FixtureRequest) -> Any:
    """``make_queue`` as it is, or one whose queues are configured ``fairness="key"`` before
    the test touches them."""
    if request.param == "fairness-off":
        return make_queue

    def make(*args: Any, **kwargs: Any) -> Any:
        q = make_queue(*args, **kwargs)
        q.configure(fairness="key")
        return q

    return make
