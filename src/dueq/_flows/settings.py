"""The settings flows: validate and write a queue's settings in Redis, read them back."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Literal

from dueq._flows.base import QueueBase
from dueq._flows.drive import Flow
from dueq._util.checks import whole_number
from dueq._util.clock import Duration, duration_ms
from dueq._wire import protocol as protocol
from dueq._wire.envelope import validate_key
from dueq._wire.snapshot import (
    KEY_LIMIT_PREFIX,
    WEIGHT_PREFIX,
    key_limit_text,
    settings_from_hash,
)
from dueq.exceptions import ConfigurationError, InvalidTaskError
from dueq.model import (
    FAIRNESS_MODES,
    MAX_CONCURRENCY,
    MAX_EVENTS_MS,
    MAX_KEEP_RESULTS_MS,
    MAX_KEY_CONCURRENCY,
    MAX_KEY_LIMITS,
    MAX_REMEMBER_DONE_MS,
    KeyLimit,
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
        concurrency: int | Literal[False] | None = None,
        key_limits: Mapping[str, KeyLimit | Literal[False] | None] | None = None,
        events: Duration | Literal[False] | None = None,
        fairness: Literal["key", False] | None = None,
    ) -> Flow[QueueSettings]:
        """Validate every change before writing any; None leaves a setting as it is."""
        changes: list[tuple[str, str]] = fairness_changes(fairness)
        if concurrency is not None and concurrency is not False and concurrency != 0:
            whole_number(concurrency, "concurrency", low=1, high=MAX_CONCURRENCY)
            changes.append(("concurrency", str(concurrency)))
        elif concurrency is not None:  # False or 0: no cap
            changes.append(("concurrency", ""))
        changes += key_limit_changes(key_limits)
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
        changes += events_changes(events)
        settings: QueueSettings = yield protocol.configure(self.keys, changes)
        return settings

    def settings_flow(self) -> Flow[QueueSettings]:
        settings: QueueSettings = yield protocol.command(
            "HGETALL", self.keys.config, parse=settings_from_hash
        )
        return settings


def events_changes(events: Duration | Literal[False] | None) -> list[tuple[str, str]]:
    """The config change of ``configure(events=...)``: the retention of outcome events in ms
    (False or 0: no events are written from now on)."""
    if events is None:
        return []
    if events is False:
        return [("events_ms", "")]
    ms = duration_ms(events, "events", error=ConfigurationError)
    if ms > MAX_EVENTS_MS:
        raise ConfigurationError(f"events must be at most 366 days, got {events!r}")
    return [("events_ms", str(ms) if ms > 0 else "")]


def fairness_changes(fairness: object) -> list[tuple[str, str]]:
    """The config change of ``configure(fairness=...)``: "key" on; False off ("off" until the
    claims have moved the lanes' tasks back to the levels: lua/include/fair.lua)."""
    if fairness is None:
        return []
    if fairness is False:
        return [("fairness", "off")]
    if fairness not in FAIRNESS_MODES:
        raise ConfigurationError(f'fairness must be "key" or False, got {fairness!r}')
    return [("fairness", "key")]


def key_limit_changes(
    key_limits: Mapping[str, KeyLimit | Literal[False] | None] | None,
) -> list[tuple[str, str]]:
    """The config changes of ``configure(key_limits=...)``: each key's KeyLimit set, or (None or
    False) removed; keys not named are left as they are."""
    if key_limits is None:
        return []
    if not isinstance(key_limits, Mapping):
        raise ConfigurationError(
            f"key_limits must be a mapping of key -> dueq.KeyLimit (or None to remove one), "
            f"got {key_limits!r}"
        )
    if len(key_limits) > MAX_KEY_LIMITS:
        raise ConfigurationError(f"a queue keeps at most {MAX_KEY_LIMITS} key limits")
    changes = []
    for key, limit in key_limits.items():
        try:
            validate_key(key)
        except InvalidTaskError as exc:
            raise ConfigurationError(f"key_limits: {exc}") from None
        if limit is None or limit is False:
            changes.append((KEY_LIMIT_PREFIX + key, ""))
            changes.append((WEIGHT_PREFIX + key, ""))
        elif isinstance(limit, KeyLimit):
            changes.append((KEY_LIMIT_PREFIX + key, key_limit_text(limit)))
            weight = "" if limit.weight is None else str(limit.weight)
            changes.append((WEIGHT_PREFIX + key, weight))
        else:
            raise ConfigurationError(
                f"key_limits[{key!r}] must be a dueq.KeyLimit or None, got {limit!r}"
            )
    return changes
