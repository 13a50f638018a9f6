"""`pcl experiment`: the config, the figures of the report from hand-made records, and a two-arm, two-step
comparison on real parts (Ray, embedded Redis, the HF engine, math-verify, the warm-started tiny model)."""

from __future__ import annotations

import json

import pytest
import yaml

from pcl.config import ConfigError
from entrypoints.experiment import ExperimentConfig, load_experiment
from entrypoints.experiment_report import arm_figures, run_figures, training_seconds


def records(accuracies: list[tuple[float, float]], ratios: list[float]) -> list[dict]:
    """A metrics.jsonl: step-0 evaluation, then one record per step, evaluations at the given elapsed seconds."""
    out = [{"step": 0, "eval_accuracy": accuracies[0][1]}]
    for i, ratio in enumerate(ratios, start=1):
        out.append({"step": i, "effective_ratio": ratio, "generation_seconds": 1.0 * i, "selection_seconds": 0.1,
                    "samples_generated": 32, "elapsed_seconds": 10.0 * i, "step_seconds": 9.0 + i})
    for elapsed, accuracy in accuracies[1:]:
        out[int(elapsed // 10)]["eval_accuracy"] = accuracy
    return out


def test_run_and_arm_figures():
    a = run_figures(records([(0, 0.40), (10, 0.45), (20, 0.52), (30, 0.50)], [0.5, 0.7, 0.9]), target=0.5)
    assert a == {"steps": 3, "accuracy_start": 0.40, "accuracy_best": 0.52, "gain_best": pytest.approx(12.0),
                 "time_to_target": 20.0,
                 "effective_ratio": pytest.approx(0.7), "generation_seconds": 2.0, "selection_seconds": pytest.approx(0.1),
                 "samples_per_step": 32, "steps_per_second": pytest.approx(0.1), "step_seconds_median": 12.0,
                 "value_explained_variance": None, "batch_staleness": None, "learner_wait_seconds": None,
                 "fleet_wait_seconds": None}
    b = run_figures(records([(0, 0.40), (10, 0.44)], [0.3]), target=0.5)
    assert b["time_to_target"] is None and b["accuracy_best"] == 0.44
    gained = run_figures(records([(0, 0.40), (10, 0.45), (20, 0.52)], [0.5, 0.7]), target=0.05, gain=True)
    assert gained["time_to_target"] == 10.0  # 0.45 >= 0.40 + 0.05
    both = arm_figures([a, b])
    assert both["reached"] == "1/2" and both["time_to_target"] == 20.0  # over the seeds that reached it
    assert both["accuracy_best"] == pytest.approx(0.48) and both["steps"] == 2
    assert both["gain_best"] == pytest.approx(8.0) and both["gain_best_se"] == pytest.approx(4.0)  # 12 and 4 points


def test_time_to_target_is_training_time_when_the_records_have_it():
    """train_elapsed_seconds leaves evaluations and checkpoint writes out; older records have only the wall clock."""
    timed = records([(0, 0.40), (10, 0.45), (20, 0.52)], [0.5, 0.7])
    for r in timed[1:]:
        r["train_elapsed_seconds"] = r["elapsed_seconds"] - 3.0 * r["step"]  # 3 s of evaluation a step
    assert run_figures(timed, target=0.5)["time_to_target"] == 14.0  # wall clock 20.0
    assert run_figures(records([(0, 0.40), (10, 0.52)], [0.5]), target=0.5)["time_to_target"] == 10.0
    assert training_seconds({"step": 0, "eval_accuracy": 0.4}) == 0.0


def test_the_progress_line_counts_the_finished_runs(tmp_path):
    from entrypoints.experiment import finished_runs

    exp = ExperimentConfig(name="x", base="configs/tiny.yaml", budget_s=10, seeds=[0, 1], target_gain=0.05,
                           runs_dir=str(tmp_path), strategies={"a": ["selection.type=uniform"],
                                                               "b": ["selection.type=pcl"]})
    assert finished_runs(exp) == 0
    for name in ("a-seed0", "b-seed1"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text("{}")
    (tmp_path / "a-seed1").mkdir()  # started, not finished
    assert finished_runs(exp) == 2


def test_an_arm_without_a_strategy_is_an_error(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump({"name": "x", "base": "configs/tiny.yaml", "budget_s": 10, "seeds": [0],
                                    "target_accuracy": 0.5, "strategies": {"a": ["run.m=8"]}}))
    with pytest.raises(ConfigError, match="arm 'a' must set selection.type"):
        load_experiment(path)
    path.write_text(yaml.safe_dump({"name": "x", "base": "configs/tiny.yaml", "budget_s": 10, "seeds": [0],
                                    "target_accuracy": 0.5, "target_gain": 0.1,
                                    "strategies": {"a": ["selection.type=uniform"]}}))
    with pytest.raises(ConfigError, match="exactly one of target_accuracy and target_gain"):
        load_experiment(path)
    with pytest.raises(ConfigError, match="does not exist"):
        load_experiment(tmp_path / "absent.yaml")


@pytest.mark.ray
@pytest.mark.redis
@pytest.mark.slow
def test_two_arms_run_and_the_report_has_its_table_and_plots(tiny_model, ray_session, tmp_path, capsys):
    from entrypoints.cli import main

    exp = {
        "name": "mini", "base": "configs/tiny.yaml", "budget_s": 300, "seeds": [0], "target_accuracy": 0.3,
        "reference_n_pre": 2, "runs_dir": str(tmp_path / "runs"), "output": str(tmp_path / "docs" / "mini.md"),
        "overrides": ["run.steps=2", "run.m=8", "run.n=4", "run.eval_every=1", "data.tiny_size=256",
                      "data.eval_size=16", "value.ev_sample=4", "learner.num_ranks=1", "control.enabled=false"],
        "strategies": {"uniform": ["selection.type=uniform"], "pcl": ["selection.type=pcl", "selection.k=2"]},
    }
    path = tmp_path / "mini.yaml"
    path.write_text(yaml.safe_dump(exp))
    assert main(["experiment", str(path)]) == 0

    report = (tmp_path / "docs" / "mini.md").read_text()
    rows = [line for line in report.splitlines() if line.startswith("| uniform |") or line.startswith("| pcl |")]
    header = next(line for line in report.splitlines() if line.startswith("| strategy |"))
    assert len(header.split("|")) == 15  # 13 columns: the best gain in points and steps per second among them
    assert len(rows) == 2 and all(len(row.split("|")) == 15 for row in rows)
    for stem in ("accuracy-vs-time", "effective-ratio", "value-ev", "reference-difficulty"):
        png = tmp_path / "docs" / "mini" / f"{stem}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"(mini/{stem}.png)" in report
    for arm in ("uniform", "pcl"):  # every run got the seed's reference rates and reports its selected difficulty
        steps = [json.loads(line) for line in (tmp_path / "runs" / f"{arm}-seed0" / "metrics.jsonl").open()][1:]
        assert len(steps) == 2 and all(0 <= r["selected_reference_pass_rate_mean"] <= 1 for r in steps)
    assert "Reference pass rates (initial policy, 2 rollouts of each of 256" in report

    capsys.readouterr()
    assert main(["experiment", str(path)]) == 0  # repeated: finished runs are kept, the report rebuilt
    assert capsys.readouterr().out.count("is finished; kept") == 2


def test_set_replaces_top_level_fields_for_a_short_try_of_a_shipped_experiment(tmp_path):
    shipped = load_experiment("configs/experiments/tiny-curriculum.yaml")
    short = load_experiment("configs/experiments/tiny-curriculum.yaml",
                            ["budget_s=20", "seeds=[0]", f"runs_dir={tmp_path}/runs", f"output={tmp_path}/x.md"])
    assert (short.budget_s, short.seeds, short.runs_path, short.output_path) == (
        20.0, [0], tmp_path / "runs", tmp_path / "x.md")
    assert short.strategies == shipped.strategies and shipped.seeds == [0, 1, 2]
    with pytest.raises(ConfigError, match="budget_s"):
        load_experiment("configs/experiments/tiny-curriculum.yaml", ["budget_s=-1"])
    with pytest.raises(ConfigError, match="expected FIELD=VALUE"):
        load_experiment("configs/experiments/tiny-curriculum.yaml", ["budget_s"])
    with pytest.raises(ConfigError, match="Extra inputs are not permitted"):
        load_experiment("configs/experiments/tiny-curriculum.yaml", ["budget=20"])
