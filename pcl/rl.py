"""Advantages, losses and step metrics of PCL's policy and value updates (docs/architecture.md).

Pure torch functions, no state: the learner and the coordinator call them on batches of one step.

    rewards = torch.tensor(...)                          # [m, n] reward of sample j of prompt i
    adv = group_advantages(rewards)                      # [m, n] step 6
    logp = token_logprobs(policy(tokens).logits, tokens_next)   # [B, T], B = m*n
    loss = policy_gradient_loss(logp, logp.detach(), adv.flatten(), mask)   # step 7
    w, ratio = truncated_importance_weights(logp, engine_logp, mask, cap=2.0)   # samples of an older policy
    loss = policy_gradient_loss(logp, logp.detach(), adv.flatten(), mask, weights=w)
    v_loss = value_loss(value_model(prompts), rewards.mean(-1))             # step 8
    metrics = effective_ratio(rewards), explained_variance(rewards.mean(-1), predicted_values)
"""

from __future__ import annotations

import math
from typing import Literal

import torch

# Rewards closer than this to their group mean count as a zero advantage: float rewards such as
# [0.3, 0.3, 0.3] do not average back to exactly 0.3.
ADVANTAGE_ATOL = 1e-6
# Var(p) at or below this makes explained variance undefined (every prompt has the same pass rate).
VARIANCE_EPS = 1e-12
# The step metrics of the importance ratios (`importance_ratio_metrics`), fields of the step record.
IMPORTANCE_RATIO_KEYS = ("importance_ratio_mean", "importance_ratio_max", "importance_ratio_clipped_share")


def _check_rewards(rewards: torch.Tensor) -> torch.Tensor:
    if not isinstance(rewards, torch.Tensor):
        raise ValueError(f"rewards: expected a torch tensor of shape [m, n], got {type(rewards).__name__}")
    if rewards.ndim != 2:
        raise ValueError(f"rewards: expected shape [m, n] (prompts x samples), got {tuple(rewards.shape)}")
    if rewards.shape[1] == 0:
        raise ValueError("rewards: each prompt needs at least one sample (n >= 1), got n = 0")
    return rewards if rewards.is_floating_point() else rewards.float()


def group_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """Group-mean advantages A_ij = r_ij - mean_j r_ij (algorithm step 6; no std normalisation).

    Args:
        rewards: [m, n] reward of sample j of prompt i (integer rewards are cast to float32).

    Returns:
        [m, n] advantages; every row sums to 0, a row of equal rewards is all zeros.
    """
    rewards = _check_rewards(rewards)
    return rewards - rewards.mean(dim=1, keepdim=True)


def effective_ratio(rewards: torch.Tensor, atol: float = ADVANTAGE_ATOL) -> float:
    """Fraction of samples with a non-zero advantage (docs/architecture.md).

    Only these samples carry gradient in step 7; a prompt whose n rewards are all equal (all solved or
    all failed) contributes n zeros. An advantage with |A| <= `atol` counts as zero.

    Args:
        rewards: [m, n] rewards of one step's batch, m >= 1.

    Returns:
        A float in [0, 1].
    """
    advantages = group_advantages(rewards)
    if advantages.numel() == 0:
        raise ValueError("rewards: the batch is empty (m = 0); the effective ratio is undefined")
    return (advantages.abs() > atol).double().mean().item()


def explained_variance(p: torch.Tensor, v: torch.Tensor) -> float:
    """How much of the spread of pass rates the value model explains: 1 - Var(p - v) / Var(p).

    docs/architecture.md. Population variances over the batch, computed in float64. 1 is a perfect value
    model, 0 is as good as predicting the batch mean, negative is worse than that.

    Args:
        p: [m] empirical pass rate of each selected prompt (mean reward of its n samples).
        v: [m] value model prediction V(x) for the same prompts.

    Returns:
        The explained variance, or NaN when Var(p) <= VARIANCE_EPS (all prompts had the same pass
        rate, e.g. m = 1): the ratio is undefined there; callers log the NaN rather than a made-up number.
    """
    p = torch.as_tensor(p).detach().to(torch.float64)
    v = torch.as_tensor(v).detach().to(device=p.device, dtype=torch.float64)
    if p.ndim != 1 or p.numel() == 0:
        raise ValueError(f"p: expected a non-empty 1-D tensor of pass rates, got shape {tuple(p.shape)}")
    if v.shape != p.shape:
        raise ValueError(f"v: expected the shape of p {tuple(p.shape)}, got {tuple(v.shape)}")
    var_p = p.var(correction=0).item()
    if not var_p > VARIANCE_EPS:
        return math.nan
    return 1.0 - (p - v).var(correction=0).item() / var_p


