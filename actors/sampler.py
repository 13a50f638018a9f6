"""PromptSampler actor: draws each step's candidate prompts from the training set (algorithm step 1).

A thin wrapper over `pcl.data.sampler.PromptSampler` (seeded epoch shuffle, resumable cursor) and the prompt
table (`pcl.data.prompts.PromptRecord`s, already templated and tokenised by the driver).
"""

from __future__ import annotations

from typing import Any

import ray

from pcl.data.prompts import PromptRecord
from pcl.data.fingerprint import data_changes, data_fingerprint
from pcl.data.sampler import PromptSampler


def draw_distinct(sampler: PromptSampler, count: int) -> list[int]:
    """The next `count` distinct indices of the stream: a draw that crosses an epoch boundary can meet a
    prompt twice (once from each epoch); the repeat is skipped so a step never holds a prompt twice."""
    if count > sampler.num_prompts:
        raise ValueError(f"cannot draw {count} distinct prompts from a set of {sampler.num_prompts}")
    seen: dict[int, None] = {}
    while len(seen) < count:
        for i in sampler.sample(count - len(seen)):
            seen.setdefault(int(i), None)
    return list(seen)


@ray.remote(num_cpus=0, max_restarts=0)
class PromptSamplerActor:
    def __init__(self, prompts: list[PromptRecord], seed: int):
        if not prompts:
            raise ValueError("the training set has no usable prompts")
        self.prompts = prompts
        self.sampler = PromptSampler(len(prompts), seed)
        self.fingerprint = data_fingerprint(prompts)  # saved with the cursor: a resume on other data is refused

    def sample(self, count: int) -> list[PromptRecord]:
        """The next `count` distinct prompts of the shuffled stream (crossing epochs as needed)."""
        return [self.prompts[i] for i in draw_distinct(self.sampler, count)]

    def records(self) -> list[PromptRecord]:
        """The whole training set, in dataset order (the reference pass rates cover every prompt)."""
        return self.prompts

    def state_dict(self) -> dict[str, Any]:
        return {**self.sampler.state_dict(), "data": self.fingerprint}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved cursor; refused (ValueError saying what differs) when it was taken on other data
        (`pcl.data.fingerprint.data_changes`, the check the driver ran before starting)."""
        differences = data_changes(state, self.prompts)
        if differences:
            raise ValueError("the sampler state was saved on other training data: " + "; ".join(differences))
        self.sampler.load_state_dict({k: v for k, v in state.items() if k != "data"})

    def ping(self) -> bool:
        return True
