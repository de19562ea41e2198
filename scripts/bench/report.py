"""Helpers shared by the benchmark scripts: percentiles and the plain-text result table."""

from __future__ import annotations

import math
from collections.abc import Sequence

HEADER = ("section", "result", "detail", "target")


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(pct / 100 * len(ordered))))
    return ordered[rank - 1]


def print_table(rows: Sequence[tuple[str, str, str, str]]) -> None:
    """Rows of (section, result, detail, target) as aligned columns between rules."""
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(HEADER)]
    line = "  ".join("-" * w for w in widths)
    print(line)
    for row in (HEADER, None, *rows, None):
        if row is None:
            print(line)
        else:
            print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
