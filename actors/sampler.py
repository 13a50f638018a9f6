"""PromptSampler actor: draws each step's candidate prompts from the training set (algorithm step 1).

A thin wrapper over `pcl.data.sampler.PromptStream` (seeded epoch shuffle, resumable cursor, distinct prompts per
draw) on the prompt table (`pcl.data.prompts.PromptRecord`s, already templated and tokenised by the driver).
"""

from __future__ import annotations

from typing import Any

import ray

from actors.runtime import heartbeat
from pcl.data.prompts import PromptRecord
from pcl.data.sampler import PromptStream


@ray.remote(num_cpus=0, max_restarts=0)
class PromptSamplerActor:
    def __init__(self, prompts: list[PromptRecord], seed: int, registry=None):
        """registry: where the run's actors beat their heartbeats (`services.incarnations.Registry`), or None."""
        self.stream = PromptStream(prompts, seed)
        self.heartbeat = heartbeat(registry, "sampler", "sampler")

    def sample(self, count: int) -> list[PromptRecord]:
        """The next `count` distinct prompts of the shuffled stream (crossing epochs as needed)."""
        return self.stream.sample(count)

    def records(self) -> list[PromptRecord]:
        """The whole training set, in dataset order (the reference pass rates cover every prompt)."""
        return self.stream.records()

    def state_dict(self) -> dict[str, Any]:
        return self.stream.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved cursor; refused when it was taken on other data (`PromptStream.load_state_dict`)."""
        self.stream.load_state_dict(state)

    def ping(self) -> bool:
        return True
