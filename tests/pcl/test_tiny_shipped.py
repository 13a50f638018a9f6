"""The shipped tiny policies (pcl/tiny/shipped.py): a build with the default settings installs them in seconds,
checked by their digest and by sampling them again against their recorded pass rates; `make test-slow` trains
each from scratch and compares."""

from __future__ import annotations

import json
import shutil
import time

import pytest
import torch
from safetensors.torch import load_file

from pcl.tiny import shipped
from pcl.tiny.build import MARKER, build_tiny
from pcl.tiny.tasks import tiny_task

SHIPPED = sorted(p.stem for p in shipped.SHIPPED_DIR.glob("*.safetensors"))


def _task_seed(stem: str) -> tuple[str, int]:
    task, seed = stem.rsplit("-seed-", 1)
    return task, int(seed)


def test_the_demo_policy_is_shipped_with_a_record_of_its_build():
    assert "tiny-carry-seed-0" in SHIPPED  # make demo's policy
    for stem in SHIPPED:
        task, seed = _task_seed(stem)
        record = shipped.shipped_record(task, seed)
        assert record["task"] == task == record["report"]["task"] and record["marker"]["seed"] == seed
        assert record["machine"]["torch"] and record["weights_digest"]
        weights, _ = shipped.shipped_paths(task, seed)
        assert weights.stat().st_size < 8 * 2**20  # a small file


@pytest.mark.parametrize("stem", SHIPPED)
def test_a_default_build_installs_the_shipped_weights_in_seconds(tmp_path, stem):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    task, seed = _task_seed(stem)
    started = time.perf_counter()
    out = build_tiny(seed=seed, task=task, out_dir=tmp_path / stem)
    assert time.perf_counter() - started < 30
    record = shipped.shipped_record(task, seed)
    assert json.loads((out / MARKER).read_text()) == record["marker"]  # a cached build like any other
    report = json.loads((out / "report.json").read_text())
    assert report["installed_from"] == f"pcl/tiny/shipped/{stem}.safetensors"
    assert shipped.weights_digest(load_file(out / "model.safetensors")) == record["weights_digest"]
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied, as built
    assert len(AutoTokenizer.from_pretrained(out)) == model.config.vocab_size
    assert sum(1 for _ in (out / "train.jsonl").open()) == 4096
    assert tiny_task(task).name == report["task"]


def _installed(tmp_path, stem: str):
    """The installed shipped policy of `stem` as a run loads it: (model, tokenizer, train rows, record)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    task, seed = _task_seed(stem)
    out = build_tiny(seed=seed, task=task, out_dir=tmp_path / stem)
    rows = [json.loads(line) for line in (out / "train.jsonl").open()]
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    return model, AutoTokenizer.from_pretrained(out), rows, shipped.shipped_record(task, seed)


@pytest.mark.parametrize("stem", SHIPPED)
def test_the_installed_policy_samples_the_recorded_pass_rate(tmp_path, stem):
    model, tokenizer, rows, record = _installed(tmp_path, stem)
    check = shipped.remeasure_pass_rate(model, tokenizer, rows, record)
    assert check["prompts"] == 512 and check["samples"] == 2
    assert 0.005 < check["standard_error"] < 0.02  # 4 standard errors: 0.044 for tiny-carry, 0.054 for tiny
    assert check["within"], check


def test_a_perturbed_policy_falls_outside_the_recorded_pass_rate(tmp_path):
    """Gaussian noise of 0.2 times each weight tensor's spread: the policy still adds (pass rate ~0.32), but
    not as recorded (0.468)."""
    model, tokenizer, rows, record = _installed(tmp_path, "tiny-carry-seed-0")
    noise = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():  # the tied head moves with the embedding
            parameter.add_(0.2 * parameter.std() * torch.randn(parameter.shape, generator=noise))
    check = shipped.remeasure_pass_rate(model, tokenizer, rows, record)
    assert not check["within"] and check["z"] < -8, check  # about -13.5 standard errors on the recording CPU
    assert check["measured"] > 0.1  # perturbed, not destroyed


def test_pass_rate_variance_sum_takes_each_bin_at_its_widest():
    # 16 samples: bin [0, 0.1) holds 0 and 1/16, [0.5, 0.6) holds 8/16 and 9/16, [0.9, 1] holds 15/16 and 1.
    histogram = [2, 0, 0, 0, 0, 1, 0, 0, 0, 3]
    widest = 2 * (1 / 16) * (15 / 16) + 0.25 + 3 * (15 / 16) * (1 / 16)
    assert shipped.pass_rate_variance_sum(histogram, samples=16) == pytest.approx(widest * 16 / 15)
    assert shipped.pass_rate_variance_sum([0, 0, 4, 0, 0, 0, 0, 0, 0, 0], samples=4) == pytest.approx(4 * 0.1875 * 4 / 3)


def test_a_damaged_shipped_file_is_an_error_naming_it(tmp_path, monkeypatch):
    shipped_copy = tmp_path / "shipped"
    shutil.copytree(shipped.SHIPPED_DIR, shipped_copy)
    monkeypatch.setattr(shipped, "SHIPPED_DIR", shipped_copy)
    weights, _ = shipped.shipped_paths("tiny-carry", 0)
    tensors = load_file(weights)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 1e-3
    from safetensors.torch import save_file

    save_file(tensors, weights)
    with pytest.raises(ValueError, match="tiny-carry-seed-0.safetensors.*damaged"):
        build_tiny(seed=0, task="tiny-carry", out_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing half-built is left


def test_other_settings_or_from_scratch_do_not_install(tmp_path):
    out = build_tiny(seed=0, task="tiny-carry", out_dir=tmp_path / "short", steps=3, measure_prompts=8)
    assert "installed_from" not in json.loads((out / "report.json").read_text())  # a build of its own


@pytest.mark.slow
@pytest.mark.parametrize("stem", SHIPPED)
def test_a_build_from_scratch_reproduces_the_shipped_policy(tmp_path, stem):
    """Bit for bit on a machine like the one recorded (same CPU model and torch); elsewhere float kernels differ,
    and the build's probe stops the warm-up at the same target: the measured pass rates agree within noise."""
    task, seed = _task_seed(stem)
    record = shipped.shipped_record(task, seed)
    out = build_tiny(seed=seed, task=task, out_dir=tmp_path / stem, from_scratch=True)
    report = json.loads((out / "report.json").read_text())
    digest = shipped.weights_digest(load_file(out / "model.safetensors"))
    here, there = shipped.machine(), record["machine"]
    if (here["cpu"], here["torch"]) == (there["cpu"], there["torch"]):
        assert digest == record["weights_digest"], f"a build on {here} differs from the shipped one"
    else:
        rates, shipped_rates = report["pass_rates"], record["report"]["pass_rates"]
        assert abs(rates["mean"] - shipped_rates["mean"]) < 0.05, (rates, shipped_rates)
        assert abs(rates["intermediate_share"] - shipped_rates["intermediate_share"]) < 0.08


def test_weights_digest_sees_every_byte():
    a = {"w": torch.zeros(3), "b": torch.ones(2)}
    b = {"w": torch.zeros(3), "b": torch.tensor([1.0, 1.0 + 2**-23])}
    assert shipped.weights_digest(a) == shipped.weights_digest(dict(reversed(a.items())))
    assert shipped.weights_digest(a) != shipped.weights_digest(b)
    assert shipped.weights_digest(a) != shipped.weights_digest({"w": torch.zeros(3), "c": torch.ones(2)})
