"""Advantages, effective ratio, explained variance and the losses of docs/architecture.md, pinned by hand
and checked as properties: the step-7 gradient is the REINFORCE gradient with the group-mean baseline,
and micro-batches with a global `num_sequences` add up to the full batch."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pcl.rl import (
    effective_ratio,
    explained_variance,
    group_advantages,
    policy_gradient_loss,
    token_logprobs,
    value_loss,
)

torch.set_num_threads(1)
FAST = settings(max_examples=100, deadline=None)


# ---------------------------------------------------------------- advantages and effective ratio


def test_group_advantages_pinned():
    # row means 0.5, 1.0, 0.25
    rewards = torch.tensor([[1, 0, 0, 1], [1, 1, 1, 1], [0, 0, 0, 1]])
    expected = torch.tensor([[0.5, -0.5, -0.5, 0.5], [0.0, 0.0, 0.0, 0.0], [-0.25, -0.25, -0.25, 0.75]])
    assert torch.equal(group_advantages(rewards), expected)


def test_no_std_normalisation():
    # rewards 0/1 with mean 0.75: advantages 0.25 / -0.75, not the std-scaled +-0.577 / 1.732 of GRPO
    assert group_advantages(torch.tensor([[1.0, 1.0, 1.0, 0.0]])).tolist() == [[0.25, 0.25, 0.25, -0.75]]


def test_effective_ratio_pinned():
    # same batch as above: 4 + 0 + 4 non-zero advantages out of 12 samples
    assert effective_ratio(torch.tensor([[1, 0, 0, 1], [1, 1, 1, 1], [0, 0, 0, 1]])) == pytest.approx(8 / 12)
    assert effective_ratio(torch.tensor([[0.0, 0.0], [1.0, 1.0]])) == 0.0
    # a sample sitting exactly at its group mean has a zero advantage: [0, 0.5, 1] -> 2 of 3
    assert effective_ratio(torch.tensor([[0.0, 0.5, 1.0]])) == pytest.approx(2 / 3)


def test_effective_ratio_tolerates_float_rounding():
    # 0.1 is not exact in binary; the group mean of seven copies may differ from 0.1 in the last bit
    assert effective_ratio(torch.full((3, 7), 0.1)) == 0.0
    assert effective_ratio(torch.full((2, 5), 1 / 3, dtype=torch.float64)) == 0.0


@pytest.mark.parametrize("rewards", [torch.zeros(4), torch.zeros(2, 2, 2), torch.zeros(3, 0), [[1.0, 0.0]]])
def test_bad_rewards_name_the_argument(rewards):
    with pytest.raises(ValueError, match="^rewards:"):
        group_advantages(rewards)


def test_effective_ratio_of_empty_batch_is_an_error():
    with pytest.raises(ValueError, match="^rewards:"):
        effective_ratio(torch.zeros(0, 4))


binary_rewards = st.integers(1, 6).flatmap(
    lambda n: st.lists(st.lists(st.sampled_from([0.0, 1.0]), min_size=n, max_size=n), min_size=1, max_size=6)
)


@FAST
@given(rows=binary_rewards)
def test_advantages_rows_sum_to_zero_and_ratio_counts_mixed_rows(rows):
    rewards = torch.tensor(rows)
    adv = group_advantages(rewards)
    assert adv.shape == rewards.shape
    assert torch.allclose(adv.sum(dim=1), torch.zeros(len(rows)), atol=1e-6)
    # With 0/1 rewards a sample has a non-zero advantage exactly when its row is mixed.
    mixed_rows = sum(1 for r in rows if 0 < sum(r) < len(r))
    ratio = effective_ratio(rewards)
    assert 0.0 <= ratio <= 1.0
    assert ratio == pytest.approx(mixed_rows / len(rows))


@FAST
@given(row_values=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=6), n=st.integers(1, 8))
def test_effective_ratio_is_zero_when_every_row_is_constant(row_values, n):
    rewards = torch.tensor(row_values).unsqueeze(1).expand(-1, n).contiguous()
    assert effective_ratio(rewards) == 0.0
    assert torch.all(group_advantages(rewards).abs() <= 1e-6)


# ---------------------------------------------------------------- explained variance


def test_explained_variance_pinned():
    # p = [0, .5, 1]: Var(p) = 1/6.  p - v = [-.1, 0, .3]: mean 1/15, deviations -1/6, -1/15, 7/30,
    # Var = (25 + 4 + 49) / 900 / 3 = 13/450.  EV = 1 - (13/450) / (1/6) = 62/75.
    p = torch.tensor([0.0, 0.5, 1.0])
    v = torch.tensor([0.1, 0.5, 0.7])
    assert explained_variance(p, v) == pytest.approx(62 / 75, abs=1e-6)
    assert explained_variance(p, p.clone()) == pytest.approx(1.0)
    assert explained_variance(p, torch.full((3,), 0.5)) == pytest.approx(0.0)  # predicting the mean
    assert explained_variance(p, 1 - p) == pytest.approx(1 - 4.0)  # Var(2p - 1) = 4 Var(p)


def test_explained_variance_is_nan_when_pass_rates_do_not_vary():
    assert math.isnan(explained_variance(torch.full((4,), 0.25), torch.rand(4)))
    assert math.isnan(explained_variance(torch.tensor([0.5]), torch.tensor([0.2])))  # m = 1


def test_explained_variance_bad_shapes():
    with pytest.raises(ValueError, match="^p:"):
        explained_variance(torch.zeros(2, 2), torch.zeros(2, 2))
    with pytest.raises(ValueError, match="^v:"):
        explained_variance(torch.zeros(3), torch.zeros(4))


# ---------------------------------------------------------------- policy-gradient loss, pinned


def test_policy_gradient_loss_at_ratio_one():
    # |y| = 2, 1;  A = .5, -.25  ->  per sequence 0.5 and -0.25; loss = -(0.25) / 2
    logprobs = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.7, -0.9]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    adv = torch.tensor([0.5, -0.25])
    assert policy_gradient_loss(logprobs, logprobs, adv, mask).item() == pytest.approx(-0.125)
    # the same batch as a part of a 4-sequence batch: -(0.25) / 4
    partial = policy_gradient_loss(logprobs, logprobs, adv, mask, num_sequences=4)
    assert partial.item() == pytest.approx(-0.0625)


def test_policy_gradient_loss_uses_per_token_ratio_and_ignores_padding():
    # log-ratios [[ln 2, 0, 5(pad)], [ln .5, 9(pad), 9(pad)]]: ratios 2, 1 -> mean 1.5;  0.5
    # per sequence 1.5 * .5 = .75 and .5 * -.25 = -.125; loss = -(.625) / 2 = -.3125
    old = torch.zeros(2, 3)
    logprobs = torch.tensor([[math.log(2), 0.0, 5.0], [math.log(0.5), 9.0, 9.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    loss = policy_gradient_loss(logprobs, old, torch.tensor([0.5, -0.25]), mask)
    assert loss.item() == pytest.approx(-0.3125)


def test_empty_response_and_infinite_padding_stay_finite():
    logprobs = torch.tensor([[-1.0, -math.inf], [-math.inf, -math.inf]], requires_grad=True)
    mask = torch.tensor([[1.0, 0.0], [0.0, 0.0]])  # the second sequence has |y| = 0
    loss = policy_gradient_loss(logprobs, logprobs.detach(), torch.tensor([2.0, 5.0]), mask)
    loss.backward()
    assert loss.item() == pytest.approx(-1.0)  # -(1 * 2 + 0) / 2
    assert torch.equal(logprobs.grad, torch.tensor([[-1.0, 0.0], [0.0, 0.0]]))


def test_old_logprobs_get_no_gradient():
    old = torch.zeros(1, 2, requires_grad=True)
    logprobs = torch.zeros(1, 2, requires_grad=True)
    policy_gradient_loss(logprobs, old, torch.tensor([1.0]), torch.ones(1, 2)).backward()
    assert old.grad is None and logprobs.grad is not None


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(logprobs=torch.zeros(2)), "logprobs"),
        (dict(old_logprobs=torch.zeros(2, 4)), "old_logprobs"),
        (dict(mask=torch.ones(3, 3)), "mask"),
        (dict(advantages=torch.zeros(3)), "advantages"),
        (dict(num_sequences=0), "num_sequences"),
    ],
)
def test_policy_gradient_loss_bad_input(kwargs, name):
    args = dict(logprobs=torch.zeros(2, 3), old_logprobs=torch.zeros(2, 3), advantages=torch.zeros(2),
                mask=torch.ones(2, 3))
    with pytest.raises(ValueError, match=f"^{name}:"):
        policy_gradient_loss(**{**args, **kwargs})


# ---------------------------------------------------------------- policy-gradient loss, properties


def tiny_policy_batch(seed: int, m: int, n: int, seq_len: int, vocab: int = 5, width: int = 3):
    """A linear policy logits = features @ weight, a sampled batch, 0/1 rewards and a response mask."""
    gen = torch.Generator().manual_seed(seed)
    batch = m * n
    weight = torch.randn(width, vocab, generator=gen, dtype=torch.float64, requires_grad=True)
    features = torch.randn(batch, seq_len, width, generator=gen, dtype=torch.float64)
    tokens = torch.randint(0, vocab, (batch, seq_len), generator=gen)
    rewards = torch.randint(0, 2, (m, n), generator=gen).double()
    mask = torch.rand(batch, seq_len, generator=gen) < 0.7  # some rows may be empty (|y| = 0)
    return weight, features, tokens, rewards, mask


@FAST
@given(seed=st.integers(0, 2**31 - 1), m=st.integers(1, 3), n=st.integers(1, 4), seq_len=st.integers(1, 4))
def test_gradient_at_ratio_one_is_reinforce_with_group_baseline(seed, m, n, seq_len):
    weight, features, tokens, rewards, mask = tiny_policy_batch(seed, m, n, seq_len)
    batch = m * n
    advantages = group_advantages(rewards).reshape(batch)
    logits = features @ weight  # [B, T, V]
    logprobs = token_logprobs(logits, tokens)
    loss = policy_gradient_loss(logprobs, logprobs.detach(), advantages, mask)
    (grad,) = torch.autograd.grad(loss, weight)

    # -(1/B) sum_i A_i (1/|y_i|) sum_l grad log pi(y_il), with the closed form
    # d log softmax(z)[y] / dz = onehot(y) - softmax(z) and dz/dweight = features (outer product).
    with torch.no_grad():
        dlogp_dlogits = torch.nn.functional.one_hot(tokens, weight.shape[1]) - logits.softmax(-1)  # [B, T, V]
        lengths = mask.sum(-1).clamp(min=1)
        coef = -(advantages / lengths).unsqueeze(1) * mask / batch  # [B, T]
        expected = torch.einsum("bt,btd,btv->dv", coef, features, dlogp_dlogits)
    assert torch.allclose(grad, expected, atol=1e-12, rtol=1e-9)


@FAST
@given(seed=st.integers(0, 2**31 - 1), m=st.integers(1, 3), n=st.integers(1, 4), seq_len=st.integers(1, 4),
       parts=st.integers(1, 4))
def test_micro_batches_with_global_count_add_up_to_full_batch(seed, m, n, seq_len, parts):
    weight, features, tokens, rewards, mask = tiny_policy_batch(seed, m, n, seq_len)
    batch = m * n
    advantages = group_advantages(rewards).reshape(batch)
    # Old log-probs from a slightly different policy, so the ratios are not all 1.
    with torch.no_grad():
        old = token_logprobs(features @ (weight + 0.1), tokens)

    def loss_of(rows):
        logprobs = token_logprobs(features[rows] @ weight, tokens[rows])
        return policy_gradient_loss(logprobs, old[rows], advantages[rows], mask[rows], num_sequences=batch)

    (full,) = torch.autograd.grad(loss_of(slice(None)), weight)
    summed = torch.zeros_like(weight)
    total = 0.0
    for rows in torch.arange(batch).tensor_split(parts):
        loss = loss_of(rows)
        summed += torch.autograd.grad(loss, weight)[0]
        total += loss.item()
    assert torch.allclose(summed, full, atol=1e-12)
    assert total == pytest.approx(loss_of(slice(None)).item(), abs=1e-12)


# ---------------------------------------------------------------- value loss and token log-probs


def test_value_loss_pinned():
    # (0.2 - 0.5)^2 + (0.9 - 0.5)^2 = 0.09 + 0.16
    values = torch.tensor([0.2, 0.9], requires_grad=True)
    targets = torch.tensor([0.5, 0.5])
    loss = value_loss(values, targets)
    assert loss.item() == pytest.approx(0.25)
    assert value_loss(values, targets, reduction="mean").item() == pytest.approx(0.125)
    loss.backward()
    assert torch.allclose(values.grad, torch.tensor([-0.6, 0.8]))  # 2 (V - p)


def test_value_loss_bad_input():
    with pytest.raises(ValueError, match="^values:"):
        value_loss(torch.zeros(2, 1), torch.zeros(2, 1))
    with pytest.raises(ValueError, match="^targets:"):
        value_loss(torch.zeros(2), torch.zeros(3))
    with pytest.raises(ValueError, match="^reduction:"):
        value_loss(torch.zeros(2), torch.zeros(2), reduction="max")


def test_token_logprobs_pinned():
    # softmax([0, ln 3]) = [1/4, 3/4];  softmax of four equal logits = 1/4 each
    logits = torch.tensor([[[0.0, math.log(3), -math.inf, -math.inf], [1.0, 1.0, 1.0, 1.0]]])
    out = token_logprobs(logits, torch.tensor([[1, 2]]))
    assert torch.allclose(out, torch.tensor([[math.log(0.75), math.log(0.25)]]))
    out = token_logprobs(logits, torch.tensor([[0, 3]]))
    assert torch.allclose(out, torch.tensor([[math.log(0.25), math.log(0.25)]]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("chunk_tokens", [1, 4, 1024])
def test_token_logprobs_matches_log_softmax_values_and_gradients(dtype, chunk_tokens):
    gen = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(3, 5, 11, generator=gen)).to(dtype).requires_grad_()
    tokens = torch.randint(0, 11, (3, 5), generator=gen)
    out = token_logprobs(logits, tokens, chunk_tokens=chunk_tokens)
    reference = logits.double().log_softmax(-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    assert out.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert torch.allclose(out.double(), reference, atol=1e-5)
    (grad,) = torch.autograd.grad(out.sum(), logits)
    (ref_grad,) = torch.autograd.grad(reference.sum(), logits)
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-6
    assert torch.allclose(grad.double(), ref_grad.double(), atol=tol)


def test_token_logprobs_gradcheck_and_empty_batch():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 3, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    tokens = torch.randint(0, 4, (2, 3), generator=gen)
    assert torch.autograd.gradcheck(lambda z: token_logprobs(z, tokens, chunk_tokens=4), (logits,))
    # an empty micro-batch still yields a (zero) loss tied to the graph
    empty = torch.zeros(0, 3, 4, requires_grad=True)
    out = token_logprobs(empty, torch.zeros(0, 3, dtype=torch.long))
    assert out.shape == (0, 3)
    (grad,) = torch.autograd.grad(out.sum(), empty)
    assert grad.shape == (0, 3, 4)


def test_token_logprobs_bad_input():
    logits = torch.zeros(2, 3, 4)
    with pytest.raises(ValueError, match="^logits:"):
        token_logprobs(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="^tokens:"):
        token_logprobs(logits, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="^tokens:"):
        token_logprobs(logits, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="^tokens:"):
        token_logprobs(logits, torch.full((2, 3), 4))
    with pytest.raises(ValueError, match="^chunk_tokens:"):
        token_logprobs(logits, torch.zeros(2, 3, dtype=torch.long), chunk_tokens=0)
