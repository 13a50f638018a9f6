"""A learner rank's share of a step cut into micro-batches, and each micro-batch collated into padded tensors.

    problem = check_sequences(share, num_sequences, vocab_size, max_tokens=16384)   # None when usable
    chunks = pack_micro_batches([length(s) for s in share], max_sequences=8, max_tokens=16384)
    chunks = split_micro_batches(chunks, lengths, count)   # as many passes as the busiest rank, where possible
    batch = collate_micro_batch([share[i] for i in chunks[0]], device)

A micro-batch is right-padded to its longest sequence, so it costs (sequences x longest) tokens of compute and
activation memory: `max_tokens` bounds that product (padding included), `max_sequences` the sequence count.
Sequences are packed longest first, so sequences of similar length share a micro-batch and little is padding.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from numbers import Integral
from typing import Sequence

import numpy as np
import torch

PAD_ID = 0  # any valid id: padded positions are masked out of attention and loss


@dataclass
class MicroBatch:
    """Right-padded sequences (prompt + response) of one forward/backward pass."""

    input_ids: torch.Tensor  # [B, T] token ids, padded with PAD_ID
    attention_mask: torch.Tensor  # [B, T] 1 on real tokens
    response_mask: torch.Tensor  # [B, T-1] 1 where the *next* token (input_ids[:, 1:]) is a response token
    advantages: torch.Tensor  # [B] A_i of each sequence (algorithm step 6)
    num_tokens: int  # response tokens in the micro-batch
    engine_logprobs: torch.Tensor | None = None  # [num_tokens] the engine's log p of each response token (NaN: none)
    padded_tokens: int = 0  # B x T minus the real tokens


def length(sequence: dict) -> int:
    """Prompt plus response tokens of one sequence."""
    return len(sequence["prompt_token_ids"]) + len(sequence["response_token_ids"])


def collate_micro_batch(sequences: Sequence[dict], device: torch.device) -> MicroBatch:
    """Pack sequences {prompt_token_ids, response_token_ids, advantage[, response_logprobs]} into one
    right-padded MicroBatch (built on the CPU, moved to `device` in one go)."""
    width = max(length(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), PAD_ID, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    response_mask = torch.zeros((len(sequences), width - 1), dtype=torch.bool)
    engine: list[float] = []
    has_engine = any(s.get("response_logprobs") is not None for s in sequences)
    for row, seq in enumerate(sequences):
        prompt, response = list(seq["prompt_token_ids"]), list(seq["response_token_ids"])
        size = len(prompt) + len(response)
        input_ids[row, :size] = torch.tensor(prompt + response, dtype=torch.long)
        attention_mask[row, :size] = 1
        # Logits at position t predict token t+1, so response token j (at len(prompt) + j) is scored at
        # position len(prompt) + j - 1.
        response_mask[row, len(prompt) - 1:size - 1] = True
        if has_engine:
            given = seq.get("response_logprobs")
            engine.extend([float(x) for x in given] if given is not None else [math.nan] * len(response))
    advantages = torch.tensor([float(s["advantage"]) for s in sequences], dtype=torch.float32)
    num_tokens = sum(len(s["response_token_ids"]) for s in sequences)
    real = sum(length(s) for s in sequences)
    engine_tensor = torch.tensor(engine, dtype=torch.float32).to(device) if has_engine else None
    return MicroBatch(input_ids.to(device), attention_mask.to(device), response_mask.to(device),
                      advantages.to(device), num_tokens, engine_tensor, len(sequences) * width - real)


def dummy_micro_batch(device: torch.device) -> MicroBatch:
    """Two tokens with advantage 0: zero loss and gradient, but the pass keeps this rank's all-gathers
    and reduce-scatters in step with ranks that hold more micro-batches."""
    batch = collate_micro_batch([{"prompt_token_ids": [PAD_ID], "response_token_ids": [PAD_ID],
                                  "advantage": 0.0}], device)
    batch.num_tokens, batch.padded_tokens = 0, 2
    return batch


def pack_micro_batches(lengths: Sequence[int], max_sequences: int, max_tokens: int | None) -> list[list[int]]:
    """Indices of `lengths` cut into micro-batches, longest first (ties in input order): each holds at most
    `max_sequences` sequences and, when `max_tokens` is set, at most that many padded tokens (sequences x
    its longest). A sequence longer than `max_tokens` is refused by `check_sequences` before this."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    chunks: list[list[int]] = []
    for index in order:
        current = chunks[-1] if chunks else None
        if current is not None and len(current) < max_sequences and (
                max_tokens is None or (len(current) + 1) * lengths[current[0]] <= max_tokens):
            current.append(index)
        else:
            chunks.append([index])
    return chunks


