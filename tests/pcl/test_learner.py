"""The FSDP2 policy learner across real processes (gloo) against a single-process reference.

Two process groups are started once per module (2 ranks, then 1 rank; see learner_worker.py); each test
checks one property of their saved results. The reference is a plain, unsharded Qwen3 that computes the
step-7 gradient (algorithm step 7) one sequence at a time with log_softmax, then takes the same AdamW step.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from pcl.models.learner import PolicyLearner, check_sequences, collate_micro_batch, resolve_backend
from tests.pcl import learner_worker as worker

ATOL = 1e-5


def _stats(out, name: str, rank: int) -> dict:
    return json.loads((out / f"{name}.rank{rank}.json").read_text())


def _weights(out, name: str) -> dict[str, torch.Tensor]:
    return torch.load(out / f"{name}.pt")


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def reference_step(model_dir, sequences, num_sequences: int, grad_clip: float | None,
                   token_weights: list[list[float]] | None = None):
    """Weights after one plain-PyTorch step, and the gradient norm before clipping; `token_weights`: each response
    token's weight in the loss (the off-policy correction's), 1 when None."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    cfg = worker.OPTIMIZER
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]),
                                  eps=cfg["eps"], weight_decay=cfg["weight_decay"])
    for index, seq in enumerate(sequences):
        prompt, response = seq["prompt_token_ids"], seq["response_token_ids"]
        ids = torch.tensor(prompt + response)
        logprobs = torch.log_softmax(model(ids[None]).logits[0, :-1], dim=-1)  # [T-1, V]
        picked = logprobs.gather(-1, ids[1:, None])[:, 0][len(prompt) - 1:]  # [|y|] log pi(y_l | ...)
        # At ratio 1 the step-7 gradient is that of -(A / |y|) * sum_l w_l log pi(y_l) / N.
        weights = torch.tensor(token_weights[index]) if token_weights is not None else torch.ones(len(response))
        (-seq["advantage"] / len(response) * (weights * picked).sum() / num_sequences).backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf if grad_clip is None else grad_clip)
    optimizer.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, float(norm)


