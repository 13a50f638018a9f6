"""A rollout layout that cannot work is refused before any actor starts, naming the setting."""

from __future__ import annotations

import pytest

from pcl.config import ConfigError, load_config


@pytest.mark.parametrize("gpus,tp", [(3, 2), (1.5, 1), (2, 4)])
def test_a_tensor_parallel_size_that_does_not_divide_the_engines_gpus_is_refused_before_any_actor(gpus, tp):
    import ray

    from entrypoints.fleet import start_fleet

    cfg = load_config("configs/tiny.yaml", ["rollout.engine=vllm", f"rollout.num_gpus_per_worker={gpus}",
                                            f"rollout.tensor_parallel_size={tp}"])
    was_up = ray.is_initialized()
    with pytest.raises(ConfigError, match="rollout.tensor_parallel_size") as refused:
        start_fleet(cfg, prep=None, redis_url="redis://127.0.0.1:1/0")  # nothing is reached before the check
    assert "rollout.num_gpus_per_worker" in str(refused.value)
    assert ray.is_initialized() == was_up


def test_a_layout_that_fits_passes_the_check():
    from entrypoints.fleet import check_fleet_config

    for gpus, tp in ((2, 2), (4, 2), (0, 1), (1, 1)):
        check_fleet_config(load_config("configs/tiny.yaml", ["rollout.engine=vllm",
                                                             f"rollout.num_gpus_per_worker={gpus}",
                                                             f"rollout.tensor_parallel_size={tp}"]))
