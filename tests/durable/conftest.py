"""Every durable-task contract test runs on a plain queue and on a queue of 3 shards (on the
suite's single Redis, where every shard shares the server: their keys and scripts are a
Cluster's), each on both front ends."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


@pytest.fixture(params=["plain", "shards"])
def make_queue(
    request: pytest.FixtureRequest, make_queue: Callable[..., Any]
) -> Callable[..., Any]:
    if request.param == "plain":
        return make_queue

    def make(name: str = "q", **kwargs: Any) -> Any:
        kwargs.setdefault("shards", 3)
        return make_queue(name, **kwargs)

    return make
