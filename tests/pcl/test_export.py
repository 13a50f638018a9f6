"""`pcl export`: the policy of a model dir, a checkpoint or a run's newest complete checkpoint, copied without
optimizer state, loadable by transformers with the very same outputs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import pcl.checkpoint_store as ckpt
from pcl.models.export import export_policy

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def run_dir(tiny_model_dir, tmp_path):
    """A run directory with a complete checkpoint at step 2 and an incomplete one at step 4."""
    run = tmp_path / "run"
    tmp = ckpt.begin(run / "checkpoints", 2)
    shutil.copytree(tiny_model_dir, tmp / "policy")
    (tmp / "learner.pt").write_bytes(b"optimizer state: never exported")
    ckpt.commit(tmp, run / "checkpoints", 2)
    # a whole policy, but the write stopped before the COMPLETE marker: never exported
    shutil.copytree(tiny_model_dir, run / "checkpoints" / "step-000004" / "policy")
    return run


def logits(path, ids=((3, 4, 5, 6),)):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path).eval()
    with torch.no_grad():
        return model(torch.tensor(ids)).logits


def test_export_of_a_run_takes_the_newest_complete_checkpoint(run_dir, tiny_model_dir, tmp_path):
    out = export_policy(run_dir, tmp_path / "out")
    meta = json.loads((out / "export.json").read_text())
    assert meta["step"] == 2 and meta["policy"].endswith("step-000002/policy")
    assert "model.safetensors" in meta["weights"] and len(meta["weights"]["model.safetensors"]) == 64
    assert not (out / "learner.pt").exists()
    assert torch.equal(logits(out), logits(tiny_model_dir))
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(out)("1+1").input_ids == AutoTokenizer.from_pretrained(tiny_model_dir)("1+1").input_ids


def test_export_of_a_checkpoint_dir(run_dir, tiny_model_dir, tmp_path):
    out = export_policy(run_dir / "checkpoints" / "step-000002", tmp_path / "out")
    assert json.loads((out / "export.json").read_text())["step"] == 2
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "export.json", "generation_config.json",
                                                     "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    assert torch.equal(logits(out), logits(tiny_model_dir))
    with pytest.raises(FileNotFoundError, match="step-000004: this checkpoint is incomplete"):
        export_policy(run_dir / "checkpoints" / "step-000004", tmp_path / "o4")


def test_export_of_a_model_dir_and_bad_sources(tiny_model_dir, run_dir, tmp_path):
    out = export_policy(tiny_model_dir, tmp_path / "copy")
    meta = json.loads((out / "export.json").read_text())
    assert meta["step"] is None and meta["weights"]["model.safetensors"] == ckpt_sha(tiny_model_dir)
    assert torch.equal(logits(out), logits(tiny_model_dir))
    with pytest.raises(FileExistsError):
        export_policy(tiny_model_dir, out)
    with pytest.raises(FileNotFoundError, match="no such file or directory"):
        export_policy(tmp_path / "nothing", tmp_path / "o2")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="not a Hugging Face model directory"):
        export_policy(tmp_path / "empty", tmp_path / "o2")
    shutil.rmtree(run_dir / "checkpoints" / "step-000002")
    with pytest.raises(FileNotFoundError, match="incomplete checkpoints only .*: step-000004"):
        export_policy(run_dir, tmp_path / "o3")
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ValueError, match="does not load with transformers"):
        export_policy(broken, tmp_path / "o5")
    assert not (tmp_path / "o5").exists() and not list(tmp_path.glob(".o5.tmp-*"))  # nothing half-written


def ckpt_sha(model_dir):
    import hashlib

    return hashlib.sha256((Path(model_dir) / "model.safetensors").read_bytes()).hexdigest()


def test_pcl_export_command(run_dir, tmp_path):
    run = subprocess.run([sys.executable, "-m", "entrypoints.cli", "export", str(run_dir), "--out", str(tmp_path / "x")],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "exported the policy of step 2" in run.stdout, run.stderr
    bad = subprocess.run([sys.executable, "-m", "entrypoints.cli", "export", str(tmp_path), "--out", str(tmp_path / "y")],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "not a Hugging Face model directory" in bad.stderr
