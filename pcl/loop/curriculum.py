"""The curriculum's figures: how well V predicts pass rates, what the selection chose from, and what it buys over
uniform selection. Pure functions of V's predictions and the realised pass rates; the step loop pools them over
recent steps (`pcl.loop.curriculum_window`).

    rows = reliability_table(predicted, realized, bins=10)  # per fixed bin of V: mean V, mean p, count
    calibration_error(rows)                                 # expected calibration error: sum_b N_b/N |V_b - p_b|
    brier_score(predicted, realized)                        # mean (V - p)^2
    pool_histogram(values, bins=10)                         # how many of the k*m candidates V put in each bin
    band_width(selected, tau)                               # the selected band: max |V - tau| over what was chosen
    realized_effective_ratio(rates)                         # share of groups with 0 < p < 1
    expected_effective_ratio(predicted, n)                  # what V expected: mean of 1 - V^n - (1 - V)^n

`predicted` is V(x), the predicted pass rate of a prompt (algorithm step 2); `realized` is p, the mean reward of its
n sampled responses (the target V trains towards in step 8). A group of n binary rewards has a non-zero advantage
in every sample exactly when 0 < p < 1 (step 6), so the effective ratio of a batch of equal-sized groups is the
share of its groups that are mixed; a prompt solved with probability q is mixed with probability
1 - q^n - (1 - q)^n. V's random probe (a uniform sample of the candidates, rolled out with n responses each) is
therefore the uniform counterfactual: its realised effective ratio is what uniform selection would have trained on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

BINS = 10  # equal-width bins of [0, 1] for reliability tables and the pool's histogram
MIXED_ATOL = 1e-9  # a pass rate this close to 0 or 1 counts as all-failed or all-solved


@dataclass(frozen=True)
class ReliabilityRow:
    """One bin of a reliability table: the prompts whose V fell in [low, high) ([low, 1] for the last bin)."""

    low: float
    high: float
    predicted: float | None  # mean V of the bin's prompts (None: no prompt fell in it)
    realized: float | None  # mean realised pass rate of the same prompts
    count: int

    @property
    def label(self) -> str:
        return bin_label(self.low, self.high)


def bin_label(low: float, high: float) -> str:
    """A bin's name, as the step record's dict-valued figures and Prometheus' `bin` label carry it.

    >>> bin_label(0.4, 0.5), bin_label(0.0, 0.1), bin_label(0.9, 1.0)
    ('0.4-0.5', '0-0.1', '0.9-1')
    """
    return f"{round(low, 6):g}-{round(high, 6):g}"


def _vector(values: Sequence[float] | np.ndarray, name: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64).reshape(-1)
    if not np.isfinite(array).all():
        raise ValueError(f"{name}: every value must be a finite number, got {array[~np.isfinite(array)][:3]}")
    return array


def _pairs(predicted, realized) -> tuple[np.ndarray, np.ndarray]:
    v, p = _vector(predicted, "predicted"), _vector(realized, "realized")
    if v.shape != p.shape:
        raise ValueError(f"predicted and realized differ in length: {v.size} and {p.size}")
    return v, p


def bin_index(values: np.ndarray, bins: int = BINS) -> np.ndarray:
    """The bin of each value in [0, 1] among `bins` equal-width bins (1.0 falls in the last one).

    >>> bin_index(np.array([0.0, 0.05, 0.1, 0.5, 0.99, 1.0])).tolist()
    [0, 0, 1, 5, 9, 9]
    """
    if bins < 1:
        raise ValueError(f"bins must be at least 1, got {bins}")
    return np.clip(np.floor(np.asarray(values, dtype=np.float64) * bins), 0, bins - 1).astype(np.int64)


def reliability_table(predicted, realized, bins: int = BINS) -> list[ReliabilityRow]:
    """V's predictions against the realised pass rates, by fixed bin of V: every bin, empty ones with None means.

    Args:
        predicted: [N] V(x) of each prompt, in [0, 1].
        realized: [N] the realised pass rate of the same prompts.
        bins: equal-width bins of [0, 1].
    """
    v, p = _pairs(predicted, realized)
    which = bin_index(v, bins)
    rows = []
    for b in range(bins):
        inside = which == b
        count = int(inside.sum())
        rows.append(ReliabilityRow(b / bins, (b + 1) / bins, float(v[inside].mean()) if count else None,
                                   float(p[inside].mean()) if count else None, count))
    return rows


def calibration_error(rows: Sequence[ReliabilityRow]) -> float | None:
    """The expected calibration error of a reliability table: sum over bins of N_b / N * |mean V_b - mean p_b|
    (None for an empty table). 0 when, bin by bin, V's mean prediction is the mean realised rate."""
    total = sum(r.count for r in rows)
    if not total:
        return None
    return float(sum(r.count * abs(r.predicted - r.realized) for r in rows if r.count) / total)


def brier_score(predicted, realized) -> float | None:
    """Mean squared error of V against the realised pass rates (None for no prompts). The realised rate of n
    samples is itself noisy: a perfect V still scores the mean of q(1 - q)/n over the prompts."""
    v, p = _pairs(predicted, realized)
    return float(np.mean((v - p) ** 2)) if v.size else None


def pool_histogram(values, bins: int = BINS) -> list[int]:
    """How many of the candidates V put in each fixed bin of [0, 1] (`bins` counts, summing to len(values))."""
    return np.bincount(bin_index(_vector(values, "values"), bins), minlength=bins).astype(int).tolist()


def band_width(selected, tau: float) -> float | None:
    """The selected band's half-width: max |V - tau| over the selected prompts (None when none were). PCL selects
    the candidates closest to tau, so it chose every candidate within this distance: a width that grows while the
    pool factor k stays says the pool holds fewer prompts near tau."""
    v = _vector(selected, "selected")
    return float(np.max(np.abs(v - tau))) if v.size else None


def realized_effective_ratio(rates) -> float | None:
    """The share of groups with a non-zero advantage (0 < p < 1): a batch's effective ratio, from its groups' pass
    rates (None for no groups)."""
    p = _vector(rates, "rates")
    return float(np.mean((p > MIXED_ATOL) & (p < 1 - MIXED_ATOL))) if p.size else None


def expected_effective_ratio(predicted, n: int) -> float | None:
    """The effective ratio V expects: mean over prompts of 1 - V^n - (1 - V)^n, the chance that n responses of a
    prompt solved with probability V are neither all right nor all wrong (None for no prompts)."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    v = np.clip(_vector(predicted, "predicted"), 0.0, 1.0)
    return float(np.mean(1.0 - v ** n - (1.0 - v) ** n)) if v.size else None
