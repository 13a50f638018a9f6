"""The experiment report's curriculum section, from hand-made step records: the second-half means, the share of
steps stalled, the means over seeds, an arm without V, a report without the curriculum's figures left as it was."""

from __future__ import annotations

import json

import pytest

from entrypoints.experiment import ExperimentConfig
from entrypoints.experiment_curriculum import PLOT, arm_curriculum, curriculum_section, run_curriculum
from entrypoints.experiment_report import write_report


def pcl_records(ratios: list[float], uniform: float, stalled: list[int]) -> list[dict]:
    """A PCL run's metrics.jsonl: the step-0 evaluation, then one record per step with the curriculum's figures;
    each step's figures are derived from its ratio so that the expected means are easy to state."""
    out = [{"step": 0, "eval_accuracy": 0.4}]
    for i, (ratio, stall) in enumerate(zip(ratios, stalled), start=1):
        out.append({"step": i, "effective_ratio": ratio, "step_seconds": 2.0, "elapsed_seconds": 2.0 * i,
                    "train_elapsed_seconds": 2.0 * i, "uniform_effective_ratio": uniform,
                    "curriculum_gain": ratio - uniform, "expected_effective_ratio": ratio + 0.1,
                    "expectation_gap": 0.1, "probe_calibration_error": 0.05 * i, "trained_calibration_error": 0.2,
                    "probe_brier": 0.01, "trained_brier": 0.02, "selected_band_width": 0.3,
                    "curriculum_stalled": stall})
    out[-1]["eval_accuracy"] = 0.55
    return out


def uniform_records(ratios: list[float]) -> list[dict]:
    out = [{"step": 0, "eval_accuracy": 0.4}]
    out += [{"step": i, "effective_ratio": r, "step_seconds": 2.0, "train_elapsed_seconds": 2.0 * i}
            for i, r in enumerate(ratios, start=1)]
    return out


def test_a_run_s_figures_are_means_over_the_second_half_of_its_steps():
    f = run_curriculum(pcl_records([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], uniform=0.25, stalled=[0, 0, 0, 1, 2, 0]))
    assert f["effective_ratio"] == pytest.approx(0.5)  # steps 4-6
    assert f["uniform_effective_ratio"] == pytest.approx(0.25)
    assert f["curriculum_gain"] == pytest.approx(0.25)
    assert f["expected_effective_ratio"] == pytest.approx(0.6) and f["expectation_gap"] == pytest.approx(0.1)
    assert f["probe_calibration_error"] == pytest.approx(0.25)  # 0.05 x (4 + 5 + 6) / 3
    assert f["trained_calibration_error"] == pytest.approx(0.2) and f["selected_band_width"] == pytest.approx(0.3)
    assert f["stalled_share"] == pytest.approx(2 / 6)  # over every step, not the second half
    odd = run_curriculum(pcl_records([0.1, 0.2, 0.3, 0.4, 0.5], uniform=0.0, stalled=[0] * 5))
    assert odd["effective_ratio"] == pytest.approx(0.4)  # steps 3-5: the later half holds the middle step


def test_an_arm_averages_its_seeds_and_an_arm_without_v_has_its_realised_ratio_only():
    a = run_curriculum(pcl_records([0.2, 0.4], uniform=0.1, stalled=[0, 1]))
    b = run_curriculum(pcl_records([0.2, 0.6], uniform=0.3, stalled=[0, 0]))
    arm = arm_curriculum([a, b])
    assert arm["effective_ratio"] == pytest.approx(0.5) and arm["uniform_effective_ratio"] == pytest.approx(0.2)
    assert arm["curriculum_gain"] == pytest.approx(0.3) and arm["stalled_share"] == pytest.approx(0.25)
    uniform = arm_curriculum([run_curriculum(uniform_records([0.1, 0.3, 0.5]))])
    assert uniform["effective_ratio"] == pytest.approx(0.4)
    assert uniform["curriculum_gain"] is None and uniform["stalled_share"] is None


def test_the_section_is_written_only_where_a_run_carries_the_curriculum_s_figures(tmp_path):
    assert curriculum_section({"uniform": {0: uniform_records([0.2, 0.3])}}, tmp_path / "plots") == []
    assert not (tmp_path / "plots").exists()
    lines = curriculum_section({"pcl": {0: pcl_records([0.2, 0.4], uniform=0.1, stalled=[0, 1])},
                                "uniform": {0: uniform_records([0.2, 0.3])}}, tmp_path / "plots")
    text = "\n".join(lines)
    assert "| pcl | 0.400 | 0.100 | 0.500 | +0.300 | +0.100 | 0.100 | 0.200 | 0.010 | 0.020 | 0.300 | 50% |" in text
    assert "| uniform | 0.300 | - | - | - | - | - | - | - | - | - | - |" in text
    assert (tmp_path / "plots" / f"{PLOT}.png").stat().st_size > 0 and f"plots/{PLOT}.png" in text


def test_the_experiment_report_carries_the_section_for_pcl_runs_and_not_for_older_runs(tmp_path):
    exp = ExperimentConfig(name="cur", base="configs/tiny-carry.yaml", budget_s=10, seeds=[0, 1], target_gain=0.1,
                           runs_dir=str(tmp_path / "runs"), output=str(tmp_path / "report" / "cur.md"),
                           strategies={"pcl": ["selection.type=pcl"], "uniform": ["selection.type=uniform"]})
    for seed in exp.seeds:
        for arm, records in (("pcl", pcl_records([0.2, 0.4, 0.6], 0.2, [0, 0, 1])),
                             ("uniform", uniform_records([0.2, 0.3, 0.2]))):
            (exp.runs_path / f"{arm}-seed{seed}").mkdir(parents=True)
            (exp.runs_path / f"{arm}-seed{seed}" / "metrics.jsonl").write_text(
                "".join(json.dumps(r) + "\n" for r in records))
    text = write_report(exp).read_text()
    assert "## Curriculum" in text and f"cur/{PLOT}.png" in text
    assert (tmp_path / "report" / "cur" / f"{PLOT}.png").is_file()
    assert text.index("## Curriculum") < text.index("## Per run")
    for seed in exp.seeds:  # the same runs without the curriculum's figures (older runs, or no arm with V)
        (exp.runs_path / f"pcl-seed{seed}" / "metrics.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in uniform_records([0.2, 0.4, 0.6])))
    assert "## Curriculum" not in write_report(exp).read_text()
