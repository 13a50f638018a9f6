"""A config's layout on one process and one device (`pcl.loop.local.layout`): counts mapped to one and said; what cannot be
mapped refused, naming the setting."""

from __future__ import annotations

import pytest

from pcl.config import ConfigError, load_config
from pcl.loop.local.layout import layout_line, one_device


def test_the_embedded_default_maps_its_two_learner_ranks_to_one_and_says_so():
    cfg, device, mapped = one_device(load_config("configs/tiny-carry.yaml"), cuda=False)
    assert device == "cpu" and cfg.learner.num_ranks == 1 and mapped == ["learner.num_ranks 2 -> 1"]
    line = layout_line(device, mapped, cfg.rollout.threads)
    assert line == ("pcl: --local: one process on cpu, torch threads 2 (rollout.threads); mapped to one: "
                    "learner.num_ranks 2 -> 1") and "\n" not in line


def test_a_preset_maps_every_count_to_one_on_a_gpu_and_keeps_the_rest():
    preset = load_config("configs/presets/qwen3-1.7b-base-math.yaml", ["value.num_ranks=2", "verifier.num_workers=3"])
    cfg, device, mapped = one_device(preset, cuda=True)
    assert device == "cuda"
    assert mapped == ["learner.num_ranks 3 -> 1", "value.num_ranks 2 -> 1", "rollout.num_workers 4 -> 1",
                      "verifier.num_workers 3 -> 1"]
    assert (cfg.learner.num_ranks, cfg.value.num_ranks, cfg.rollout.num_workers, cfg.verifier.num_workers) == (1,) * 4
    assert cfg.run == preset.run and cfg.selection == preset.selection and cfg.rollout.engine == "vllm"
    assert one_device(load_config("configs/tiny.yaml", ["learner.num_ranks=1"]), cuda=True)[1:] == ("cpu", [])


@pytest.mark.parametrize("overrides, cuda, named", [
    (["cluster.nodes=2"], True, "cluster.nodes = 2"),
    (["learner.num_gpus_per_rank=1"], False, "learner.num_gpus_per_rank = 1"),
    (["rollout.num_gpus_per_worker=0.5"], False, "rollout.num_gpus_per_worker = 0.5"),
    (["run.max_staleness=1", "learner.off_policy.correction=truncated"], False, "run.max_staleness = 1"),
])
def test_a_layout_one_device_cannot_hold_is_refused_naming_the_setting(overrides, cuda, named):
    with pytest.raises(ConfigError) as refused:
        one_device(load_config("configs/tiny.yaml", overrides), cuda=cuda)
    assert str(refused.value).startswith(named)
