"""The rehearsal's config: the preset's layout kept, the tiny model, data and lengths swapped in, CPU shrinkage."""

from __future__ import annotations

import glob

from pcl.config import load_config
from pcl.tools.rehearse import REHEARSAL_STEPS, layout, rehearsal_config

TINY = load_config("configs/tiny.yaml")


def test_the_8b_preset_keeps_its_layout_on_cpu_with_the_tiny_model_and_lengths():
    preset = load_config("configs/presets/qwen3-8b-base-math.yaml")
    cfg, swapped = rehearsal_config(preset, TINY)
    for section, keys in {"rollout": ("engine", "num_workers", "tensor_parallel_size", "weight_sync",
                                      "weight_sync_bucket_mb", "resources"),
                          "learner": ("num_ranks", "micro_batch_size", "max_tokens_per_micro_batch"),
                          "value": ("num_ranks", "lr"), "verifier": ("num_workers",)}.items():
        for key in keys:
            assert getattr(getattr(cfg, section), key) == getattr(getattr(preset, section), key), (section, key)
    assert cfg.redis == preset.redis and cfg.selection == preset.selection and cfg.optimizer == preset.optimizer
    assert cfg.rollout.engine == "vllm"  # vLLM stays vLLM (its CPU build)
    assert cfg.model == TINY.model and cfg.data == TINY.data and cfg.value.path == TINY.value.path
    assert cfg.rollout.max_new_tokens == TINY.rollout.max_new_tokens
    assert cfg.rollout.num_gpus_per_worker == 0 and cfg.learner.num_gpus_per_rank == 0
    assert cfg.learner.backend == "gloo" and cfg.rollout.threads == 1 and cfg.verifier.processes == 1
    assert not cfg.learner.compile and cfg.run.steps == REHEARSAL_STEPS and cfg.run.time_budget_s is None
    # m scaled to the tiny config's, a multiple of the workers, and one request chunk a worker as in the preset
    assert cfg.run.m % cfg.rollout.num_workers == 0 and cfg.run.n == TINY.run.n
    assert preset.run.m // preset.rollout.max_in_flight == cfg.run.m // cfg.rollout.max_in_flight
    assert "model.path: 'Qwen/Qwen3-8B-Base' -> 'tiny'" in swapped
    assert "learner.backend: 'nccl' -> 'gloo'" in swapped
    assert not any(line.startswith(("rollout.num_workers", "learner.num_ranks", "value.num_ranks")) for line in swapped)


def test_the_shipped_presets_have_three_distinct_layouts():
    presets = sorted(glob.glob("configs/presets/*.yaml"))
    layouts = {layout(rehearsal_config(load_config(p), TINY)[0]) for p in presets}
    assert len(presets) == 8 and len(layouts) == 3  # 1.7B and Llama 3B; 4B; 8B
