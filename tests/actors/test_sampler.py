"""The sampler actor restores a saved cursor only on the training data it was saved on: the one training-data check
(`pcl.data.fingerprint.data_changes`), the same the driver runs before starting."""

from __future__ import annotations

import pytest

from pcl.data.prompts import PromptRecord

pytestmark = [pytest.mark.ray]


def records(answers: list[str]) -> list[PromptRecord]:
    return [PromptRecord(str(i), f"{i}+{i}", a, f"{i}+{i}=", (1, 2)) for i, a in enumerate(answers)]


def test_a_cursor_saved_on_other_data_is_refused_naming_the_difference(ray_session):
    import ray

    from actors.sampler import PromptSamplerActor

    data = records([str(2 * i) for i in range(8)])
    first = PromptSamplerActor.remote(data, 0)
    ray.get(first.sample.remote(3))
    state = ray.get(first.state_dict.remote())
    same = PromptSamplerActor.remote(data, 0)
    ray.get(same.load_state_dict.remote(state))
    assert [p.id for p in ray.get(same.sample.remote(2))] == [p.id for p in ray.get(first.sample.remote(2))]
    edited = records([str(2 * i) for i in range(7)] + ["15"])
    other = PromptSamplerActor.remote(edited, 0)
    with pytest.raises(ray.exceptions.RayTaskError, match="the gold answers differ"):
        ray.get(other.load_state_dict.remote(state))
    older = {k: v for k, v in state.items() if k != "data"}  # a checkpoint written before the fingerprint
    ray.get(other.load_state_dict.remote(older))
    for actor in (first, same, other):
        ray.kill(actor)
