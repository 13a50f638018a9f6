"""Asynchronous steps (`run.max_staleness`, `pcl.loop.ahead`) on in-memory fakes: step t+s's batch is selected
before step t trains and generated while it trains, each batch is trained on exactly once and exactly s versions
after the one that generated it, a resumed run trains on the very batches the interrupted one generated ahead,
and what cannot run ahead is refused before the run."""

from __future__ import annotations

import json
import threading
from dataclasses import replace

import pytest

from pcl.config import ConfigError, load_config
from pcl.loop.runlog import read_metrics
from tests.pcl.loop.fakes import FakeFleet, config

TRUNCATED = {"off_policy": {"correction": "truncated", "cap": 2.0}}
TIMES = ("seconds", "elapsed")  # clock-dependent figures: the fake clock is advanced from two threads


def async_config(selection: dict, staleness: int = 1, steps: int = 6, **sections) -> object:
    return config(selection, run={"steps": steps, "max_staleness": staleness}, learner=TRUNCATED, **sections)


def with_engine_logprobs(fleet: FakeFleet) -> FakeFleet:
    generate = fleet.rollouts.generate_rollouts

    def generate_rollouts(*args, **kwargs):
        return [replace(s, response_logprobs=(-0.5,) * len(s.response_token_ids)) for s in generate(*args, **kwargs)]

    fleet.rollouts.generate_rollouts = generate_rollouts
    return fleet


def steps_of(run_dir) -> list[dict]:
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if "step_seconds" in r]


def untimed(record: dict) -> dict:
    return {k: v for k, v in record.items() if not any(t in k for t in TIMES)}


@pytest.mark.parametrize("staleness", [1, 2])
def test_each_batch_is_trained_exactly_s_versions_after_the_one_that_generated_it(tmp_path, staleness):
    fleet = with_engine_logprobs(FakeFleet(tmp_path, async_config({"type": "pcl", "tau": 0.5, "k": 2}, staleness)))
    fleet.run.run()

    records = steps_of(tmp_path)
    # the first s steps' batches are generated on the spot (fewer versions back), then exactly s
    expected = [0] + [0 if step < staleness else staleness for step in range(1, 6)]
    assert [r["batch_staleness"] for r in records] == expected
    selections = read_metrics(tmp_path / "selections.jsonl")
    for line, staleness_of_step in zip(selections, expected):
        versions = {v for group in line["versions"] for v in group}
        assert versions == {line["step"] - 1 - staleness_of_step}  # every sample, by the version it carries
        assert all(sorted(indices) == list(range(4)) for indices in line["samples"])
    batches = [c for c in fleet.rollouts.calls if c["tag"] == ""]
    assert sorted(c["step"] for c in batches) == list(range(6))  # each step's batch generated once, none past the end
    assert fleet.learner.synced == [1, 2, 3, 4, 5, 6] and len(fleet.learner.trained) == 6
    assert all(r["batch_samples"] == r["batch_unique_samples"] == 16 for r in records)
    assert all("learner_wait_seconds" in r and "fleet_wait_seconds" in r for r in records)


def test_the_next_batch_is_generated_while_the_learner_trains(tmp_path):
    fleet = with_engine_logprobs(FakeFleet(tmp_path, async_config({"type": "uniform"}, steps=2)))
    started = threading.Event()
    generate, train = fleet.rollouts.generate_rollouts, fleet.learner.train

    def generate_rollouts(step, *args, **kwargs):
        if step == 1:
            started.set()
        return generate(step, *args, **kwargs)

    def learner_train(sequences, global_count):
        overlapped.append(started.wait(timeout=10))  # step 0 trains only once step 1's generation has begun
        return train(sequences, global_count)

    overlapped: list[bool] = []
    fleet.rollouts.generate_rollouts, fleet.learner.train = generate_rollouts, learner_train
    fleet.run.run()
    assert overlapped[0] is True


def test_selection_for_step_t_plus_s_uses_v_before_its_step_t_update(tmp_path):
    """V scores step t+1's candidates before it trains on step t's batch: the order is fixed, not a race."""
    fleet = with_engine_logprobs(FakeFleet(tmp_path, async_config({"type": "pcl", "tau": 0.5, "k": 2}, steps=3)))
    events: list[str] = []
    score, train = fleet.scorer.score, fleet.scorer.train
    fleet.scorer.score = lambda tokens: (events.append("score"), score(tokens))[1]
    fleet.scorer.train = lambda tokens, rates: (events.append("train"), train(tokens, rates))[1]
    fleet.run.run()
    # step 0: its own batch scored, then step 1's, then V trains on step 0; step 1: step 2's scored, V trains
    assert events == ["score", "score", "train", "score", "train", "train"]


def test_a_run_resumed_from_a_checkpoint_trains_on_the_batches_generated_ahead(tmp_path):
    cfg = async_config({"type": "pcl", "tau": 0.5, "k": 2}, steps=6, checkpoint={"every": 3, "keep": 2})
    straight = with_engine_logprobs(FakeFleet(tmp_path / "straight", cfg))
    straight.run.run()
    checkpoint = tmp_path / "straight" / "checkpoints" / "step-000003"
    held = json.loads((checkpoint / "state.json").read_text())["ahead"]
    assert [b["step"] for b in held] == [3] and held[0]["version"] == 2  # step 4's batch, generated by version 2

    resumed = with_engine_logprobs(FakeFleet(tmp_path / "resumed", cfg))
    resumed.run.restore(str(checkpoint))
    resumed.run.run()
    assert [c["step"] for c in resumed.rollouts.calls if c["tag"] == ""] == [4, 5]  # step 4's is not generated again
    assert [untimed(r) for r in steps_of(tmp_path / "resumed")] == [untimed(r) for r in steps_of(tmp_path / "straight")[3:]]
    selections = [read_metrics(tmp_path / name / "selections.jsonl") for name in ("resumed", "straight")]
    assert selections[0] == selections[1][3:]


def test_synchronous_steps_record_staleness_zero_and_no_waits(tmp_path):
    fleet = FakeFleet(tmp_path, config({"type": "uniform"}))
    record = fleet.loop.train_step(0).to_dict()
    assert record["batch_staleness"] == 0 and "learner_wait_seconds" not in record
    assert fleet.loop.last_versions == [[0] * 4] * 4


def test_a_synchronous_run_refuses_a_checkpoint_holding_batches_generated_ahead(tmp_path):
    a = with_engine_logprobs(FakeFleet(tmp_path / "a", async_config({"type": "uniform"}, steps=2)))
    a.loop.train_step(0)
    a.loop.state.step = 1
    state = json.loads(json.dumps(a.loop.state_dict()))
    b = FakeFleet(tmp_path / "b", config({"type": "uniform"}, learner=TRUNCATED))
    with pytest.raises(ValueError, match="run.max_staleness"):
        b.loop.load_state_dict(state)


@pytest.mark.parametrize("overrides, message", [
    (["selection.type=speed", "learner.off_policy.correction=truncated"], "several rounds within a step"),
    (["selection.type=dynamic_sampling", "learner.off_policy.correction=truncated"], "several rounds"),
    ([], "learner.off_policy.correction = 'truncated'"),
    (["run.max_staleness=5", "learner.off_policy.correction=truncated"], "must be <= 4"),
])
def test_what_cannot_run_ahead_is_refused_before_the_run_naming_the_setting(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(["configs/tiny-carry.yaml"], ["run.max_staleness=1", *overrides])
