"""The policy-gradient loss for off-policy samples: truncated importance sampling (`pcl.rl.truncated_importance_weights`,
Yao et al., 2025), its step metrics, and the settings and checks around it (`learner.off_policy`).

The loss with the correction off, or with every ratio 1, is the on-policy loss of algorithm step 7, value and
gradient; a batch that needs the engine's log-probabilities and lacks them is refused, naming the setting.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pcl import config_schema
from pcl.config import Config, ConfigError, validate_tree
from pcl.loop.batch import Groups, training_sequences
from pcl.samples import Sample
from pcl.models.micro_batches import check_sequences
from pcl.rl import (IMPORTANCE_RATIO_KEYS, group_advantages, importance_ratio_metrics, importance_ratio_totals,
                    policy_gradient_loss, token_logprobs, truncated_importance_weights)

LN = math.log


def todays_loss(logprobs, advantages, mask, num_sequences):
    """Algorithm step 7 as written before the correction existed: -(sum_i (1/|y_i|) sum_l ratio_il A_i) / N."""
    mask = mask.to(torch.bool)
    ratio = torch.exp(torch.where(mask, logprobs - logprobs.detach(), torch.zeros_like(logprobs))) * mask
    lengths = mask.sum(-1).clamp(min=1).to(ratio.dtype)
    return -(ratio.sum(-1) / lengths * advantages).sum() / num_sequences


def random_batch(seed: int, rows: int = 6, width: int = 5, vocab: int = 7):
    """Learner log-probs of a small linear policy (with grad through `weight`), a response mask, advantages."""
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(3, vocab, generator=gen, dtype=torch.float64, requires_grad=True)
    features = torch.randn(rows, width, 3, generator=gen, dtype=torch.float64)
    tokens = torch.randint(0, vocab, (rows, width), generator=gen)
    mask = torch.rand(rows, width, generator=gen) < 0.7
    advantages = group_advantages(torch.randint(0, 2, (rows // 2, 2), generator=gen).double()).reshape(rows)
    return weight, token_logprobs(features @ weight, tokens), mask, advantages


# ---------------------------------------------------------------- the weights, by hand


def hand_example():
    """Two sequences: ratios 0.5, 1, 3 (A = 1) and 1.5 then two padding positions (A = -2); cap 2."""
    logprobs = torch.tensor([[-1.0, -2.0, -0.5], [-0.7, -3.0, -1.0]], requires_grad=True)
    log_ratio = torch.tensor([[LN(0.5), 0.0, LN(3.0)], [LN(1.5), 0.0, 0.0]])
    engine = logprobs.detach() - log_ratio
    engine[1, 1:] = torch.tensor([-math.inf, math.nan])  # padding: never read
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    return logprobs, engine, mask, torch.tensor([1.0, -2.0])


def test_truncated_weights_loss_and_gradient_by_hand():
    logprobs, engine, mask, advantages = hand_example()
    weights, ratios = truncated_importance_weights(logprobs, engine, mask, cap=2.0)
    assert torch.allclose(ratios, torch.tensor([[0.5, 1.0, 3.0], [1.5, 0.0, 0.0]]), atol=1e-6)
    assert torch.allclose(weights, torch.tensor([[0.5, 1.0, 2.0], [1.5, 0.0, 0.0]]), atol=1e-6)  # 3 -> the cap
    assert not weights.requires_grad and not ratios.requires_grad
    loss = policy_gradient_loss(logprobs, logprobs.detach(), advantages, mask, num_sequences=2, weights=weights)
    # -((0.5 + 1 + 2) / 3 * 1 + 1.5 / 1 * (-2)) / 2
    assert loss.item() == pytest.approx(-((3.5 / 3) - 3.0) / 2, abs=1e-6)
    (grad,) = torch.autograd.grad(loss, logprobs)
    # d loss / d logp_il = -w_il * A_i / |y_i| / N at ratio 1; nothing at padding
    expected = torch.tensor([[-0.5 / 6, -1.0 / 6, -2.0 / 6], [1.5, 0.0, 0.0]])
    assert torch.allclose(grad, expected, atol=1e-6)


def test_ratio_metrics_by_hand_mean_max_and_clipped_share():
    logprobs, engine, mask, _ = hand_example()
    _, ratios = truncated_importance_weights(logprobs, engine, mask, cap=2.0)
    totals = importance_ratio_totals(ratios, mask, cap=2.0)
    assert totals.tolist() == pytest.approx([6.0, 4.0, 1.0, 3.0], abs=1e-6)  # sum, tokens, above the cap, max
    metrics = importance_ratio_metrics(*totals.tolist())
    assert list(metrics) == list(IMPORTANCE_RATIO_KEYS)
    assert metrics["importance_ratio_mean"] == pytest.approx(1.5, abs=1e-6)
    assert metrics["importance_ratio_max"] == pytest.approx(3.0, abs=1e-6)
    assert metrics["importance_ratio_clipped_share"] == pytest.approx(0.25)
    assert all(math.isnan(v) for v in importance_ratio_metrics(0.0, 0.0, 0.0, 0.0).values())  # no token


def test_a_huge_ratio_is_truncated_to_the_cap_and_stays_finite():
    logprobs = torch.tensor([[-0.1, -0.2]], requires_grad=True)
    engine = torch.tensor([[-200.0, -0.2]])  # the engine almost never samples token 0: ratio e^199.9, inf in float32
    mask = torch.ones(1, 2, dtype=torch.bool)
    weights, ratios = truncated_importance_weights(logprobs, engine, mask, cap=1.5)
    assert weights[0].tolist() == pytest.approx([1.5, 1.0]) and ratios[0, 0] > 1e30
    loss = policy_gradient_loss(logprobs, logprobs.detach(), torch.tensor([1.0]), mask, weights=weights)
    (grad,) = torch.autograd.grad(loss, logprobs)
    assert loss.item() == pytest.approx(-(1.5 + 1.0) / 2) and torch.isfinite(grad).all()
    assert importance_ratio_totals(ratios, mask, 1.5)[2].item() == 1.0


# ---------------------------------------------------------------- off, or on-policy: today's loss


@pytest.mark.parametrize("seed", range(5))
def test_without_weights_the_loss_and_gradient_are_todays(seed):
    weight, logprobs, mask, advantages = random_batch(seed)
    loss = policy_gradient_loss(logprobs, logprobs.detach(), advantages, mask, num_sequences=9)
    (grad,) = torch.autograd.grad(loss, weight, retain_graph=True)
    expected = todays_loss(logprobs, advantages, mask, 9)
    (expected_grad,) = torch.autograd.grad(expected, weight)
    assert loss.item() == expected.item() and torch.equal(grad, expected_grad)  # bit for bit


@pytest.mark.parametrize("seed", range(5))
def test_on_policy_engine_logprobs_give_todays_loss_and_gradient(seed):
    weight, logprobs, mask, advantages = random_batch(seed)
    engine = torch.where(mask, logprobs.detach(), torch.full_like(logprobs, math.nan))  # ratios all 1
    weights, ratios = truncated_importance_weights(logprobs, engine, mask, cap=2.0)
    assert torch.equal(weights[mask], torch.ones(int(mask.sum()), dtype=weights.dtype))
    loss = policy_gradient_loss(logprobs, logprobs.detach(), advantages, mask, num_sequences=9, weights=weights)
    (grad,) = torch.autograd.grad(loss, weight, retain_graph=True)
    plain = policy_gradient_loss(logprobs, logprobs.detach(), advantages, mask, num_sequences=9)
    (plain_grad,) = torch.autograd.grad(plain, weight)
    assert abs(loss.item() - plain.item()) < 1e-6 and torch.allclose(grad, plain_grad, atol=1e-6, rtol=0)
    metrics = importance_ratio_metrics(*importance_ratio_totals(ratios, mask, 2.0).tolist())
    if mask.any():
        assert metrics == {"importance_ratio_mean": 1.0, "importance_ratio_max": 1.0,
                           "importance_ratio_clipped_share": 0.0}


def test_shifted_engine_logprobs_change_the_gradient():
    weight, logprobs, mask, advantages = random_batch(0)
    engine = logprobs.detach() + torch.linspace(-1.0, 1.0, logprobs.numel()).reshape(logprobs.shape).double()
    weights, _ = truncated_importance_weights(logprobs, engine, mask, cap=2.0)
    (grad,) = torch.autograd.grad(policy_gradient_loss(logprobs, logprobs.detach(), advantages, mask,
                                                       weights=weights), weight, retain_graph=True)
    (plain,) = torch.autograd.grad(policy_gradient_loss(logprobs, logprobs.detach(), advantages, mask), weight)
    assert (grad - plain).abs().max() > 1e-3


def test_bad_weights_and_caps_are_refused():
    logprobs, engine, mask, advantages = hand_example()
    with pytest.raises(ValueError, match="^weights:"):
        policy_gradient_loss(logprobs, logprobs.detach(), advantages, mask, weights=torch.ones(2, 2))
    with pytest.raises(ValueError, match="^cap:"):
        truncated_importance_weights(logprobs, engine, mask, cap=0.9)
    with pytest.raises(ValueError, match="engine_logprobs"):
        truncated_importance_weights(logprobs, engine[:, :2], mask, cap=2.0)


# ---------------------------------------------------------------- a batch without the engine's log-probs


def groups_of(logprobs: list[tuple[float, ...] | None]) -> Groups:
    samples = [Sample("p0", j, (1, 2), (3, 4), float(j % 2), "stop", lp) for j, lp in enumerate(logprobs)]
    return Groups(["p0"], [samples], np.array([[s.reward for s in samples]]))


def test_a_sample_without_engine_logprobs_is_refused_when_the_correction_needs_them():
    groups = groups_of([(-0.1, -0.2), None])
    assert len(training_sequences(groups)) == 2  # no correction: the engine's log-probs are optional
    with pytest.raises(ValueError, match=r"\('p0', 1\).*learner\.off_policy\.correction = 'truncated'"):
        training_sequences(groups, "truncated")
    assert len(training_sequences(groups_of([(-0.1, -0.2), (-0.3, -0.4)]), "truncated")) == 2


def test_the_learner_refuses_a_share_without_engine_logprobs_naming_the_setting():
    share = [{"prompt_token_ids": [1], "response_token_ids": [2, 3], "advantage": 0.5,
              "response_logprobs": [-0.1, -0.2]},
             {"prompt_token_ids": [1], "response_token_ids": [2], "advantage": -0.5}]
    assert check_sequences(share, 2, vocab_size=8) is None
    problem = check_sequences(share, 2, vocab_size=8, correction="truncated")
    assert problem.startswith("sequence 1: no response_logprobs") and "learner.off_policy.correction" in problem


# ---------------------------------------------------------------- the settings


def test_the_correction_is_off_by_default_with_a_cap_of_two():
    off_policy = Config().learner.off_policy
    assert (off_policy.correction, off_policy.cap) == ("none", 2.0)


@pytest.mark.parametrize("off_policy, where", [
    ({"correction": "clipped"}, "learner.off_policy.correction"),
    ({"correction": "truncated", "cap": 0.5}, "learner.off_policy.cap"),
    ({"cap": math.inf}, "learner.off_policy.cap"),
    ({"correction": "truncated", "kap": 2}, "learner.off_policy.kap"),
])
def test_bad_settings_are_refused_naming_the_key(off_policy, where):
    with pytest.raises(ConfigError, match=where.replace(".", r"\.")):
        validate_tree({"learner": {"off_policy": off_policy}}, "test")


def test_a_correction_is_refused_with_an_engine_that_reports_no_logprobs(monkeypatch):
    for engine in config_schema.LOGPROB_ENGINES:  # both engines report them
        tree = {"rollout": {"engine": engine}, "learner": {"off_policy": {"correction": "truncated"}}}
        assert validate_tree(tree, "test").learner.off_policy.correction == "truncated"
    monkeypatch.setattr(config_schema, "LOGPROB_ENGINES", ("vllm",))
    with pytest.raises(ConfigError, match=r"learner\.off_policy\.correction = 'truncated'.*rollout\.engine = 'hf'"):
        validate_tree({"learner": {"off_policy": {"correction": "truncated"}}}, "test")
    assert validate_tree({"learner": {"off_policy": {"cap": 3.0}}}, "test").learner.off_policy.cap == 3.0
