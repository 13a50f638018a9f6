"""Plain GRPO (`selection.type: uniform`): the sampler's next m prompts, n responses each, all trained on."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from pcl.config import UniformSelection
from pcl.data.prompts import PromptRecord
from pcl.strategies.base import Request, Rollout, Strategy


class UniformStrategy(Strategy):
    config = UniformSelection

    @classmethod
    def from_config(cls, selection: UniformSelection, m: int, n: int, seed: int = 0) -> "UniformStrategy":
        return cls(m, n)

    def begin_step(self, step: int) -> None:
        super().begin_step(step)
        self.batch: list[PromptRecord] = []

    @property
    def ready(self) -> bool:
        return self.round >= 1

    def next_request(self) -> Request:
        return Request(draw=self.m)

    def propose(self, candidates: Sequence[PromptRecord], values: np.ndarray | None) -> list[Rollout]:
        self.batch = list(candidates[: self.m])
        return [Rollout(p, self.n) for p in self.batch]

    def finish_step(self) -> list[PromptRecord]:
        return self.batch