@pytest.fixture(scope="module")
def two_ranks(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("learner_2")
    return worker.run_ranks(2, tiny_model_dir, out, ["mbs1", "mbs4", "clip", "resume", "unsharded", "bad",
                                                   "poisoned", "tokens", "ckpt", "both", "gap", "off_policy"])


@pytest.fixture(scope="module")
def one_rank(tiny_model_dir, tmp_path_factory):
    return worker.run_ranks(1, tiny_model_dir, tmp_path_factory.mktemp("learner_1"),
                            ["mbs1", "mbs4", "resume", "planted", "compiled"])


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    sequences = worker.make_sequences(worker.STEP_SEQUENCES, seed=1)
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()
    return {"initial": initial, "sequences": sequences,
            "plain": reference_step(tiny_model_dir, sequences, worker.STEP_COUNT, None),
            "clipped": reference_step(tiny_model_dir, sequences, worker.STEP_COUNT,
                                      worker.SCENARIOS["clip"]["grad_clip"]),
            "truncated": reference_step(tiny_model_dir, sequences, worker.STEP_COUNT, None,
                                        [shifted_weights(len(s["response_token_ids"])) for s in sequences])}


def shifted_weights(size: int) -> list[float]:
    """The truncated importance weights min(ratio, cap) of a response of `size` tokens in the "off_policy"
    scenario's shifted step."""
    first, rest = (math.exp(r) for r in worker.OFF_POLICY_LOG_RATIOS)
    return [min(first, worker.OFF_POLICY_CAP)] + [min(rest, worker.OFF_POLICY_CAP)] * (size - 1)


# ------------------------------------------------------------------------------------------------------
# Pure helpers (no process group)


def test_collate_masks_only_response_tokens_and_right_pads():
    batch = collate_micro_batch([
        {"prompt_token_ids": [5, 6], "response_token_ids": [7, 8, 9], "advantage": 0.5},
        {"prompt_token_ids": [3], "response_token_ids": [4], "advantage": -1.0},
    ], torch.device("cpu"))
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9], [3, 4, 0, 0, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    # position t scores token t+1: responses start at positions len(prompt) - 1
    assert batch.response_mask.int().tolist() == [[0, 1, 1, 1], [1, 0, 0, 0]]
    assert batch.advantages.tolist() == [0.5, -1.0] and batch.num_tokens == 4


@pytest.mark.parametrize("sequences, count, expected", [
    ([{"prompt_token_ids": [1], "response_token_ids": [], "advantage": 1.0}], 1,
     "response_token_ids is empty"),
    ([{"prompt_token_ids": [], "response_token_ids": [1], "advantage": 1.0}], 1, "prompt_token_ids is empty"),
    ([{"prompt_token_ids": [1], "response_token_ids": [32], "advantage": 1.0}], 1, "[0, 32)"),
    ([{"prompt_token_ids": [1], "response_token_ids": [2]}], 1, "missing keys ['advantage']"),
    ([{"prompt_token_ids": [1], "response_token_ids": [2], "advantage": math.nan}], 1, "advantage is nan"),
    ([{"prompt_token_ids": [1], "response_token_ids": [2], "advantage": 1.0}] * 2, 1, "num_sequences"),
    *[([{"prompt_token_ids": [1], "response_token_ids": [2, 3], "advantage": 1.0, "response_logprobs": [-0.5, -1.0]},
        {"prompt_token_ids": [1], "response_token_ids": [2, 3], "advantage": 1.0, "response_logprobs": [-0.5, bad]}],
       2, f"sequence 1: response_logprobs[1] is {bad} (1 of 2 not finite numbers <= 0)")
      for bad in (math.nan, math.inf, -math.inf, 0.25)],
    ([{"prompt_token_ids": [1], "response_token_ids": [2], "advantage": 1.0, "response_logprobs": ["x"]}], 1,
     "sequence 0: response_logprobs must hold numbers"),
])
def test_check_sequences_names_the_bad_input(sequences, count, expected):
    assert expected in check_sequences(sequences, count, vocab_size=32)


def test_check_sequences_accepts_an_empty_share_and_valid_ones():
    assert check_sequences([], 3, vocab_size=32) is None
    assert check_sequences(worker.make_sequences(4, seed=0), 4, vocab_size=32) is None
    certain = {"prompt_token_ids": [1], "response_token_ids": [2, 3], "advantage": 1.0,
               "response_logprobs": [0.0, -0.0]}  # a token the engine was certain of
    assert check_sequences([certain, {**certain, "response_logprobs": (-1e30, -3.5)}], 2, vocab_size=32) is None


def test_backend_resolution_and_missing_process_group(tiny_model_dir):
    assert resolve_backend("gloo") == "gloo"
    assert resolve_backend("auto") == ("nccl" if torch.cuda.is_available() else "gloo")
    with pytest.raises(ValueError, match="backend"):
        resolve_backend("mpi")
    from pcl.config import OptimizerConfig

    with pytest.raises(RuntimeError, match="init_process_group"):
        PolicyLearner(str(tiny_model_dir), OptimizerConfig(), micro_batch_size=1)


# ------------------------------------------------------------------------------------------------------
# Real process groups


def test_update_matches_single_process_reference(two_ranks, reference):
    ref_weights, ref_norm = reference["plain"]
    assert _max_diff(reference["initial"], ref_weights) > 1e-3  # the step moves the weights visibly
    expected_loss = -sum(s["advantage"] for s in reference["sequences"]) / worker.STEP_COUNT  # ratio 1
    for name in ("mbs1", "mbs4", "tokens", "ckpt", "both"):
        assert _max_diff(_weights(two_ranks, name), ref_weights) < ATOL, name
        for rank in (0, 1):
            stats = _stats(two_ranks, name, rank)
            assert stats["grad_norm"] == pytest.approx(ref_norm, rel=1e-5)
            assert stats["loss"] == pytest.approx(expected_loss, abs=1e-6)
            assert stats["step_skipped"] == 0.0


def test_compiled_layers_give_the_eager_update(one_rank, reference):
    """learner.compile: each layer's forward compiled (with a token budget and checkpointing) updates the weights
    as the single-process eager reference does, with the parameter names unchanged."""
    ref_weights, ref_norm = reference["plain"]
    weights = _weights(one_rank, "compiled")
    assert weights.keys() == ref_weights.keys()
    assert _max_diff(weights, ref_weights) < ATOL
    assert _stats(one_rank, "compiled", 0)["grad_norm"] == pytest.approx(ref_norm, rel=1e-5)
    assert _stats(one_rank, "compiled", 0)["compiled_frames"] > 0


def test_rank_count_and_micro_batch_size_do_not_change_the_update(two_ranks, one_rank):
    runs = {(ws, name): _weights(out, name) for ws, out in ((1, one_rank), (2, two_ranks))
            for name in ("mbs1", "mbs4")}
    base = runs[(2, "mbs1")]
    for key, weights in runs.items():
        assert _max_diff(weights, base) < ATOL, key


def test_each_rank_reports_its_own_response_tokens(two_ranks, reference):
    total = sum(len(s["response_token_ids"]) for s in reference["sequences"])
    for name in ("mbs1", "mbs4", "clip"):
        assert sum(_stats(two_ranks, name, r)["num_tokens"] for r in (0, 1)) == total
    assert _stats(two_ranks, "mbs4", 1)["num_tokens"] == 0  # rank 1 held no sequence: dummy passes only


def test_gradient_clipping(two_ranks, reference):
    clipped_weights, clipped_norm = reference["clipped"]
    plain_weights, plain_norm = reference["plain"]
    assert clipped_norm == pytest.approx(plain_norm)  # the reported norm is the pre-clip one
    assert plain_norm > 10 * worker.SCENARIOS["clip"]["grad_clip"]
    weights = _weights(two_ranks, "clip")
    assert _max_diff(weights, clipped_weights) < ATOL
    assert _max_diff(weights, plain_weights) > 1e-3
    assert _stats(two_ranks, "clip", 0)["grad_norm"] == pytest.approx(plain_norm, rel=1e-5)


def test_full_state_dict_and_hf_export(two_ranks, reference):
    from transformers import AutoModelForCausalLM

    full = _weights(two_ranks, "mbs1")
    assert {k: v.shape for k, v in full.items()} == {k: v.shape for k, v in reference["initial"].items()}
    exported = AutoModelForCausalLM.from_pretrained(two_ranks / "hf", dtype=torch.float32)
    assert exported.config.architectures == ["Qwen3ForCausalLM"] and exported.config.use_cache
    assert _max_diff(exported.state_dict(), full) == 0.0


@pytest.mark.parametrize("world_size", [1, 2])
def test_checkpoint_resume_reproduces_the_next_step(world_size, one_rank, two_ranks):
    out = {1: one_rank, 2: two_ranks}[world_size]
    stats = _stats(out, "resume", 0)
    assert stats["steps_in_checkpoint"] == 1 and stats["state_keys"] == ["model", "optimizer", "steps"]
    # Returned states are snapshots: neither loading them nor training on writes into them (on one rank
    # there is nothing to gather, so this needs copies).
    assert stats["caller_state_unchanged"] and stats["weights_unchanged"]
    assert stats["rng_restored"]  # learner-rng-<r>.pt, read with torch.load(weights_only=True)
    if world_size == 2:
        assert _stats(out, "resume", 1)["state_keys"] == []  # only rank 0 holds the full state
    both = _weights(out, "resume")
    assert _max_diff(both["a"], both["b"]) < 1e-6


@pytest.mark.parametrize("name", ["learner.pt", "learner-rng-0.pt"])
def test_a_planted_pickle_in_a_checkpoint_is_refused_and_runs_nothing(name, one_rank):
    result = _stats(one_rank, "planted", 0)[name]
    assert not result["code_ran"], "loading the checkpoint ran the planted code"
    assert result["message"] is not None and result["message"].startswith("CheckpointError: "), result
    assert f"planted-{name}/{name}: refused" in result["message"] and "could run code" in result["message"]


def test_keeping_gathered_weights_through_the_step_gives_the_same_updates(two_ranks):
    # Two steps: weights kept gathered within a step must still be re-gathered after each update.
    reference_run = _weights(two_ranks, "resume")["a"]
    assert _max_diff(_weights(two_ranks, "unsharded"), reference_run) < ATOL


def test_bad_share_raises_on_every_rank_and_the_group_survives(two_ranks):
    first, last = _stats(two_ranks, "bad", 0), _stats(two_ranks, "bad", 1)
    assert "sequence 1: response_token_ids is empty" in last["message"]
    assert "another learner rank rejected" in first["message"]
    assert math.isfinite(first["next_loss"]) and first["next_loss"] == last["next_loss"]


def test_poisoned_batches_are_refused_or_skipped_on_every_rank_and_the_group_survives(two_ranks):
    """A NaN engine log-probability on one rank is refused by name on every rank before any pass; an advantage large
    enough to overflow the gradient gives a step that every rank skips (weights untouched); the next step trains."""
    first, last = _stats(two_ranks, "poisoned", 0), _stats(two_ranks, "poisoned", 1)
    assert "sequence 1: response_logprobs[0] is nan" in last["refused"]
    assert "another learner rank rejected" in first["refused"]
    for stats in (first, last):
        assert stats["overflow"]["step_skipped"] == 1.0 and not math.isfinite(stats["overflow"]["grad_norm"])
        assert stats["next"]["step_skipped"] == 0.0 and math.isfinite(stats["next"]["loss"])
    weights = _weights(two_ranks, "poisoned")
    assert _max_diff(weights["after_overflow"], weights["before"]) == 0.0
    assert _max_diff(weights["after_next"], weights["before"]) > 1e-4


def test_token_budget_packs_micro_batches_and_reports_the_padding(two_ranks):
    # Rank 0's 5 sequences under 20 tokens a micro-batch; rank 1 splits its 2 to match instead of a dummy pass.
    first, second = _stats(two_ranks, "tokens", 0), _stats(two_ranks, "tokens", 1)
    assert first["micro_batches"] == second["micro_batches"] == 2
    assert 0 < first["learner_padding_ratio"] == second["learner_padding_ratio"] < 1
    assert "logprob_gap_mean" not in first
    mbs4 = _stats(two_ranks, "mbs4", 0)  # 7 sequences in micro-batches of 4, padded to their longest
    assert 0 < mbs4["learner_padding_ratio"] < 1


def test_engine_logprob_gap_is_measured_from_the_step_forward(two_ranks):
    for rank in (0, 1):
        stats = _stats(two_ranks, "gap", rank)
        assert stats["with"]["logprob_gap_max"] == pytest.approx(0.25, abs=1e-5)
        tokens = sum(len(s["response_token_ids"]) for s in worker.make_sequences(worker.STEP_SEQUENCES, 1)[:4])
        assert stats["with"]["logprob_gap_mean"] == pytest.approx(0.25 / tokens, abs=1e-5)
        assert "logprob_gap_mean" not in stats["without"] and "logprob_gap_max" not in stats["without"]


def test_off_policy_correction_on_policy_is_the_plain_update_and_shifted_log_probs_weight_each_token(
        two_ranks, reference):
    """learner.off_policy.correction = truncated on 2 ranks: with the engine's log-probs equal to the learner's the
    update is the uncorrected one; shifted, it is the single-process step with each token's term weighted by
    min(ratio, cap), and the step reports the ratios."""
    weights = _weights(two_ranks, "off_policy")
    assert _max_diff(weights["on_policy"], reference["plain"][0]) < ATOL
    assert _max_diff(weights["shifted"], reference["truncated"][0]) < ATOL
    assert _max_diff(weights["shifted"], reference["plain"][0]) > 1e-3  # the correction moves the update
    sizes = [len(s["response_token_ids"]) for s in reference["sequences"]]
    ratios = [r for size in sizes for r in [math.e] + [math.exp(-0.5)] * (size - 1)]
    expected_loss = -sum(s["advantage"] * sum(shifted_weights(size)) / size
                         for s, size in zip(reference["sequences"], sizes)) / worker.STEP_COUNT
    for rank in (0, 1):
        stats = _stats(two_ranks, "off_policy", rank)
        on_policy, shifted = stats["on_policy"], stats["shifted"]
        assert on_policy["importance_ratio_mean"] == pytest.approx(1.0, abs=1e-5)
        assert on_policy["importance_ratio_max"] == pytest.approx(1.0, abs=1e-5)
        assert on_policy["importance_ratio_clipped_share"] == 0.0
        assert shifted["importance_ratio_mean"] == pytest.approx(sum(ratios) / len(ratios), abs=1e-5)
        assert shifted["importance_ratio_max"] == pytest.approx(math.e, abs=1e-5)
        assert shifted["importance_ratio_clipped_share"] == pytest.approx(len(sizes) / len(ratios))
        assert shifted["loss"] == pytest.approx(expected_loss, abs=1e-6)
        assert shifted["grad_norm"] == pytest.approx(reference["truncated"][1], rel=1e-5)
    assert "importance_ratio_mean" not in _stats(two_ranks, "mbs1", 0)  # no correction, no ratios


@pytest.mark.gpu
def test_nccl_step_matches_reference(tiny_model_dir, tmp_path, reference):
    if torch.cuda.device_count() < 1:
        pytest.skip("needs at least 1 CUDA device for the NCCL learner")
    world_size = min(2, torch.cuda.device_count())
    out = worker.run_ranks(world_size, tiny_model_dir, tmp_path, ["mbs1", "both"], backend="nccl", device="cuda")
    ref_weights, ref_norm = reference["plain"]
    for name in ("mbs1", "both"):  # "both": a token budget and activation checkpointing under NCCL
        assert _max_diff(_weights(out, name), ref_weights) < 1e-4, name
        assert _stats(out, name, 0)["grad_norm"] == pytest.approx(ref_norm, rel=1e-4)
