"""The growth of one resource over a long run: a least-squares slope with its 95% confidence interval, and its
projection to a long run. Pure; `pcl soak`'s report (pcl/tools/soak_report.py) judges every series with it.

    fit = fit_slope(xs, ys)                   # xs: hours (or thousands of steps), ys: bytes
    fit.slope, fit.low, fit.high              # per unit of x, the 95% interval
    fit.judge(scale=72.0, limit=50e6)         # "flat" / "grows" / "unresolved": is scale x slope under limit?

Samples of a resource a few seconds apart are not independent (memory moves in runs of allocations, a file in
bursts), and the ordinary standard error of a slope is then too small. The interval here is widened for the
residuals' lag-1 autocorrelation r: the effective number of samples is n (1 - r) / (1 + r) (for r > 0), and the
t quantile is taken at that many degrees of freedom less two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

Z95 = 1.959964  # the normal 97.5% quantile


def t95(dof: float) -> float:
    """The 97.5% quantile of Student's t with `dof` degrees of freedom (Cornish-Fisher, within 1% from dof 3;
    dof <= 1 gives the dof-1 value 12.71)."""
    if dof <= 1:
        return 12.706
    z = Z95
    return (z + (z**3 + z) / (4 * dof) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * dof**3))


@dataclass(frozen=True)
class Fit:
    """y = intercept + slope x over n samples; [low, high] the slope's 95% interval (None below 3 samples)."""

    slope: float
    intercept: float
    low: float
    high: float
    n: int
    n_eff: float

    def projected(self, scale: float) -> tuple[float, float, float]:
        """Growth over `scale` units of x: (estimate, low, high)."""
        return self.slope * scale, self.low * scale, self.high * scale

    def judge(self, scale: float, limit: float) -> str:
        """'flat' when even the interval's top projects under `limit` over `scale` units of x, 'grows' when even
        its bottom projects over it, else 'unresolved' (the run is too short, or too noisy, to tell)."""
        if self.high * scale < limit:
            return "flat"
        if self.low * scale > limit:
            return "grows"
        return "unresolved"


def fit_slope(xs: list[float], ys: list[float]) -> Fit:
    """The least-squares line through (xs, ys) and its slope's 95% interval, widened for autocorrelation."""
    n = len(xs)
    if n != len(ys):
        raise ValueError(f"{n} x values but {len(ys)} y values")
    if n < 3:
        raise ValueError(f"a slope needs at least 3 samples, got {n}")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("every sample has the same x: no slope")
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    intercept = my - slope * mx
    residuals = [y - intercept - slope * x for x, y in zip(xs, ys)]
    sse = sum(r * r for r in residuals)
    r1 = lag1(residuals)
    n_eff = max(3.0, min(float(n), n * (1 - r1) / (1 + r1))) if r1 > 0 else float(n)
    se = math.sqrt(sse / (n - 2) / sxx) * math.sqrt((n - 2) / max(n_eff - 2, 1.0))
    half = t95(n_eff - 2) * se
    return Fit(slope, intercept, slope - half, slope + half, n, n_eff)


def lag1(values: list[float]) -> float:
    """The lag-1 autocorrelation of `values` (0 when they do not vary), clipped to [-0.99, 0.99]."""
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values)
    if var == 0 or n < 3:
        return 0.0
    cov = sum((values[i] - mean) * (values[i + 1] - mean) for i in range(n - 1))
    return max(-0.99, min(0.99, cov / var))
