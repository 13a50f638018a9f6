"""V by a token budget and with activation checkpointing: the same values and the same update as without."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from pcl.models.value import ValueModel, ValueTrainer


def _prompts(count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(32) for _ in range(rng.randint(1, 9))] for _ in range(count)]


def _randomised(tiny_model_dir) -> ValueModel:
    model = ValueModel.from_pretrained(tiny_model_dir, dtype="float32", device="cpu")
    with torch.no_grad():
        model.head.weight.copy_(torch.randn(model.head.weight.shape, generator=torch.Generator().manual_seed(0)))
    return model


def test_budgeted_checkpointed_scoring_and_step_equal_the_plain_ones(tiny_model_dir):
    prompts, targets = _prompts(11, seed=1), [random.Random(2).random() for _ in range(11)]
    plain_model = _randomised(tiny_model_dir)
    budget_model = copy.deepcopy(plain_model)
    # A large eps: the first AdamW update is then proportional to the gradient, not ~lr * sign(grad).
    plain = ValueTrainer(plain_model, lr=1e-2, batch_size=64, eps=1e-2)
    budget = ValueTrainer(budget_model, lr=1e-2, batch_size=64, eps=1e-2, max_tokens_per_micro_batch=12,
                          activation_checkpointing=True)
    assert list(budget._batches(prompts)) and all(ids.numel() <= 12 for _, ids, _ in budget._batches(prompts))
    assert abs(plain.score(prompts) - budget.score(prompts)).max() < 1e-5  # float32, other padding widths
    first, second = plain.train_step(prompts, targets), budget.train_step(prompts, targets)
    assert first["loss"] == pytest.approx(second["loss"], rel=1e-6)
    assert first["grad_norm"] == pytest.approx(second["grad_norm"], rel=1e-5)
    for (name, a), (_, b) in zip(plain_model.named_parameters(), budget_model.named_parameters()):
        assert (a - b).abs().max().item() < 1e-5, name


def test_a_prompt_over_the_token_budget_is_refused_naming_the_setting(tiny_model_dir):
    trainer = ValueTrainer(_randomised(tiny_model_dir), lr=1e-2, max_tokens_per_micro_batch=4)
    with pytest.raises(ValueError, match=r"prompt 1: 6 tokens exceed value.max_tokens_per_micro_batch = 4; "
                                         r"raise it to at least 6"):
        trainer.score([[1, 2], [1, 2, 3, 4, 5, 6]])
