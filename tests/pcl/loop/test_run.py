"""The schedule around the steps on in-memory fakes: pauses, tau / k changes between steps, the two clocks,
evaluations, and continuing from a state dict or a checkpoint."""

from __future__ import annotations

import json
import shutil

import pytest

from pcl.loop.runlog import read_metrics
from tests.pcl.loop.fakes import SECONDS_PER_SAMPLE, FakeFleet, closest_to, config, world

PCL = {"type": "pcl", "tau": 0.5, "k": 2}


def steps_of(run_dir) -> list[dict]:
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if "step_seconds" in r]


def test_a_pause_counts_on_neither_clock_and_a_checkpoint_asked_for_during_it_is_written(tmp_path):
    plan = {1: {"pause": 100.0, "checkpoint_in_pause": "req-1"}}
    fleet = FakeFleet(tmp_path, config(PCL), plan)
    summary = fleet.run.run()

    records = steps_of(tmp_path)
    assert [r["step"] for r in records] == [1, 2, 3] and summary["steps"] == 3
    step_time = sum(r["step_seconds"] for r in records)
    assert records[-1]["elapsed_seconds"] == pytest.approx(step_time) and summary["seconds"] < 100
    [(request, path)] = fleet.control.done
    assert request == "req-1" and path.endswith("step-000001")
    state = json.loads((tmp_path / "checkpoints" / "step-000001" / "state.json").read_text())
    assert state["step"] == 1 and state["elapsed_seconds"] == pytest.approx(records[0]["elapsed_seconds"])


def test_tau_and_k_changed_between_steps_take_effect_at_the_next_step(tmp_path):
    fleet = FakeFleet(tmp_path, config(PCL), plan={1: {"tau": 0.25, "k": 3}})
    fleet.run.run()
    first, second, third = steps_of(tmp_path)
    assert (first["tau"], first["k"]) == (0.5, 2.0) and (second["tau"], second["k"]) == (0.25, 3.0) == (
        third["tau"], third["k"])
    assert [len(d) for d in fleet.prompts.drawn] == [8, 12, 12]  # k*m candidates, m = 4
    selections = read_metrics(tmp_path / "selections.jsonl")
    assert closest_to(0.5, selections[0]["ids"], fleet.prompts.drawn[0], fleet.rates)
    assert closest_to(0.25, selections[1]["ids"], fleet.prompts.drawn[1], fleet.rates)


def test_a_loop_restored_from_another_loops_state_dict_continues_identically(tmp_path):
    a = FakeFleet(tmp_path / "a", config({**PCL, "pipelined": True}))
    for step in range(2):
        a.loop.train_step(step)
        a.loop.state.step = step + 1
    b = FakeFleet(tmp_path / "b", config({**PCL, "pipelined": True}))
    b.learner.steps, b.scorer.steps = a.learner.steps, a.scorer.steps  # their files come with a checkpoint
    b.loop.load_state_dict(json.loads(json.dumps(a.loop.state_dict())))  # through JSON, as in state.json
    assert b.learner.synced == [2]  # the fleet serves the restored policy version

    after_a, after_b = a.loop.train_step(2), b.loop.train_step(2)
    assert after_a == after_b and a.loop.last_ids == b.loop.last_ids
    assert a.prompts.cursor == b.prompts.cursor and a.loop.state_dict() == b.loop.state_dict()


def test_a_run_restored_from_a_checkpoint_writes_the_same_records_as_one_that_went_on(tmp_path):
    cfg = config({"type": "speed", "k": 2, "n_init": 2}, run={"steps": 4}, checkpoint={"every": 2, "keep": 2})
    straight = FakeFleet(tmp_path / "straight", cfg)
    straight.run.run()
    resumed = FakeFleet(tmp_path / "resumed", cfg)
    resumed.run.restore(str(tmp_path / "straight" / "checkpoints" / "step-000002"))
    assert resumed.learner.steps == 2 and resumed.loop.policy_version == 2
    resumed.run.run()

    expected = steps_of(tmp_path / "straight")[2:]
    assert steps_of(tmp_path / "resumed") == expected  # clocks included: both carried in the state


def test_training_time_excludes_evaluations_and_checkpoints(tmp_path):
    cfg = config({"type": "uniform"}, run={"steps": 2, "eval_every": 1, "eval_samples": 2},
                 checkpoint={"every": 1, "keep": 1})
    fleet = FakeFleet(tmp_path, cfg, held_out=5)
    fleet.run.run()

    records = read_metrics(tmp_path / "metrics.jsonl")
    assert records[0]["step"] == 0 and "eval_accuracy" in records[0]  # before the first step
    steps = records[1:]
    evaluation = 5 * 2 * SECONDS_PER_SAMPLE  # each evaluation: 5 prompts x 2 samples
    for i, r in enumerate(steps, start=1):
        trained = sum(s["step_seconds"] for s in steps[:i])
        assert r["train_elapsed_seconds"] == pytest.approx(trained)
        assert r["elapsed_seconds"] == pytest.approx(trained + (i + 1) * evaluation)  # step 0's included
    state = json.loads((tmp_path / "checkpoints" / "step-000002" / "state.json").read_text())
    assert state["train_elapsed_seconds"] == pytest.approx(steps[-1]["train_elapsed_seconds"])


