"""Dynamic sampling (`selection.type: dynamic_sampling`), as in DAPO: roll out k*m prompts with n responses
each, keep those with 0 < p < 1, and repeat until m are kept, for at most `max_rounds` rounds; then the batch
is filled with the best available and the shortfall counted (`pcl.strategies.base.RolloutFilter`)."""

from __future__ import annotations

from pcl.strategies.base import RolloutFilter


class DynamicSamplingStrategy(RolloutFilter):
    name = "dynamic_sampling"
