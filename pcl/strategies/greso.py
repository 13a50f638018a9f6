"""GRESO (`selection.type: greso`; Zheng et al. 2025, "Act Only When It Pays"): dynamic sampling that skips,
before rollout, prompts whose recent groups were all correct or all wrong. A step's first round draws ceil(k*m)
candidates (k=1.5: the paper's B_r^default = 768 for m = 512).

Each prompt carries a reward history: the number of consecutive steps, up to its last rollout, in which all of
its n responses were correct (an easy streak) or all were wrong (a hard streak). A candidate on an easy streak
of length s is still rolled out with probability max(p_easy ** s, 0.01), else skipped; likewise with p_hard.
After each step, p_easy moves by delta_p toward keeping the share of all-correct groups among the rolled-out
prompts at target_zero_variance / 3 (down, skipping more, when the share is at or above it; up otherwise), and
p_hard toward 2 * target_zero_variance / 3, both within [0.05, 0.95], as the reference implementation does.
Later rounds of a step draw only about as many candidates as the observed keep rate needs (x1.25), and the
last round skips nothing, so the batch can always be filled. The history, p_easy, p_hard and the random
generator are in `state_dict`.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from pcl.config import GresoSelection
from pcl.data.prompts import PromptRecord
from pcl.strategies.base import Request, Tunable
from pcl.strategies.rollout_filter import RolloutFilter

P_MIN, P_MAX = 0.05, 0.95  # bounds of the adapted exploration probabilities
KEEP_FLOOR = 0.01  # a prompt on any streak is still rolled out with at least this probability


class GresoStrategy(RolloutFilter):
    config = GresoSelection
    tunable = {"k": Tunable(float, 1.0)}
    adapted = ("p_easy", "p_hard")

    @classmethod
    def from_config(cls, selection: GresoSelection, m: int, n: int, seed: int = 0) -> "GresoStrategy":
        return cls(m, n, selection.k, selection.max_rounds, selection.p_easy, selection.p_hard, selection.delta_p,
                   selection.target_zero_variance, seed)

    def __init__(self, m: int, n: int, k: float, max_rounds: int, p_easy: float, p_hard: float, delta_p: float,
                 target_zero_variance: float, seed: int = 0):
        super().__init__(m, n, k, max_rounds)
        self.p_easy, self.p_hard, self.delta_p = p_easy, p_hard, delta_p
        self.target_easy, self.target_hard = target_zero_variance / 3, 2 * target_zero_variance / 3
        self.streaks: dict[str, int] = {}  # prompt id -> +s: s all-correct steps in a row; -s: all-wrong
        self.rng = np.random.default_rng([seed, 0x6E50])
        self.step_counts = {"easy": 0, "hard": 0, "rolled": 0, "skipped": 0, "eligible": 0}

    def begin_step(self, step: int) -> None:
        super().begin_step(step)
        self.step_counts = dict.fromkeys(self.step_counts, 0)

    def keep_probability(self, prompt_id: str) -> float:
        """The probability of rolling a candidate out given its streak (1 without a streak)."""
        streak = self.streaks.get(prompt_id, 0)
        if streak == 0:
            return 1.0
        return max((self.p_easy if streak > 0 else self.p_hard) ** abs(streak), KEEP_FLOOR)

    def next_request(self) -> Request:
        if self.round == 0 or self.step_counts["rolled"] == 0 or self.round >= self.max_rounds - 1:
            return Request(draw=self.round_size())
        keep_rate = len(self.kept) / self.step_counts["rolled"]
        missing = self.m - len(self.kept)
        # Enough for the missing prompts at the observed keep rate, with a 25% margin (GRESO's adaptive size).
        wanted = max(1, math.ceil(1.25 * missing / max(keep_rate, 0.05)))
        return Request(draw=min(math.ceil(self.k * self.m), wanted))

    def admit(self, candidates: Sequence[PromptRecord]) -> list[PromptRecord]:
        if self.round >= self.max_rounds - 1:
            return list(candidates)  # the last round skips nothing: the batch must be fillable
        out = []
        for c in candidates:
            keep = self.keep_probability(c.id)
            self.step_counts["eligible"] += keep < 1.0
            if keep >= 1.0 or self.rng.random() < keep:
                out.append(c)
            else:
                self.step_counts["skipped"] += 1
        return out

    def observe(self, rewards: Mapping[str, np.ndarray]) -> None:
        for pid in self.pending:
            r = rewards.get(pid)
            if r is None or len(r) == 0:
                continue
            streak = self.streaks.get(pid, 0)
            if np.all(r == 1):
                self.streaks[pid] = streak + 1 if streak > 0 else 1
                self.step_counts["easy"] += 1
            elif np.all(r == 0):
                self.streaks[pid] = streak - 1 if streak < 0 else -1
                self.step_counts["hard"] += 1
            else:
                self.streaks.pop(pid, None)
            self.step_counts["rolled"] += 1
        super().observe(rewards)

    def finish_step(self) -> list[PromptRecord]:
        batch = super().finish_step()
        rolled = self.step_counts["rolled"]
        # Adapt only once the history can skip anything (GRESO starts adapting after its first epoch).
        if rolled and self.step_counts["eligible"]:
            easy, hard = self.step_counts["easy"] / rolled, self.step_counts["hard"] / rolled
            step = -self.delta_p if easy >= self.target_easy else self.delta_p
            self.p_easy = min(max(self.p_easy + step, P_MIN), P_MAX)
            step = -self.delta_p if hard >= self.target_hard else self.delta_p
            self.p_hard = min(max(self.p_hard + step, P_MIN), P_MAX)
        return batch

    def metrics(self) -> dict[str, float]:
        c = self.step_counts
        return super().metrics() | {
            "greso_p_easy": self.p_easy, "greso_p_hard": self.p_hard, "greso_skipped": float(c["skipped"]),
            "greso_easy_share": c["easy"] / c["rolled"] if c["rolled"] else 0.0,
            "greso_hard_share": c["hard"] / c["rolled"] if c["rolled"] else 0.0,
        }

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"p_easy": self.p_easy, "p_hard": self.p_hard, "streaks": dict(self.streaks),
                                       "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.p_easy, self.p_hard = float(state["p_easy"]), float(state["p_hard"])
        self.streaks = {str(k): int(v) for k, v in state["streaks"].items()}
        self.rng.bit_generator.state = state["rng"]