def policy_gradient_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    num_sequences: int | None = None,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Loss of the on-policy step: minimising it maximises E[(1/|y|) sum_l ratio_l * A] (algorithm step 7).

    ratio_l = exp(logprobs_l - old_logprobs_l) with the old log-probs detached, so at pi = pi_t the
    ratio is 1 and the gradient is the REINFORCE gradient with the group-mean baseline: no clipping,
    no KL, no reference model. Returns
        -(sum_i (1/|y_i|) sum_l ratio_il * A_i * mask_il) / num_sequences,   |y_i| = sum_l mask_il.

    `num_sequences` is the size of the whole batch. A learner that splits the batch into micro-batches
    (or over data-parallel ranks) passes the global count to each part: the parts' losses, and so their
    gradients, then add up to those of the whole batch. It defaults to B (the batch is all there is).

    `weights` scales each token's term: -(sum_i (1/|y_i|) sum_l w_il * ratio_il * A_i * mask_il) / num_sequences.
    They are the off-policy correction's (`truncated_importance_weights`) for samples an older policy generated;
    None leaves the terms unscaled, computed exactly as the on-policy loss.

    Args:
        logprobs: [B, T] log pi(y_l | x, y_<l) under the parameters being trained (with grad).
        old_logprobs: [B, T] the same under the sampling policy pi_t (detached here).
        advantages: [B] advantage of each sequence (constant over its tokens).
        mask: [B, T] 1 (or True) for response tokens, 0 for prompt and padding.
        num_sequences: divisor, the number of sequences of the whole batch; must be > 0.
        weights: [B, T] per-token weights (detached here), or None.

    Returns:
        Scalar loss. A sequence with no response token (|y| = 0) contributes 0.
    """
    if logprobs.ndim != 2:
        raise ValueError(f"logprobs: expected shape [B, T], got {tuple(logprobs.shape)}")
    for name, tensor in (("old_logprobs", old_logprobs), ("mask", mask), ("weights", weights)):
        if tensor is not None and tensor.shape != logprobs.shape:
            raise ValueError(f"{name}: expected the shape of logprobs {tuple(logprobs.shape)}, "
                             f"got {tuple(tensor.shape)}")
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(f"advantages: expected shape [{logprobs.shape[0]}], got {tuple(advantages.shape)}")
    num_sequences = logprobs.shape[0] if num_sequences is None else num_sequences
    if num_sequences <= 0:
        raise ValueError(f"num_sequences: must be positive, got {num_sequences}")
    mask = mask.to(torch.bool)
    # Mask the log-ratio before exp: padding may hold -inf log-probs, and inf or NaN there must not
    # reach the loss or leak NaN gradients through the masked-out positions.
    log_ratio = torch.where(mask, logprobs - old_logprobs.detach(), torch.zeros_like(logprobs))
    ratio = torch.exp(log_ratio) * mask  # [B, T]
    if weights is not None:
        ratio = ratio * torch.where(mask, weights.detach().to(ratio.dtype), 0.0)  # padding's weight is never read
    lengths = mask.sum(dim=-1).clamp(min=1).to(ratio.dtype)  # [B]; |y| = 0 gives 0 / 1 = 0
    per_sequence = ratio.sum(dim=-1) / lengths * advantages.detach().to(ratio.dtype)  # [B]
    return -per_sequence.sum() / num_sequences


def truncated_importance_weights(
    logprobs: torch.Tensor, engine_logprobs: torch.Tensor, mask: torch.Tensor, cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token weights of the policy-gradient loss for samples the engine generated with another policy.

    Truncated importance sampling (TIS: "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training",
    Yao et al., 2025; verl's and SkyRL's `tis_imp_ratio_cap`): the gradient of step 7 is an expectation under the
    learner's policy, the samples come from the engine's (a policy some versions older, or the same weights in
    another numerical form), so each token's term is weighted by the importance ratio
    r_l = pi_learner(y_l | ...) / pi_engine(y_l | ...) = exp(logprobs_l - engine_logprobs_l), truncated at `cap`:
    w_l = min(r_l, cap), detached. The truncation bounds the variance a token the engine rarely samples would add,
    for a bias towards the engine's policy. At r = 1 everywhere (on-policy) the weights are 1 and the loss is the
    on-policy one.

    Args:
        logprobs: [B, T] the learner's log-probabilities of the sampled tokens (detached here).
        engine_logprobs: [B, T] the engine's log-probabilities of the same tokens.
        mask: [B, T] 1 (or True) for response tokens, 0 for prompt and padding.
        cap: the truncation C >= 1.

    Returns:
        (weights, ratios), [B, T] each, detached, 0 outside the mask.
    """
    if logprobs.ndim != 2 or engine_logprobs.shape != logprobs.shape or mask.shape != logprobs.shape:
        raise ValueError(f"logprobs, engine_logprobs, mask: expected one shape [B, T], got {tuple(logprobs.shape)}, "
                         f"{tuple(engine_logprobs.shape)}, {tuple(mask.shape)}")
    if not cap >= 1:  # a cap below 1 would down-weight on-policy tokens too
        raise ValueError(f"cap: expected >= 1, got {cap}")
    mask = mask.to(torch.bool)
    # Masked before exp, as in the loss: padding may hold -inf or NaN log-probabilities.
    log_ratio = torch.where(mask, logprobs.detach() - engine_logprobs.detach().to(logprobs.dtype), 0.0)
    ratios = torch.where(mask, torch.exp(log_ratio), 0.0)
    return ratios.clamp(max=cap), ratios


