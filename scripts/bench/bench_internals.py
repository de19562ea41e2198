"""dueq's internals that a benchmark changes, reached in this one named place.

Benchmarks use the public API. One measures what a feature of the Lua scripts costs by running
the same queue with that feature cut out of its scripts (``views.py``: the per-minute
history). Nothing public lets a queue run other script sources, and nothing should: a queue
runs dueq's own scripts. So the one private reach is here, named and explained, as the test
suite's reaches are in ``tests/internals_support.py``:

- ``replace_scripts``: a blocking queue runs the given sources instead of dueq's, by script
  name (the script runner, ``dueq._wire.scripts.Scripts``, keeps them by name; each is registered on
  the queue's client, so EVALSHA with the NOSCRIPT fallback works as for dueq's own).
"""

from __future__ import annotations

from collections.abc import Mapping

from dueq import Queue
from dueq._wire.scripts import SCRIPT_NAMES

__all__ = ["replace_scripts"]


def replace_scripts(queue: Queue, sources: Mapping[str, str]) -> None:
    """Make ``queue`` run ``sources[name]`` for each script named there (its own for others)."""
    runner = queue._scripts
    for name, source in sources.items():
        if name not in SCRIPT_NAMES:  # the runner registers its scripts on first use
            raise KeyError(f"dueq has no script named {name!r}")
        runner._scripts[name] = queue.redis.register_script(source)
