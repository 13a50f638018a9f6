"""What a run prints about its plan and, at the end, what to try next (entrypoints/guide.py)."""

from __future__ import annotations

import shlex
from pathlib import Path

from entrypoints.guide import comparison_command, next_steps, training_plan
from pcl.config import load_config

CONFIG = str(Path(__file__).resolve().parents[2] / "configs" / "tiny-carry.yaml")


def test_the_plan_names_every_limit_and_the_evaluations():
    text = training_plan(load_config(CONFIG, overrides=["run.train_budget_s=270"]))
    assert "240 steps" in text and "270 s of training (run.train_budget_s)" in text and "540 s in all" in text
    assert "whichever comes first" in text and "every 20 steps" in text
    assert training_plan(load_config(CONFIG, overrides=["run.time_budget_s=null", "run.eval_every=0"])) == \
        "training: 240 steps"


def test_the_comparison_is_the_same_command_with_uniform_selection():
    argv = ["pcl", "train", "configs/tiny-carry.yaml", "--run-dir", "runs/demo", "run.train_budget_s=270",
            "selection.tau=0.4"]
    words = shlex.split(comparison_command(Path("runs/demo"), argv))
    assert words == ["pcl", "train", "configs/tiny-carry.yaml", "run.train_budget_s=270", "selection.tau=0.4",
                     "--run-dir", "runs/demo-uniform", "selection.type=uniform"]
    resumed = shlex.split(comparison_command(Path("r"), ["pcl", "train", "c.yaml", "--run-dir=r", "--resume",
                                                         "selection.type=pcl"]))
    assert resumed == ["pcl", "train", "c.yaml", "--run-dir", "r-uniform", "selection.type=uniform"]
    assert "CONFIG" in comparison_command(Path("r"), ["python", "-m", "x"])  # not from the command line


def test_next_steps_point_to_summary_plot_comparison_and_dashboard():
    text = next_steps(load_config(CONFIG), Path("runs/demo"), ["pcl", "train", "configs/tiny-carry.yaml"])
    for expected in ("pcl summary runs/demo", "pcl plot runs/demo", "selection.type=uniform",
                     "pcl summary runs/demo runs/demo-uniform", "http://127.0.0.1:8600/"):
        assert expected in text, expected
    uniform = next_steps(load_config(CONFIG, overrides=["selection.type=uniform", "control.enabled=false"]),
                         Path("u"), [])
    assert "selection.type=uniform" not in uniform and "http" not in uniform
