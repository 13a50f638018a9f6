"""Difficulty probe (`selection.type: probe`): the PCL paper's experiment on which pass rate learns best.

Each step draws k*m candidates and rolls each out n_probe times with the current policy to estimate its pass
rate; the m candidates whose estimate is closest to `target_p` are then trained on with n fresh rollouts. The
estimation rollouts are never trained on (they are `Rollout(train=False)`: see `pcl.loop.rounds`), so the batch
is a plain GRPO batch whose prompts were chosen by (noisy) true difficulty, not by a value model. Running it
for target_p in {0, .25, .5, .75, 1} re-runs the paper's finding that prompts of intermediate difficulty
(p about 0.5) give the most learning per sample. It costs k*m*n_probe extra rollouts a step: an experiment,
not a production strategy.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from pcl.config import ProbeSelection
from pcl.data.prompts import PromptRecord
from pcl.strategies.selection import select_closest
from pcl.strategies.base import Request, Rollout, Strategy, Tunable


class ProbeStrategy(Strategy):
    config = ProbeSelection
    tunable = {"target_p": Tunable(float, 0.0, 1.0), "k": Tunable(int, 1)}

    @classmethod
    def from_config(cls, selection: ProbeSelection, m: int, n: int, seed: int = 0) -> "ProbeStrategy":
        return cls(m, n, selection.target_p, selection.k, selection.n_probe)

    def __init__(self, m: int, n: int, target_p: float, k: int, n_probe: int):
        super().__init__(m, n)
        if not 0 <= target_p <= 1 or k < 1 or n_probe < 1:
            raise ValueError(f"probe: need 0 <= target_p <= 1, k >= 1 and n_probe >= 1, got target_p={target_p}, "
                             f"k={k}, n_probe={n_probe}")
        self.target_p, self.k, self.n_probe = target_p, k, n_probe
        self.pool: list[PromptRecord] = []
        self.estimates: dict[str, float] = {}
        self.batch: list[PromptRecord] = []
        self.last: dict[str, float] = {}

    def begin_step(self, step: int) -> None:
        super().begin_step(step)
        self.pool, self.estimates, self.batch = [], {}, []

    @property
    def ready(self) -> bool:
        return self.round >= 2  # round 0 estimates the pool, round 1 generates the batch

    def next_request(self) -> Request:
        return Request(draw=self.k * self.m if self.round == 0 else 0)

    def propose(self, candidates: Sequence[PromptRecord], values: np.ndarray | None) -> list[Rollout]:
        if self.round == 0:
            self.pool = list(candidates)
            return [Rollout(c, self.n_probe, train=False) for c in self.pool]
        estimates = np.array([self.estimates[c.id] for c in self.pool])
        chosen = select_closest(estimates, min(self.m, len(self.pool)), self.target_p)
        self.batch = [self.pool[i] for i in chosen]
        picked = estimates[chosen]
        self.last = {"probe_estimate_mean": float(picked.mean()) if len(picked) else 0.0,
                     "probe_estimate_gap": float(np.abs(picked - self.target_p).mean()) if len(picked) else 0.0,
                     "probe_pool_estimate_mean": float(estimates.mean()) if len(estimates) else 0.0}
        return [Rollout(p, self.n) for p in self.batch]

    def observe(self, rewards: Mapping[str, np.ndarray]) -> None:
        if self.round == 0:
            missing = [c.id for c in self.pool if c.id not in rewards]
            if missing:
                raise ValueError(f"probe: no estimation rewards observed for prompts {missing[:3]}")
            self.estimates = {c.id: float(np.mean(rewards[c.id])) for c in self.pool}
        super().observe(rewards)

    def finish_step(self) -> list[PromptRecord]:
        if not self.ready:
            raise RuntimeError("probe: finish_step before the batch is ready")
        return self.batch

    def state_dict(self) -> dict[str, Any]:
        return {"target_p": self.target_p, "k": self.k}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.target_p, self.k = float(state["target_p"]), int(state["k"])

    def metrics(self) -> dict[str, float]:
        return {"probe_target_p": self.target_p, **self.last}
