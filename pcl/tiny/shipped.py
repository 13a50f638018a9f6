"""The tiny policies shipped with the package: a first run installs one in seconds instead of training it for
minutes.

A build of a task family with the default settings (`pcl make-tiny`, or a run whose model.path names a tiny
task) looks here first. When `pcl/tiny/shipped/<task>-seed-<seed>.safetensors` exists and its record
(`<task>-seed-<seed>.json`) was written by a build with the same settings, the build writes the task's files as
always (tokenizer, train.jsonl, eval.jsonl, config) and takes the policy's weights from the shipped file instead
of warming up; the weights are checked against the digest in the record, and report.json is the shipped build's
report (it says where it came from). Everything else reads the result like any build.

    pcl make-tiny --task tiny-carry                  # installs the shipped policy (a few seconds)
    pcl make-tiny --task tiny-carry --from-scratch   # trains it here (minutes, one thread, deterministic)
    pcl make-tiny --task tiny-carry --from-scratch --ship   # trains it and writes the shipped files (maintainers)

`make test-slow` builds each shipped policy from scratch and compares it with the shipped one
(tests/pcl/test_tiny_shipped.py): on the CPU model and torch build in the record, the same weights (by digest);
elsewhere float kernels differ and it compares the build's measured pass rates with the record's (mean within
0.05, share of prompts with 0.1 <= p <= 0.9 within 0.08). The default suite samples the installed policy again
(`remeasure_pass_rate`): its mean pass rate on the record's own prompts must lie within 4 standard errors of
the recorded one.
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
import shutil
from pathlib import Path
from typing import Mapping

import torch

from pcl.tiny.measure import MEASURE_SAMPLES, deterministic_cpu, measure_pass_rates

SHIPPED_DIR = Path(__file__).with_name("shipped")
RECORD_FORMAT = 1


def shipped_paths(task: str, seed: int) -> tuple[Path, Path]:
    """(weights, record) of a task family's shipped policy for a seed; they may not exist."""
    stem = SHIPPED_DIR / f"{task}-seed-{seed}"
    return stem.with_suffix(".safetensors"), stem.with_suffix(".json")


def shipped_record(task: str, seed: int) -> dict | None:
    """The record of the shipped policy of (task, seed), or None when none is shipped."""
    weights, record = shipped_paths(task, seed)
    if not (weights.is_file() and record.is_file()):
        return None
    data = json.loads(record.read_text())
    if data.get("format") != RECORD_FORMAT:
        raise ValueError(f"{record}: record format {data.get('format')!r}, expected {RECORD_FORMAT}")
    return data


def weights_digest(tensors: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 over every tensor's name, dtype, shape and bytes, in name order: equal digests, equal weights
    (whatever metadata a safetensors writer adds)."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().contiguous().cpu()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def load_shipped_weights(task: str, seed: int, record: dict) -> dict[str, torch.Tensor]:
    """The shipped tensors of (task, seed), checked against the record's digest (a damaged file is an error
    naming it, never a silently different policy)."""
    from safetensors.torch import load_file

    weights, _ = shipped_paths(task, seed)
    tensors = load_file(weights)
    if (found := weights_digest(tensors)) != record["weights_digest"]:
        raise ValueError(f"{weights}: weights digest {found[:16]}... differs from its record's "
                         f"{record['weights_digest'][:16]}...; the file is damaged: restore it from the repository "
                         f"or train the policy with `pcl make-tiny --from-scratch`")
    return tensors


def machine() -> dict:
    """What decides a build's float results: the CPU, the torch build, the Python version."""
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "machine": platform.machine(), "torch": torch.__version__,
            "python": platform.python_version()}


