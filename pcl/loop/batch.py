"""Turning one step's verified samples into the learner's batch and the step's group statistics.

The coordinator collects exactly one `Sample` (`pcl.samples`) per (prompt, sample index) for the m selected
prompts, then:

    groups = group_samples(samples, prompt_ids, n)       # rewards[m, n] in selection order
    seqs = training_sequences(groups)                    # only samples with a non-zero advantage
    shards = shard_sequences(seqs, world_size)           # balanced by token count, one list per rank

Samples whose advantage is zero contribute nothing to the loss or its gradient (algorithm step 7: the loss is
sum_i (1/|y_i|) sum_l ratio_l * A_i over the batch), so they are not sent to the learner; the learner still
divides by the full number of sequences m*n, which keeps the update identical to training on everything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from pcl.rl import group_advantages
from pcl.samples import Sample


@dataclass(frozen=True)
class Groups:
    """The step's samples arranged as m groups of n, in the order the prompts were selected."""

    prompt_ids: list[str]  # [m]
    samples: list[list[Sample]]  # [m][n], sorted by sample index
    rewards: np.ndarray  # [m, n] float64

    @property
    def pass_rates(self) -> np.ndarray:
        """[m] mean reward per prompt: the realised pass rate p that V is trained towards (step 8)."""
        return self.rewards.mean(axis=1)


def group_samples(samples: Sequence[Sample], prompt_ids: Sequence[str], n: int) -> Groups:
    """Arrange samples into [m, n] groups, failing loudly if any (prompt, sample index) is missing or doubled."""
    by_key: dict[tuple[str, int], Sample] = {}
    for s in samples:
        key = (s.prompt_id, s.sample_index)
        if key in by_key:
            raise ValueError(f"sample {key} appears twice in the step's batch")
        by_key[key] = s
    wanted = {(pid, j) for pid in prompt_ids for j in range(n)}
    missing = wanted - by_key.keys()
    if missing:
        raise ValueError(f"{len(missing)} samples missing from the step's batch, e.g. {sorted(missing)[:3]}")
    extra = by_key.keys() - wanted
    if extra:
        raise ValueError(f"{len(extra)} samples do not belong to the step's prompts, e.g. {sorted(extra)[:3]}")
    rows = [[by_key[(pid, j)] for j in range(n)] for pid in prompt_ids]
    rewards = np.array([[s.reward for s in row] for row in rows], dtype=np.float64).reshape(len(prompt_ids), n)
    return Groups(list(prompt_ids), rows, rewards)


def training_sequences(groups: Groups, correction: str = "none") -> list[dict]:
    """The learner's input: one dict per sample with a non-zero advantage (algorithm step 6).

    Each dict has `prompt_token_ids`, `response_token_ids` (lists of int) and `advantage` (float), and
    `response_logprobs` (list of float: the engine's, for the learner's on-policy gap) when the engine reported them.
    An off-policy `correction` (learner.off_policy.correction) weights each token by the engine's log-probs: a
    trained sample without them is then a ValueError naming the setting, never a silent on-policy fallback.
    """
    if groups.rewards.size == 0:
        return []
    advantages = group_advantages(torch.as_tensor(groups.rewards)).numpy()
    out = []
    for row, adv_row in zip(groups.samples, advantages):
        for sample, adv in zip(row, adv_row):
            if abs(adv) > 1e-9 and sample.response_token_ids:
                sequence = {
                    "prompt_token_ids": list(sample.prompt_token_ids),
                    "response_token_ids": list(sample.response_token_ids),
                    "advantage": float(adv),
                }
                if sample.response_logprobs is not None:
                    sequence["response_logprobs"] = list(sample.response_logprobs)
                elif correction != "none":
                    raise ValueError(f"sample ({sample.prompt_id!r}, {sample.sample_index}) has no engine "
                                     f"log-probabilities, which learner.off_policy.correction = {correction!r} needs")
                out.append(sequence)
    return out


def shard_sequences(sequences: Sequence[dict], world_size: int) -> list[list[dict]]:
    """Split sequences over ranks, balancing total tokens (longest first onto the lightest rank).

    The assignment is deterministic for a given input order, so a retried step shards identically.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    shards: list[list[dict]] = [[] for _ in range(world_size)]
    load = [0] * world_size
    order = sorted(range(len(sequences)),
                   key=lambda i: -(len(sequences[i]["prompt_token_ids"]) + len(sequences[i]["response_token_ids"])))
    for i in order:
        rank = min(range(world_size), key=lambda r: (load[r], r))
        shards[rank].append(sequences[i])
        load[rank] += len(sequences[i]["prompt_token_ids"]) + len(sequences[i]["response_token_ids"])
    return shards
