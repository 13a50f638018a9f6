"""The `pcl` console script: instant help, config errors as clean messages with a non-zero exit."""

import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PCL = [sys.executable, "-m", "entrypoints.cli"]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*PCL, *args], cwd=REPO, capture_output=True, text=True, timeout=60)


def test_help_is_fast():
    run("--help")  # warm the file cache
    start = time.perf_counter()
    out = run("--help")
    elapsed = time.perf_counter() - start
    assert out.returncode == 0 and "train" in out.stdout and "make-tiny" in out.stdout
    assert elapsed < 1.0, f"pcl --help took {elapsed:.2f}s"


def test_train_with_bad_config_fails_cleanly(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("selection: {type: pcl, tau: 2}\n")
    out = run("train", str(bad))
    assert out.returncode == 2
    assert "selection.tau" in out.stderr and "Traceback" not in out.stderr


def test_config_command_prints_resolved_yaml():
    out = run("config", "configs/tiny.yaml", "selection.tau=0.25")
    assert out.returncode == 0, out.stderr
    assert "tau: 0.25" in out.stdout


def test_eval_takes_the_config_and_overrides_and_its_help_names_the_keys():
    out = run("eval", "--help")
    assert out.returncode == 0, out.stderr
    assert "[CONFIG|key=value ...]" in out.stdout and "--out" in out.stdout
    for key in ("model.path", "evaluation.suite", "evaluation.k", "evaluation.temperature", "rollout.engine"):
        assert key in out.stdout, key
    assert "--temperature" not in out.stdout and "--model" not in out.stdout  # no flag repeats a config default
