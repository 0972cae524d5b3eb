"""Order statistics over timing samples."""

from __future__ import annotations

import math
from dataclasses import dataclass


def quantile(samples: list[float], q: float) -> float:
    """Linear-interpolation quantile (the same definition as numpy's default)."""
    if not samples:
        raise ValueError("no samples")
    ordered = sorted(samples)
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True)
class Summary:
    n: int
    median: float
    p90: float
    minimum: float
    maximum: float

    @classmethod
    def of(cls, samples: list[float]) -> Summary:
        return cls(
            n=len(samples),
            median=quantile(samples, 0.5),
            p90=quantile(samples, 0.9),
            minimum=min(samples),
            maximum=max(samples),
        )