def importance_ratio_totals(ratios: torch.Tensor, mask: torch.Tensor, cap: float) -> torch.Tensor:
    """[4] (sum, count, count above `cap`, max) of the importance ratios over the response tokens: figures that
    add up (max: take the largest) over micro-batches and ranks without a device sync; `importance_ratio_metrics`
    turns them into the step's metrics."""
    mask = mask.to(torch.bool)
    picked = ratios.detach().double()[mask]
    largest = picked.max() if picked.numel() else picked.new_zeros(())
    return torch.stack([picked.sum(), picked.new_tensor(float(picked.numel())), (picked > cap).sum().double(),
                        largest])


def importance_ratio_metrics(total: float, count: float, above_cap: float, largest: float) -> dict[str, float]:
    """The step's `IMPORTANCE_RATIO_KEYS` from the totals of `importance_ratio_totals`: the mean and largest ratio
    over the trained tokens, and the share of tokens whose ratio exceeded the cap (their weight is the cap). NaN
    where there was no token."""
    if not count:
        return dict.fromkeys(IMPORTANCE_RATIO_KEYS, math.nan)
    return dict(zip(IMPORTANCE_RATIO_KEYS, (total / count, largest, above_cap / count)))


def value_loss(
    values: torch.Tensor, targets: torch.Tensor, reduction: Literal["sum", "mean"] = "sum"
) -> torch.Tensor:
    """Squared error of the value model against the observed pass rates (algorithm step 8).

    Args:
        values: [m] V(x_i) of the selected prompts (with grad).
        targets: [m] p_i = mean_j r_ij, the pass rate measured this step (detached here).
        reduction: "sum" (the paper's sum_i (V(x_i) - p_i)^2) or "mean" (the same divided by m).

    Returns:
        Scalar loss.
    """
    if values.ndim != 1:
        raise ValueError(f"values: expected shape [m], got {tuple(values.shape)}")
    if targets.shape != values.shape:
        raise ValueError(f"targets: expected the shape of values {tuple(values.shape)}, "
                         f"got {tuple(targets.shape)}")
    squared = (values - targets.detach().to(values.dtype)) ** 2
    if reduction == "sum":
        return squared.sum()
    if reduction == "mean":
        return squared.mean()
    raise ValueError(f"reduction: expected 'sum' or 'mean', got {reduction!r}")


