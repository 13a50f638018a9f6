"""A verified sample: one generation of one prompt with its reward, the record the rollouts hand back.

The rollout client (`services.streams.rollout_client`) turns each verified result into a `Sample`; the
strategies screen them (SPEED carries some into later steps), and the loop groups them into the learner's batch
(`pcl.loop.batch`). Plain data, no torch, so every part of the core below the loop can hold them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sample:
    """One verified generation, as the learner and the statistics need it."""

    prompt_id: str  # the dataset's stable prompt id
    sample_index: int  # 0..n-1 within the prompt's group
    prompt_token_ids: tuple[int, ...]  # the templated prompt, tokenised
    response_token_ids: tuple[int, ...]  # the generation, EOS included when it stopped
    reward: float  # verified reward in {0, 1}; 0 for truncated responses
    finish_reason: str  # "stop" or "length"
    response_logprobs: tuple[float, ...] | None = None  # the engine's log pi of each response token, if reported
    policy_version: int = -1  # the policy version that generated it (-1: not recorded)
