"""Selection strategies: which m prompts of the step's candidates are trained on.

    strategy = make_strategy(cfg.selection, m=cfg.run.m, seed=cfg.run.seed)
    pool = strategy.pool_size                        # candidates to draw from the sampler (k*m for PCL)
    chosen = strategy.select(values, m)              # indices into the candidates; values is None unless needs_values

Every strategy keeps its state in `state_dict()` / `load_state_dict()` and reports `metrics()`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pcl.config import PCLSelection, UniformSelection
from pcl.selection import select_closest


class Strategy:
    """The interface every selection strategy implements."""

    name: str = "base"
    needs_values: bool = False  # whether `select` needs the value model's scores of the candidates

    def __init__(self, m: int):
        self.m = m

    @property
    def pool_size(self) -> int:
        """How many candidates the sampler draws each step."""
        return self.m

    def select(self, values: np.ndarray | None, m: int) -> np.ndarray:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        return {}


class UniformStrategy(Strategy):
    """Plain GRPO: the sampler's m candidates are already a uniform random draw; train on all of them."""

    name = "uniform"

    def select(self, values: np.ndarray | None, m: int) -> np.ndarray:
        return np.arange(m, dtype=np.int64)


class PCLStrategy(Strategy):
    """PCL (DESIGN 1.1-1.3): score k*m candidates with V, keep the m closest to tau.

    tau and k may change between steps (the control plane sets them); the next step uses the new values.
    """

    name = "pcl"
    needs_values = True

    def __init__(self, m: int, tau: float, k: int):
        super().__init__(m)
        self.tau, self.k = tau, k

    @property
    def pool_size(self) -> int:
        return self.k * self.m

    def select(self, values: np.ndarray | None, m: int) -> np.ndarray:
        if values is None:
            raise ValueError("the pcl strategy needs the value model's scores of the candidates")
        return select_closest(values, m, self.tau)

    def state_dict(self) -> dict[str, Any]:
        return {"tau": self.tau, "k": self.k}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tau, self.k = float(state["tau"]), int(state["k"])

    def metrics(self) -> dict[str, float]:
        return {"tau": self.tau, "k": float(self.k)}


def make_strategy(selection, m: int, seed: int = 0) -> Strategy:
    """The strategy object for a `selection` config section."""
    if isinstance(selection, PCLSelection):
        return PCLStrategy(m, selection.tau, selection.k)
    if isinstance(selection, UniformSelection):
        return UniformStrategy(m)
    raise NotImplementedError(f"selection.type={selection.type!r} is not available in this build")