class _ChunkedTokenLogprobs(torch.autograd.Function):
    """log softmax(z)[y] per row of z = flat logits [N, V], computed and differentiated chunk by chunk.

    Forward keeps only references to the logits plus a [N] logsumexp; backward writes
    d/dz = grad * (onehot(y) - softmax(z)) straight into one [N, V] gradient buffer, recomputing
    softmax per chunk. Neither pass holds more than one [chunk, V] temporary at a time.
    """

    @staticmethod
    def forward(ctx, flat_logits: torch.Tensor, flat_tokens: torch.Tensor, chunk: int) -> torch.Tensor:
        out_dtype = torch.float64 if flat_logits.dtype == torch.float64 else torch.float32
        rows = flat_logits.shape[0]
        out = flat_logits.new_empty(rows, dtype=out_dtype)  # [N]
        lse = flat_logits.new_empty(rows, dtype=out_dtype)  # [N]
        for start in range(0, rows, chunk):
            part = flat_logits[start:start + chunk].to(out_dtype)  # [c, V]; upcast copy for bf16 only
            lse[start:start + chunk] = torch.logsumexp(part, dim=-1)
            picked = part.gather(-1, flat_tokens[start:start + chunk, None]).squeeze(-1)
            out[start:start + chunk] = picked - lse[start:start + chunk]
        ctx.save_for_backward(flat_logits, flat_tokens, lse)
        ctx.chunk = chunk
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        flat_logits, flat_tokens, lse = ctx.saved_tensors
        grad = torch.empty_like(flat_logits)  # [N, V], in the logits' dtype
        for start in range(0, flat_logits.shape[0], ctx.chunk):
            rows = slice(start, start + ctx.chunk)
            g_rows = grad_out[rows, None].to(lse.dtype)  # [c, 1]
            part = (flat_logits[rows].to(lse.dtype) - lse[rows, None]).exp_()  # softmax, [c, V], in place
            part.mul_(-g_rows).scatter_add_(-1, flat_tokens[rows, None], g_rows)
            grad[rows] = part
        return grad, None, None


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, chunk_tokens: int = 1024) -> torch.Tensor:
    """log softmax(logits)[token] at every position, without a full [B, T, V] log-softmax.

    Computed as logit[token] - logsumexp(logits) over chunks of `chunk_tokens` positions, forward and
    backward: the temporaries are [chunk_tokens, V] instead of [B, T, V] (with a 150k vocabulary a
    full log-softmax of a long batch costs gigabytes), autograd keeps no [B, T, V] tensor besides the
    logits themselves, and the backward pass allocates only the logits' gradient. Half-precision
    logits are upcast to float32 chunk by chunk, since logsumexp in bf16 loses the precision that
    ratio_l in step 7 needs. Differentiable once (no double backward).

    Args:
        logits: [B, T, V] next-token logits.
        tokens: [B, T] integer token ids in [0, V), the token scored at each position.
        chunk_tokens: positions per chunk, > 0.

    Returns:
        [B, T] log-probabilities, float32 (float64 when the logits are float64).
    """
    if logits.ndim != 3:
        raise ValueError(f"logits: expected shape [B, T, V], got {tuple(logits.shape)}")
    if tokens.shape != logits.shape[:2]:
        raise ValueError(f"tokens: expected shape {tuple(logits.shape[:2])}, got {tuple(tokens.shape)}")
    if tokens.is_floating_point() or tokens.dtype == torch.bool:
        raise ValueError(f"tokens: expected integer token ids, got dtype {tokens.dtype}")
    if chunk_tokens <= 0:
        raise ValueError(f"chunk_tokens: must be positive, got {chunk_tokens}")
    vocab = logits.shape[-1]
    if tokens.numel() and (tokens.min().item() < 0 or tokens.max().item() >= vocab):
        raise ValueError(f"tokens: ids must be in [0, {vocab}), got range "
                         f"[{tokens.min().item()}, {tokens.max().item()}]")
    flat = _ChunkedTokenLogprobs.apply(logits.reshape(-1, vocab), tokens.reshape(-1).long(), chunk_tokens)
    return flat.reshape(tokens.shape)


