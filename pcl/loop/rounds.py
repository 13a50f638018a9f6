"""The generation rounds of one training step: which sample indices each prompt has used, and every sample.

A selection strategy may generate more than once within a step, always with the step's policy version:
dynamic sampling and GRESO roll out fresh prompts until enough are informative, SPEED screens prompts with a
few rollouts and continues the accepted ones. The ledger gives each request the next free sample indices of
its prompt, so the records of two rounds never share an idempotency key (run, step, prompt id, sample index,
policy version), and assembles the step's batch from all rounds:

    ledger = RoundLedger()
    requests = ledger.reserve([Rollout(prompt, 4), Rollout(other, 8)], sampling)  # RolloutRequests, indices 0..
    ledger.add(rollouts.generate_rollouts(step, version, requests))
    ledger.reserve([Rollout(prompt, 12)], sampling)   # -> [RolloutRequest(prompt, n=12, first_index=4)]: 4..15
    ledger.round_rewards(samples)                     # {prompt id: rewards of this round, by index}
    ledger.samples_of(["p-1", "p-7"])                 # every sample of those prompts, all rounds

Estimation rollouts (`Rollout(prompt, 8, train=False)`, the `probe` strategy's pass-rate estimates) are shown to
the strategy but never trained on: their indices start at ESTIMATE_BASE, so they share no idempotency key with
the prompt's trained samples (still 0 .. n-1), and `samples_of` leaves them out.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Iterable, Sequence

import numpy as np

from pcl.data.prompts import PromptRecord
from pcl.engines.request import RolloutRequest, SamplingParams
from pcl.loop.curriculum import pool_histogram
from pcl.samples import Sample

ESTIMATE_BASE = 1 << 20  # first sample index of a prompt's estimation rollouts (never trained on)


class RoundLedger:
    def __init__(self) -> None:
        self.next_index: Counter[str] = Counter()  # prompt id -> first sample index not yet asked for
        self.next_estimate: Counter[str] = Counter()  # prompt id -> estimation rollouts asked for so far
        self.samples: dict[str, list[Sample]] = {}  # prompt id -> its samples so far, every round
        self.rounds = 0  # generation rounds that asked for at least one sample
        self.generated = 0  # samples collected, all rounds (screening, probes and the batch)
        self.estimated = 0  # of those, estimation samples (not trained on)

    def reserve(self, rollouts: Iterable, sampling: SamplingParams) -> list[RolloutRequest]:
        """The requests of a round's rollouts (each a `pcl.strategies.base.Rollout`: prompt, n, train), sampled as
        `sampling` says with the rollout's n: each from its prompt's next free sample index, or with train=False
        its next free estimation index (from ESTIMATE_BASE on)."""
        out, by_n = [], {}
        for rollout in rollouts:
            prompt, n = rollout.prompt, rollout.n
            counter, base = (self.next_index, 0) if rollout.train else (self.next_estimate, ESTIMATE_BASE)
            first = counter[prompt.id]
            counter[prompt.id] = first + n
            if n not in by_n:
                by_n[n] = replace(sampling, n=n)
            out.append(RolloutRequest.of(prompt, by_n[n], base + first))
        return out

    def carry_in(self, samples: Sequence[Sample]) -> None:
        """Samples generated in an earlier step that this step continues (SPEED's carried screening): part of
        the batch, not counted as generated or as a round; the prompt's next indices follow them."""
        for s in samples:
            self.samples.setdefault(s.prompt_id, []).append(s)
            self.next_index[s.prompt_id] = max(self.next_index[s.prompt_id], s.sample_index + 1)

    def add(self, samples: Sequence[Sample]) -> None:
        """Record one round's samples."""
        if samples:
            self.rounds += 1
        self.generated += len(samples)
        for s in samples:
            if s.sample_index >= ESTIMATE_BASE:
                self.estimated += 1
            else:
                self.samples.setdefault(s.prompt_id, []).append(s)

    @staticmethod
    def round_rewards(samples: Sequence[Sample]) -> dict[str, np.ndarray]:
        """prompt id -> float64[n] rewards of this round's samples of the prompt, in sample-index order."""
        by_prompt: dict[str, list[Sample]] = {}
        for s in samples:
            by_prompt.setdefault(s.prompt_id, []).append(s)
        return {pid: np.array([s.reward for s in sorted(group, key=lambda s: s.sample_index)], dtype=np.float64)
                for pid, group in by_prompt.items()}

    def samples_of(self, prompt_ids: Iterable[str]) -> list[Sample]:
        """Every sample of these prompts collected this step, from all rounds (estimation rollouts excluded)."""
        return [s for pid in prompt_ids for s in self.samples.get(pid, [])]


@dataclass
class StepBatch:
    """What a step's rounds produced: every sample (the ledger), the strategy's batch, V's scores, the probe."""

    ledger: RoundLedger
    prompts: list[PromptRecord] = field(default_factory=list)  # the m prompts trained on, in order
    values: dict[str, float] = field(default_factory=dict)  # V(x) of every scored candidate, by prompt id
    probe_ids: list[str] = field(default_factory=list)  # the unfiltered probe of V's explained variance
    probe_rates: list[float] = field(default_factory=list)  # their realised pass rates, in the same order
    probe_samples: int = 0  # samples generated only for the probe (its prompts the strategy did not choose)
    probe_seconds: float = 0.0  # their share of the generation call's seconds (by sample count)
    version: int = 0  # the policy version that generated it
    value_version: int | None = None  # the policy version whose rollouts V had last trained on when it scored them
    pool: list[int] = field(default_factory=list)  # V's scored candidates by bin (curriculum.bins), all rounds
    tau: float | None = None  # the strategy's target pass rate when it selected (a strategy that has one)

    @property
    def ids(self) -> list[str]:
        return [p.id for p in self.prompts]

    def add_scores(self, candidates: Sequence[PromptRecord], values: np.ndarray, value_version: int | None,
                   bins: int, tau: float | None) -> None:
        """V's predictions of a round's candidates: by prompt, their histogram over `bins` (the pool), the version
        of V that made them, and the strategy's tau when it selected."""
        self.values.update({c.id: float(v) for c, v in zip(candidates, values)})
        counts = pool_histogram(values, bins)
        self.pool = [a + b for a, b in zip(self.pool, counts)] if self.pool else counts
        self.value_version, self.tau = value_version, tau
