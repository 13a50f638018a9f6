"""The value model and its trainer on a tiny random Qwen3 (and a tiny BERT encoder): range, padding
invariance, the value loss, learning, micro-batch accumulation, checkpoints and determinism."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from pcl.models.value import HEAD_FILE, ValueModel, ValueTrainer

PROMPTS = [[4, 5, 6], [7, 8, 9, 10, 11, 12, 13], [5], [6, 6, 6, 6, 6], [20, 21, 22], [9, 9]]
TARGETS = [0.1, 0.9, 0.5, 0.0, 1.0, 0.25]
# sum_i (0.5 - p_i)^2 = 0.16 + 0.16 + 0 + 0.25 + 0.25 + 0.0625: the loss of the zero-initialised head.
INITIAL_LOSS = 0.8825
# |V_bf16(x) - V_fp32(x)| on the tiny model with the randomised head: 4.1e-3 at most before the first step, 1.7e-3
# after it (the backbone in bfloat16, 8 mantissa bits; the head and the sigmoid in float32).
BF16_SCORE_TOLERANCE = 1e-2


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # Tests share two cores with other processes; one thread avoids OpenMP spin-wait slowdowns.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def value_model(tiny_model_dir) -> ValueModel:
    return ValueModel.from_pretrained(tiny_model_dir, dtype="float32", device="cpu")


def randomise_head(model: ValueModel, seed: int = 0) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.head.weight.copy_(torch.randn(model.head.weight.shape, generator=generator) * 0.3)
        model.head.bias.fill_(0.1)


def test_backbone_is_the_base_model_without_lm_head(value_model):
    assert type(value_model.backbone).__name__ == "Qwen3Model"
    assert value_model.head.weight.dtype == torch.float32 and value_model.head.weight.shape == (1, 64)


def test_initial_predictions_are_one_half(value_model):
    values = ValueTrainer(value_model, lr=1e-3).score(PROMPTS)
    assert values.dtype == np.float64 and values.shape == (len(PROMPTS),)
    np.testing.assert_array_equal(values, 0.5)


def test_outputs_are_in_unit_interval_and_differ_between_prompts(value_model):
    randomise_head(value_model)
    values = ValueTrainer(value_model, lr=1e-3, batch_size=4).score(PROMPTS)
    assert ((values > 0) & (values < 1)).all()
    assert len(set(np.round(values, 6))) == len(PROMPTS)


def test_padding_invariance_left_and_right(value_model):
    randomise_head(value_model)
    trainer = ValueTrainer(value_model, lr=1e-3, batch_size=len(PROMPTS))
    batched = trainer.score(PROMPTS)  # left-padded to the longest prompt (7 tokens)
    alone = np.array([trainer.score([prompt])[0] for prompt in PROMPTS])
    np.testing.assert_allclose(batched, alone, atol=1e-5, rtol=0)
    # Batches of 2 are formed in length order; the values still come back in input order.
    in_pairs = ValueTrainer(value_model, lr=1e-3, batch_size=2).score(PROMPTS)
    np.testing.assert_allclose(in_pairs, alone, atol=1e-5, rtol=0)
    # Right padding goes through the same last-real-token lookup.
    width = max(len(p) for p in PROMPTS)
    input_ids = torch.tensor([p + [0] * (width - len(p)) for p in PROMPTS])
    attention_mask = torch.tensor([[1] * len(p) + [0] * (width - len(p)) for p in PROMPTS])
    with torch.no_grad():
        right = value_model(input_ids, attention_mask).double().numpy()
    np.testing.assert_allclose(right, alone, atol=1e-5, rtol=0)


def test_first_loss_is_the_summed_squared_error_and_training_reduces_it(value_model):
    trainer = ValueTrainer(value_model, lr=3e-3, grad_clip=1.0, batch_size=4)
    losses = [trainer.train_step(PROMPTS, TARGETS)["loss"] for _ in range(8)]
    assert losses[0] == pytest.approx(INITIAL_LOSS, abs=1e-6)
    assert all(later < earlier for earlier, later in zip(losses, losses[1:]))
    assert losses[-1] < 0.4 * losses[0]
    values = trainer.score(PROMPTS)
    # The predictions moved toward their targets: the 0.9 / 1.0 prompts now rank above the 0.0 / 0.1 ones.
    assert min(values[1], values[4]) > max(values[0], values[3])
    assert trainer.steps == 8


def test_micro_batches_accumulate_to_the_full_batch_gradient(tiny_model_dir):
    results = []
    for batch_size in (2, len(PROMPTS)):
        trainer = ValueTrainer(ValueModel.from_pretrained(tiny_model_dir), lr=1e-2, grad_clip=None,
                               batch_size=batch_size)
        trainer.train_step(PROMPTS, TARGETS)  # moves the head off zero so the backbone gets gradients
        stats = trainer.train_step(PROMPTS, TARGETS)
        results.append((stats, trainer.score(PROMPTS)))
    (small, small_values), (full, full_values) = results
    assert small["loss"] == pytest.approx(full["loss"], rel=1e-5)
    assert small["grad_norm"] == pytest.approx(full["grad_norm"], rel=1e-4)
    np.testing.assert_allclose(small_values, full_values, atol=1e-5)


def test_grad_clip_reports_the_norm_before_clipping(value_model):
    trainer = ValueTrainer(value_model, lr=1e-3, grad_clip=1e-3)
    stats = trainer.train_step(PROMPTS, TARGETS)
    assert stats["grad_norm"] > 1e-3 and stats["skipped"] == 0.0 and stats["num_prompts"] == len(PROMPTS)


def test_training_is_deterministic_on_cpu(tiny_model_dir):
    runs = []
    for _ in range(2):
        trainer = ValueTrainer(ValueModel.from_pretrained(tiny_model_dir), lr=3e-3, batch_size=4)
        losses = [trainer.train_step(PROMPTS, TARGETS)["loss"] for _ in range(3)]
        runs.append((losses, trainer.model.state_dict()))
    assert runs[0][0] == runs[1][0]
    for name, tensor in runs[0][1].items():
        assert torch.equal(tensor, runs[1][1][name]), name


def test_trainer_state_dict_round_trip_includes_the_optimizer(tiny_model_dir):
    original = ValueTrainer(ValueModel.from_pretrained(tiny_model_dir), lr=3e-3, batch_size=4)
    for _ in range(2):
        original.train_step(PROMPTS, TARGETS)
    buffer = io.BytesIO()  # through bytes, as a checkpoint goes: state_dict() holds live tensors
    torch.save(original.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    assert state["steps"] == 2 and state["optimizer"]["state"], "AdamW moments must be in the checkpoint"
    restored = ValueTrainer(ValueModel.from_pretrained(tiny_model_dir), lr=3e-3, batch_size=4)
    restored.load_state_dict(state)
    assert restored.steps == 2
    np.testing.assert_array_equal(restored.score(PROMPTS), original.score(PROMPTS))
    # Same next step only if the AdamW moments came along (a fresh optimizer would step differently).
    next_original = original.train_step(PROMPTS, TARGETS)
    next_restored = restored.train_step(PROMPTS, TARGETS)
    assert next_restored == next_original
    np.testing.assert_array_equal(restored.score(PROMPTS), original.score(PROMPTS))


def test_checkpoint_files_load_tensors_only_with_the_optimizer_and_rng(tiny_model_dir, tmp_path):
    original = ValueTrainer(ValueModel.from_pretrained(tiny_model_dir), lr=3e-3, batch_size=4)
    original.train_step(PROMPTS, TARGETS)
    original.save_checkpoint(tmp_path / "value")
    rng = torch.get_rng_state()
    torch.manual_seed(99)
    restored = ValueTrainer(ValueModel.from_pretrained(tiny_model_dir), lr=3e-3, batch_size=4)
    restored.load_checkpoint(tmp_path / "value")  # torch.load(weights_only=True)
    assert torch.equal(torch.get_rng_state(), rng) and restored.steps == 1
    assert restored.train_step(PROMPTS, TARGETS) == original.train_step(PROMPTS, TARGETS)  # AdamW came along


class PlantedCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):  # unpickling runs os.system
        import os

        return os.system, (f"touch {self.marker}",)


def test_a_planted_pickle_as_trainer_pt_is_refused_and_runs_nothing(value_model, tmp_path):
    trainer = ValueTrainer(value_model, lr=3e-3, batch_size=4)
    trainer.save_checkpoint(tmp_path / "value")
    marker = tmp_path / "ran"
    torch.save(PlantedCode(marker), tmp_path / "value" / "trainer.pt")
    with pytest.raises(Exception) as refused:
        trainer.load_checkpoint(tmp_path / "value")
    assert not marker.exists(), "loading the checkpoint ran the planted code"
    assert type(refused.value).__name__ == "CheckpointError"
    assert "value/trainer.pt: refused: " in str(refused.value) and "could run code" in str(refused.value)


def test_save_pretrained_and_reload(value_model, tmp_path):
    randomise_head(value_model, seed=3)
    value_model.save_pretrained(tmp_path / "value")
    assert (tmp_path / "value" / HEAD_FILE).is_file()
    reloaded = ValueModel.from_pretrained(tmp_path / "value")
    before = ValueTrainer(value_model, lr=1e-3).score(PROMPTS)
    after = ValueTrainer(reloaded, lr=1e-3).score(PROMPTS)
    np.testing.assert_array_equal(after, before)
    assert not np.allclose(after, 0.5)


def test_bad_inputs_name_the_argument(value_model):
    trainer = ValueTrainer(value_model, lr=1e-3)
    with pytest.raises(ValueError, match="targets"):
        trainer.train_step(PROMPTS, TARGETS[:-1])
    with pytest.raises(ValueError, match="targets"):
        trainer.train_step(PROMPTS, [1.5] + TARGETS[1:])
    with pytest.raises(ValueError, match="targets"):
        trainer.train_step(PROMPTS, [float("nan")] + TARGETS[1:])
    with pytest.raises(ValueError, match=r"prompt_token_ids\[1\]"):
        trainer.score([[4, 5], []])
    with pytest.raises(ValueError, match=r"prompt_token_ids\[0\]"):
        trainer.score([[4, 999]])
    with pytest.raises(ValueError, match="lr"):
        ValueTrainer(value_model, lr=0.0)


def test_encoder_backbone(tmp_path):
    """A BERT-style encoder works as a backbone too, padding-invariant with absolute positions."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=32, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    BertModel(config).save_pretrained(tmp_path / "bert")
    model = ValueModel.from_pretrained(tmp_path / "bert")
    randomise_head(model)
    trainer = ValueTrainer(model, lr=1e-3, batch_size=len(PROMPTS))
    batched = trainer.score(PROMPTS)
    alone = np.array([trainer.score([prompt])[0] for prompt in PROMPTS])
    np.testing.assert_allclose(batched, alone, atol=1e-5, rtol=0)
    assert trainer.train_step(PROMPTS, TARGETS)["loss"] > 0


