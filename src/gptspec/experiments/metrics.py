"""The numbers a study reports: bits per byte, and intervals over seeds.

Bits per byte compares models of different vocabularies (a larger vocabulary's token
spells more bytes, so its loss per token is larger while the text is predicted no worse):
over ``n_tokens`` predicted tokens spelling ``n_bytes`` bytes with summed cross-entropy
``nats``, bits per byte = nats / (n_bytes · ln 2). Intervals are Student's t over seeds
(each seed its own initialisation and batches): mean ± t_{0.975, n−1} · s / √n. A
difference between two arms is judged on seeds paired by index, whose differences get the
same interval; it is *inside the noise* when that interval contains 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

LEVEL = 0.95  # every interval on the page and in the results


def bits_per_byte(nats: float, n_bytes: int) -> float:
    """Summed cross-entropy (nats) of a split's predicted tokens → bits per byte of the
    text those tokens spell."""
    if n_bytes <= 0:
        raise ValueError(f"bits per byte needs a positive byte count, got {n_bytes}")
    return nats / (n_bytes * math.log(2))


@dataclass(frozen=True)
class Interval:
    """The mean of ``n`` values and its two-sided ``LEVEL`` interval (Student's t); with
    one value there is no interval (``low`` and ``high`` are NaN)."""

    mean: float
    low: float
    high: float
    n: int

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def contains(self, value: float) -> bool:
        return self.n > 1 and self.low <= value <= self.high

    def overlaps(self, other: Interval) -> bool:
        return self.n > 1 and other.n > 1 and self.low <= other.high and other.low <= self.high

    def to_dict(self) -> dict[str, float | int | None]:
        def finite(x: float) -> float | None:
            return x if math.isfinite(x) else None

        return {"mean": self.mean, "low": finite(self.low), "high": finite(self.high),
                "n": self.n, "level": LEVEL}


def t_interval(values: Sequence[float], level: float = LEVEL) -> Interval:
    """mean ± t_{(1+level)/2, n−1} · s / √n over ``values`` (s with n − 1 in the
    denominator)."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError("an interval needs at least one value")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"an interval needs finite values, got {x.tolist()}")
    mean = float(x.mean())
    if x.size == 1:
        return Interval(mean, math.nan, math.nan, 1)
    from scipy import stats  # here: a run's process needs bits_per_byte only (scipy is slow to import)

    half = float(stats.t.ppf((1 + level) / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return Interval(mean, mean - half, mean + half, int(x.size))


def paired_difference(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> Interval:
    """The interval of a − b over seeds paired by position."""
    if len(a) != len(b):
        raise ValueError(f"paired values need as many of each: {len(a)} and {len(b)}")
    return t_interval([x - y for x, y in zip(a, b, strict=True)], level)
