"""What a rollout asks of an engine: how to sample (`SamplingParams`) and for which prompt (`RolloutRequest`).

One type travels from the step loop to the engine. The loop's round ledger (`pcl.loop.rounds`) or an evaluation
builds a `RolloutRequest` per prompt with the `SamplingParams` it means (the run's rollout settings, the held-out
evaluation's temperature, the suite's decoding); the stream client (`services.streams.rollout_client`) carries it
in a `services.streams.payloads.RequestRecord`, whose `sampling` field is this very `SamplingParams`; the rollout
worker hands that `sampling` to `Engine.generate` unchanged:

    sampling = SamplingParams.from_rollout_config(cfg.rollout, n=cfg.run.n)
    requests = RolloutRequest.for_prompts(prompts, sampling)      # sample indices 0 .. n-1 of each prompt
    request.indices                                               # range(first_index, first_index + n)
    groups = engine.generate([list(r.prompt_token_ids) for r in requests], sampling)

Plain dataclasses only (no torch, no msgspec, no pydantic), so any layer can import them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class SamplingParams:
    """How to sample: the same meaning in every engine.

    temperature == 0 means greedy decoding; top_k == -1 (or 0) disables top-k; top_p == 1 disables
    nucleus sampling. `seed` fixes the samples of one `generate` call; when None the HF engine derives a
    seed from its own seed and a call counter (a freshly built engine with the same seed replays the same
    calls identically) and vLLM samples unseeded (seeded requests cost it a kernel launch per sequence).
    Frozen, hence hashable: a rollout worker batches the requests that share one.
    """

    n: int = 1  # samples per prompt
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 256  # response budget; a response that reaches it finishes with "length"
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.n, int) and self.n >= 1):
            raise ValueError(f"SamplingParams.n: expected an integer >= 1, got {self.n!r}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"SamplingParams.temperature: expected a finite value >= 0, "
                             f"got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p: expected 0 < top_p <= 1, got {self.top_p!r}")
        if not (isinstance(self.top_k, int) and self.top_k >= -1):
            raise ValueError(f"SamplingParams.top_k: expected -1 (off) or an integer >= 1, "
                             f"got {self.top_k!r}")
        if not (isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1):
            raise ValueError(f"SamplingParams.max_new_tokens: expected an integer >= 1, "
                             f"got {self.max_new_tokens!r}")
        if self.seed is not None and not (isinstance(self.seed, int) and self.seed >= 0):
            raise ValueError(f"SamplingParams.seed: expected None or an integer >= 0, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def top_k_enabled(self) -> bool:
        return self.top_k > 0

    @classmethod
    def from_rollout_config(cls, rollout_cfg, n: int, seed: int | None = None) -> "SamplingParams":
        """Sampling parameters of a run (`pcl.config.RolloutConfig`) with n samples per prompt."""
        return cls(n=n, temperature=rollout_cfg.temperature, top_p=rollout_cfg.top_p, top_k=rollout_cfg.top_k,
                   max_new_tokens=rollout_cfg.max_new_tokens, seed=seed)


@dataclass(frozen=True)
class RolloutRequest:
    """Samples `indices` (first_index .. first_index + n - 1) of one prompt, drawn as `sampling` says.

    A prompt asked for again in a later generation round of the same step continues its sample indices
    (`first_index`), so no two rounds' samples share an idempotency key; estimation rollouts start theirs at
    `pcl.loop.rounds.ESTIMATE_BASE`.
    """

    prompt_id: str  # stable id of the dataset row
    prompt_token_ids: tuple[int, ...]  # the templated prompt
    sampling: SamplingParams  # n (samples asked for), temperature, top-p, top-k, length limit, seed
    first_index: int = 0  # sample index of the first of the n samples

    def __post_init__(self) -> None:
        if not isinstance(self.prompt_id, str):
            raise ValueError(f"RolloutRequest.prompt_id: expected a str, got {type(self.prompt_id).__name__}")
        if not _token_ids(self.prompt_token_ids):
            raise ValueError(f"RolloutRequest.prompt_token_ids of prompt {self.prompt_id!r}: expected a non-empty "
                             f"tuple of token ids >= 0, got {self.prompt_token_ids!r:.80}")
        if not isinstance(self.sampling, SamplingParams):
            raise ValueError(f"RolloutRequest.sampling of prompt {self.prompt_id!r}: expected SamplingParams, "
                             f"got {type(self.sampling).__name__}")
        if isinstance(self.first_index, bool) or not isinstance(self.first_index, int) or self.first_index < 0:
            raise ValueError(f"RolloutRequest.first_index of prompt {self.prompt_id!r}: expected an integer >= 0, "
                             f"got {self.first_index!r}")

    @property
    def n(self) -> int:
        """Samples asked for."""
        return self.sampling.n

    @property
    def indices(self) -> range:
        """The sample indices of the request's samples."""
        return range(self.first_index, self.first_index + self.sampling.n)

    @classmethod
    def of(cls, prompt, sampling: SamplingParams, first_index: int = 0) -> "RolloutRequest":
        """The request for a PromptRecord-like prompt (`.id`, `.prompt_token_ids`)."""
        tokens = prompt.prompt_token_ids
        return cls(prompt.id, tokens if isinstance(tokens, tuple) else tuple(tokens or ()), sampling, first_index)

    @classmethod
    def for_prompts(cls, prompts: Iterable, sampling: SamplingParams) -> list["RolloutRequest"]:
        """One request per prompt, each for samples 0 .. n-1 with `sampling` (an evaluation, the reference pass)."""
        return [cls.of(prompt, sampling) for prompt in prompts]


def _token_ids(tokens) -> bool:
    """Whether `tokens` is a non-empty tuple of non-negative integers (their upper bound is the engine's check)."""
    try:
        return isinstance(tokens, tuple) and len(tokens) > 0 and min(tokens) >= 0
    except TypeError:  # an element that is not a number
        return False
