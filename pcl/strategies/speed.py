"""SPEED (`selection.type: speed`; Zhang et al. 2025, "SPEED-RL"): screen candidates with n_init rollouts,
continue the accepted ones (0 < screening pass rate < 1) with n - n_init more.

Rounds of one step, all with the step's policy version, each one generation call:

    round 1:  screen k*m fresh candidates (n_init each)
    round r:  continue the prompts accepted in round r-1 (n - n_init each), and, while fewer than m prompts
              are accepted in all, screen k*m fresh candidates in the same call, as SPEED batches them
    last:     continuation only; if fewer than m were accepted, screened-but-rejected prompts are continued
              too (the best available), and the shortfall is counted

A trained prompt's group is its n_init screening responses plus its n - n_init continuation responses (sample
indices 0..n-1 across the two rounds). Accepted prompts beyond the m needed are dropped at the end of the
step: their screening was done with this step's policy and cannot be continued with the next one.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from pcl.data import PromptRecord
from pcl.strategies.base import Request, Rollout, Strategy, zero_variance


class SpeedStrategy(Strategy):
    name = "speed"

    def __init__(self, m: int, n: int, k: int, n_init: int, max_rounds: int):
        super().__init__(m, n)
        if not 1 <= n_init < n:
            raise ValueError(f"selection.type=speed: selection.n_init ({n_init}) must be at least 1 and below "
                             f"run.n ({n}): the accepted prompts need n - n_init continuation responses")
        if max_rounds < 2 or k < 1:
            raise ValueError(f"selection.type=speed: selection.max_rounds ({max_rounds}) must be >= 2 (a screening "
                             f"round and a continuation round) and selection.k ({k}) >= 1")
        self.k, self.n_init, self.max_rounds = k, n_init, max_rounds
        self.totals = {"shortfall": 0}
        self.last: dict[str, float] = {}
        self.begin_step(-1)

    def begin_step(self, step: int) -> None:
        super().begin_step(step)
        self.seen: set[str] = set()
        self.accepted: list[PromptRecord] = []  # screened, awaiting continuation
        self.rejected: list[PromptRecord] = []  # screened, all responses equal
        self.complete: list[PromptRecord] = []  # screened and continued: full groups of n
        self.screening: dict[str, PromptRecord] = {}  # proposed this round for screening
        self.continuing: dict[str, PromptRecord] = {}  # proposed this round for continuation
        self.screened = 0
        self.filled = 0

    @property
    def last_round(self) -> bool:
        return self.round >= self.max_rounds - 1

    @property
    def ready(self) -> bool:
        return len(self.complete) >= self.m

    def next_request(self) -> Request:
        enough = len(self.complete) + len(self.accepted) >= self.m
        return Request(draw=0 if enough or self.last_round else self.k * self.m)

    def propose(self, candidates: Sequence[PromptRecord], values: np.ndarray | None) -> list[Rollout]:
        room = self.m - len(self.complete)
        go_on = self.accepted[:room]
        if self.last_round and len(go_on) < room:  # fill with the best available: screened, rejected prompts
            fill = self.rejected[: room - len(go_on)]
            self.filled = len(fill)
            go_on = go_on + fill
        self.continuing = {p.id: p for p in go_on}
        fresh = [] if self.last_round else [c for c in candidates if c.id not in self.seen]
        self.seen.update(c.id for c in fresh)
        self.screening = {c.id: c for c in fresh}
        return ([Rollout(p, self.n - self.n_init) for p in go_on] +
                [Rollout(c, self.n_init) for c in fresh])

    def observe(self, rewards: Mapping[str, np.ndarray]) -> None:
        done = set(self.continuing)
        self.complete += list(self.continuing.values())
        self.accepted = [p for p in self.accepted if p.id not in done]
        self.rejected = [p for p in self.rejected if p.id not in done]
        for pid, prompt in self.screening.items():
            if pid not in rewards:
                raise ValueError(f"speed: no screening rewards observed for prompt {pid!r}")
            (self.rejected if zero_variance(rewards[pid]) else self.accepted).append(prompt)
        self.screened += len(self.screening)
        self.screening, self.continuing = {}, {}
        super().observe(rewards)
        if self.round >= self.max_rounds and not self.ready:
            raise RuntimeError(f"speed: {len(self.complete)} of {self.m} prompts complete after {self.round} rounds; "
                               "the training set is smaller than run.m")

    def finish_step(self) -> list[PromptRecord]:
        if not self.ready:
            raise RuntimeError("speed: finish_step before the batch is ready")
        self.totals["shortfall"] += self.filled
        accepted = len(self.complete) - self.filled + len(self.accepted)  # passed screening, continued or not
        self.last = {"speed_rounds": float(self.round), "speed_screened": float(self.screened),
                     "speed_accept_share": accepted / max(1, self.screened), "speed_shortfall": float(self.filled)}
        return self.complete[: self.m]

    def metrics(self) -> dict[str, float]:
        return self.last | {"speed_shortfall_total": float(self.totals["shortfall"])}

    def state_dict(self) -> dict[str, Any]:
        return {"totals": dict(self.totals)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.totals = {key: int(value) for key, value in state.get("totals", self.totals).items()}
