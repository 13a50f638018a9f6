"""The disk a run writes (pcl/tools/disk.py), as `pcl plan` prints it and checks it against cluster.disk_gb: the
checkpoints kept (each the policy's Hugging Face copy and its float32 weights and AdamW moments, V's in float32,
and the step records to its step), the step records, the embedded Redis' append-only file; a config whose run would
need more than cluster.disk_gb is refused by `pcl plan` and `pcl train`, naming the checkpoint.keep that fits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pcl.config import ConfigError, load_config
from pcl.tools.disk import (AOF_REWRITE_MIN_BYTES, DRIVER_OUTPUT_BYTES_PER_STEP, GB, METRICS_BYTES_PER_STEP,
                            SELECTION_BYTES_PER_SAMPLE, disk_plan)
from pcl.tools.plan import plan_run
from pcl.tools.shapes import KNOWN_MODELS

REPO = Path(__file__).resolve().parents[2]
PRESET = REPO / "configs" / "presets" / "qwen3-8b-base-math.yaml"


def test_a_preset_writes_its_checkpoints_records_and_aof():
    cfg = load_config(PRESET)
    shape = KNOWN_MODELS["Qwen/Qwen3-8B-Base"]
    disk = disk_plan(cfg, shape, shape)
    params, value = shape.policy_params, shape.value_params
    one = params * (2 + 12) + value * (4 + 12)  # bfloat16 copy + learner.pt; V's float32 copy + trainer.pt
    records = (METRICS_BYTES_PER_STEP + SELECTION_BYTES_PER_SAMPLE * 512 * 16) * 300
    kept = 3 + 1 + 1  # checkpoint.keep, one being written, the best (MATH500 every 8 steps)
    assert disk.parts["checkpoints"] == pytest.approx(kept * (one + records))
    assert disk.parts["step records"] == pytest.approx(records + DRIVER_OUTPUT_BYTES_PER_STEP * 300)
    rollouts = 512 * 16 * (4 * 1024 + 12 * 3072)  # a step's samples at their longest
    assert disk.parts["Redis AOF"] == pytest.approx(2 * max(AOF_REWRITE_MIN_BYTES, rollouts + 1_600 * 300))
    assert 1_000 * GB < disk.total < 1_300 * GB  # 8B parameters x 30 bytes x 5 checkpoints: a terabyte and more


def test_what_the_run_does_not_write_is_not_counted():
    shape = KNOWN_MODELS["Qwen/Qwen3-4B-Base"]
    base = load_config(REPO / "configs" / "presets" / "qwen3-4b-base-math.yaml")
    uniform = load_config(REPO / "configs" / "presets" / "qwen3-4b-base-math.yaml", ["selection.type=uniform"])
    with_v, without_v = plan_run(base).disk, plan_run(uniform).disk
    kept = 3 + 1 + 1
    assert with_v.parts["checkpoints"] - without_v.parts["checkpoints"] == pytest.approx(
        kept * shape.value_params * 16)  # no V to checkpoint
    external = disk_plan(load_config(REPO / "configs" / "presets" / "qwen3-4b-base-math.yaml",
                                     ["redis.url=redis://redis.example:6379/0"]), shape, shape)
    assert "Redis AOF" not in external.parts  # the AOF is the external server's
    no_best = disk_plan(load_config(REPO / "configs" / "presets" / "qwen3-4b-base-math.yaml",
                                    ["evaluation.keep_best=false"]), shape, shape)
    assert no_best.parts["checkpoints"] == pytest.approx(with_v.parts["checkpoints"] * 4 / 5)


def test_a_run_over_its_disk_is_refused_naming_the_keep_that_fits():
    plan = plan_run(load_config(PRESET, ["cluster.disk_gb=1000"]))
    assert plan.shortfalls == [f"disk: the run writes up to {plan.disk.total / GB:.1f} GB, cluster.disk_gb is 1000 GB; "
                               "set checkpoint.keep <= 2, or raise cluster.disk_gb"]
    assert plan_run(load_config(PRESET, ["cluster.disk_gb=2000"])).shortfalls == []
    assert "cluster.disk_gb unset: not checked" in plan_run(load_config(PRESET)).table()
    with pytest.raises(ConfigError, match="cluster.disk_gb"):
        load_config(PRESET, ["cluster.disk_gb=0"])


def test_pcl_plan_and_pcl_train_refuse_a_run_over_its_disk():
    def pcl(*args):
        return subprocess.run([sys.executable, "-m", "entrypoints.cli", *args], cwd=REPO, capture_output=True,
                              text=True, timeout=120)

    plan = pcl("plan", str(PRESET), "--disk", "800")
    assert plan.returncode == 1
    assert "disk for 300 steps (the run directory)" in plan.stdout and "checkpoints" in plan.stdout
    assert "cluster.disk_gb is 800 GB; set checkpoint.keep <= 1, or raise cluster.disk_gb" in plan.stdout
    train = pcl("train", str(PRESET), "cluster.disk_gb=800")
    assert train.returncode == 2 and "cluster.disk_gb is 800 GB" in train.stderr


def test_the_bounds_counted_are_the_services_own():
    from pcl.tools.disk import HISTORY_CAP
    from services.control.state import HISTORY_MAXLEN
    from services.redis_server import AOF_REWRITE_MIN_MB, AOF_REWRITE_PERCENTAGE

    assert HISTORY_CAP == HISTORY_MAXLEN and AOF_REWRITE_MIN_BYTES == AOF_REWRITE_MIN_MB << 20
    assert AOF_REWRITE_PERCENTAGE == 100  # "twice": the AOF is rewritten once it has doubled
