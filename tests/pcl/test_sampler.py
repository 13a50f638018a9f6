"""The prompt sampler: every index once per epoch, orders fixed by (seed, epoch), seamless epoch crossing,
and exact resume from a state dict taken anywhere, including at and across epoch boundaries."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pcl.data.sampler import PromptSampler


def test_pinned_orders():
    # The stream is part of a run's reproducibility contract: a change here changes resumed runs.
    sampler = PromptSampler(5, seed=0)
    assert sampler.sample(5) == [2, 4, 3, 0, 1]
    assert (sampler.epoch, sampler.cursor) == (1, 0)
    assert sampler.sample(7) == [1, 4, 3, 0, 2, 4, 2]
    assert sampler.state_dict() == {"num_prompts": 5, "seed": 0, "epoch": 2, "cursor": 2}
    assert PromptSampler(5, seed=1).sample(5) == [4, 0, 1, 2, 3]


def test_every_index_once_per_epoch_whatever_the_draw_sizes():
    sampler = PromptSampler(37, seed=7)
    stream: list[int] = []
    for count in [1, 5, 36, 2, 100, 3, 17, 21]:  # 185 = 5 epochs of 37
        stream += sampler.sample(count)
    assert (sampler.epoch, sampler.cursor) == (5, 0)
    epochs = [stream[i : i + 37] for i in range(0, 185, 37)]
    for e, order in enumerate(epochs):
        assert sorted(order) == list(range(37))
        assert order == sampler.epoch_order(e).tolist()  # a pure function of (seed, epoch)
    assert len({tuple(order) for order in epochs}) == 5  # each epoch is reshuffled


def test_crossing_an_epoch_boundary_in_one_draw():
    sampler = PromptSampler(10, seed=3)
    first = sampler.sample(8)
    crossing = sampler.sample(5)
    order0, order1 = PromptSampler(10, 3).epoch_order(0).tolist(), PromptSampler(10, 3).epoch_order(1).tolist()
    assert first + crossing == order0 + order1[:3]
    assert (sampler.epoch, sampler.cursor) == (1, 3)
    assert all(isinstance(i, int) for i in crossing)


def test_orders_differ_between_seeds():
    assert PromptSampler(50, 0).sample(50) != PromptSampler(50, 1).sample(50)
    assert PromptSampler(50, 0).sample(50) == PromptSampler(50, 0).sample(50)


def test_resume_exactly_at_an_epoch_boundary():
    reference = PromptSampler(6, seed=11)
    reference.sample(6)
    state = reference.state_dict()
    assert (state["epoch"], state["cursor"]) == (1, 0)
    restored = PromptSampler(6, seed=11)
    restored.load_state_dict(json.loads(json.dumps(state)))
    assert restored.sample(9) == reference.sample(9)
    # A cursor at the very end of an epoch (as another writer might store it) is the next epoch's start.
    at_end = PromptSampler(6, seed=11)
    at_end.load_state_dict({"num_prompts": 6, "seed": 11, "epoch": 0, "cursor": 6})
    assert (at_end.epoch, at_end.cursor) == (1, 0)
    assert at_end.sample(6) == PromptSampler(6, 11).epoch_order(1).tolist()


@settings(max_examples=150, deadline=None)
@given(
    num_prompts=st.integers(1, 30),
    seed=st.integers(0, 2**32),
    before=st.lists(st.integers(1, 45), max_size=8),
    after=st.lists(st.integers(1, 45), min_size=1, max_size=8),
)
def test_restored_sampler_continues_the_same_stream(num_prompts, seed, before, after):
    uninterrupted = PromptSampler(num_prompts, seed)
    for count in before:
        uninterrupted.sample(count)
    state = json.loads(json.dumps(uninterrupted.state_dict()))
    restored = PromptSampler(num_prompts, seed)
    restored.load_state_dict(state)
    assert (restored.epoch, restored.cursor) == (uninterrupted.epoch, uninterrupted.cursor)
    for count in after:
        assert restored.sample(count) == uninterrupted.sample(count)
    assert restored.state_dict() == uninterrupted.state_dict()


@pytest.mark.parametrize("num_prompts, seed", [(0, 0), (-3, 0), (2.5, 0), (True, 0), (4, -1), (4, "x")])
def test_bad_construction(num_prompts, seed):
    with pytest.raises(ValueError, match="PromptSampler"):
        PromptSampler(num_prompts, seed)


@pytest.mark.parametrize("count", [0, -1, 1.5, None])
def test_bad_count(count):
    with pytest.raises(ValueError, match="count must be a positive int"):
        PromptSampler(4, 0).sample(count)


@pytest.mark.parametrize("state, message", [
    ({"num_prompts": 5, "seed": 0, "epoch": 0, "cursor": 0}, "dataset has 4"),
    ({"num_prompts": 4, "seed": 1, "epoch": 0, "cursor": 0}, "seed 1"),
    ({"num_prompts": 4, "seed": 0, "epoch": 0, "cursor": 5}, "out of range"),
    ({"num_prompts": 4, "seed": 0, "epoch": -1, "cursor": 0}, "out of range"),
    ({"num_prompts": 4, "seed": 0, "epoch": 0}, "keys"),
    ({"num_prompts": 4, "seed": 0, "epoch": "0", "cursor": 0}, "ints"),
    ([1, 2], "keys"),
])
def test_bad_state_dicts(state, message):
    sampler = PromptSampler(4, 0)
    sampler.sample(3)
    with pytest.raises(ValueError, match=message):
        sampler.load_state_dict(state)
    assert (sampler.epoch, sampler.cursor) == (0, 3)  # a rejected state leaves the sampler as it was


def test_numpy_ints_are_accepted():
    sampler = PromptSampler(np.int64(4), np.int64(2))
    assert sorted(sampler.sample(np.int32(4))) == [0, 1, 2, 3]
    json.dumps(sampler.state_dict())
