"""Export a trained policy in Hugging Face format, loadable by transformers and vLLM.

    export_policy("runs/demo", "exports/demo")                          # the newest complete checkpoint's policy
    export_policy("runs/demo/checkpoints/step-000120", "exports/s120")  # a given (complete) checkpoint
    export_policy("path/to/hf-model", "exports/copy")                   # any Hugging Face model directory

Only the model's files are copied (config, safetensors weights and their index, tokenizer, generation config),
never optimizer or learner state. The copy is assembled in a temporary directory beside `out`, loaded back with
transformers on CPU (config, weights, tokenizer), and only then renamed to `out`, with `export.json` recording
the source, the step (None for a plain model directory) and the sha256 of every weight file. A checkpoint is
complete when it holds a `COMPLETE` marker (pcl/checkpoint_store.py); an incomplete one is never exported.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pcl.checkpoint_store as ckpt

MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json",
               "chat_template.jinja", "chat_template.json", "model.safetensors.index.json")
EXPORT_FILE = "export.json"


def find_policy(src: str | Path) -> tuple[Path, int | None]:
    """(the Hugging Face policy directory, its step or None) for a model dir, a checkpoint or a run dir."""
    src = Path(src)
    if not src.exists():
        raise FileNotFoundError(f"{src}: no such file or directory")
    if not src.is_dir():
        raise FileNotFoundError(f"{src}: not a directory (expected a run, a checkpoint or a model directory)")
    if (src / "config.json").is_file():
        return src, None
    if (src / "policy").is_dir():  # a checkpoint directory
        if not ckpt.is_complete(src):
            raise FileNotFoundError(f"{src}: this checkpoint is incomplete (no {ckpt.COMPLETE} file: its write "
                                    "was interrupted); export an earlier one or the run directory")
        return _policy_of(src), ckpt.step_of(src)
    for root in (src / "checkpoints", src):  # a run directory, or its checkpoints/ directory
        found = ckpt.latest(root)
        if found is not None:
            return _policy_of(found), ckpt.step_of(found)
    partial = sorted(p.name for root in (src / "checkpoints", src) if root.is_dir() for p in root.iterdir()
                     if p.is_dir() and p.name.startswith("step-"))
    why = f"; incomplete checkpoints only (no {ckpt.COMPLETE} file): {', '.join(partial)}" if partial else ""
    raise FileNotFoundError(f"{src}: not a Hugging Face model directory (no config.json), a complete checkpoint, "
                            f"or a run directory with one{why}")


def _policy_of(checkpoint: Path) -> Path:
    policy = checkpoint / "policy"
    if not (policy / "config.json").is_file():
        raise FileNotFoundError(f"{checkpoint}: complete, but {policy} holds no Hugging Face model (no config.json)")
    return policy


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_export(path: Path) -> None:
    """Load config, weights and (when present) tokenizer with transformers on CPU; raise ValueError if any fails."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        AutoConfig.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype="auto")  # on CPU
        del model
        if (path / "tokenizer_config.json").is_file():
            AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # transformers raises many types for a bad checkpoint
        raise ValueError(f"the exported policy does not load with transformers: {type(exc).__name__}: {exc}") from exc


def export_policy(src: str | Path, out: str | Path, verify: bool = True) -> Path:
    """Copy the policy of `src` (model dir, checkpoint or run dir) to `out` in Hugging Face format; returns out."""
    policy, step = find_policy(src)
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out}: exists and is not an empty directory; choose another --out")
    weights = sorted(policy.glob("*.safetensors"))
    if not weights:
        raise FileNotFoundError(f"{policy}: no .safetensors weights (only safetensors checkpoints are exported)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        for path in [*weights, *(policy / name for name in MODEL_FILES)]:
            if path.is_file():
                shutil.copy2(path, tmp / path.name)
        if verify:
            verify_export(tmp)
        (tmp / EXPORT_FILE).write_text(json.dumps({
            "source": str(Path(src).resolve()), "policy": str(policy.resolve()), "step": step,
            "weights": {p.name: sha256(tmp / p.name) for p in weights}}, indent=2) + "\n")
        if out.exists():
            out.rmdir()  # empty, checked above
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
