"""bench/gpu_check.py runs its checks end to end on CPU (gloo, a tiny random Qwen3): the same code paths as the
GPU run, whose figures are in docs/results/gpu.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_smoke_run_on_cpu(tmp_path):
    out = tmp_path / "check.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--device", "cpu", "--small",
                           "--out", str(out), "--peak-tflops", "0.5"], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    learner = report["learner"]
    assert learner["backend"] == "gloo" and learner["grad_norm"] > 0
    assert report["peak_tflops"] == 0.5  # the MFU: 6 N FLOPs per trained token over the peak
    assert abs(learner["mfu"] - 6 * report["parameters"] * learner["tokens_per_second"] / 0.5e12) < 1e-12
    assert f"MFU {learner['mfu']:.1%} of 0.5 TFLOP/s" in proc.stdout
    assert report["engine"]["generated_tokens"] > 0 and report["engine"]["tokens_per_second"] > 0
    assert report["value"]["candidates"] == 16
    assert report["weight_sync"]["engine_version"] == 1 and report["weight_sync"]["tensors"] > 0
    assert proc.stdout.strip().splitlines()[-1].startswith("engine generated tokens per second:")


def test_the_peak_comes_from_the_device_name_unless_given():
    sys.path.insert(0, str(ROOT / "bench"))
    from gpu_check import mfu, peak_tflops

    assert peak_tflops("NVIDIA H100 80GB HBM3", None) == 989.0 and peak_tflops("NVIDIA H200", None) == 989.0
    assert peak_tflops("cpu", None) is None and peak_tflops("cpu", 2.0) == 2.0
    assert mfu(600_000_000, 14_099, 989.0) == 6 * 600e6 * 14_099 / 989e12 and mfu(1, 1.0, None) is None


def test_gpu_check_refuses_cuda_without_a_device():
    import torch

    if torch.cuda.is_available():
        return  # the real run is the check there
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py")], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and "no CUDA device is visible" in proc.stderr