def test_a_bfloat16_scoring_copy_is_refreshed_after_each_step_and_close_to_float32(tiny_model_dir):
    model = ValueModel.from_pretrained(tiny_model_dir)
    randomise_head(model)
    trainer = ValueTrainer(model, lr=3e-2, batch_size=4, score_dtype="bfloat16")
    exact = ValueTrainer(model, lr=3e-2, batch_size=4)  # scores with the float32 weights themselves
    assert trainer.scorer is not None and exact.scorer is None
    for _ in range(2):
        gap = np.abs(trainer.score(PROMPTS) - exact.score(PROMPTS)).max()
        assert gap < BF16_SCORE_TOLERANCE, gap
        trainer.train_step(PROMPTS, TARGETS)
        for name, weight in trainer.model.named_parameters():  # the copy is the new weights, cast
            copied = dict(trainer.scorer.named_parameters())[name]
            expected_dtype = torch.float32 if name.startswith("head.") else torch.bfloat16
            assert copied.dtype == expected_dtype and torch.equal(copied, weight.detach().to(expected_dtype)), name
    state = {k: v.clone() for k, v in ValueTrainer(ValueModel.from_pretrained(tiny_model_dir), lr=1e-3)
             .state_dict()["model"].items()}  # the initial weights: loading them refreshes the copy too
    before = trainer.score(PROMPTS)
    trainer.load_state_dict({"model": state, "optimizer": trainer.optimizer.state_dict(), "steps": 0})
    after = trainer.score(PROMPTS)
    assert not np.allclose(before, after) and np.allclose(after, 0.5, atol=1e-6)  # the zero head again


def test_auto_scores_with_the_float32_weights_on_cpu(value_model):
    trainer = ValueTrainer(value_model, lr=1e-3, score_dtype="auto")
    assert trainer.scorer is None and trainer.scoring_model is value_model


def test_the_scoring_copy_shares_no_memory_with_the_trained_weights(value_model):
    from pcl.models.value import score_copy

    for dtype in (torch.bfloat16, torch.float32):
        duplicate = score_copy(value_model, dtype)
        trained = {p.untyped_storage().data_ptr() for p in value_model.parameters()}
        assert not trained & {p.untyped_storage().data_ptr() for p in duplicate.parameters()}
        assert duplicate.head.weight.dtype == torch.float32 and duplicate.backbone.dtype == dtype
        assert not any(p.requires_grad for p in duplicate.parameters())
