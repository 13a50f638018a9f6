"""The tiny tasks learn (`make test-slow`): `configs/tiny-carry.yaml` as `make demo` runs it meets the demo's
bar (about 10 minutes on 2 cores, plus the task's build when it is not cached), and on the arithmetic task
(`configs/tiny.yaml`) PCL keeps more signal than uniform GRPO on the same seed (about 10 minutes for both)."""

from __future__ import annotations

import pytest

from pcl.config import load_config
from pcl.loop.runlog import read_metrics, summarize

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.redis]


def run(tmp_path, name: str, overrides: list[str], config: str = "configs/tiny.yaml") -> dict:
    from entrypoints.train import run_training

    cfg = load_config(config, ["control.enabled=false", *overrides])
    run_dir = tmp_path / name
    assert run_training(cfg, run_dir=str(run_dir)) == 0
    return summarize(read_metrics(run_dir / "metrics.jsonl"))


@pytest.mark.timeout(1500)  # two runs of up to run.time_budget_s (540 s) each, plus start-up
def test_tiny_default_learns_and_pcl_keeps_more_signal_than_grpo(tiny_model, ray_session, tmp_path):
    pcl = run(tmp_path, "pcl", [])
    uniform = run(tmp_path, "uniform", ["selection.type=uniform"])
    print(f"\nPCL: {pcl}\nuniform: {uniform}")
    assert pcl["steps"] >= 200, "the default should reach 200 steps inside its time budget"
    assert pcl["eval_gain_points"] >= 10.0  # held-out accuracy up by at least 10 points over step 0
    assert pcl["value_explained_variance_late"] > 0.3
    assert pcl["effective_ratio_mean"] > uniform["effective_ratio_mean"]


@pytest.fixture(scope="module")
def tiny_carry_model() -> str:
    from pcl.tiny.build import build_tiny

    return str(build_tiny(seed=0, task="tiny-carry"))


def demo_train_seconds() -> str:
    """`make demo`'s training budget, read from the Makefile (DEMO_TRAIN_S), so the test runs what users run."""
    import re
    from pathlib import Path

    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    return re.search(r"^DEMO_TRAIN_S \?= (\d+)$", makefile, re.M).group(1)


@pytest.mark.timeout(1800)  # the shipped policy installs in seconds; then make demo's training budget
def test_the_demo_on_tiny_carry_gains_ten_points_within_its_budget(tiny_carry_model, ray_session, tmp_path):
    pcl = run(tmp_path, "demo", [f"run.train_budget_s={demo_train_seconds()}"], config="configs/tiny-carry.yaml")
    print(f"\ndemo: {pcl}")
    assert pcl["eval_gain_points"] >= 10.0
    assert pcl["value_explained_variance_late"] > 0.3
