"""Pre-filtering (`selection.type: prefilter`): train uniformly on the prompts whose pass rate under the
reference (initial) policy lies strictly between p_low and p_high.

The reference pass rates come from n_pre rollouts of every training prompt with the initial policy, made once
before the first step and cached in the run directory (`pcl.data.reference_rates`); the strategy receives
them with `load_reference`. Each step then draws candidates from the sampler's stream and keeps the admitted
ones until it has m, so the batch is a uniform draw from the filtered set.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from pcl.config import PrefilterSelection
from pcl.data.prompts import PromptRecord
from pcl.strategies.base import Needs, Request, Rollout, Strategy, pool_draw

MAX_DRAWS = 64  # draws of one step before giving up: the admitted set is checked to hold >= m prompts


class PrefilterStrategy(Strategy):
    config = PrefilterSelection
    uses_reference = True

    @classmethod
    def from_config(cls, selection: PrefilterSelection, m: int, n: int, seed: int = 0) -> "PrefilterStrategy":
        return cls(m, n, selection.n_pre, selection.p_low, selection.p_high)

    def __init__(self, m: int, n: int, n_pre: int, p_low: float, p_high: float):
        super().__init__(m, n)
        if not 0 <= p_low < p_high <= 1:
            raise ValueError(f"prefilter: need 0 <= p_low < p_high <= 1, got p_low={p_low}, p_high={p_high}")
        self.n_pre, self.p_low, self.p_high = n_pre, p_low, p_high
        self.admitted: set[str] | None = None
        self.share = 1.0  # admitted share of the training set
        self.dataset_size = 0
        self.batch: list[PromptRecord] = []
        self.draws = 0

    @property
    def needs(self) -> Needs:
        """n_pre rollouts of every training prompt with the initial policy, before the first step."""
        return Needs(reference_rollouts=self.n_pre)

    def load_reference(self, pass_rates: Mapping[str, float]) -> None:
        """The reference pass rate of every training prompt (prompt id -> mean reward of n_pre rollouts)."""
        self.admitted = {pid for pid, p in pass_rates.items() if self.p_low < p < self.p_high}
        self.dataset_size = len(pass_rates)
        self.share = len(self.admitted) / max(1, self.dataset_size)
        if len(self.admitted) < self.m:
            raise ValueError(
                f"selection.type=prefilter: only {len(self.admitted)} of {self.dataset_size} training prompts have a "
                f"reference pass rate strictly between p_low={self.p_low} and p_high={self.p_high}, fewer than "
                f"run.m={self.m}; widen the interval or lower run.m")

    def begin_step(self, step: int) -> None:
        if self.admitted is None:
            raise RuntimeError("prefilter: load_reference must be called before the first step")
        super().begin_step(step)
        self.batch, self.draws = [], 0

    @property
    def ready(self) -> bool:
        return self.round >= 1

    def next_request(self) -> Request:
        if self.draws >= MAX_DRAWS:
            raise RuntimeError(f"prefilter: {MAX_DRAWS} draws found only {len(self.batch)} of {self.m} "
                               "admitted prompts")
        self.draws += 1
        return Request(draw=pool_draw(self.m - len(self.batch), self.share, self.dataset_size))

    def propose(self, candidates: Sequence[PromptRecord], values: np.ndarray | None) -> list[Rollout]:
        held = {p.id for p in self.batch}
        for c in candidates:
            if len(self.batch) < self.m and c.id in self.admitted and c.id not in held:
                self.batch.append(c)
                held.add(c.id)
        if len(self.batch) < self.m:
            return []  # not enough yet: the next round draws more, generating nothing meanwhile
        return [Rollout(p, self.n) for p in self.batch]

    def observe(self, rewards: Mapping[str, np.ndarray]) -> None:
        if len(self.batch) >= self.m:  # a round that generated nothing does not finish the step
            super().observe(rewards)

    def finish_step(self) -> list[PromptRecord]:
        return self.batch

    def metrics(self) -> dict[str, float]:
        return {"prefilter_admitted_share": self.share, "prefilter_draws": float(self.draws)}
