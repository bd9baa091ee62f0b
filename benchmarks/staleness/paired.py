"""Paired differences over seeds with a 95% interval (Student's t), as every table of docs/evidence.md quotes them."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

# two-sided 95% quantiles of Student's t, t_{0.975, df}, for df = 1..30 (beyond: 1.96 is within 2%)
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with `df` degrees of freedom (df >= 1)."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    return _T975[df - 1] if df <= len(_T975) else 1.96


@dataclass(frozen=True)
class Paired:
    """a - b over the seeds both have, in the units of a and b."""

    n: int  # paired seeds
    mean: float
    low: float  # 95% interval, nan with one seed
    high: float
    above: int  # seeds with a > b

    def points(self) -> str:
        """'+6.6 [-2.2, +15.3], 5 of 6 above' for accuracies given as fractions."""
        if self.n == 0:
            return "-"
        if self.n == 1:
            return f"{100 * self.mean:+.1f} (1 seed)"
        return f"{100 * self.mean:+.1f} [{100 * self.low:+.1f}, {100 * self.high:+.1f}], {self.above} of {self.n} above"

    @property
    def supported(self) -> bool:
        """The 95% interval lies above 0."""
        return self.n > 1 and self.low > 0


def paired(a: dict[int, float], b: dict[int, float]) -> Paired:
    """Mean of a[seed] - b[seed] over the shared seeds, its 95% t interval and how many seeds have a above b."""
    seeds = sorted(set(a) & set(b))
    diffs = [a[s] - b[s] for s in seeds]
    if not diffs:
        return Paired(0, math.nan, math.nan, math.nan, 0)
    mean = statistics.fmean(diffs)
    if len(diffs) == 1:
        return Paired(1, mean, math.nan, math.nan, int(diffs[0] > 0))
    half = t975(len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return Paired(len(diffs), mean, mean - half, mean + half, sum(d > 0 for d in diffs))
