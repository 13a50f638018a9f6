"""The value scorer actor over two Ray processes (value.num_ranks: 2, FSDP2 on gloo) against one: the same
scores and steps, a checkpoint either loads, and the typed `value` section it is built from."""

from __future__ import annotations

import numpy as np
import pytest

from pcl.config import ValueModelConfig

pytestmark = [pytest.mark.ray]

PROMPTS = [[4, 5, 6], [7, 8, 9, 10, 11, 12, 13], [5], [6, 6, 6, 6, 6], [20, 21, 22]]
RATES = [0.1, 0.9, 0.5, 0.0, 1.0]


def test_two_value_ranks_score_and_train_as_one(ray_session, tiny_model_dir, tmp_path):
    import ray

    from actors.scorer import ValueScorerActor

    actors = {n: ValueScorerActor.remote(ValueModelConfig(lr=1e-2, batch_size=2, num_ranks=n), str(tiny_model_dir),
                                         "cpu", 0, timeout_s=120) for n in (1, 2)}
    for _ in range(2):  # the head starts at zero: the first step moves it, the second the backbone too
        stats = {n: ray.get(a.train.remote(PROMPTS, RATES), timeout=300) for n, a in actors.items()}
        assert stats[2]["value_loss"] == pytest.approx(stats[1]["value_loss"], abs=1e-5)
        assert stats[2]["value_grad_norm"] == pytest.approx(stats[1]["value_grad_norm"], rel=1e-5)
        assert stats[2]["value_num_prompts"] == len(PROMPTS)
    scores = {n: ray.get(a.score.remote(PROMPTS), timeout=300) for n, a in actors.items()}
    assert scores[1].shape == scores[2].shape == (len(PROMPTS),)
    assert np.abs(scores[2] - scores[1]).max() < 1e-5 and np.ptp(scores[1]) > 1e-4
    ray.get(actors[2].save_checkpoint.remote(str(tmp_path / "value")), timeout=300)
    ray.get(actors[1].load_checkpoint.remote(str(tmp_path / "value")), timeout=300)  # unsharded reads sharded
    assert np.abs(ray.get(actors[1].score.remote(PROMPTS), timeout=300) - scores[2]).max() < 1e-6
    for actor in actors.values():
        ray.kill(actor, no_restart=True)


@pytest.mark.parametrize("deterministic", [False, True])
def test_a_lost_value_process_is_restarted_in_place_unless_rollouts_are_deterministic(deterministic, ray_session,
                                                                                     tiny_model_dir):
    """Restarted in place, V comes back from the newest checkpoint: not the V an uninterrupted run has, so with
    rollout.deterministic the selections, and the final weights, would differ from it (`pcl chaos --reference`).
    There the lost process fails the call, a failure the driver restarts the whole run from its checkpoint for."""
    import os
    import signal

    import ray

    from actors.scorer import ValueScorerActor, restart_options
    from entrypoints.train import recoverable

    actor = ValueScorerActor.options(**restart_options(deterministic)).remote(
        ValueModelConfig(lr=1e-2, batch_size=2), str(tiny_model_dir), "cpu", 0, timeout_s=120)
    pid = ray.get(actor.__ray_call__.remote(lambda self: os.getpid()), timeout=300)
    os.kill(pid, signal.SIGKILL)
    if deterministic:
        with pytest.raises(ray.exceptions.RayActorError) as lost:
            ray.get(actor.score.remote(PROMPTS), timeout=300)
        assert recoverable(lost.value)
    else:  # Ray restarted it and retried the call
        assert ray.get(actor.score.remote(PROMPTS), timeout=300).shape == (len(PROMPTS),)
        assert ray.get(actor.__ray_call__.remote(lambda self: os.getpid()), timeout=60) != pid
    ray.kill(actor, no_restart=True)
