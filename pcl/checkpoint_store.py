"""Checkpoint directories: written atomically, found again after a crash, pruned to the last K.

    root = run_dir / "checkpoints"
    remove_partial(root)                         # at the start of a run: leftovers of a crashed writer
    check_free_space(root, step, estimate)       # CheckpointSpaceError naming root and the bytes needed
    with writing(root, step) as tmp:             # checkpoints/.tmp-step-000012-<pid>/, empty; deleted on error
        ... every part writes its files into tmp ...
        final = commit(tmp, root, step, meta)    # fsync every file, write COMPLETE, rename, fsync the root
    prune(root, keep=2)                          # the newest 2 complete checkpoints stay
    latest(root)                                 # -> checkpoints/step-000012 (or None)

A checkpoint is complete when its directory is named `step-NNNNNN` and holds a `COMPLETE` file: the rename
is the commit, so a crash at any moment leaves either the previous checkpoint set or the new one, plus at
most a `.tmp-*` directory that the next `begin` or `prune` removes. The layout inside:

    COMPLETE           JSON: step, policy_version, time, the files below and their total bytes
    policy/            the policy in Hugging Face format (config, safetensors, tokenizer): `from_pretrained` loads it
    learner.pt         full (unsharded) float32 policy weights, AdamW state and step count of the learner group
    learner-rng-<r>.pt torch RNG state of learner rank r
    value/             the value model (backbone in Hugging Face format) and `trainer.pt` (weights, optimizer, RNG)
    state.json         the training loop (`pcl.loop`): step, policy version, its RNG, sampler cursor, strategy, ...
    control.json       the control state at the checkpoint: tau, k, pause, the event log
    metrics.jsonl      the metrics history up to this step; selections.jsonl the prompts chosen at each step
    config.yaml        the run's configuration
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

COMPLETE = "COMPLETE"
_NAME = re.compile(r"^step-(\d{6,})$")


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used as it is (refused, not the expected layout); names the file."""


