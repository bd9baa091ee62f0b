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


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def t_two_sided_p(t: float, df: int) -> float:
    """P(|T| >= |t|) for Student's t with `df` degrees of freedom: I_{df/(df+t^2)}(df/2, 1/2)."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    if not math.isfinite(t):
        return 0.0
    x, a, b = df / (df + t * t), df / 2.0, 0.5
    if x <= 0.0:
        return 0.0
    if x >= 1.0:  # t = 0
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return min(1.0, front * _betacf(a, b, x) / a)
    return min(1.0, 1.0 - front * _betacf(b, a, 1.0 - x) / b)


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input's order (family-wise error control)."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


@dataclass(frozen=True)
class Paired:
    """a - b over the seeds both have, in the units of a and b."""

    n: int  # paired seeds
    mean: float
    low: float  # 95% interval, nan with one seed
    high: float
    above: int  # seeds with a > b
    p: float = math.nan  # two-sided paired t test of mean 0

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


def mean_std(values: list[float]) -> str:
    """'0.460 ± 0.064' over seeds (sample std), the value alone for one seed, '-' for none."""
    if not values:
        return "-"
    return f"{statistics.fmean(values):.3f} ± {statistics.stdev(values):.3f}" if len(values) > 1 else f"{values[0]:.3f}"


def paired(a: dict[int, float], b: dict[int, float]) -> Paired:
    """Mean of a[seed] - b[seed] over the shared seeds, its 95% t interval and how many seeds have a above b."""
    seeds = sorted(set(a) & set(b))
    diffs = [a[s] - b[s] for s in seeds]
    if not diffs:
        return Paired(0, math.nan, math.nan, math.nan, 0)
    mean = statistics.fmean(diffs)
    if len(diffs) == 1:
        return Paired(1, mean, math.nan, math.nan, int(diffs[0] > 0))
    se = statistics.stdev(diffs) / math.sqrt(len(diffs))
    half = t975(len(diffs) - 1) * se
    p = t_two_sided_p(mean / se, len(diffs) - 1) if se > 0 else (1.0 if mean == 0 else 0.0)
    return Paired(len(diffs), mean, mean - half, mean + half, sum(d > 0 for d in diffs), p)


def seeds_for_power(sd: float, effect: float, alpha: float = 0.05, power: float = 0.8, low: int = 12,
                    high: int = 60) -> int:
    """Paired seeds for a two-sided paired t test at `alpha` to detect a mean difference `effect` with `power`, given
    the differences' standard deviation `sd` (same units): the normal formula with Guenther's correction for t,
    ceil(((z_{1-alpha/2} + z_power) sd / effect)^2 + z_{1-alpha/2}^2 / 2), clamped to [low, high]."""
    if sd < 0 or effect <= 0:
        raise ValueError(f"sd must be >= 0 and effect > 0, got sd={sd}, effect={effect}")
    from statistics import NormalDist

    z_a, z_b = NormalDist().inv_cdf(1 - alpha / 2), NormalDist().inv_cdf(power)
    n = math.ceil(((z_a + z_b) * sd / effect) ** 2 + z_a ** 2 / 2)
    return min(max(n, low), high)


def detectable_effect(sd: float, n: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest mean difference `n` paired seeds detect with `power` (the inverse of `seeds_for_power`)."""
    from statistics import NormalDist

    z_a, z_b = NormalDist().inv_cdf(1 - alpha / 2), NormalDist().inv_cdf(power)
    return (z_a + z_b) * sd / math.sqrt(max(n - z_a ** 2 / 2, 1e-9))
