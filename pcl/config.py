"""The run configuration: one pydantic model tree, loaded from YAML, overridable with dotted keys.

    cfg = load_config("configs/tiny.yaml", overrides=["selection.tau=0.4", "run.steps=20"])

Every section rejects unknown keys (`extra="forbid"`) and reads types strictly (a bool is no count, a quoted number
no number; files and `key=value` values are read as YAML, so `run.m=64` is an int), every number carries its
allowed range, URLs are checked by scheme (`pcl.config_service`), and the selection strategy is a discriminated union
on `type`. Errors come out as `ConfigError` with one line per
problem naming the dotted key, the file it came from and the allowed values, before any actor starts.
The sections themselves are in `pcl.config_schema`; every name there is importable from here.

Where a value comes from, first match wins: the command line (`key=value` overrides), the YAML layers (later files
over earlier ones), the environment for the keys the config leaves unset (`ENV_FALLBACKS`: REDIS_URL -> redis.url,
PCL_DATA_ROOT -> data.root, PCL_API_TOKEN -> control.token, MLFLOW_TRACKING_URI -> logging.mlflow_tracking_uri),
the defaults. A value from the environment is validated as a file's is, its error naming the variable. The
environment is read here and only here (`load_config`); code below takes the config's values.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Mapping, get_args

import yaml
from pydantic import ValidationError

from pcl.config_schema import (
    ConfigError, Section, RunConfig, DataConfig, ModelConfig, OptimizerConfig, ValueModelConfig,
    UniformSelection, PCLSelection, PrefilterSelection, DynamicSamplingSelection, SpeedSelection,
    GresoSelection, ProbeSelection, RolloutConfig, VerifierConfig, LearnerConfig, RedisConfig, ControlConfig,
    CheckpointConfig, EvaluationConfig, LoggingConfig, CurriculumConfig, ClusterConfig, Config, Resources,
    TINY_SOURCES,
    Selection, OffPolicyConfig, LOGPROB_ENGINES,
)
from pcl.credentials import MASK, check_token, mask_url, redact

__all__ = [  # the schema's names (pcl.config_schema) and the loading's
    "ConfigError", "Section", "RunConfig", "DataConfig", "ModelConfig", "OptimizerConfig", "ValueModelConfig",
    "UniformSelection", "PCLSelection", "PrefilterSelection", "DynamicSamplingSelection", "SpeedSelection",
    "GresoSelection", "ProbeSelection", "RolloutConfig", "VerifierConfig", "LearnerConfig", "RedisConfig",
    "ControlConfig", "CheckpointConfig", "EvaluationConfig", "LoggingConfig", "CurriculumConfig", "ClusterConfig",
    "Config",
    "Resources", "TINY_SOURCES", "Selection", "OffPolicyConfig", "LOGPROB_ENGINES", "parse_override", "validate_tree",
    "load_config", "dump_config", "redacted", "ENV_FALLBACKS", "apply_env_fallbacks",
]

# The environment variable each of these keys falls back to when the command line and the YAML layers leave it
# unset (null); applied once, by load_config.
ENV_FALLBACKS: dict[str, str] = {
    "redis.url": "REDIS_URL",
    "data.root": "PCL_DATA_ROOT",
    "control.token": "PCL_API_TOKEN",
    "logging.mlflow_tracking_uri": "MLFLOW_TRACKING_URI",
}


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, whose floats (YAML 1.1) need a dot, with YAML 1.2's exponent floats added: `lr: 8e-06`
    in a preset and `optimizer.lr=1e-6` on the command line are numbers, not strings the strict sections refuse."""


_Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
                              list("-+0123456789"))


