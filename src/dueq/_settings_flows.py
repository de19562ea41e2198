"""The settings flows: validate and write a queue's settings in Redis, read them back."""

from __future__ import annotations

import logging
from typing import Literal

from . import _protocol as protocol
from ._drive import Flow
from ._queue_base import QueueBase
from .checks import whole_number
from .clock import Duration, duration_ms
from .exceptions import ConfigurationError
from .snapshot import settings_from_hash
from .task import (
    MAX_KEEP_RESULTS_MS,
    MAX_KEY_CONCURRENCY,
    MAX_REMEMBER_DONE_MS,
    QueueSettings,
    Rate,
)

logger = logging.getLogger("dueq.queue")


class SettingsFlows(QueueBase):
    """The settings flows (``configure``, ``settings``)."""

    def configure_flow(
        self,
        *,
        paused: bool | None = None,
        remember_done: Duration | None = None,
        keep_results: Duration | None = None,
        rate: Rate | Literal[False] | None = None,
        key_rate: Rate | Literal[False] | None = None,
        key_concurrency: int | Literal[False] | None = None,
    ) -> Flow[QueueSettings]:
        """Validate every change before writing any; None leaves a setting as it is."""
        if self._sharded is not None:
            return (
                yield from self._sharded.configure_flow(
                    paused=paused,
                    remember_done=remember_done,
                    keep_results=keep_results,
                    rate=rate,
                    key_rate=key_rate,
                    key_concurrency=key_concurrency,
                )
            )
        changes: list[tuple[str, str]] = []
        for name, value in (("rate", rate), ("key_rate", key_rate)):
            if value is None:
                continue
            if value is not False and not isinstance(value, Rate):
                raise ConfigurationError(f"{name} must be a dueq.Rate or False, got {value!r}")
            changes.append((name, "" if value is False else f"{value.n}/{value.per_ms}"))
        if key_concurrency is not None:
            if key_concurrency is not False:
                whole_number(key_concurrency, "key_concurrency", low=1, high=MAX_KEY_CONCURRENCY)
            changes.append(
                ("key_concurrency", "" if key_concurrency is False else str(key_concurrency))
            )
        if paused is not None:
            if not isinstance(paused, bool):
                raise ConfigurationError(f"paused must be True or False, got {paused!r}")
            changes.append(("paused", "1" if paused else ""))
        if remember_done is not None:
            ms = duration_ms(remember_done, "remember_done", error=ConfigurationError)
            if ms > MAX_REMEMBER_DONE_MS:
                raise ConfigurationError(
                    f"remember_done must be at most 366 days, got {remember_done!r}"
                )
            changes.append(("remember_done_ms", str(ms) if ms > 0 else ""))
        if keep_results is not None:
            ms = duration_ms(keep_results, "keep_results", error=ConfigurationError)
            if ms > MAX_KEEP_RESULTS_MS:
                raise ConfigurationError(
                    f"keep_results must be at most 366 days, got {keep_results!r}"
                )
            changes.append(("keep_results_ms", str(ms) if ms > 0 else ""))
        settings: QueueSettings = yield protocol.configure(self.keys, changes)
        return settings

    def settings_flow(self) -> Flow[QueueSettings]:
        if self._sharded is not None:
            return (yield from self._sharded.settings_flow())
        settings: QueueSettings = yield protocol.command(
            "HGETALL", self.keys.config, parse=settings_from_hash
        )
        return settings
