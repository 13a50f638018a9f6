"""PCL (`selection.type: pcl`, algorithm steps 1-3): V scores k*m candidates; the m closest to tau roll out.

tau and k are tunable: the control plane changes them between steps (`tune`) and the next step uses the new
values. With `pipelined`, the coordinator draws and scores step t+1's candidates while step t generates (V
is then one more update behind the policy when it scores them).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from pcl.config import PCLSelection
from pcl.data.prompts import PromptRecord
from pcl.strategies.selection import select_closest
from pcl.strategies.base import Needs, Request, Rollout, Strategy, Tunable


class PCLStrategy(Strategy):
    config = PCLSelection
    needs_values = True
    tunable = {"tau": Tunable(float, 0.0, 1.0), "k": Tunable(int, 1)}

    def __init__(self, m: int, n: int, tau: float, k: int, pipelined: bool = False):
        super().__init__(m, n)
        self.tau, self.k, self.pipelined = tau, k, pipelined
        self.batch: list[PromptRecord] = []
        self.selected_values = np.zeros(0)

    @classmethod
    def from_config(cls, selection: PCLSelection, m: int, n: int, seed: int = 0) -> "PCLStrategy":
        return cls(m, n, selection.tau, selection.k, selection.pipelined)

    @property
    def needs(self) -> Needs:
        """V's scores; with `pipelined`, the next step's k*m candidates drawn and scored during this step."""
        return Needs(values=True, prefetch=self.pool_size if self.pipelined else 0)

    @property
    def pool_size(self) -> int:
        """Candidates scored each step: k*m."""
        return self.k * self.m

    def begin_step(self, step: int) -> None:
        super().begin_step(step)
        self.batch = []

    @property
    def ready(self) -> bool:
        return self.round >= 1

    def next_request(self) -> Request:
        return Request(draw=self.pool_size, score=True)

    def propose(self, candidates: Sequence[PromptRecord], values: np.ndarray | None) -> list[Rollout]:
        if values is None:
            raise ValueError("the pcl strategy needs the value model's scores of the candidates")
        if len(values) != len(candidates):
            raise ValueError(f"pcl: {len(values)} values for {len(candidates)} candidates")
        chosen = select_closest(values, min(self.m, len(candidates)), self.tau)
        self.batch = [candidates[i] for i in chosen]
        self.selected_values = np.asarray(values)[chosen]
        return [Rollout(p, self.n) for p in self.batch]

    def finish_step(self) -> list[PromptRecord]:
        return self.batch

    def state_dict(self) -> dict[str, Any]:
        return {"tau": self.tau, "k": self.k}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tau, self.k = float(state["tau"]), int(state["k"])

    def metrics(self) -> dict[str, float]:
        return {"tau": self.tau, "k": float(self.k)}