def load_tensors(path: str | os.PathLike, map_location: Any = "cpu") -> Any:
    """A `.pt` file of a checkpoint (tensors in dicts, lists and plain values), read with
    `torch.load(weights_only=True)`: a file holding any other object (a pickle that would run code when loaded,
    planted on a shared run volume) is refused with a CheckpointError naming it, and nothing of it runs."""
    import pickle

    import torch

    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        why = next((line.strip() for line in str(exc).splitlines() if "GLOBAL" in line or "Unsupported" in line),
                   str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
        raise CheckpointError(f"checkpoint file {path}: refused: it holds more than tensors and plain values, so "
                              f"loading it could run code ({why[:200]}); pcl never writes such files: restore "
                              f"the checkpoint from a trusted copy or resume from another one") from None


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def begin(root: str | os.PathLike, step: int) -> Path:
    """A fresh, empty temporary directory for checkpoint `step` under `root` (created as needed)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-{step_dir_name(step)}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    return tmp


@contextlib.contextmanager
def writing(root: str | os.PathLike, step: int) -> Iterator[Path]:
    """`begin(root, step)` for a `with` block: when the block fails (a full disk, a part that raised), the
    partial checkpoint is deleted before the error goes on, so no `.tmp-*` directory is left behind."""
    tmp = begin(root, step)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def remove_partial(root: str | os.PathLike) -> list[Path]:
    """At the start of a run (nothing writes checkpoints yet): delete every partial checkpoint under `root`
    (`.tmp-*`, whoever wrote it: a process id may have been reused since), and put back a complete checkpoint
    that a crash left renamed aside (`.old-step-N-*` while `step-N` is missing); returns what was deleted."""
    root = Path(root)
    removed: list[Path] = []
    if not root.is_dir():
        return removed
    for p in sorted(root.iterdir()):
        if p.name.startswith(".old-"):
            final = root / p.name[len(".old-"):].rsplit("-", 1)[0]
            if _NAME.match(final.name) and not final.exists() and (p / COMPLETE).is_file():
                os.replace(p, final)
                continue
        if p.name.startswith((".tmp-", ".old-")):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


class CheckpointSpaceError(OSError):
    """Not enough free space for the next checkpoint (errno ENOSPC); names the directory and the bytes."""


def tree_bytes(path: str | os.PathLike) -> int:
    """Bytes of the files under `path`."""
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit} ({n} bytes)"
    return f"{n} bytes"


def check_free_space(root: str | os.PathLike, step: int, estimate: int = 0) -> int:
    """Raise CheckpointSpaceError unless the filesystem of `root` has room for checkpoint `step`: the size of
    the newest complete checkpoint (recorded in its COMPLETE file), else `estimate` (the state's size), plus 5%.
    Returns the bytes needed (0: nothing to go by)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    previous = latest(root)
    if previous is not None:
        recorded = json.loads((previous / COMPLETE).read_text()).get("bytes")
        needed, basis = int(recorded if recorded is not None else tree_bytes(previous)), f"the size of {previous.name}"
    else:
        needed, basis = int(estimate), "an estimate from the model's size"
    if needed <= 0:
        return 0
    needed += needed // 20
    free = shutil.disk_usage(root).free
    if free < needed:
        raise CheckpointSpaceError(errno.ENOSPC, f"checkpoint at step {step}: not enough free space in {root}: "
                                   f"{_size(needed)} needed ({basis}, plus 5%), {_size(free)} free; free space "
                                   f"there or lower checkpoint.keep, then resume (earlier checkpoints are intact)")
    return needed


def state_bytes_estimate(model_dirs: list[str]) -> int:
    """The size of a first checkpoint, from the weight files of the policy and value model directories: each
    parameter as its Hugging Face copy (the file's bytes) plus float32 weights and two AdamW moments (12 bytes).
    Hub names (no local directory) count 0."""
    total = 0
    for directory in model_dirs:
        path = Path(directory)
        if not path.is_dir():
            continue
        weights = sum(p.stat().st_size for p in path.iterdir() if p.suffix in (".safetensors", ".bin"))
        try:
            config = json.loads((path / "config.json").read_text())
        except (OSError, ValueError):
            config = {}
        width = 4 if (config.get("dtype") or config.get("torch_dtype")) == "float32" else 2
        total += weights + weights // width * 12
    return total


def _fsync_tree(path: Path) -> None:
    for dirpath, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (a rename, a new file) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write JSON to `path` atomically (a temporary file, fsync, rename)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, allow_nan=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def commit(tmp: Path, root: str | os.PathLike, step: int, meta: dict[str, Any] | None = None) -> Path:
    """Make the checkpoint in `tmp` durable and visible as `root/step-NNNNNN`; returns that path.

    A complete checkpoint of the same step already there (a run resumed from an earlier one and checkpointing
    the same step again) is replaced: the new one is first renamed beside it, so one of them is always complete.
    """
    root = Path(root)
    files = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file())
    write_json(tmp / COMPLETE, {"step": step, "time": time.time(), "files": files, "bytes": tree_bytes(tmp),
                                **(meta or {})})
    _fsync_tree(tmp)
    final = root / step_dir_name(step)
    if final.exists():
        old = root / f".old-{step_dir_name(step)}-{os.getpid()}"
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    fsync_dir(root)
    return final


def is_complete(path: Path) -> bool:
    return path.is_dir() and _NAME.match(path.name) is not None and (path / COMPLETE).is_file()


def complete_checkpoints(root: str | os.PathLike) -> list[Path]:
    """Complete checkpoints under `root`, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if is_complete(p)]
    return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))


def latest(root: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint under `root`, or None."""
    found = complete_checkpoints(root)
    return found[-1] if found else None


def step_of(checkpoint: Path) -> int:
    return int(json.loads((Path(checkpoint) / COMPLETE).read_text())["step"])


def prune(root: str | os.PathLike, keep: int, protect: tuple = ()) -> list[Path]:
    """Delete all but the newest `keep` complete checkpoints (and those in `protect`, e.g. the best one) and any
    leftover temporary directories of processes that are gone; returns what was deleted."""
    root = Path(root)
    kept = {Path(p).resolve() for p in protect if p}
    removed = [p for p in (complete_checkpoints(root)[:-keep] if keep > 0 else []) if p.resolve() not in kept]
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith((".tmp-", ".old-")) and not _owner_alive(p.name):
                removed.append(p)
    for p in removed:
        shutil.rmtree(p, ignore_errors=True)
    return removed


def _owner_alive(name: str) -> bool:
    pid = name.rsplit("-", 1)[-1]
    if not pid.isdigit():
        return False
    if int(pid) == os.getpid():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def resolve(resume: str | os.PathLike, run_dir: str | os.PathLike) -> Path:
    """What `pcl train --resume [DIR]` means: DIR may be a checkpoint, a run directory or a checkpoints
    directory; empty means the run directory. Returns the checkpoint; raises FileNotFoundError naming it."""
    target = Path(resume) if str(resume) else Path(run_dir)
    if is_complete(target):
        return target
    for root in (target / "checkpoints", target):
        found = latest(root)
        if found is not None:
            return found
    if target.is_dir() and _NAME.match(target.name):
        raise FileNotFoundError(f"--resume {target}: this checkpoint is incomplete (no {COMPLETE} file): the "
                                f"write was interrupted; resume from an earlier one in {target.parent}")
    # No complete one: any step directory there is one whose write was interrupted; name it.
    partial = [str(p.relative_to(target)) for root in (target / "checkpoints", target) if root.is_dir()
               for p in sorted(root.iterdir()) if p.is_dir() and _NAME.match(p.name)]
    why = (f"; incomplete (no {COMPLETE} file, the write was interrupted): {', '.join(partial)}"
           if partial else "")
    raise FileNotFoundError(f"--resume {target}: no complete checkpoint found there or in its checkpoints/ "
                            f"directory{why}")
