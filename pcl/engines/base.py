"""The generation-engine interface: sampling parameters (`pcl.engines.request.SamplingParams`) in, `Generation`
records out.

Both engines (Hugging Face transformers for CPU/tests, vLLM for GPU production) implement `Engine`, so
the rollout worker never knows which one it drives:

    engine = make_engine(cfg.rollout, model_path, seed=cfg.run.seed)
    groups = engine.generate(prompt_token_ids, SamplingParams(n=8, temperature=1.0, max_new_tokens=64))
    groups[i][j].token_ids          # sample j of prompt i
    engine.load_weights(learner_state_dict, version=step + 1)   # on-policy: the next step's weights

Conventions shared by every engine:
- `token_ids` hold the response only (no prompt, no padding) and INCLUDE the end-of-sequence token when
  generation stopped on it (finish_reason "stop"), as vLLM returns them: the learner then trains the
  decision to stop. A "length" response holds exactly `max_new_tokens` tokens.
- `text` is decoded from `token_ids` without special tokens.
- `policy_version` is the version passed to the last `load_weights` (0 for the weights loaded at start,
  -1 after a failed load); every `Generation` records the version that produced it.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal, Union

import numpy as np
import torch

from pcl.engines.request import SamplingParams

FinishReason = Literal["stop", "length"]
# A full or partial state dict, or a stream of (name, tensor) pairs (a learner can send one at a time).
NamedTensors = Union[Mapping[str, torch.Tensor], Iterable[tuple[str, torch.Tensor]]]


@dataclass
class Generation:
    """One sampled response to one prompt."""

    prompt_index: int  # position of the prompt in the `generate` call's list
    sample_index: int  # 0..n-1 within that prompt's group
    token_ids: list[int]  # response tokens; no padding; ends with EOS iff finish_reason == "stop"
    text: str  # token_ids decoded without special tokens
    finish_reason: FinishReason  # "stop": the model produced EOS; "length": max_new_tokens reached
    num_tokens: int  # len(token_ids)
    policy_version: int = 0  # version of the weights that generated it
    logprobs: list[float] | None = None  # log pi(token) of each of token_ids (raw logits' log-softmax; both engines)


class EngineDead(RuntimeError):
    """The engine can serve nothing more (its process is gone): its owner must be replaced, not retried."""


def engine_dead(exc: BaseException) -> bool:
    """Whether `exc` (or an exception it was raised from) says the engine died: EngineDead, or vLLM's
    EngineDeadError (matched by name, so vllm need not be importable)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, EngineDead) or type(exc).__name__ == "EngineDeadError":
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class Engine(abc.ABC):
    """A policy that generates responses and accepts new weights in place."""

    _policy_version: int = 0

    def alive(self) -> bool:
        """False once the engine cannot serve any more (its process died); in-process engines stay alive."""
        return True

    @abc.abstractmethod
    def generate(self, prompt_token_ids: list[list[int]], params: SamplingParams) -> list[list[Generation]]:
        """n responses per prompt: result[i][j] is sample j of prompt i, in order."""

    @abc.abstractmethod
    def load_weights(self, weights: NamedTensors, version: int) -> int:
        """Copy `weights` (Hugging Face parameter names) into the policy; returns the tensors loaded."""

    @property
    def policy_version(self) -> int:
        """Version of the weights loaded: the `version` of the last `load_weights`, 0 for the initial
        weights, -1 after a failed load left the weights partly updated."""
        return self._policy_version

    def close(self) -> None:
        """Release the model and its memory; the engine is unusable afterwards."""

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------------------
# Input checks shared by the engines


def check_prompts(prompt_token_ids: list[list[int]], vocab_size: int | None = None) -> None:
    """Raise ValueError naming the first bad prompt: each must be a non-empty list of token ids in range."""
    if not isinstance(prompt_token_ids, (list, tuple)):
        raise ValueError(f"prompt_token_ids: expected a list of token-id lists, "
                         f"got {type(prompt_token_ids).__name__}")
    for index, prompt in enumerate(prompt_token_ids):
        if not isinstance(prompt, (list, tuple)) or len(prompt) == 0:
            raise ValueError(f"prompt_token_ids[{index}]: expected a non-empty list of token ids, "
                             f"got {prompt!r:.80}")
        low, high = min(prompt), max(prompt)
        if low < 0 or (vocab_size is not None and high >= vocab_size):
            raise ValueError(f"prompt_token_ids[{index}]: token ids must be in [0, {vocab_size}), "
                             f"got range [{low}, {high}]")


def left_pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded token ids [B, T] and attention mask [B, T] (1 = real token), T = the longest sequence.

    Left padding puts every sequence's last token in column T - 1, where generation continues.
    """
    width = max(len(sequence) for sequence in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, sequence in enumerate(sequences):
        input_ids[row, width - len(sequence):] = torch.as_tensor(sequence, dtype=torch.long)
        attention_mask[row, width - len(sequence):] = 1
    return input_ids, attention_mask


def derive_seed(*parts: int) -> int:
    """A well-mixed 63-bit seed from integers (engine seed, call counter, prompt index, ...)."""
    state = np.random.SeedSequence([int(part) for part in parts]).generate_state(1, np.uint64)
    return int(state[0] >> np.uint64(1))


def resolve_device(device: str | torch.device) -> torch.device:
    """'auto' -> CUDA when available, else CPU; anything else as torch spells it."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device: expected 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}") from exc


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """'float32' | 'bfloat16' | 'float16' (the config's spelling) or a torch dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"dtype: expected one of {sorted(_DTYPES)}, got {dtype!r}")
    return _DTYPES[dtype]


def check_version(version: int) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"version: expected an integer >= 0, got {version!r}")
    return version


def iter_named_tensors(weights: NamedTensors) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs from a state dict or from an iterable of pairs."""
    items = weights.items() if isinstance(weights, Mapping) else weights
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                and isinstance(item[1], torch.Tensor)):
            raise ValueError(f"weights: expected (name, tensor) pairs, "
                             f"got {type(item).__name__} {item!r:.80}")
        yield item
