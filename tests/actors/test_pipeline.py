"""End to end on real parts: local Ray actors, an embedded Redis server, a 2-rank FSDP2 learner on gloo,
the HF engine and math-verify, on an untrained tiny-task policy (fast; the learning run is a slow test)."""

from __future__ import annotations

import json

import pytest

from pcl.config import load_config
from pcl.loop.runlog import STEP_KEYS, read_metrics

pytestmark = [pytest.mark.ray, pytest.mark.redis]



def test_pcl_trains_end_to_end_and_records_every_step(untrained_tiny, ray_session, tmp_path, capsys):
    """Three PCL steps with held-out accuracy every 2 steps and, through the same fleet, the paper's benchmark suite
    (the real MATH500 / AIME24 files, the first 3 prompts, avg@k) every 2 steps and at the end, the best suite
    average checkpointed and kept beyond checkpoint.keep=1."""
    from pathlib import Path

    from entrypoints.train import run_training

    math = Path(__file__).resolve().parents[3] / "shared" / "data" / "math"
    model = str(untrained_tiny)
    cfg = load_config("configs/tiny.yaml", [
        f"model.path={model}", f"value.path={model}", "run.steps=3", "run.m=8", "run.n=4", "run.eval_every=2",
        "data.eval_size=16", "data.tiny_size=256", "selection.k=2", "value.ev_sample=4", "learner.num_ranks=2",
        "run.time_budget_s=null", "control.port=0", "data.max_prompt_tokens=1024", f"data.root={math}",
        "evaluation.suite=[math500,aime24]", "evaluation.every=2", "evaluation.limit=3", "evaluation.k={aime24: 4}",
        "evaluation.max_new_tokens=8", "checkpoint.keep=1", "evaluation.best_by=math500", "evaluation.top_k=-1"])
    assert run_training(cfg, run_dir=str(tmp_path / "run")) == 0
    assert_suite_evaluated_and_best_kept(tmp_path / "run", [2, 3], last=3)

    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert records[0]["eval_accuracy"] is not None  # held-out accuracy at step 0
    assert records[0]["eval_accuracy_se"] >= 0  # and its standard error (4 samples a prompt)
    steps = records[1:]
    for r in steps:
        assert set(STEP_KEYS) <= r.keys(), set(STEP_KEYS) - r.keys()
        assert 0.0 <= r["effective_ratio"] <= 1.0 and r["step_seconds"] > 0 and r["generation_seconds"] > 0
        assert r["dropped_stale_version"] == 0 and r["dead_letters"] == 0
    assert [r["policy_version"] for r in steps] == [1, 2, 3]  # one optimizer step and one weight sync per step
    # the training clock leaves out the evaluations (step 0's included); V's probe is counted apart
    assert 0 < steps[-1]["train_elapsed_seconds"] < steps[-1]["elapsed_seconds"]
    assert all(r["probe_samples"] % 4 == 0 and r["samples_generated"] == 8 * 4 for r in steps)
    assert "eval_accuracy" in steps[1] and "eval_accuracy" in steps[2]  # every 2 steps and at the end
    assert 0.0 <= steps[0]["selected_value_mean"] <= 1.0
    # whether the curriculum pays: V one version behind once trained, k*m candidates in the pool, the probe's
    # figures from step 1 on (value.ev_every 4), the reliability tables in the run directory
    assert [r.get("value_lag") for r in steps] == [None, 1, 1]
    assert all(sum(r["pool_histogram"].values()) == 2 * 8 for r in steps)
    assert sum(steps[-1]["probe_reliability_count"].values()) == 4 and 0 <= steps[-1]["probe_brier"] <= 1
    assert steps[-1]["curriculum_gain"] == pytest.approx(
        sum(r["effective_ratio"] for r in steps) / 3 - steps[-1]["uniform_effective_ratio"])
    assert json.loads((tmp_path / "run" / "calibration.json").read_text())["steps"] == [1, 2, 3]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 3
    out = capsys.readouterr().out
    assert "step    3/3" in out and "pcl: done" in out and "suite" in out


@pytest.mark.slow  # the default suite: the correction on 2 learner ranks (tests/pcl/test_learner.py) and in the loop
def test_the_off_policy_correction_trains_end_to_end_and_reports_its_ratios(tiny_model, ray_session, tmp_path):
    """learner.off_policy.correction = truncated on real parts: the HF engine's sampled-token log-probabilities reach
    the learner rank, and with the fleet serving the learner's own float32 weights every ratio is 1 up to the two
    forward passes' numerics."""
    from entrypoints.train import run_training

    cfg = load_config("configs/tiny.yaml", [
        f"model.path={tiny_model}", "selection.type=uniform", "run.steps=2", "run.m=8", "run.n=4",
        "run.eval_every=0", "data.tiny_size=256", "learner.num_ranks=1", "run.time_budget_s=null", "control.port=0",
        "learner.off_policy.correction=truncated"])
    assert run_training(cfg, run_dir=str(tmp_path / "run")) == 0
    steps = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "step_seconds" in r]
    assert [r["step"] for r in steps] == [1, 2]
    trained = [r for r in steps if r["train_sequences"] > 0]
    assert trained, [r["effective_ratio"] for r in steps]
    for r in trained:
        assert r["importance_ratio_mean"] == pytest.approx(1.0, abs=1e-3)
        assert r["importance_ratio_max"] == pytest.approx(1.0, abs=1e-2)
        assert r["importance_ratio_clipped_share"] == 0.0


def test_existing_run_dir_is_not_overwritten(untrained_tiny, tmp_path):
    from pcl.config import ConfigError
    from entrypoints.train import run_training

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 0}\n')
    cfg = load_config("configs/tiny.yaml", [f"model.path={untrained_tiny}"])
    with pytest.raises(ConfigError, match="already holds a run"):
        run_training(cfg, run_dir=str(run))
    assert (run / "metrics.jsonl").read_text() == '{"step": 0}\n'


def test_missing_model_path_is_a_clear_error(tmp_path):
    from pcl.config import ConfigError
    from entrypoints.train import run_training

    cfg = load_config("configs/tiny.yaml", [f"model.path={tmp_path / 'nope'}"])
    with pytest.raises(ConfigError, match="no such model directory"):
        run_training(cfg, run_dir=str(tmp_path / "run"))


def assert_suite_evaluated_and_best_kept(run_dir, steps: list[int], last: int) -> None:
    """The suite's figures at `steps`, best.json naming the best math500 score, its checkpoint and the last kept."""
    records = read_metrics(run_dir / "metrics.jsonl")
    evaluated = [r for r in records if "suite_average" in r]
    assert [r["step"] for r in evaluated] == steps
    for r in evaluated:
        assert 0.0 <= r["suite_math500"] <= 1.0 and 0.0 <= r["suite_aime24"] <= 1.0
        assert r["suite_average"] == (r["suite_math500"] + r["suite_aime24"]) / 2
    best = json.loads((run_dir / "best.json").read_text())
    first_best = max(evaluated, key=lambda r: (r["suite_math500"], -r["step"]))  # the first of the best scores
    assert best["step"] == first_best["step"]
    assert (best["best_by"], best["score"], best["average"]) == ("math500", first_best["suite_math500"],
                                                                 first_best["suite_average"])
    kept = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert f"step-{best['step']:06d}" in kept and f"step-{last:06d}" in kept  # the best survives keep=1
