"""The tiny build's supervised warm-up: `<bos> prompt response <eos>` sequences, and AdamW steps over them with a
warm-up-then-cosine learning rate and an optional early stop (the build's probe)."""

from __future__ import annotations

import math
import time
from typing import Callable

import torch

from pcl.tiny.task import format_prompt
from pcl.tiny.tasks import ARITH


def encode_for_training(rows: list[dict], tokenizer, response: Callable[[dict], str] = ARITH.response,
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded `<bos> prompt response <eos>` sequences and their labels, both [N, L] int64; the response of a
    row is `response(row)` (the arithmetic task's: the answer).

    Labels are -100 except on the response and its EOS: the warm-up teaches answering, not prompt statistics.
    """
    prompts = tokenizer([format_prompt(r["problem"]) for r in rows]).input_ids
    answers = tokenizer([response(r) for r in rows], add_special_tokens=False).input_ids
    targets = [answer + [tokenizer.eos_token_id] for answer in answers]
    length = max(len(p) + len(t) for p, t in zip(prompts, targets))
    pad = tokenizer.pad_token_id
    input_ids = [p + t + [pad] * (length - len(p) - len(t)) for p, t in zip(prompts, targets)]
    labels = [[-100] * len(p) + t + [-100] * (length - len(p) - len(t)) for p, t in zip(prompts, targets)]
    return torch.tensor(input_ids), torch.tensor(labels)


def warm_up(model, input_ids: torch.Tensor, labels: torch.Tensor, steps: int, batch_size: int, lr: float,
            log: Callable[[str], None], stop: Callable[[int], bool] | None = None,
            decay_steps: int | None = None) -> list[float]:
    """Supervised warm-up: up to `steps` AdamW steps over consecutive batches of the (pre-shuffled) rows.

    Linear warm-up for 5% of `decay_steps` (default: `steps`), cosine decay to 10% of lr at `decay_steps`,
    then 10% of lr. `stop(done)`, called after each step but the last with the steps done (the model in
    eval mode), ends the warm-up early by returning True.
    Returns the loss of every step taken.
    """
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
    decay_steps = steps if decay_steps is None else min(decay_steps, steps)
    warm = max(1, decay_steps // 20)

    def schedule(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        progress = min(1.0, (step - warm) / max(1, decay_steps - warm))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    model.train()
    losses = []
    every, started = max(1, steps // 10), time.perf_counter()
    for step in range(steps):
        start = (step * batch_size) % input_ids.shape[0]
        batch = slice(start, start + batch_size)
        # Right padding only, so no attention mask is needed: pads sit after every real token.
        loss = model(input_ids=input_ids[batch], labels=labels[batch]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if (step + 1) % every == 0 or step + 1 == steps:
            recent = losses[-every:]
            log(f"  warm-up step {step + 1:5d}/{steps}  loss {sum(recent) / len(recent):.4f}"
                f"  {time.perf_counter() - started:6.1f}s")
        if stop is not None and step + 1 < steps:
            model.eval()
            if stop(step + 1):
                log(f"  warm-up stopped at step {step + 1}/{steps}")
                break
            model.train()
    model.eval()
    return losses
