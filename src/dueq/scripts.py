"""The Lua scripts, loaded from ``dueq/lua`` and run with EVALSHA (NOSCRIPT falls back to EVAL).

Each script is ``_prelude.lua`` followed by its own file. redis-py's ``Script`` computes the
SHA locally and reloads the script when the server answers NOSCRIPT (after a restart or
``SCRIPT FLUSH``), so callers never see that error.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

import redis
from redis.cluster import RedisCluster

SCRIPT_NAMES = (
    "schedule",
    "claim",
    "ack",
    "fail",
    "extend",
    "release",
    "cancel",
    "reschedule",
    "dead",
    "inspect",
    "stats",
    "cron_add",
    "cron_advance",
    "cron_remove",
)

#: Status codes returned by fail.lua.
FAIL_LOST, FAIL_RETRIED, FAIL_DEAD = 0, 1, 2


@cache
def script_source(name: str) -> str:
    """The full source of one script: the shared prelude, then the script's own file."""
    folder = resources.files("dueq").joinpath("lua")
    prelude = folder.joinpath("_prelude.lua").read_text(encoding="utf-8")
    body = folder.joinpath(f"{name}.lua").read_text(encoding="utf-8")
    return prelude + "\n" + body


class Scripts:
    """The registered scripts of one Redis client, called by name."""

    def __init__(self, client: redis.Redis | RedisCluster) -> None:
        self._scripts = {name: client.register_script(script_source(name)) for name in SCRIPT_NAMES}

    def run(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """Run script ``name`` with KEYS and ARGV."""
        return self._scripts[name](keys=keys, args=args)
