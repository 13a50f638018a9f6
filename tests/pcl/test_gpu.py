"""The HF engine and the value model on a CUDA device agree with their CPU runs (skipped, naming the reason,
where no CUDA device is visible). The NCCL learner's check is in test_learner.py, vLLM's in test_engines.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pcl.engines import SamplingParams
from pcl.engines.hf import HFEngine
from pcl.models.value import ValueModel, ValueTrainer

pytestmark = pytest.mark.gpu

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]]


@needs_cuda
def test_cuda_engine_greedy_matches_cpu_and_sampling_is_seeded(tiny_model_dir):
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=6)
    cpu = HFEngine(str(tiny_model_dir), device="cpu", dtype="float32", seed=0).generate(PROMPTS, greedy)
    engine = HFEngine(str(tiny_model_dir), device="cuda", dtype="float32", seed=0)
    assert engine.device.type == "cuda"
    gpu = engine.generate(PROMPTS, greedy)
    assert [[g.token_ids for g in group] for group in gpu] == [[g.token_ids for g in group] for group in cpu]

    sampled = SamplingParams(n=3, temperature=1.0, max_new_tokens=6, seed=11)
    first, second = engine.generate(PROMPTS, sampled), engine.generate(PROMPTS, sampled)
    assert [[g.token_ids for g in grp] for grp in first] == [[g.token_ids for g in grp] for grp in second]
    assert all(len(group) == 3 and all(1 <= g.num_tokens <= 6 for g in group) for group in first)


@needs_cuda
def test_cuda_engine_takes_weights_from_a_cpu_state_dict(tiny_model_dir):
    engine = HFEngine(str(tiny_model_dir), device="cuda", dtype="bfloat16", seed=0)
    weights = {k: torch.zeros_like(v, device="cpu", dtype=torch.float32) for k, v in engine.model.state_dict().items()}
    assert engine.load_weights(weights, version=3) == len(weights)
    assert engine.policy_version == 3
    assert all(float(p.abs().sum()) == 0.0 for p in engine.model.parameters())


@needs_cuda
def test_cuda_value_model_scores_like_cpu_and_trains(tiny_model_dir):
    scores = {}
    for device in ("cpu", "cuda"):
        model = ValueModel.from_pretrained(str(tiny_model_dir), dtype="float32", device=device)
        head = torch.randn(model.head.weight.shape, generator=torch.Generator().manual_seed(0)) * 0.5
        with torch.no_grad():
            model.head.weight.copy_(head)  # the same non-zero head on both devices
        trainer = ValueTrainer(model, lr=1e-2, batch_size=2)
        scores[device] = trainer.score(PROMPTS)
        before = trainer.score(PROMPTS)
        trainer.train_step(PROMPTS, [1.0, 1.0, 1.0, 1.0])
        assert (trainer.score(PROMPTS) > before).all()  # moved towards the targets on this device
    np.testing.assert_allclose(scores["cuda"], scores["cpu"], atol=1e-4)
