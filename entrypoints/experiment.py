"""`pcl experiment CONFIG`: the strategy comparison, re-run with one command.

    pcl experiment configs/experiments/tiny-compare.yaml

An experiment config names a base run config, overrides common to every run, one list of overrides per arm
(a selection strategy and its settings), the seeds and one training budget (seconds of training, evaluations and
checkpoint writes excluded: the paper's clock). Every arm runs with
every seed, one after another on the same machine, each run a normal `pcl train` run in
`{runs_dir}/{arm}-seed{seed}` (finished runs are kept and skipped when the command is repeated). Before a seed's
runs, the initial policy's pass rate of every training prompt (n_pre rollouts each, single process) is cached
into each run directory: the prefilter arm filters on it, and every arm reports the reference difficulty of the
prompts it selected. The report (`output`) holds a table and PNG plots; `write_report` rebuilds it from the runs.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pcl.config import ConfigError, load_config


class ExperimentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, description="Names the runs directory and the report.")
    base: str = Field(description="The run config every run starts from (a path relative to the working directory).")
    overrides: list[str] = Field(default_factory=list, description="key=value overrides of every run.")
    strategies: dict[str, list[str]] = Field(min_length=1,
                                             description="arm name -> its overrides (selection.type=...).")
    seeds: list[int] = Field(min_length=1, description="Each arm runs once per seed (run.seed).")
    budget_s: float = Field(gt=0, description="Training budget of every run in seconds of training, evaluations "
                            "and checkpoint writes excluded (run.train_budget_s).")
    target_accuracy: float | None = Field(None, ge=0, le=1, description="Held-out accuracy whose first reaching "
                                          "is timed; or give target_gain.")
    target_gain: float | None = Field(None, gt=0, le=1, description="Timed instead: first reaching the run's own "
                                      "step-0 held-out accuracy plus this (seeds start from different accuracies).")
    reference_n_pre: int = Field(8, ge=0, description="Rollouts per training prompt for the reference pass rates "
                                 "(0: none measured beforehand; a prefilter arm then measures its own).")
    runs_dir: str | None = Field(None, description="Where the runs go; runs/experiments/{name} when unset.")
    output: str | None = Field(None, description="The report; docs/results/{name}.md when unset (plots beside it).")

    @field_validator("strategies")
    @classmethod
    def _arms_choose_a_strategy(cls, arms: dict[str, list[str]]) -> dict[str, list[str]]:
        for arm, overrides in arms.items():
            if not any(o.startswith("selection.type=") for o in overrides):
                raise ValueError(f"arm {arm!r} must set selection.type=... among its overrides")
        return arms

    @model_validator(mode="after")
    def _one_target(self) -> "ExperimentConfig":
        if (self.target_accuracy is None) == (self.target_gain is None):
            raise ValueError("give exactly one of target_accuracy and target_gain")
        return self

    @property
    def runs_path(self) -> Path:
        return Path(self.runs_dir or f"runs/experiments/{self.name}")

    @property
    def output_path(self) -> Path:
        return Path(self.output or f"docs/results/{self.name}.md")


def load_experiment(path: str | Path, sets: list[str] = ()) -> ExperimentConfig:
    """The experiment config at `path`, with `sets` (FIELD=VALUE, the value read as YAML) replacing its top-level
    fields: `budget_s=20`, `seeds=[0]`, `runs_dir=/tmp/x` for a short try of a shipped experiment."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"experiment config {str(path)!r} does not exist")
    try:
        raw = yaml.safe_load(p.read_text()) or {}
        for item in sets:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise ConfigError(f"{item!r}: expected FIELD=VALUE (an experiment config's top-level field)")
            raw[key.strip()] = yaml.safe_load(value)
        return ExperimentConfig.model_validate(raw)
    except (ValidationError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: invalid experiment config:\n{exc}") from None


def run_config(exp: ExperimentConfig, arm: str, seed: int):
    """The validated run config of one arm and seed."""
    return load_config(exp.base, [*exp.overrides, *exp.strategies[arm], f"run.seed={seed}",
                                  f"run.train_budget_s={exp.budget_s}", f"run.name={exp.name}-{arm}-s{seed}"])


def run_experiment(path: str | Path, sets: list[str] = ()) -> int:
    """Run every arm with every seed (skipping finished runs), then write the report. `sets`: see
    `load_experiment`."""
    from actors.runtime import start_ray
    from entrypoints.train import run_training

    exp = load_experiment(path, sets)
    configs = {(arm, seed): run_config(exp, arm, seed) for seed in exp.seeds for arm in exp.strategies}  # fail early
    exp.runs_path.mkdir(parents=True, exist_ok=True)
    started, own_ray, failed = time.perf_counter(), start_ray(), []  # one Ray for every run
    try:
        for seed in exp.seeds:
            reference = None
            for arm in exp.strategies:
                run_dir = exp.runs_path / f"{arm}-seed{seed}"
                if (run_dir / "summary.json").is_file():
                    print(f"pcl experiment: {run_dir} is finished; kept", flush=True)
                    continue
                shutil.rmtree(run_dir, ignore_errors=True)  # an interrupted run starts over
                run_dir.mkdir(parents=True)
                if exp.reference_n_pre:  # 0: no arm filters on them, and none reports its prompts' difficulty
                    reference = reference or reference_cache(exp, configs[(arm, seed)], seed)
                    shutil.copy(reference, run_dir / reference.name.split("@")[0])
                print(f"pcl experiment: run {finished_runs(exp) + 1}/{len(configs)}: {arm}, seed {seed} "
                      f"({time.perf_counter() - started:.0f}s in)", flush=True)
                try:  # one failed run must not cost the hour: it is recorded, and the others go on
                    run_training(configs[(arm, seed)], run_dir=str(run_dir))
                except Exception as exc:  # noqa: BLE001
                    failed.append(f"{arm} seed {seed}: {type(exc).__name__}: {exc}")
                    (run_dir / "FAILED").write_text(failed[-1] + "\n")
                    print(f"pcl experiment: FAILED {failed[-1]}", flush=True)
    finally:
        if own_ray:
            import ray

            ray.shutdown()
    from entrypoints.experiment_report import write_report

    write_report(exp)
    print(f"pcl experiment: done in {time.perf_counter() - started:.0f}s; report {exp.output_path}"
          + (f"; {len(failed)} run(s) failed: " + "; ".join(failed) if failed else ""), flush=True)
    return 1 if failed else 0


def finished_runs(exp: ExperimentConfig) -> int:
    """How many of the experiment's runs have finished (written their summary)."""
    return sum((exp.runs_path / f"{arm}-seed{seed}" / "summary.json").is_file()
               for arm in exp.strategies for seed in exp.seeds)


def reference_cache(exp: ExperimentConfig, cfg, seed: int) -> Path:
    """The seed's reference pass-rate cache (computed once, kept in the runs directory)."""
    from pcl.data.inputs import run_inputs, training_prompts
    from pcl.data.reference_rates import REFERENCE_FILE, load_reference, save_reference

    path = exp.runs_path / f"{REFERENCE_FILE}@seed{seed}"
    inputs = run_inputs(cfg)
    prompts = training_prompts(cfg, inputs.tokenizer)[0]  # exactly as `pcl train` loads them for this config
    if load_reference(path, cfg.model.path, prompts, exp.reference_n_pre) is None:
        start = time.perf_counter()
        rates = measure_reference(cfg, inputs.policy_path, prompts, exp.reference_n_pre)
        save_reference(path, cfg.model.path, prompts, exp.reference_n_pre, rates)
        (exp.runs_path / f"reference-seed{seed}.json").write_text(json.dumps(
            {"seconds": time.perf_counter() - start, "prompts": len(prompts), "n_pre": exp.reference_n_pre}))
    return path


def measure_reference(cfg, policy_path: str, prompts: list, n_pre: int, chunk: int = 256) -> dict[str, float]:
    """Mean verified reward of n_pre samples of each prompt from the initial policy (one process, HF engine)."""
    from pcl.engines import SamplingParams, make_engine
    from pcl.progress import Progress
    from pcl.reward.verdict import response_reward

    engine = make_engine(cfg.rollout.model_copy(update={"engine": "hf"}), policy_path, cfg.run.seed, device="cpu")
    params = SamplingParams.from_rollout_config(cfg.rollout, n=n_pre)
    rates = {}
    with Progress(len(prompts), f"reference pass rates ({n_pre} samples each)", "prompt") as bar:
        for start in range(0, len(prompts), chunk):
            batch = prompts[start:start + chunk]
            for p, group in zip(batch, engine.generate([list(p.prompt_token_ids) for p in batch], params)):
                rewards = [response_reward(g.finish_reason, g.text, p.answer) for g in group]
                rates[p.id] = sum(rewards) / len(rewards)
            bar.update(len(batch))
    return rates
