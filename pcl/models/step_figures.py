"""What a learner step measures beside its gradient, in the forward pass it runs anyway: the loss, the gap between
the engine's sampled-token log-probabilities and the learner's, and the off-policy correction's importance ratios.

    figures = StepFigures(OffPolicySettings("truncated", cap=2.0), device)
    weights = figures.importance_weights(batch, logprobs)   # [B, T-1] for the loss, or None; the ratios counted
    figures.add(loss, batch, flat)                          # one micro-batch's loss and log-prob gaps
    stats = figures.stats(agree, any_engine)                # the step's figures over all ranks

The figures stay in one float64 tensor on the device over the micro-batches (no device sync per pass) and are
reduced over the ranks once, at the end of the step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from pcl.models.micro_batches import MicroBatch
from pcl.rl import importance_ratio_metrics, importance_ratio_totals, truncated_importance_weights

CORRECTIONS = ("none", "truncated")  # learner.off_policy.correction
# The layout of StepFigures.totals: the first SUMMED entries are summed over micro-batches and ranks (loss, gap
# sum, gap count, ratio sum, ratio count, ratios above the cap), the others maxed (largest gap, largest ratio).
SUMMED, SIZE = 6, 8
GAP_MAX, RATIO_MAX = SUMMED, SUMMED + 1


@dataclass(frozen=True)
class OffPolicySettings:
    """The loss's correction for samples of another policy: the `learner.off_policy` section's fields
    (`pcl.config.OffPolicyConfig` has the same names and can be passed instead); a plain dataclass, so the
    learner imports without pydantic. "none": the on-policy loss; "truncated": truncated importance sampling,
    each token weighted by min(ratio, cap) (`pcl.rl.truncated_importance_weights`)."""

    correction: str = "none"
    cap: float = 2.0


def checked_off_policy(off_policy: OffPolicySettings | None) -> OffPolicySettings:
    """`off_policy` (None: the defaults, no correction), refused with a ValueError when the loss has no such
    correction or the cap is below 1 (which would down-weight on-policy tokens too)."""
    off_policy = off_policy or OffPolicySettings()
    if off_policy.correction not in CORRECTIONS or not off_policy.cap >= 1:
        raise ValueError(f"off_policy: expected a correction in {CORRECTIONS} and a cap >= 1, got {off_policy}")
    return off_policy


class StepFigures:
    """One learner step's running figures on `device` (see the module docstring)."""

    def __init__(self, off_policy: OffPolicySettings, device: torch.device):
        self.off_policy = checked_off_policy(off_policy)
        self.totals = torch.zeros(SIZE, dtype=torch.float64, device=device)

    @property
    def correcting(self) -> bool:
        return self.off_policy.correction != "none"

    def importance_weights(self, batch: MicroBatch, logprobs: torch.Tensor) -> torch.Tensor | None:
        """The correction's per-token weights [B, T-1] of a micro-batch against the engine's log-probs, its ratios
        counted; None without a correction (and for a dummy pass, which has no tokens)."""
        if not self.correcting or batch.engine_logprobs is None:
            return None
        mask, cap = batch.response_mask, self.off_policy.cap
        engine = torch.zeros_like(logprobs).masked_scatter(mask, batch.engine_logprobs.to(logprobs.dtype))
        weights, ratios = truncated_importance_weights(logprobs, engine, mask, cap)
        ratio_totals = importance_ratio_totals(ratios, mask, cap)
        self.totals[3:SUMMED] += ratio_totals[:3]
        self.totals[RATIO_MAX] = torch.maximum(self.totals[RATIO_MAX], ratio_totals[3])
        return weights

    def add(self, loss: torch.Tensor, batch: MicroBatch, flat: torch.Tensor) -> None:
        """A micro-batch's loss and, where the engine reported log-probs, |log p_engine - log p_learner| of its
        tokens (`flat`: the learner's, [num_tokens])."""
        self.totals[0] += loss.detach().double()
        if batch.engine_logprobs is None:
            return
        gap = (batch.engine_logprobs.double() - flat.detach().double()).abs()
        known = ~torch.isnan(gap)
        gap = torch.where(known, gap, 0.0)  # tokens without an engine log-prob count nowhere
        self.totals[1:3] += torch.stack([gap.sum(), known.sum().double()])
        if gap.numel():
            self.totals[GAP_MAX] = torch.maximum(self.totals[GAP_MAX], gap.max())

    def stats(self, agree: Callable[[list[float], dist.ReduceOp], list[float]], any_engine: bool,
              computed: int, padded: int) -> dict[str, float]:
        """The step's loss, padding ratio (`computed` and `padded`: this rank's tokens), log-prob gaps (with engine
        log-probs on any rank) and importance ratios (with a correction), over all ranks through `agree`."""
        loss, gap_sum, gap_count, ratio_sum, ratio_count, above_cap, computed_all, padded_all = agree(
            self.totals[:SUMMED].tolist() + [computed, padded], dist.ReduceOp.SUM)
        stats = {"loss": loss, "learner_padding_ratio": padded_all / computed_all if computed_all else 0.0}
        if any_engine or self.correcting:
            gap_max, ratio_max = agree(self.totals[SUMMED:].tolist(), dist.ReduceOp.MAX)
        if any_engine:
            stats["logprob_gap_mean"] = gap_sum / gap_count if gap_count else math.nan
            stats["logprob_gap_max"] = gap_max if gap_count else math.nan
        if self.correcting:
            stats.update(importance_ratio_metrics(ratio_sum, ratio_count, above_cap, ratio_max))
        return stats
