"""`pcl plot` / `pcl summary --plot` and `pcl summary`'s report, on run directories written here: the PNG holds
one panel per curve with every run overlaid; the report names each run's figures, step time split and files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pcl.loop.runlog import summary_report
from entrypoints.cli import main
from entrypoints.run_plot import PANELS, _reliability_points, plot_runs
from pcl.loop.runlog import read_records


def write_run(run_dir: Path, ratio: float, with_value: bool) -> Path:
    run_dir.mkdir(parents=True)
    rows = [{"step": 0, "eval_accuracy": 0.3}]
    for s in range(1, 21):
        rows.append({"step": s, "effective_ratio": ratio, "train_reward_mean": 0.4 + s / 100,
                     "generation_seconds": 0.5, "selection_seconds": 0.1, "train_seconds": 0.3,
                     "weight_sync_seconds": 0.1, "step_seconds": 1.0,
                     "value_explained_variance": 0.4 if with_value else None,
                     **({"eval_accuracy": 0.3 + s / 100} if s % 10 == 0 else {}),
                     **(CURRICULUM if with_value else {})})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


CURRICULUM = {"uniform_effective_ratio": 0.35, "expected_effective_ratio": 0.9, "curriculum_gain": 0.3,
              "probe_calibration_error": 0.1, "trained_calibration_error": 0.2, "selected_band_width": 0.1, "tau": 0.5,
              "pool_histogram": {"0-0.5": 6, "0.5-1": 2}, "trained_reliability_count": {"0.4-0.5": 4},
              "trained_reliability_predicted": {"0.4-0.5": 0.45}, "trained_reliability_realized": {"0.4-0.5": 0.3}}


def test_plot_overlays_runs_in_one_png(tmp_path):
    import matplotlib.image

    a = write_run(tmp_path / "pcl", 0.8, True)
    b = write_run(tmp_path / "uniform", 0.6, False)
    out = plot_runs([a, b], tmp_path / "out" / "curves.png", labels="PCL,uniform GRPO")
    image = matplotlib.image.imread(out)
    assert image.shape[0] >= 1000 and image.shape[1] >= 1800  # a 3 x 4 grid of panels
    assert len(PANELS) == 8  # against the step; V's reliability and the pool besides
    assert plot_runs([a]) == a / "curves.png" and (a / "curves.png").is_file()
    with pytest.raises(ValueError, match="2 labels for 1 runs"):
        plot_runs([a], labels=["x", "y"])
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
        plot_runs([tmp_path / "nowhere"])


def test_the_reliability_diagram_reads_the_run_directorys_tables_else_the_last_record(tmp_path):
    run = write_run(tmp_path / "pcl", 0.8, True)
    records = read_records(run / "metrics.jsonl")
    assert _reliability_points(run, records, "trained") == [(0.45, 0.3, 4)]  # the last record's table
    assert _reliability_points(run, records, "probe") == []
    rows = [{"bin": "0-0.5", "predicted": 0.2, "realized": 0.1, "count": 3},
            {"bin": "0.5-1", "predicted": None, "realized": None, "count": 0}]
    (run / "calibration.json").write_text(json.dumps({"probe": {"all": rows}, "trained": {"all": rows}}))
    assert _reliability_points(run, records, "probe") == [(0.2, 0.1, 3)]  # the window's, empty bins left out


def test_summary_report_and_the_cli(tmp_path, capsys):
    a = write_run(tmp_path / "pcl", 0.8, True)
    b = write_run(tmp_path / "uniform", 0.6, False)
    text = summary_report([a, b])
    assert "held-out accuracy 0.300 -> 0.500 (best 0.500), +20.0 points" in text
    assert "1.00 s/step: selection 0.10s (10%), generation 0.50s (50%), train 0.30s (30%), weight_sync 0.10s (10%)" \
        in text
    assert f"metrics {a / 'metrics.jsonl'}; checkpoint none" in text
    assert main(["summary", str(a), str(b), "--plot", str(tmp_path / "both.png")]) == 0
    assert (tmp_path / "both.png").is_file() and "effective_ratio_mean" in capsys.readouterr().out
    assert main(["plot", str(a), str(tmp_path / "nowhere")]) == 2
    assert "nowhere: no metrics.jsonl here" in capsys.readouterr().err