def _yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader: plain data only


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (["a", "b", "c"], value), the value parsed as YAML (numbers, bools, null, lists)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected key=value (for example selection.tau=0.4)")
    key, raw = text.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"override {text!r}: empty key segment")
    try:
        value = _yaml(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return parts, value


def _set_dotted(tree: dict, parts: list[str], value: Any) -> None:
    node = tree
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value


def _describe(err: dict, source: str) -> str:
    loc = ".".join(str(p) for p in err["loc"] if not (isinstance(p, str) and p in _STRATEGY_TAGS))
    if loc == "control.token":  # a secret: the message names the key and the rule, never the value
        return f"{source}: 'control.token': {err['msg'].removeprefix('Value error, ')}"
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind == "extra_forbidden":
        return f"{source}: unknown key '{loc}'"
    if kind == "union_tag_invalid":
        return f"{source}: '{loc}.type' is {ctx.get('tag')!r}; allowed: {ctx.get('expected_tags')}"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        bounds = {"greater_than": "> {gt}", "greater_than_equal": ">= {ge}", "less_than": "< {lt}", "less_than_equal": "<= {le}"}
        return f"{source}: '{loc}' = {err.get('input')!r} is out of range; it must be {bounds[kind].format(**ctx)}"
    if kind == "literal_error":
        return f"{source}: '{loc}' = {err.get('input')!r}; allowed: {ctx.get('expected')}"
    if kind == "value_error":  # a validator's rule: its message says what is wrong and what is allowed
        value, msg = err.get("input"), err["msg"].removeprefix("Value error, ")
        if loc in _URL_KEYS and isinstance(value, str):
            return f"{source}: '{loc}' = {mask_url(value)!r}: {msg}"
        if not loc or isinstance(value, (dict, list)):  # a section's or the whole config's rule, naming its keys
            return f"{source}: " + (f"'{loc}': " if loc else "") + msg
        return f"{source}: '{loc}' = {value!r}: {msg}"
    return f"{source}: '{loc}': {err['msg']} (got {err.get('input')!r})"


# The settings that are URLs, whose passwords an error masks.
_URL_KEYS = ("redis.url", "logging.mlflow_tracking_uri")


# The discriminator tags of the selection union (pydantic puts them in error locations): every strategy's.
_STRATEGY_TAGS = {model.model_fields["type"].default for model in get_args(get_args(Selection)[0])}


def validate_tree(tree: dict, source: str = "<config>") -> Config:
    """Validate a plain dict into a Config, raising ConfigError with one line per problem."""
    try:
        return Config.model_validate(tree)
    except ValidationError as exc:
        lines = [redact(_describe(e, source), _secrets(tree)) for e in exc.errors()]
        sep = "\n  " if len(lines) > 1 else " "  # a single problem stays on the message's one line
        raise ConfigError("invalid configuration:" + sep + "\n  ".join(lines)) from None


def _secrets(tree: dict) -> list:
    """The secrets a config tree holds (the API token, the URLs that carry a password), to keep out of messages."""
    control = tree.get("control")
    token = control.get("token") if isinstance(control, dict) else None
    urls = []
    for key in _URL_KEYS:
        section, name = key.split(".")
        url = tree.get(section, {}).get(name) if isinstance(tree.get(section), dict) else None
        urls.append(url if isinstance(url, str) and mask_url(url) != url else None)
    return [str(token) if token is not None else None, *urls]


def _read_yaml(path: str | os.PathLike) -> dict:
    source, p = str(path), Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {source!r} does not exist")
    try:
        loaded = _yaml(p.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of sections, got {type(loaded).__name__}")
    return loaded or {}


def _merge(base: dict, layer: dict) -> dict:
    """`layer` over `base`, section by section; a selection of another type replaces the base's whole (one
    without a type refines the base's strategy)."""
    out = dict(base)
    for key, value in layer.items():
        old = out.get(key)
        if isinstance(value, dict) and isinstance(old, dict) and (
                key != "selection" or value.get("type", old.get("type")) == old.get("type")):
            out[key] = _merge(old, value)
        else:
            out[key] = value
    return out


def load_config(path: str | os.PathLike | list | tuple | None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a YAML config (or the defaults when path is None; several files are layered in order, later ones
    winning key by key, e.g. a paper preset then a baseline's selection) and apply dotted `key=value` overrides."""
    tree: dict = {}
    source = "<defaults>"
    paths = [] if path is None else list(path) if isinstance(path, (list, tuple)) else [path]
    for p in paths:
        tree = _merge(tree, _read_yaml(p))
    if paths:
        source = " + ".join(str(p) for p in paths)
    cfg = validate_tree(tree, source)
    if overrides:
        # Overrides apply to the validated tree so a strategy's defaults survive a partial override, but a
        # new `selection.type` starts that strategy from its own defaults (naming the file's own type keeps
        # the file's settings of it).
        merged = cfg.model_dump()
        parsed = [parse_override(item) for item in overrides]
        for parts, value in parsed:
            if parts == ["selection", "type"] and value != merged["selection"]["type"]:
                merged["selection"] = {"type": value}
        for parts, value in parsed:
            if parts != ["selection", "type"]:
                _set_dotted(merged, parts, value)
        cfg = validate_tree(merged, f"{source} + command line")
    return apply_env_fallbacks(cfg)


def apply_env_fallbacks(cfg: Config, environ: Mapping[str, str] | None = None) -> Config:
    """`cfg` with each ENV_FALLBACKS key it leaves unset taken from the environment (`environ`, else os.environ)
    when the variable is set and not empty, validated as a file's value would be: a bad one is a ConfigError
    naming the variable and the key (never a token, nor a URL's password)."""
    env = os.environ if environ is None else environ
    for key, var in ENV_FALLBACKS.items():
        section, name = key.split(".")
        value = env.get(var)
        if not value or getattr(getattr(cfg, section), name) is not None:
            continue
        if key == "control.token":
            try:
                check_token(value, var)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        tree = cfg.model_dump()
        tree[section][name] = value
        cfg = validate_tree(tree, f"the environment's {var}")
    return cfg


def dump_config(cfg: Config) -> str:
    """The config as YAML, as a run directory records it."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def redacted(cfg: Config, token_mask: str | None = MASK) -> Config:
    """The config with its secrets hidden, for printing and run directories: control.token replaced by
    `token_mask` when set (None drops it: a run directory's copy), the passwords of redis.url and
    logging.mlflow_tracking_uri masked."""
    token = None if cfg.control.token is None else token_mask
    url = None if cfg.redis.url is None else mask_url(cfg.redis.url)
    mlflow = cfg.logging.mlflow_tracking_uri
    return cfg.model_copy(update={
        "control": cfg.control.model_copy(update={"token": token}),
        "redis": cfg.redis.model_copy(update={"url": url}),
        "logging": cfg.logging.model_copy(update={"mlflow_tracking_uri": mlflow and mask_url(mlflow)})})
