"""`pcl train`: the driver. It prepares everything before any actor starts (config, model paths, data), then
starts Redis (embedded unless configured) and Ray (local unless RAY_ADDRESS points at a cluster), places the
actors, and follows the coordinator, printing one line per step and a progress bar.

    run_training(load_config("configs/tiny.yaml"), run_dir="runs/demo")
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from pcl.config import Config, ConfigError, dump_config

log = logging.getLogger("pcl.train")


@dataclass
class Prepared:
    """What the driver resolved before starting any actor."""

    run_dir: Path
    policy_path: str
    value_path: str
    train_prompts: list
    eval_prompts: list
    answers: dict


def resolve_model_path(path: str, what: str) -> str:
    """'tiny' -> the built tiny model (building it if needed); a local dir must exist; else a hub name."""
    if path == "tiny":
        from pcl.tiny.build import build_tiny

        return str(build_tiny(seed=0, verbose=True))
    p = Path(path).expanduser()
    if p.exists():
        if not (p / "config.json").is_file():
            raise ConfigError(f"{what} = {path!r}: the directory has no config.json (not a Hugging Face model)")
        return str(p.resolve())
    if path.startswith((".", "/", "~")) or path.count("/") != 1:
        raise ConfigError(f"{what} = {path!r}: no such model directory")
    return path  # a hub name such as Qwen/Qwen3-4B-Base, resolved by transformers on the workers


def prepare(cfg: Config, run_dir: str | None, resume: str | None) -> Prepared:
    """Everything that can fail on bad input, done before Redis, Ray or any actor starts."""
    from transformers import AutoTokenizer

    from pcl.data import load_prompts
    from pcl.strategies import make_strategy

    try:  # a strategy that does not fit the run fails here, not mid-run
        make_strategy(cfg.selection, cfg.run.m, cfg.run.seed, n=cfg.run.n)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    out = Path(run_dir or cfg.run.run_dir or f"runs/{cfg.run.name}")
    if resume is None and (out / "metrics.jsonl").exists():
        raise ConfigError(f"run dir {str(out)!r} already holds a run: pass --resume to continue it, "
                          f"or choose another --run-dir")
    out.mkdir(parents=True, exist_ok=True)
    # control.token is a secret: it stays out of the run directory (a resumed run takes it from PCL_API_TOKEN)
    (out / "config.yaml").write_text(dump_config(cfg.model_copy(update={"control": cfg.control.model_copy(
        update={"token": None})})))

    policy = resolve_model_path(cfg.model.path, "model.path")
    value = resolve_model_path(cfg.value.path, "value.path") if cfg.value.path else policy
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.tokenizer or policy)
    train, report = load_prompts(cfg.data, tokenizer, split="train", seed=cfg.run.seed)
    print(f"pcl: training set {cfg.data.source}: {report.summary()}", flush=True)
    if len(train) < cfg.run.m:
        raise ConfigError(f"data.source {cfg.data.source!r}: {len(train)} usable prompts, fewer than run.m={cfg.run.m}")
    evals = []
    if cfg.data.eval_source and cfg.run.eval_every:
        evals, report = load_prompts(cfg.data, tokenizer, split="eval", seed=cfg.run.seed)
        print(f"pcl: held-out set {cfg.data.eval_source}: {report.summary()}", flush=True)
        # Held-out ids get their own namespace: row-index ids of two files would otherwise collide.
        evals = [replace(p, id=f"eval/{p.id}") for p in evals[: cfg.data.eval_size]]
    answers = {p.id: p.answer for p in train}
    answers.update({p.id: p.answer for p in evals})
    return Prepared(out, policy, value, train, evals, answers)


def start_ray() -> bool:
    """Connect to the cluster in RAY_ADDRESS, or start a local Ray; returns whether we started it."""
    import ray

    if ray.is_initialized():
        return False
    # Actors inherit a quiet, single-threaded environment: many of them share the cores of a small machine.
    env = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TOKENIZERS_PARALLELISM": "false"}
    quiet = {"logging_level": logging.ERROR, "log_to_driver": True, "include_dashboard": False,
             "runtime_env": {"env_vars": env}}
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], **{k: v for k, v in quiet.items() if k != "include_dashboard"})
        return False
    ray.init(num_cpus=max(2, os.cpu_count() or 2), **quiet)
    return True


def follow(coordinator_ref, run_dir: Path, total_steps: int, stream=None) -> dict:
    """Print each new metrics line as the coordinator writes it, with a progress bar, until it finishes."""
    stream = stream or sys.stdout  # looked up now: sys.stdout may have been replaced since import
    import ray
    from tqdm import tqdm

    from pcl.runlog import METRICS_FILE, format_step_line, iter_metrics

    seen, result = 0, None
    path = run_dir / METRICS_FILE
    bar = tqdm(total=total_steps, unit="step", file=sys.stderr, dynamic_ncols=True, leave=False,
               disable=not sys.stderr.isatty())
    try:
        while result is None:
            done, _ = ray.wait([coordinator_ref], timeout=1.0)
            if done:
                result = ray.get(coordinator_ref)
            records = list(iter_metrics(path))
            for r in records[seen:]:
                if "effective_ratio" in r:
                    tqdm.write(format_step_line(r, total_steps), file=stream)
                    bar.n = r["step"]
                    bar.refresh()
                elif r.get("eval_accuracy") is not None:
                    tqdm.write(f"step {r['step']:>4}/{total_steps}  eval_acc {r['eval_accuracy']:.3f}", file=stream)
            seen = len(records)
    finally:
        bar.close()
    return result


def run_training(cfg: Config, run_dir: str | None = None, resume: str | None = None) -> int:
    """Train to completion; returns the process exit code."""
    import ray

    from services.control_plane import DriverControl
    from services.fleet import start_fleet
    from services.redis_server import open_redis

    started = time.perf_counter()
    prep = prepare(cfg, run_dir, resume)
    print(f"pcl: run dir {prep.run_dir}  policy {prep.policy_path}  strategy {cfg.selection.type}  "
          f"m={cfg.run.m} n={cfg.run.n}  {len(prep.train_prompts)} train / {len(prep.eval_prompts)} eval prompts",
          flush=True)
    redis = open_redis(cfg.redis, prep.run_dir / "redis")
    control, own_ray, fleet = None, False, None
    try:
        # Control state in Redis (reset for a fresh run) and, with control.enabled, the control plane.
        control = DriverControl(cfg, redis.url, prep.run_dir, k_max=len(prep.train_prompts) // cfg.run.m,
                                fresh=resume is None, tools_url=redis.tcp_url)
        own_ray = start_ray()
        fleet = start_fleet(cfg, prep, redis.url)
        print(f"pcl: actors up in {time.perf_counter() - started:.1f}s; training", flush=True)
        summary = follow(fleet.coordinator.run.remote(), prep.run_dir, cfg.run.steps)
        summary["total_seconds"] = time.perf_counter() - started
        (prep.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        print(f"pcl: done: {summary['steps']} steps in {summary['total_seconds']:.0f}s; "
              f"metrics in {prep.run_dir / 'metrics.jsonl'}", flush=True)
        return 0
    except BaseException as exc:
        if control is not None:
            control.failed(exc)
        raise
    finally:
        if fleet is not None:
            fleet.stop()
        if control is not None:
            control.close()
        if own_ray:
            ray.shutdown()
        redis.close()
