"""Export a trained policy in Hugging Face format, loadable by transformers and vLLM.

    export_policy("runs/demo", "exports/demo")                          # the newest complete checkpoint's policy
    export_policy("runs/demo/checkpoints/step-000120", "exports/s120")  # a given checkpoint
    export_policy("path/to/hf-model", "exports/copy")                   # any Hugging Face model directory

Only the model's files are copied (config, safetensors weights and index, tokenizer, generation config), never
optimizer state. The copy is loaded back with transformers before the export is declared done, and
`export.json` records the source, the step and the sha256 of every weight file.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from pcl import checkpoint as ckpt

MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json",
               "chat_template.jinja", "model.safetensors.index.json")


def find_policy(src: str | Path) -> tuple[Path, int | None]:
    """(the Hugging Face policy directory, its step or None) for a model dir, a checkpoint or a run dir."""
    src = Path(src)
    if (src / "config.json").is_file():
        return src, None
    if ckpt.is_complete(src) and (src / "policy" / "config.json").is_file():
        return src / "policy", ckpt.step_of(src)
    for root in (src / "checkpoints", src):
        found = ckpt.latest(root)
        if found is not None and (found / "policy" / "config.json").is_file():
            return found / "policy", ckpt.step_of(found)
    raise FileNotFoundError(f"{src}: not a Hugging Face model directory, a complete checkpoint, or a run directory "
                            "with one")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def export_policy(src: str | Path, out: str | Path, verify: bool = True) -> Path:
    policy, step = find_policy(src)
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out}: exists and is not empty; choose another --out")
    weights = sorted(policy.glob("*.safetensors"))
    if not weights:
        raise FileNotFoundError(f"{policy}: no .safetensors weights (only safetensors checkpoints are exported)")
    out.mkdir(parents=True, exist_ok=True)
    for path in [*weights, *(policy / name for name in MODEL_FILES)]:
        if path.is_file():
            shutil.copy2(path, out / path.name)
    if verify:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        AutoConfig.from_pretrained(out)
        AutoModelForCausalLM.from_pretrained(out)
        if (out / "tokenizer_config.json").is_file():
            AutoTokenizer.from_pretrained(out)
    (out / "export.json").write_text(json.dumps({
        "source": str(Path(src).resolve()), "policy": str(policy.resolve()), "step": step,
        "weights": {p.name: sha256(out / p.name) for p in weights}}, indent=2) + "\n")
    return out
