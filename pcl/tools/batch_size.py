"""The paper's optimal-batch finding as a calculation: where generation time stops growing sublinearly.

Generating b = m*n responses costs about the same for small b (the engine is not yet full), then grows in
proportion to b. Below that knee a larger batch is nearly free; above it, doubling b doubles the step.
`pcl probe-batch` measures generation seconds over doubling sizes and calls:

    knee = find_knee([64, 128, 256, 512, 1024], [0.30, 0.32, 0.40, 0.75, 1.50])
    knee.batch_size        # 256: from there on the time per sample no longer falls
    knee.exponents         # growth exponents between neighbours: log(t2/t1) / log(b2/b1)

The time per sample t(b)/b falls while growth is sublinear and stays flat once it is linear. The knee is the
smallest size whose time per sample is within `tolerance` (10%) of the best at that size or any larger one:
from there on, a larger batch buys nothing per sample. (A single growth exponent is too noisy to decide:
on a shared CPU neighbouring sizes can differ by 20%.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

TOLERANCE = 0.10  # a time per sample within 10% of the best still to come counts as flat


@dataclass(frozen=True)
class Knee:
    batch_size: int  # the recommended b: the smallest size from which the time per sample stays flat
    index: int  # its position in the measured sizes
    exponents: list[float]  # growth exponent from sizes[i] to sizes[i + 1], len(sizes) - 1 of them
    found: bool  # False when the knee is the largest size measured: growth may still be sublinear beyond


def growth_exponents(sizes: Sequence[int], seconds: Sequence[float]) -> list[float]:
    """log(t[i+1] / t[i]) / log(b[i+1] / b[i]) for each neighbouring pair."""
    return [math.log(seconds[i + 1] / seconds[i]) / math.log(sizes[i + 1] / sizes[i]) for i in range(len(sizes) - 1)]


def find_knee(sizes: Sequence[int], seconds: Sequence[float], tolerance: float = TOLERANCE) -> Knee:
    """The smallest size from which the time per sample stays flat (see the module doc).

    Raises ValueError naming the argument for fewer than two sizes, sizes not strictly increasing, or times
    that are not positive.
    """
    if len(sizes) != len(seconds) or len(sizes) < 2:
        raise ValueError(f"sizes and seconds: need two or more measurements of equal count, got {len(sizes)} "
                         f"sizes and {len(seconds)} times")
    if any(b2 <= b1 for b1, b2 in zip(sizes, sizes[1:])) or sizes[0] < 1:
        raise ValueError(f"sizes: must be positive and strictly increasing, got {list(sizes)}")
    if any(not (t > 0 and math.isfinite(t)) for t in seconds):
        raise ValueError(f"seconds: every time must be positive and finite, got {list(seconds)}")
    per_sample = [t / b for b, t in zip(sizes, seconds)]
    for i, cost in enumerate(per_sample):
        if cost <= (1 + tolerance) * min(per_sample[i:]):
            return Knee(sizes[i], i, growth_exponents(sizes, seconds), i < len(sizes) - 1)
    raise AssertionError("unreachable: the last size always satisfies the rule")
