"""dueq's internals that some tests pin directly, reached in this one named place.

Most tests use the public API only. A few are unit tests of parts users never touch, and
import them from here rather than from dueq's private modules, so the list of such seams is
short and visible (issue 26: tests use the public API or a named test-support module):

- ``protocol``: each Lua script's Python owner (key order, argument packing, reply parsing),
  which tests/wire/test_scripts.py checks against the scripts' headers;
- ``schedule_flows``: the scheduling flows' module (a test replaces its id generator to force
  an id collision);
- ``tracing``: the tracer lookup and its cache (reset between tracing tests);
- ``prefetch``, ``consume``, ``process`` and ``emit``: the consumers' prefetch, claim-loop
  rules, handler-thread algorithms and serial emitter, unit tested on their own;
- ``follow``: the steps a progress follower's flow asks its driver for (``FollowStep``), so a
  test can drive the flow by hand and lose a message on purpose;
- ``shards``: the shard placement rule (``dueq.sharding.layout.shard_names``) and its bound
  (``MAX_SHARDS``);
- ``sharded_flows``: the sharded core's bound on skipping an idle shard (``IDLE_RECHECK_S``),
  which a test waits out;
- ``spark_source()``: the Spark data source's module (pyspark >= 4.0; imported on demand);
  ``spark_events()``: its events source (pyspark >= 4.2; imported on demand).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from dueq._consume import prefetch as prefetch
from dueq._consume import progress as follow
from dueq._consume import rules as consume
from dueq._flows import schedule as schedule_flows
from dueq._util import tracing as tracing
from dueq._wire import protocol as protocol
from dueq.operators import _emit as emit
from dueq.operators import _process as process
from dueq.sharding import flows as sharded_flows
from dueq.sharding import layout as shards

__all__ = [
    "consume",
    "emit",
    "follow",
    "look_again_for_tracer",
    "prefetch",
    "process",
    "protocol",
    "schedule_flows",
    "script_runner",
    "sharded_flows",
    "shards",
    "spark_events",
    "spark_source",
    "tracing",
]


def spark_source() -> ModuleType:
    """``dueq.spark._source`` (needs pyspark >= 4.0 and pyarrow)."""
    from dueq.spark import _source as _spark_source

    return _spark_source


def spark_events() -> ModuleType:
    """``dueq.spark._events`` (needs pyspark >= 4.2)."""
    from dueq.spark import _events as _spark_events

    return _spark_events


def script_runner(queue: Any) -> Any:
    """The script runner (``_wire.scripts.Scripts``) a blocking queue sends its calls through."""
    return queue._scripts


def look_again_for_tracer() -> None:
    """Make dueq look for the tracer provider at its next span, not within RECHECK_S."""
    tracing._cache = (None, None, 0.0)
