"""The learner at long sequences: the chunked LM head, micro-batches by a token budget, the per-step metrics.

Pure functions here; the process-group properties (token budget, activation checkpointing, engine log-prob gaps
under FSDP2 on gloo) run in tests/pcl/test_learner.py's spawned ranks.
"""

from __future__ import annotations

import math

import pytest
import torch

from pcl.models.micro_batches import check_sequences, collate_micro_batch, pack_micro_batches, split_micro_batches
from pcl.rl import head_token_logprobs, token_logprobs


@pytest.mark.parametrize("chunk", [1, 3, 7, 1000])
def test_chunked_head_matches_full_logits_in_values_and_gradients(chunk):
    torch.manual_seed(0)
    hidden = torch.randn(11, 16, requires_grad=True)
    weight = torch.randn(50, 16, requires_grad=True)
    tokens = torch.randint(0, 50, (11,))
    upstream = torch.randn(11)
    expected = token_logprobs((hidden @ weight.t())[None], tokens[None])[0]
    grads = torch.autograd.grad((expected * upstream).sum(), (hidden, weight))
    got = head_token_logprobs(hidden, weight, tokens, chunk_tokens=chunk)
    got_grads = torch.autograd.grad((got * upstream).sum(), (hidden, weight))
    assert got.dtype == torch.float32
    assert torch.allclose(got, expected, atol=1e-5, rtol=0)
    for a, b in zip(got_grads, grads):
        assert torch.allclose(a, b, atol=1e-5, rtol=0)


def test_chunked_head_in_bfloat16_keeps_float32_logprobs():
    torch.manual_seed(0)
    hidden, weight = torch.randn(5, 8), torch.randn(30, 8)
    tokens = torch.randint(0, 30, (5,))
    exact = head_token_logprobs(hidden, weight, tokens)
    half = head_token_logprobs(hidden.bfloat16(), weight.bfloat16(), tokens, chunk_tokens=2)
    assert half.dtype == torch.float32 and torch.allclose(half, exact, atol=0.1)


def test_chunked_head_refuses_bad_shapes():
    with pytest.raises(ValueError, match="hidden"):
        head_token_logprobs(torch.zeros(3, 4), torch.zeros(5, 3), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="tokens"):
        head_token_logprobs(torch.zeros(3, 4), torch.zeros(5, 4), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="chunk_tokens"):
        head_token_logprobs(torch.zeros(3, 4), torch.zeros(5, 4), torch.zeros(3, dtype=torch.long), 0)


def test_packing_by_tokens_counts_padding_and_caps_sequences():
    lengths = [10, 3, 9, 4, 4, 2]
    # Longest first: 10, 9 | 4, 4, 3, 2 -> 2 x 10 = 20 <= 20; then 4 x 4 = 16.
    assert pack_micro_batches(lengths, max_sequences=8, max_tokens=20) == [[0, 2], [3, 4, 1, 5]]
    assert pack_micro_batches(lengths, max_sequences=3, max_tokens=20) == [[0, 2], [3, 4, 1], [5]]
    # No budget: fixed counts of sequences, longest first (the former behaviour).
    assert pack_micro_batches(lengths, max_sequences=4, max_tokens=None) == [[0, 2, 3, 4], [1, 5]]
    assert pack_micro_batches([], max_sequences=4, max_tokens=8) == []
    for chunk in pack_micro_batches(lengths, max_sequences=8, max_tokens=12):
        assert len(chunk) * max(lengths[i] for i in chunk) <= 12


def test_splitting_reaches_the_busiest_ranks_count_where_it_can():
    lengths = [8, 8, 8, 8, 2]
    chunks = pack_micro_batches(lengths, max_sequences=8, max_tokens=64)
    assert chunks == [[0, 1, 2, 3, 4]]
    split = split_micro_batches(chunks, lengths, 3)
    assert len(split) == 3 and sorted(i for c in split for i in c) == list(range(5))
    assert split_micro_batches([[0]], [5], 4) == [[0]]  # one sequence: nothing to split, dummy passes remain


