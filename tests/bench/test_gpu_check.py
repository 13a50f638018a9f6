"""bench/gpu_check.py runs where only torch, transformers, safetensors, numpy and pyyaml are installed: a CPU smoke
run in a subprocess in which pydantic, Ray, Redis, msgspec, FastAPI and vLLM cannot be imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MISSING = ("pydantic", "ray", "redis", "msgspec", "fastapi", "vllm")
SHIM = f'''import sys
class _Missing:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {MISSING!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (made unimportable by the test)", name=name)
        return None
sys.meta_path.insert(0, _Missing())
'''


def test_gpu_check_smoke_runs_without_the_service_packages(tmp_path):
    (tmp_path / "shim").mkdir()
    (tmp_path / "shim" / "sitecustomize.py").write_text(SHIM)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "shim"), str(ROOT)])}
    probe = subprocess.run([sys.executable, "-c", "import pydantic"], env=env, capture_output=True, text=True)
    assert probe.returncode != 0 and "made unimportable" in probe.stderr  # the shim is in force
    out = tmp_path / "check.json"
    done = subprocess.run([sys.executable, "-m", "bench.gpu_check", "--device", "cpu", "--small", "--weights", "--out",
                           str(out)],
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
    assert "scale check MFU" in done.stdout.splitlines()[-1]