def test_a_checkpoint_without_the_training_clock_continues_it_from_the_wall_clock(tmp_path):
    from pcl.loop.state import RunClock
    from tests.pcl.loop.fakes import FakeClock

    clock = RunClock(FakeClock())
    clock.load_state_dict({"elapsed_seconds": 12.5})
    clock.start()
    clock.clock.advance(1.0)
    assert clock.elapsed() == pytest.approx(13.5) and clock.train_elapsed() == pytest.approx(13.5)


def test_the_time_budget_stops_the_run_at_a_step_boundary(tmp_path):
    cfg = config({"type": "uniform"}, run={"steps": 10, "time_budget_s": 0.25})
    fleet = FakeFleet(tmp_path, cfg)
    summary = fleet.run.run()  # each step generates 16 samples: 0.16 s on the fake clock
    assert summary["steps"] == 2 and summary["steps_this_run"] == 2 and fleet.control.finished == 2
    assert (tmp_path / "checkpoints" / "step-000002").is_dir()  # the end of a run is checkpointed


def test_the_training_budget_excludes_evaluations_and_evaluations_can_be_spaced_in_training_seconds(tmp_path):
    cfg = config({"type": "uniform"}, run={"steps": 10, "eval_every": 0, "eval_every_s": 0.3,
                                           "train_budget_s": 0.5, "eval_samples": 2})
    fleet = FakeFleet(tmp_path, cfg, held_out=20)  # an evaluation (0.4 s) takes longer than a step (0.16 s)
    summary = fleet.run.run()
    records = read_metrics(tmp_path / "metrics.jsonl")
    evaluated = [(r["step"], r.get("train_elapsed_seconds")) for r in records if "eval_accuracy" in r]
    # steps end at 0.16, 0.32, 0.48, 0.64 s of training: evaluated at step 0, after crossing 0.3 s, and at the
    # step that spends the budget; evaluations do not count against it
    assert [step for step, _ in evaluated] == [0, 2, 4]
    assert evaluated[-1][1] == pytest.approx(0.64)
    assert summary["steps"] == 4 and summary["train_seconds"] == pytest.approx(0.64)
    assert summary["seconds"] == pytest.approx(0.64 + 3 * 20 * 2 * SECONDS_PER_SAMPLE)


def test_the_suite_is_evaluated_on_schedule_and_the_best_checkpoint_is_kept(tmp_path):
    cfg = config({"type": "uniform"}, run={"steps": 3},
                 evaluation={"suite": ["math500"], "every": 2, "best_by": "math500", "keep_best": True},
                 checkpoint={"every": 0, "keep": 1})
    records, _ = world()
    fleet = FakeFleet(tmp_path, cfg, suite={"math500": records[:6]})
    fleet.run.run()

    steps = steps_of(tmp_path)
    assert ["suite_math500" in r for r in steps] == [False, True, True]  # every 2 steps and at the end
    suite_calls = [c for c in fleet.rollouts.calls if c["tag"] == "suite"]
    assert len(suite_calls) == 2 and all({s.temperature for s in c["sampling"]} == {0.6} for c in suite_calls)
    best = json.loads((tmp_path / "best.json").read_text())
    assert best["best_by"] == "math500" and (tmp_path / "checkpoints" / f"step-{best['step']:06d}").is_dir()
    assert (tmp_path / "checkpoints" / "step-000003").is_dir()  # the last one, beside the best despite keep=1
    suite_seconds = sum(c["samples"] for c in suite_calls) * SECONDS_PER_SAMPLE
    assert steps[-1]["elapsed_seconds"] - steps[-1]["train_elapsed_seconds"] == pytest.approx(suite_seconds)


def test_a_run_restored_from_a_checkpoint_at_step_0_does_not_evaluate_step_0_again(tmp_path):
    """A checkpoint asked for before step 1 is written after the step-0 evaluation: the restored run keeps that
    evaluation's line and goes on from there, writing what the run that went on wrote (pcl chaos, seeds 2 and 7:
    the evaluation was taken again, written twice, and the deterministic run's weights differed)."""
    cfg = config(PCL, run={"steps": 3, "eval_every": 1})
    straight = FakeFleet(tmp_path / "straight", cfg, plan={0: {"checkpoint": "req-0"}}, held_out=8)
    straight.run.run()
    checkpoint = tmp_path / "straight" / "checkpoints" / "step-000000"
    assert checkpoint.is_dir()
    resumed = FakeFleet(tmp_path / "resumed", cfg, held_out=8)
    (tmp_path / "resumed").mkdir(parents=True, exist_ok=True)
    shutil.copy(tmp_path / "straight" / "metrics.jsonl", tmp_path / "resumed" / "metrics.jsonl")
    resumed.run.restore(str(checkpoint))
    calls = len(resumed.rollouts.calls)
    resumed.run.run()
    lines = read_metrics(tmp_path / "resumed" / "metrics.jsonl")
    assert [r["step"] for r in lines] == [0, 1, 2, 3]  # one step-0 evaluation
    assert resumed.rollouts.calls[calls]["tag"] == ""  # the first generation is step 1's batch, not an evaluation
    assert steps_of(tmp_path / "resumed") == steps_of(tmp_path / "straight")
