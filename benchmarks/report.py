"""What every benchmark module writes into: medians, and ratios against peers.

A benchmark module ``benchmarks/<area>.py`` defines ``run(report: Report, quick: bool)``.
It times each contender with :func:`median_seconds` (several runs, the median) and
records metrics; then it records ratios between metrics measured in the same run.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field


def median_seconds(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> float:
    """Median wall time of ``fn()`` over ``repeats`` runs, after ``warmup`` untimed runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@dataclass
class Metric:
    group: str  # "tokenizer", "training", "generation", "forward", "machine", ...
    name: str  # e.g. "encode throughput / fast"
    value: float
    unit: str  # e.g. "MB/s", "tokens/s", "s"
    note: str = ""


@dataclass
class Ratio:
    group: str
    name: str  # e.g. "fast encode / tiktoken encode"
    value: float
    goal: float | None = None  # the goal, where it names one
    goal_text: str = ""  # e.g. "≥ 1.0"

    @property
    def met(self) -> bool | None:
        return None if self.goal is None else self.value >= self.goal


@dataclass
class Report:
    metrics: list[Metric] = field(default_factory=list)
    ratios: list[Ratio] = field(default_factory=list)

    def metric(self, group: str, name: str, value: float, unit: str, note: str = "") -> float:
        self.metrics.append(Metric(group, name, value, unit, note))
        return value

    def ratio(self, group: str, name: str, value: float, goal: float | None = None,
              goal_text: str = "") -> float:
        """Record value = something / its peer; ``goal`` is the least acceptable value
        (for a 'within 5x' goal record the inverse ratio so that higher is better)."""
        self.ratios.append(Ratio(group, name, value, goal, goal_text))
        return value

    def to_dict(self) -> dict:
        return {
            "metrics": [asdict(m) for m in self.metrics],
            "ratios": [dict(asdict(r), met=r.met) for r in self.ratios],
        }
