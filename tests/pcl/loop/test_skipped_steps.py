"""Policy steps the learner skips (a non-finite loss or gradient norm) on the in-memory fakes: each is a field of the
step record and a count, printed on the step's line, and learner.max_skipped_steps of them in a row stop the run
with an error naming the cause, also across a restore."""

from __future__ import annotations

import json
import math

import pytest

from pcl.loop.runlog import format_step_line, read_metrics
from pcl.loop.skipped import SkippedSteps
from tests.pcl.loop.fakes import FakeFleet, FakeLearner, config

PCL = {"type": "pcl", "tau": 0.5, "k": 2}


class SkippingLearner(FakeLearner):
    """Reports the steps numbered in `skips` (1-based, in this learner's count) as skipped, the gradient norm
    infinite; the others as FakeLearner does."""

    def __init__(self, skips: set[int]) -> None:
        super().__init__()
        self.skips = skips

    def train(self, sequences, global_count: int) -> dict[str, float]:
        stats = super().train(sequences, global_count)
        skipped = self.steps in self.skips
        return {**stats, "step_skipped": float(skipped), **({"grad_norm": math.inf} if skipped else {})}


def fleet_with(tmp_path, skips: set[int], steps: int = 8, limit: int = 3) -> FakeFleet:
    fleet = FakeFleet(tmp_path, config(PCL, run={"steps": steps}, learner={"max_skipped_steps": limit}))
    fleet.learner = fleet.loop.learner = SkippingLearner(skips)
    return fleet


def test_n_skipped_steps_in_a_row_stop_the_run_naming_the_cause_and_each_is_recorded_counted_and_printed(tmp_path):
    fleet = fleet_with(tmp_path, skips={2, 4, 5, 6})
    with pytest.raises(SkippedSteps) as stopped:
        fleet.run.run()
    assert str(stopped.value).startswith(
        "the policy learner skipped 3 steps in a row (steps 4-6; learner.max_skipped_steps = 3), the last for a "
        "non-finite gradient norm (inf, loss 0.6")
    assert "the weights have not changed since step 3" in str(stopped.value)
    from entrypoints.train import recoverable

    assert not recoverable(stopped.value)  # the driver does not restart the run into the same steps

    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]  # the step that stopped the run is recorded
    assert [r["policy_skipped"] for r in records] == [0, 1, 0, 1, 1, 1]
    assert [r["policy_skipped_steps_total"] for r in records] == [0, 1, 1, 2, 3, 4]
    assert fleet.learner.steps == 6 and fleet.control.published[-1].step == 6  # nothing trained after it
    assert "policy step SKIPPED (loss 0.2, grad norm -: not finite; 1 skipped so far)" in format_step_line(records[1], 8)
    assert "SKIPPED" not in format_step_line(records[2], 8)


def test_skipped_steps_apart_never_stop_the_run(tmp_path):
    fleet = fleet_with(tmp_path, skips={1, 2, 4, 5, 7}, steps=8, limit=3)
    assert fleet.run.run()["steps"] == 8
    assert read_metrics(tmp_path / "metrics.jsonl")[-1]["policy_skipped_steps_total"] == 5


def test_the_counts_survive_a_restore_so_a_run_resumed_in_a_streak_stops_in_time(tmp_path):
    a = fleet_with(tmp_path / "a", skips={2, 3})
    for step in range(3):
        a.loop.train_step(step)
        a.loop.state.step = step + 1
    a.loop.state.skipped.check(3)  # two in a row: under the limit
    b = fleet_with(tmp_path / "b", skips={1})  # b's first step is the run's fourth
    b.loop.load_state_dict(json.loads(json.dumps(a.loop.state_dict())))  # through JSON, as in state.json
    record = b.loop.train_step(3)
    assert (record.policy_skipped, record.policy_skipped_steps_total) == (1, 3)
    with pytest.raises(SkippedSteps, match=r"skipped 3 steps in a row \(steps 2-4;"):
        b.loop.state.skipped.check(3)
    older = a.loop.state_dict()
    del older["policy_skipped_total"], older["policy_skipped_in_a_row"]  # a checkpoint written before they existed
    b.loop.load_state_dict(json.loads(json.dumps(older)))
    assert (b.loop.state.skipped.total, b.loop.state.skipped.in_a_row) == (0, 0)
