"""A step with the off-policy correction (`learner.off_policy`), through the loop's ports on in-memory fakes: the
learner's importance-ratio figures reach the step record only when the correction is on, and a batch whose
samples lack the engine's log-probabilities is refused before the learner sees it."""

from __future__ import annotations

import pytest

from pcl.loop.record import FIGURES
from pcl.rl import IMPORTANCE_RATIO_KEYS
from tests.pcl.loop.fakes import FakeFleet, config

RATIOS = {"importance_ratio_mean": 1.25, "importance_ratio_max": 3.5, "importance_ratio_clipped_share": 0.125}
TRUNCATED = {"off_policy": {"correction": "truncated", "cap": 2.0}}


def with_ratio_stats(fleet: FakeFleet) -> None:
    """The fake learner reports importance ratios as a learner with the correction on does."""
    train = fleet.learner.train
    fleet.learner.train = lambda sequences, global_count: {**train(sequences, global_count), **RATIOS}


def with_engine_logprobs(fleet: FakeFleet) -> None:
    """The fake fleet's samples carry the engine's log-probs, as both real engines report them."""
    generate = fleet.rollouts.generate_rollouts

    def generate_rollouts(*args, **kwargs):
        from dataclasses import replace

        return [replace(s, response_logprobs=(-0.5,) * len(s.response_token_ids))
                for s in generate(*args, **kwargs)]

    fleet.rollouts.generate_rollouts = generate_rollouts


def test_the_importance_ratios_are_step_record_fields():
    assert set(IMPORTANCE_RATIO_KEYS) <= set(FIGURES)
    assert not any(FIGURES[key].every_step for key in IMPORTANCE_RATIO_KEYS)  # absent unless the correction is on


def test_the_learners_importance_ratios_reach_the_record(tmp_path):
    fleet = FakeFleet(tmp_path, config({"type": "uniform"}, learner=TRUNCATED))
    with_engine_logprobs(fleet)
    with_ratio_stats(fleet)
    record = fleet.loop.train_step(0).to_dict()
    assert {key: record[key] for key in IMPORTANCE_RATIO_KEYS} == RATIOS


def test_without_the_correction_the_record_has_no_importance_ratios(tmp_path):
    fleet = FakeFleet(tmp_path, config({"type": "uniform"}))
    record = fleet.loop.train_step(0).to_dict()
    assert not set(IMPORTANCE_RATIO_KEYS) & set(record)


def test_a_batch_without_engine_logprobs_is_refused_naming_the_setting(tmp_path):
    fleet = FakeFleet(tmp_path, config({"type": "uniform"}, learner=TRUNCATED))  # fake samples carry none
    with pytest.raises(ValueError, match=r"learner\.off_policy\.correction = 'truncated' needs"):
        fleet.loop.train_step(0)
    assert fleet.learner.trained == []  # refused before the learner saw it