def ship(build_dir: str | Path, marker: dict) -> tuple[Path, Path]:
    """Write the shipped files of a complete build: its model.safetensors as is, and a record holding the
    build's marker (its settings, `marker`), the weights' digest, the machine and the build's report."""
    from safetensors.torch import load_file

    build_dir = Path(build_dir)
    report = json.loads((build_dir / "report.json").read_text())
    weights, record = shipped_paths(report["task"], marker["seed"])
    SHIPPED_DIR.mkdir(exist_ok=True)
    shutil.copyfile(build_dir / "model.safetensors", weights)
    record.write_text(json.dumps({
        "format": RECORD_FORMAT, "task": report["task"], "marker": marker,
        "weights_digest": weights_digest(load_file(weights)), "machine": machine(), "report": report,
    }, indent=2) + "\n")
    return weights, record


REMEASURE_SAMPLES = 2  # samples per prompt of a re-measurement (the build's took MEASURE_SAMPLES)
REMEASURE_SEED = 1  # a sampling stream other than the build's (its seed, 0 for the shipped policies)
REMEASURE_Z = 4.0  # the tolerance, in standard errors of the difference


def pass_rate_variance_sum(histogram: list[int], samples: int = MEASURE_SAMPLES) -> float:
    """An upper estimate of sum_i p_i (1 - p_i) over the prompts of a build's measurement, from its pass-rate
    histogram (10 bins; each prompt's rate r_i = successes / `samples`): each prompt counts as the value of
    r (1 - r) furthest from 0 among the rates its bin can hold, and E[r (1 - r)] = p (1 - p) (samples - 1) /
    samples."""
    worst = [0.0] * 10
    for successes in range(samples + 1):
        rate = successes / samples
        b = min(int(rate * 10 + 1e-9), 9)  # the bin summarize() puts the rate in
        worst[b] = max(worst[b], rate * (1 - rate))
    return sum(count * w for count, w in zip(histogram, worst)) * samples / (samples - 1)


def remeasure_pass_rate(model, tokenizer, rows: list[dict], record: dict, samples: int = REMEASURE_SAMPLES,
                        seed: int = REMEASURE_SEED, z: float = REMEASURE_Z) -> dict:
    """The mean pass rate of `model` sampled again on the prompts the record's build measured (`rows`: the
    task's train rows, of which the first marker["measure_prompts"] are taken), against the recorded mean.

    The measurement is the build's own (pcl.tiny.measure.measure_pass_rates: temperature 1, no top-k or top-p,
    chunks of 128 prompts each generating up to the chunk's longest target response + 2 tokens, one thread),
    with `samples` samples a prompt instead of MEASURE_SAMPLES. The same prompts, so for the same policy the
    two means differ only by sampling: Var = sum_i p_i (1 - p_i) (1/samples + 1/MEASURE_SAMPLES) / N^2, the
    sum estimated from the recorded histogram (pass_rate_variance_sum), never from the new samples (a broken
    policy cannot widen its own tolerance). Within: |measured - recorded| <= z standard errors. Returns the
    figures as a dict; the caller's torch random state is left as it was.
    """
    from pcl.tiny.tasks import tiny_task

    recorded = record["report"]["pass_rates"]
    prompts = record["marker"]["measure_prompts"]
    rows = rows[:prompts]
    if len(rows) != prompts or recorded["prompts"] != prompts:
        raise ValueError(f"the record measured {prompts} prompts; got {len(rows)} rows")
    with torch.random.fork_rng(), deterministic_cpu(1):
        rates = measure_pass_rates(model, tokenizer, rows, samples, seed=seed,
                                   response=tiny_task(record["task"]).response)
    measured = sum(rates) / len(rates)
    variance = pass_rate_variance_sum(recorded["histogram"]) * (1 / samples + 1 / MEASURE_SAMPLES) / prompts**2
    error = math.sqrt(variance)
    difference = measured - recorded["mean"]
    return {"prompts": prompts, "samples": samples, "measured": measured, "recorded": recorded["mean"],
            "difference": difference, "standard_error": error, "tolerance": z * error,
            "z": difference / error, "within": abs(difference) <= z * error}