def test_a_sequence_over_the_token_budget_is_refused_naming_its_length_and_the_setting():
    seqs = [{"prompt_token_ids": [1] * 6, "response_token_ids": [2] * 5, "advantage": 1.0}]
    message = check_sequences(seqs, 1, 32, max_tokens=10)
    assert message == ("sequence 0: 11 tokens (prompt + response) exceed learner.max_tokens_per_micro_batch = 10; "
                       "raise it to at least 11")
    assert check_sequences(seqs, 1, 32, max_tokens=11) is None


def test_collate_counts_padding_and_lines_up_engine_logprobs():
    seqs = [{"prompt_token_ids": [1, 2], "response_token_ids": [3, 4, 5], "advantage": 1.0,
             "response_logprobs": [-0.1, -0.2, -0.3]},
            {"prompt_token_ids": [1], "response_token_ids": [6], "advantage": -1.0}]
    batch = collate_micro_batch(seqs, torch.device("cpu"))
    assert batch.padded_tokens == 2 * 5 - 7 and batch.num_tokens == 4
    assert batch.input_ids[:, 1:][batch.response_mask].tolist() == [3, 4, 5, 6]
    assert batch.engine_logprobs[:3].tolist() == pytest.approx([-0.1, -0.2, -0.3])
    assert torch.isnan(batch.engine_logprobs[3])
    message = check_sequences([{**seqs[0], "response_logprobs": [-0.1]}], 1, 32)
    assert message == "sequence 0: response_logprobs has 1 entries for 3 response tokens"


def test_step_figures_weight_a_micro_batch_and_count_its_ratios_and_gaps():
    """pcl.models.step_figures on one process: the weights the loss gets from a micro-batch's engine log-probs (two
    sequences, engine log-probs below the learner's by log 3 and log 1.5), the ratios and gaps of the step."""
    from pcl.models.step_figures import OffPolicySettings, StepFigures, checked_off_policy

    seqs = [{"prompt_token_ids": [1, 2], "response_token_ids": [3, 4], "advantage": 1.0,
             "response_logprobs": [-0.5 - math.log(3.0), -1.0]},
            {"prompt_token_ids": [1], "response_token_ids": [6], "advantage": -1.0,
             "response_logprobs": [-2.0 - math.log(1.5)]}]
    batch = collate_micro_batch(seqs, torch.device("cpu"))
    flat = torch.tensor([-0.5, -1.0, -2.0])  # the learner's log-probs of the 3 response tokens
    logprobs = torch.zeros(batch.response_mask.shape).masked_scatter(batch.response_mask, flat)
    same = lambda values, op: values  # noqa: E731 - one rank: the reduction over ranks returns its input
    figures = StepFigures(OffPolicySettings("truncated", cap=2.0), torch.device("cpu"))
    weights = figures.importance_weights(batch, logprobs)
    assert weights[batch.response_mask].tolist() == pytest.approx([2.0, 1.0, 1.5])  # 3 truncated to the cap
    figures.add(torch.tensor(0.25), batch, flat)
    stats = figures.stats(same, True, computed=6, padded=2)
    assert stats["loss"] == 0.25 and stats["learner_padding_ratio"] == pytest.approx(1 / 3)
    assert stats["importance_ratio_mean"] == pytest.approx(5.5 / 3)
    assert stats["importance_ratio_max"] == pytest.approx(3.0)
    assert stats["importance_ratio_clipped_share"] == pytest.approx(1 / 3)
    assert stats["logprob_gap_max"] == pytest.approx(math.log(3.0))
    off = StepFigures(OffPolicySettings(), torch.device("cpu"))
    assert off.importance_weights(batch, logprobs) is None  # no correction: the on-policy loss
    assert "importance_ratio_mean" not in off.stats(same, True, computed=6, padded=2)
    with pytest.raises(ValueError, match="off_policy"):
        checked_off_policy(OffPolicySettings("truncated", cap=0.5))
