"""Small argument checks shared by the public API."""

from __future__ import annotations

from .exceptions import ConfigurationError


def whole_number(value: object, what: str, *, low: int, high: int | None = None) -> int:
    """``value`` if it is an int (not a bool) within [low, high], else ConfigurationError."""
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or value < low
        or (high is not None and value > high)
    ):
        bounds = f"from {low} to {high}" if high is not None else f">= {low}"
        raise ConfigurationError(f"{what} must be an int {bounds}, got {value!r}")
    return value
