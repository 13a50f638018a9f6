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
(tests/pcl/test_tiny_shipped.py): equal bit for bit on a machine like the one recorded, else within the build's
own tolerance (its probe stops the warm-up at the same pass rate on any CPU).
"""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
from pathlib import Path
from typing import Mapping

import torch

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
