"""Post-rollout filtering in bounded rounds: the engine that dynamic sampling (DAPO) and GRESO share."""

from __future__ import annotations

import logging
import math
from typing import Any, Mapping, Sequence

import numpy as np

from pcl.data.prompts import PromptRecord
from pcl.strategies.base import Request, Rollout, Strategy, zero_variance

log = logging.getLogger(__name__)


class RolloutFilter(Strategy):
    """Post-rollout filtering in bounded rounds, the engine of dynamic sampling (DAPO) and GRESO.

    Each round draws ceil(k*m) candidates, rolls out n responses for every one that `admit` lets through (and
    that this step has not generated yet), and keeps the prompts whose rewards are not all equal, until m are
    kept. `max_rounds` is a safeguard; when it is reached first (a round-limit hit, counted in
    `<name>_round_limit_hits_total` and logged as a warning), `at_round_limit` says what the step trains on:

        shrink   the informative prompts kept so far, fewer than m: the batch keeps its effective ratio of 1
                 (only when none was kept does it train on zero-variance groups, a step without gradient)
        fill     m prompts, the missing ones filled with the zero-variance groups already generated (they add
                 no gradient, but the batch keeps its m*n size)

    The prompts missing from a full batch of informative ones are counted as the shortfall either way.
    """

    def __init__(self, m: int, n: int, k: float, max_rounds: int, at_round_limit: str = "fill"):
        super().__init__(m, n)
        if k < 1 or max_rounds < 1:
            raise ValueError(f"selection.k ({k}) and selection.max_rounds ({max_rounds}) must be >= 1")
        if at_round_limit not in ("shrink", "fill"):
            raise ValueError(f"selection.at_round_limit must be 'shrink' or 'fill', got {at_round_limit!r}")
        self.k, self.max_rounds, self.at_round_limit = k, max_rounds, at_round_limit
        self.kept: list[PromptRecord] = []
        self.rejected: list[PromptRecord] = []
        self.pending: dict[str, PromptRecord] = {}  # proposed this round, rewards not yet observed
        self.seen: set[str] = set()
        self.totals = {"shortfall": 0, "rollout_prompts": 0, "round_limit_hits": 0}
        self.last: dict[str, float] = {}

    def begin_step(self, step: int) -> None:
        super().begin_step(step)
        self.kept, self.rejected, self.pending, self.seen = [], [], {}, set()

    @property
    def ready(self) -> bool:
        return len(self.kept) >= self.m or self.round >= self.max_rounds

    def next_request(self) -> Request:
        return Request(draw=self.round_size())

    def round_size(self) -> int:
        """ceil(k*m), and with `fill`, in the last round at least enough fresh prompts (beyond those this step has
        seen, which a draw across an epoch boundary can repeat) to fill the batch."""
        size = math.ceil(self.k * self.m)
        if self.round < self.max_rounds - 1 or self.at_round_limit != "fill":
            return size
        missing = self.m - len(self.kept) - len(self.rejected)
        return max(size, missing + len(self.seen) if missing > 0 else 0)

    def admit(self, candidates: Sequence[PromptRecord]) -> list[PromptRecord]:
        """The candidates worth rolling out (all of them here; GRESO skips predicted zero-variance ones)."""
        return list(candidates)

    def propose(self, candidates: Sequence[PromptRecord], values: np.ndarray | None) -> list[Rollout]:
        fresh = [c for c in candidates if c.id not in self.seen]
        self.seen.update(c.id for c in fresh)
        chosen = self.admit(fresh)
        self.pending = {c.id: c for c in chosen}
        return [Rollout(c, self.n) for c in chosen]

    def observe(self, rewards: Mapping[str, np.ndarray]) -> None:
        for pid, prompt in self.pending.items():
            if pid not in rewards:
                raise ValueError(f"{self.name}: no rewards observed for proposed prompt {pid!r}")
            (self.rejected if zero_variance(rewards[pid]) else self.kept).append(prompt)
        self.totals["rollout_prompts"] += len(self.pending)
        self.pending = {}
        super().observe(rewards)

    def finish_step(self) -> list[PromptRecord]:
        if not self.ready:
            raise RuntimeError(f"{self.name}: finish_step before the batch is ready")
        shortfall = max(0, self.m - len(self.kept))
        filled = shortfall if self.at_round_limit == "fill" or not self.kept else 0
        if filled > len(self.rejected):
            raise RuntimeError(f"{self.name}: only {len(self.kept) + len(self.rejected)} prompts were generated in "
                               f"{self.round} rounds, fewer than run.m={self.m}; is the training set smaller than m?")
        if shortfall:
            self.totals["round_limit_hits"] += 1
            done = (f"filled with {filled} zero-variance groups" if filled else
                    f"trains on those {len(self.kept)} prompts only (selection.at_round_limit=shrink)")
            log.warning("%s: step %d kept %d of m=%d informative prompts in selection.max_rounds=%d rounds; the "
                        "step %s", self.name, self.step + 1, len(self.kept), self.m, self.max_rounds, done)
        self.totals["shortfall"] += shortfall
        generated = len(self.kept) + len(self.rejected)
        batch = self.kept[: self.m] + self.rejected[:filled]
        self.last = {"rounds": float(self.round), "shortfall": float(shortfall), "filled": float(filled),
                     "round_limit_hit": float(shortfall > 0), "batch_prompts": float(len(batch)),
                     "kept_share": len(self.kept) / generated if generated else 0.0}
        return batch

    def metrics(self) -> dict[str, float]:
        return {f"{self.name}_{key}": value for key, value in self.last.items()} | {
            f"{self.name}_shortfall_total": float(self.totals["shortfall"]),
            f"{self.name}_round_limit_hits_total": float(self.totals["round_limit_hits"])}

    def state_dict(self) -> dict[str, Any]:
        return {"totals": dict(self.totals)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.totals |= {key: int(value) for key, value in state.get("totals", {}).items()}
