"""SPEED (`selection.type: speed`; Zhang et al. 2025, "SPEED-RL"; the PCL paper's Algorithm 4): screen candidates
with n_init rollouts, continue the accepted ones (0 < screening pass rate < 1) with n - n_init more.

Rounds of one step, each one generation call:

    round 1:  continue up to m accepted prompts (n - n_init each) and, while the accepted prompts left over
              would not cover what is still needed, screen k*m fresh candidates (n_init each) in the same call
    round r:  likewise with the prompts accepted so far
    last:     continuation only; if fewer than m were accepted, screened-but-rejected prompts are continued
              too (the best available), and the shortfall is counted

A trained prompt's group is its n_init screening responses plus its n - n_init continuation responses (sample
indices 0..n-1). `carry_over` decides what happens to accepted prompts that were not continued:

    true   (the default, the paper's SPEED) they stay in D_accepted, with their screening samples, and are
           continued by the next step, whose policy is one update newer: the batch is off-policy by one step
           for those prompts' first n_init responses. Screening aims to keep m accepted prompts in reserve for
           the next step, so in steady state a step is one generation call. The buffer and its samples are in
           `state_dict`, so a resumed run continues exactly.
    false  (on-policy) they are dropped at the end of the step: every response of the batch comes from the
           step's policy, at the price of more rounds per step.

`start_step` hands the step loop the carried screening samples for the step's rounds; `end_step` takes back,
from the step's samples, those of the prompts it carries on.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from pcl.config import SpeedSelection
from pcl.data.prompts import PromptRecord
from pcl.samples import Sample
from pcl.strategies.base import Request, Rollout, Strategy, Tunable, zero_variance


class SpeedStrategy(Strategy):
    config = SpeedSelection
    tunable = {"k": Tunable(int, 1)}

    @classmethod
    def from_config(cls, selection: SpeedSelection, m: int, n: int, seed: int = 0) -> "SpeedStrategy":
        return cls(m, n, selection.k, selection.n_init, selection.max_rounds, selection.carry_over)

    @classmethod
    def check_run(cls, m: int, n: int, selection=None) -> None:
        super().check_run(m, n)
        if selection is not None and not 1 <= selection.n_init < n:
            raise ValueError(f"selection.type=speed: selection.n_init ({selection.n_init}) must be at least 1 and "
                             f"below run.n ({n}): the accepted prompts need n - n_init continuation responses")

    def __init__(self, m: int, n: int, k: int, n_init: int, max_rounds: int, carry_over: bool = False):
        super().__init__(m, n)
        if not 1 <= n_init < n:
            raise ValueError(f"selection.type=speed: selection.n_init ({n_init}) must be at least 1 and below "
                             f"run.n ({n}): the accepted prompts need n - n_init continuation responses")
        if max_rounds < 2 or k < 1:
            raise ValueError(f"selection.type=speed: selection.max_rounds ({max_rounds}) must be >= 2 (a screening "
                             f"round and a continuation round) and selection.k ({k}) >= 1")
        self.k, self.n_init, self.max_rounds, self.carry_over = k, n_init, max_rounds, carry_over
        self.totals = {"shortfall": 0}
        self.last: dict[str, float] = {}
        self.buffer: list[PromptRecord] = []  # D_accepted carried from earlier steps (carry_over)
        self.buffer_samples: list[Sample] = []  # their n_init screening samples
        self.begin_step(-1)

    def begin_step(self, step: int) -> None:
        super().begin_step(step)
        self.seen: set[str] = {p.id for p in self.buffer}
        self.accepted: list[PromptRecord] = list(self.buffer)  # screened, awaiting continuation
        self.carried_in = len(self.buffer)
        self.rejected: list[PromptRecord] = []  # screened, all responses equal
        self.complete: list[PromptRecord] = []  # screened and continued: full groups of n
        self.screening: dict[str, PromptRecord] = {}  # proposed this round for screening
        self.continuing: dict[str, PromptRecord] = {}  # proposed this round for continuation
        self.screened = self.accepted_now = self.filled = 0

    # -- carried samples (carry_over) --------------------------------------------------------------------------

    def start_step(self, step: int) -> list[Sample]:
        """Begin the step; returns the screening samples of D_accepted from earlier steps, for its rounds."""
        self.begin_step(step)
        return self.carried_samples()

    def end_step(self, samples_of: Callable[[Sequence[str]], list[Sample]]) -> list[PromptRecord]:
        """The batch; D_accepted's screening samples (of `carry_ids`) are kept for the next step."""
        batch = self.finish_step()
        self.carry(samples_of(self.carry_ids))
        return batch

    def carried_samples(self) -> list[Sample]:
        """Screening samples from earlier steps of the prompts in D_accepted, for this step's rounds."""
        return list(self.buffer_samples)

    @property
    def carry_ids(self) -> list[str]:
        """After `finish_step`: the prompts whose samples `carry` keeps for the next step."""
        return [p.id for p in self.buffer]

    def carry(self, samples: Sequence[Sample]) -> None:
        """The screening samples of `carry_ids`, from this step's rounds (and earlier steps')."""
        wanted = set(self.carry_ids)
        self.buffer_samples = [s for s in samples if s.prompt_id in wanted]
        missing = wanted - {s.prompt_id for s in self.buffer_samples}
        if missing:
            raise ValueError(f"speed: no screening samples to carry for {sorted(missing)[:3]}")

    # -- the round protocol ------------------------------------------------------------------------------------

    @property
    def last_round(self) -> bool:
        return self.round >= self.max_rounds - 1

    @property
    def ready(self) -> bool:
        return len(self.complete) >= self.m

    def continue_count(self) -> int:
        return min(self.m - len(self.complete), len(self.accepted))

    def screening_needed(self) -> bool:
        """Whether this round screens fresh candidates: the accepted prompts left after this round's continuation
        do not cover the rest of this step (and, with carry_over, a full next step)."""
        go_on = self.continue_count()
        still = self.m - len(self.complete) - go_on + (self.m if self.carry_over else 0)
        return not self.last_round and len(self.accepted) - go_on < still

    def next_request(self) -> Request:
        return Request(draw=self.k * self.m if self.screening_needed() else 0)

    def propose(self, candidates: Sequence[PromptRecord], values: np.ndarray | None) -> list[Rollout]:
        room = self.m - len(self.complete)
        go_on = self.accepted[:room]
        if self.last_round and len(go_on) < room:  # fill with the best available: screened, rejected prompts
            fill = self.rejected[: room - len(go_on)]
            self.filled = len(fill)
            go_on = go_on + fill
        self.continuing = {p.id: p for p in go_on}
        fresh = [c for c in candidates if c.id not in self.seen] if self.screening_needed() else []
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
            accept = not zero_variance(rewards[pid])
            (self.accepted if accept else self.rejected).append(prompt)
            self.accepted_now += accept
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
        carried = {p.id for p in self.buffer}
        batch = self.complete[: self.m]
        self.buffer = list(self.accepted) if self.carry_over else []
        self.last = {"speed_rounds": float(self.round), "speed_screened": float(self.screened),
                     "speed_accept_share": self.accepted_now / max(1, self.screened),
                     "speed_shortfall": float(self.filled),
                     "speed_carried_in": float(self.carried_in),  # D_accepted at the start of the step
                     "speed_off_policy_prompts": float(sum(p.id in carried for p in batch)),
                     "speed_carried_out": float(len(self.buffer))}
        return batch

    # -- state and figures -------------------------------------------------------------------------------------

    def metrics(self) -> dict[str, float]:
        return self.last | {"speed_shortfall_total": float(self.totals["shortfall"])}

    def state_dict(self) -> dict[str, Any]:
        return {"totals": dict(self.totals), "buffer": [asdict(p) for p in self.buffer],
                "buffer_samples": [asdict(s) for s in self.buffer_samples]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.totals = {key: int(value) for key, value in state.get("totals", self.totals).items()}
        self.buffer = [_prompt(p) for p in state.get("buffer", [])]
        self.buffer_samples = [_sample(s) for s in state.get("buffer_samples", [])]
        self.begin_step(self.step)


def _prompt(d: dict[str, Any]) -> PromptRecord:
    ids = d.get("prompt_token_ids")
    answer = d["answer"]
    return PromptRecord(str(d["id"]), str(d["problem"]), list(answer) if isinstance(answer, list) else answer,
                        str(d["prompt"]), tuple(int(i) for i in ids) if ids is not None else None)


def _sample(d: dict[str, Any]) -> Sample:
    return Sample(str(d["prompt_id"]), int(d["sample_index"]), tuple(int(i) for i in d["prompt_token_ids"]),
                  tuple(int(i) for i in d["response_token_ids"]), float(d["reward"]), str(d["finish_reason"]),
                  None if d.get("response_logprobs") is None else tuple(float(x) for x in d["response_logprobs"]),
                  int(d.get("policy_version", -1)))