class _ChunkedHeadLogprobs(torch.autograd.Function):
    """log softmax(h W^T)[y] per row of h = hidden states [N, H], W the LM head [V, H], chunk by chunk.

    Forward keeps the hidden states, the head and a [N] logsumexp; backward recomputes each chunk's logits,
    so neither pass holds more than one [chunk, V] logits block (plus its softmax) at a time. The logits are
    float32 (float64 for float64 inputs) whatever the compute dtype; the weight's gradient is accumulated in
    that precision over the chunks and returned in the weight's dtype.
    """

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, tokens: torch.Tensor, chunk: int) -> torch.Tensor:
        out_dtype = torch.float64 if hidden.dtype == torch.float64 else torch.float32
        rows = hidden.shape[0]
        out = hidden.new_empty(rows, dtype=out_dtype)  # [N]
        lse = hidden.new_empty(rows, dtype=out_dtype)  # [N]
        for start in range(0, rows, chunk):
            part = slice(start, start + chunk)
            logits = (hidden[part] @ weight.t()).to(out_dtype)  # [c, V]
            lse[part] = torch.logsumexp(logits, dim=-1)
            out[part] = logits.gather(-1, tokens[part, None]).squeeze(-1) - lse[part]
        ctx.save_for_backward(hidden, weight, tokens, lse)
        ctx.chunk = chunk
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        hidden, weight, tokens, lse = ctx.saved_tensors
        want_hidden, want_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.empty_like(hidden) if want_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=lse.dtype, device=weight.device) if want_weight else None
        for start in range(0, hidden.shape[0], ctx.chunk):
            part = slice(start, start + ctx.chunk)
            g_rows = grad_out[part, None].to(lse.dtype)  # [c, 1]
            # d/dlogits = g * (onehot(y) - softmax(logits)), built in place in the recomputed logits.
            grad_logits = (hidden[part] @ weight.t()).to(lse.dtype).sub_(lse[part, None]).exp_()  # [c, V]
            grad_logits.mul_(-g_rows).scatter_add_(-1, tokens[part, None], g_rows)
            grad_logits = grad_logits.to(hidden.dtype)
            if want_hidden:
                grad_hidden[part] = grad_logits @ weight
            if want_weight:
                if grad_weight.dtype == hidden.dtype:
                    grad_weight.addmm_(grad_logits.t(), hidden[part])
                else:
                    grad_weight += grad_logits.t() @ hidden[part]
        return grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype), None, None


def head_token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, tokens: torch.Tensor,
                        chunk_tokens: int = 1024) -> torch.Tensor:
    """log softmax(hidden @ weight^T)[token] per row, without ever holding more than `chunk_tokens` rows of logits.

    The policy's token log-probabilities straight from its final hidden states and LM head: the logits of a
    chunk of positions are computed, reduced to log p(token) and dropped, and recomputed in the backward pass,
    so the memory is O(chunk_tokens x V) whatever the number of positions. Same values and gradients as
    `token_logprobs(hidden @ weight.T, tokens)`. Differentiable once (no double backward).

    Args:
        hidden: [N, H] final hidden states of the positions scored (after the final norm).
        weight: [V, H] the LM head (the input embeddings when they are tied).
        tokens: [N] integer ids in [0, V), the token scored at each position.
        chunk_tokens: positions per chunk, > 0.

    Returns:
        [N] log-probabilities, float32 (float64 when the hidden states are float64).
    """
    if hidden.ndim != 2 or weight.ndim != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden [N, H] and weight [V, H]: got shapes {tuple(hidden.shape)} and {tuple(weight.shape)}")
    if tokens.shape != hidden.shape[:1] or tokens.is_floating_point() or tokens.dtype == torch.bool:
        raise ValueError(f"tokens: expected integer ids of shape [{hidden.shape[0]}], got {tuple(tokens.shape)} "
                         f"{tokens.dtype}")
    if chunk_tokens <= 0:
        raise ValueError(f"chunk_tokens: must be positive, got {chunk_tokens}")
    return _ChunkedHeadLogprobs.apply(hidden, weight, tokens.long(), chunk_tokens)
