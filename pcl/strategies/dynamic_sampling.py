"""Dynamic sampling (`selection.type: dynamic_sampling`), as the PCL paper's Algorithm 3 (after DAPO): roll out
k*m prompts with n responses each, keep those with 0 < p < 1, and repeat until m are kept, so the trained batch
has an effective ratio of 1 (k=2 in the paper). `max_rounds` is a safeguard, not part of the algorithm: when it
is reached first, the hit is counted and logged, and `at_round_limit` decides the batch (`shrink`, the default:
the informative prompts kept so far; `fill`: pad to m with zero-variance groups, the earlier behaviour); see
`pcl.strategies.rollout_filter.RolloutFilter`."""

from __future__ import annotations

from pcl.config import DynamicSamplingSelection
from pcl.strategies.base import Tunable
from pcl.strategies.rollout_filter import RolloutFilter


class DynamicSamplingStrategy(RolloutFilter):
    config = DynamicSamplingSelection
    tunable = {"k": Tunable(int, 1)}

    @classmethod
    def from_config(cls, selection: DynamicSamplingSelection, m: int, n: int,
                    seed: int = 0) -> "DynamicSamplingStrategy":
        return cls(m, n, selection.k, selection.max_rounds, selection.at_round_limit)