def split_micro_batches(chunks: list[list[int]], lengths: Sequence[int], count: int) -> list[list[int]]:
    """`chunks` split until there are `count` of them, or none holds two sequences: the micro-batch of most
    padded tokens is halved first. Splitting never raises a micro-batch's tokens, so the budget still holds;
    ranks that reach the busiest rank's count need no dummy passes to keep their collectives in step."""
    chunks = [list(c) for c in chunks]
    while len(chunks) < count:
        splittable = [i for i, c in enumerate(chunks) if len(c) > 1]
        if not splittable:
            break
        index = max(splittable, key=lambda i: (len(chunks[i]) * lengths[chunks[i][0]], -i))
        chunk = chunks[index]
        half = (len(chunk) + 1) // 2
        chunks[index:index + 1] = [chunk[:half], chunk[half:]]
    return chunks


def check_sequences(sequences: Sequence[dict], num_sequences: int, vocab_size: int,
                    max_tokens: int | None = None, correction: str = "none") -> str | None:
    """The first problem with a rank's share, as a message naming the bad input; None when usable. With an
    off-policy `correction` (learner.off_policy.correction) every sequence must carry the engine's log-probs."""
    if not isinstance(num_sequences, Integral) or num_sequences < max(1, len(sequences)):
        return (f"num_sequences: expected an int >= the {len(sequences)} sequences of this rank "
                f"(and >= 1), got {num_sequences!r}")
    for index, seq in enumerate(sequences):
        missing = {"prompt_token_ids", "response_token_ids", "advantage"} - set(seq)
        if missing:
            return f"sequence {index}: missing keys {sorted(missing)}"
        for key in ("prompt_token_ids", "response_token_ids"):
            ids = seq[key]
            if len(ids) == 0:
                return f"sequence {index}: {key} is empty"
            # min/max run at C speed; a share can hold thousands of sequences of thousands of tokens.
            low, high = min(ids), max(ids)
            integral = isinstance(low, Integral) and isinstance(high, Integral)
            if not (integral and 0 <= low and high < vocab_size):
                return f"sequence {index}: {key} must hold int ids in [0, {vocab_size}), got [{low}, {high}]"
        if not math.isfinite(float(seq["advantage"])):
            return f"sequence {index}: advantage is {seq['advantage']!r}"
        if max_tokens is not None and length(seq) > max_tokens:
            return (f"sequence {index}: {length(seq)} tokens (prompt + response) exceed "
                    f"learner.max_tokens_per_micro_batch = {max_tokens}; raise it to at least {length(seq)}")
        logprobs = seq.get("response_logprobs")
        if logprobs is None and correction != "none":
            return (f"sequence {index}: no response_logprobs (the engine's log-probabilities of its tokens), which "
                    f"learner.off_policy.correction = {correction!r} needs")
        if logprobs is not None and len(logprobs) != len(seq["response_token_ids"]):
            return (f"sequence {index}: response_logprobs has {len(logprobs)} entries for "
                    f"{len(seq['response_token_ids'])} response tokens")
    return _check_logprobs(sequences)


def _check_logprobs(sequences: Sequence[dict]) -> str | None:
    """The first sequence whose engine log-probabilities are not all finite numbers <= 0 (a NaN or an infinity would
    poison the off-policy weights and the log-prob gaps), named; one vectorised pass over the whole share, the
    sequence and token only looked for when it fails."""
    given = [(index, seq["response_logprobs"]) for index, seq in enumerate(sequences)
             if seq.get("response_logprobs") is not None]
    try:
        values = np.fromiter(itertools.chain.from_iterable(lp for _, lp in given), dtype=np.float64)
    except (TypeError, ValueError):
        values = None  # not numbers: named below
    if values is not None and (not values.size or (values.min() > -math.inf and values.max() <= 0)):
        return None  # NaN fails both comparisons
    for index, logprobs in given:
        try:
            row = np.asarray(logprobs, dtype=np.float64)
        except (TypeError, ValueError):
            return f"sequence {index}: response_logprobs must hold numbers"
        bad = np.flatnonzero(~(np.isfinite(row) & (row <= 0)))
        if bad.size:
            return (f"sequence {index}: response_logprobs[{bad[0]}] is {row[bad[0]]} ({bad.size} of {row.size} "
                    f"not finite numbers <= 0): the engine's log-probabilities cannot weigh the loss")
    return None
