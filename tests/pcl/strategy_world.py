"""A simulated prompt world for the selection strategies' tests: a prompt stream (the sampler's seeded epoch
shuffle) with known pass rates and Bernoulli rewards, driven through the round protocol as the coordinator drives
a strategy."""

from __future__ import annotations

import numpy as np

from pcl.loop.batch import group_samples
from pcl.samples import Sample
from pcl.data.prompts import PromptRecord
from pcl.engines import SamplingParams
from pcl.loop.rounds import RoundLedger
from pcl.data.sampler import PromptSampler


def prompts(count: int) -> list[PromptRecord]:
    return [PromptRecord(f"p{i}", f"{i}+1", str(i + 1), f"{i}+1=", (5, i % 7 + 3)) for i in range(count)]


class World:
    """A prompt stream (the sampler's seeded epoch shuffle, distinct within a draw) and true pass rates."""

    def __init__(self, rates: dict[str, float], seed: int = 0):
        self.records = prompts(len(rates))
        self.rates = rates
        self.sampler = PromptSampler(len(self.records), seed)
        self.rng = np.random.default_rng(seed)
        self.generated = 0

    def draw(self, count: int) -> list[PromptRecord]:
        seen: dict[int, None] = {}
        while len(seen) < count:
            for i in self.sampler.sample(count - len(seen)):
                seen.setdefault(i, None)
        return [self.records[i] for i in seen]

    def run_step(self, strategy, step: int = 0, values=None, full: bool = True):
        """One step through the protocol; returns (batch prompts, groups [m, n], ledger, rounds). With
        full=False the batch may hold fewer than m prompts (dynamic sampling's `shrink` at its round limit)."""
        ledger, rounds = RoundLedger(), 0
        ledger.carry_in(strategy.start_step(step))
        while not strategy.ready:
            request = strategy.next_request()
            candidates = self.draw(request.draw) if request.draw else []
            scores = np.array([values[c.id] for c in candidates]) if request.score else None
            rollouts = strategy.propose(candidates, scores)
            wanted = ledger.reserve(rollouts, SamplingParams())
            samples = [Sample(r.prompt_id, i, r.prompt_token_ids, (1,),
                              float(self.rng.random() < self.rates[r.prompt_id]), "stop")
                       for r in wanted for i in r.indices]
            self.generated += len(samples)
            ledger.add(samples)
            rewards = ledger.round_rewards(samples)
            strategy.observe({r.prompt.id: rewards[r.prompt.id] for r in rollouts})
            rounds += 1
            assert rounds < 100, "the strategy never became ready"
        batch = strategy.end_step(ledger.samples_of)
        ids = [p.id for p in batch]
        assert len(ids) == len(set(ids)) and (len(ids) == strategy.m if full else 1 <= len(ids) <= strategy.m)
        groups = group_samples(ledger.samples_of(ids), ids, strategy.n)  # raises on a missing / extra index
        return batch, groups, ledger, rounds


def rates_cycle(count: int, cycle: list[float]) -> dict[str, float]:
    return {f"p{i}": cycle[i % len(cycle)] for i in range(count)}
