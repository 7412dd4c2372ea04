"""How a run of N guests shared the host: the aggregate of the guests' figures and how evenly it was split.

Jain's fairness index, (sum x)^2 / (n * sum x^2), is 1 when every guest got the same share and 1/n when one guest
got everything (R. Jain, D. Chiu, W. Hawe, "A quantitative measure of fairness and discrimination", DEC-TR-301).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Spread:
    """N figures of one test (one per guest or per bare-metal process): their sum and how they spread."""

    n: int
    total: float
    min: float
    median: float
    max: float
    jain: float

    def describe(self, unit: str = "MB/s") -> str:
        return (f"{self.n} guests: sum {self.total:.1f} {unit}, per guest min {self.min:.1f} / median "
                f"{self.median:.1f} / max {self.max:.1f}, Jain's index {self.jain:.3f}")


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index of non-negative `values`: 1/n (one took all) to 1 (equal); 1 when all are zero."""
    if not values:
        raise ValueError("Jain's index of no values")
    if any(v < 0 for v in values):
        raise ValueError(f"Jain's index needs non-negative values (got {min(values)})")
    squares = sum(v * v for v in values)
    if squares == 0:
        return 1.0
    return sum(values) ** 2 / (len(values) * squares)


def spread(values: Sequence[float]) -> Spread:
    """The sum, min, median, max and Jain's index of the guests' figures (at least one)."""
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError("no figures to aggregate")
    return Spread(len(vals), sum(vals), min(vals), statistics.median(vals), max(vals), jain_index(vals))
