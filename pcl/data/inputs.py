"""A run's inputs, loaded one way for every caller (`pcl train`, `pcl eval`, `pcl experiment`, the benches):
the model paths, the tokenizer and the prompt sets.

    inputs = run_inputs(cfg)                                   # policy and value paths, the tokenizer
    train, report = training_prompts(cfg, inputs.tokenizer)    # the training set, templated and tokenised
    evals, report = held_out_prompts(cfg, inputs.tokenizer)    # the held-out set (ids under "eval/")

Every problem is a `ConfigError` naming the setting: a model directory that does not exist or is not a Hugging
Face model (model.path, value.path), a tokenizer that cannot be loaded (model.tokenizer, else model.path), a
dataset that cannot be read or has no usable row (data.source, data.eval_source). A tiny task's name
('tiny', 'tiny-carry') resolves to its built policy, built on first use.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pcl.config_schema import TINY_SOURCES, Config, ConfigError
from pcl.data.prompts import load_prompts


def resolve_model_path(path: str, what: str) -> str:
    """A tiny task's name ('tiny', 'tiny-carry') -> its built policy (building it if needed); a local dir must
    exist; else a hub name. `what` names the setting in errors (model.path, value.path)."""
    if path in TINY_SOURCES:
        from pcl.tiny.build import build_tiny  # torch and transformers: only a tiny run builds its policy

        return str(build_tiny(seed=0, verbose=True, task=path))
    p = Path(path).expanduser()
    if p.exists():
        if not (p / "config.json").is_file():
            raise ConfigError(f"{what} = {path!r}: the directory has no config.json (not a Hugging Face model)")
        return str(p.resolve())
    if path.startswith((".", "/", "~")) or path.count("/") != 1:
        raise ConfigError(f"{what} = {path!r}: no such model directory")
    return path  # a hub name such as Qwen/Qwen3-4B-Base, resolved by transformers on the workers


def load_tokenizer(cfg: Config, policy_path: str) -> Any:
    """The run's tokenizer: model.tokenizer, else the policy's (`policy_path`, resolved). A hub name that is
    neither on a reachable hub nor cached is named like a missing directory."""
    from transformers import AutoTokenizer  # late: a config, run dir or path problem fails in under a second

    try:
        return AutoTokenizer.from_pretrained(cfg.model.tokenizer or policy_path)
    except (OSError, ValueError) as exc:
        key, name = ("model.tokenizer", cfg.model.tokenizer) if cfg.model.tokenizer else ("model.path", cfg.model.path)
        why = " ".join(str(exc).split())[:300] or type(exc).__name__  # on the message's one line
        raise ConfigError(f"{key} = {name!r}: cannot load a tokenizer: {why}") from None


@dataclass
class RunInputs:
    """The model side of a run's inputs."""

    policy_path: str
    value_path: str  # value.path, else the policy's
    tokenizer: Any


def run_inputs(cfg: Config) -> RunInputs:
    """Resolve the policy and value model paths and load the tokenizer (ConfigError naming a bad one)."""
    policy = resolve_model_path(cfg.model.path, "model.path")
    value = resolve_model_path(cfg.value.path, "value.path") if cfg.value.path else policy
    return RunInputs(policy, value, load_tokenizer(cfg, policy))


def training_prompts(cfg: Config, tokenizer: Any, seed: int | None = None) -> tuple[list, Any]:
    """(records, load report) of the training set as `pcl train` loads it (`seed`: run.seed unless given)."""
    try:  # a dataset that cannot be read, or has no usable row, is a configuration problem, named as such
        return load_prompts(cfg.data, tokenizer, split="train", seed=cfg.run.seed if seed is None else seed)
    except (ValueError, OSError) as exc:
        raise ConfigError(f"data.source {cfg.data.source!r}: {exc}") from None


def held_out_prompts(cfg: Config, tokenizer: Any) -> tuple[list, Any]:
    """(records, load report) of the held-out set, at most data.eval_size, its ids under "eval/" (the row-index
    ids of two files would otherwise collide)."""
    try:
        records, report = load_prompts(cfg.data, tokenizer, split="eval", seed=cfg.run.seed)
    except (ValueError, OSError) as exc:
        raise ConfigError(f"data.eval_source {cfg.data.eval_source!r}: {exc}") from None
    return [replace(p, id=f"eval/{p.id}") for p in records[: cfg.data.eval_size]], report
