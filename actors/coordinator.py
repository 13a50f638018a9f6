"""The coordinator actor: drives training one step at a time, exactly as DESIGN.md section 1 reads.

It owns no model. Each step it asks the sampler for candidates, the value scorer for their predicted pass
rates, lets the selection strategy choose, sends the chosen prompts to the rollout fleet through the request
stream, collects exactly one verified sample per (prompt, sample index) from the reward stream, has the learner
group take one optimizer step, syncs the new weights to the fleet, trains V, and appends the step's metrics to
`RUN_DIR/metrics.jsonl`.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any

import numpy as np
import ray

from pcl.batch import Sample, group_samples, training_sequences
from pcl.config import Config
from pcl.data import PromptRecord
from pcl.rl import effective_ratio, explained_variance
from pcl.runlog import MetricsLog
from pcl.strategies import make_strategy


class StepTimer(dict):
    """Collects named wall-clock durations of a step: `with timer("generation_seconds"): ...`."""

    @contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self[name] = self.get(name, 0.0) + time.perf_counter() - start


@ray.remote(num_cpus=0, max_restarts=0)
class Coordinator:
    def __init__(self, cfg: dict, run_dir: str, fleet: dict, eval_prompts: list[PromptRecord]):
        from services.fleet import RolloutClient  # noqa: PLC0415 - keeps redis out of import time

        self.cfg = Config.model_validate(cfg)
        self.run_dir = run_dir
        self.sampler, self.scorer = fleet["sampler"], fleet["scorer"]
        self.learners, self.workers = fleet["learners"], fleet["rollout_workers"]
        self.rollouts = RolloutClient(self.cfg, fleet["redis_url"])
        self.eval_prompts = eval_prompts
        self.strategy = make_strategy(self.cfg.selection, self.cfg.run.m, self.cfg.run.seed)
        self.log = MetricsLog(run_dir)
        self.rng = np.random.default_rng(self.cfg.run.seed + 7919)
        self.policy_version = 0
        self.probes: list[tuple[np.ndarray, np.ndarray]] = []  # (V, p) of recent unfiltered probes
        self.step = 0

    # -- the algorithm ---------------------------------------------------------------------------------------

    def train_step(self, step: int) -> dict[str, Any]:
        """One PCL step (DESIGN 1.1-1.8); returns the step's metrics record."""
        cfg, timer = self.cfg, StepTimer()
        m, n = cfg.run.m, cfg.run.n
        with timer("step_seconds"):
            with timer("selection_seconds"):
                candidates = ray.get(self.sampler.sample.remote(self.strategy.pool_size))  # 1. k*m candidates
                values = self.score(candidates)  # 2. V(x), prompt only
                chosen = self.strategy.select(values, m)  # 3. the m closest to tau
            selected = [candidates[i] for i in chosen]
            probe = self.choose_probe(candidates, chosen)
            with timer("generation_seconds"):  # 4-5. n responses each, verified
                samples = self.rollouts.generate(step, self.policy_version, selected + probe["extra"], n)
            groups = group_samples([s for s in samples if s.prompt_id in {p.id for p in selected}],
                                   [p.id for p in selected], n)
            with timer("train_seconds"):  # 6-7. group-mean advantages, one policy-gradient step; 8. train V
                value_ref = self.train_value(selected, groups.pass_rates)
                sequences = training_sequences(groups)
                learn = self.learners.train(sequences, global_count=m * n)
                value_stats = ray.get(value_ref) if value_ref is not None else {}
            with timer("weight_sync_seconds"):
                self.sync_weights(self.policy_version + 1)
        record = {
            "step": step + 1,
            "policy_version": self.policy_version,
            "effective_ratio": effective_ratio(_tensor(groups.rewards)),
            "train_reward_mean": float(groups.rewards.mean()),
            **timer,
            "selected_value_mean": float(np.mean(values[chosen])) if values is not None else None,
            "value_explained_variance": self.probe_explained_variance(probe, samples, values),
            "selected_pass_rate_mean": float(groups.pass_rates.mean()),
            "grad_norm": learn.get("grad_norm"),
            "policy_loss": learn.get("loss"),
            "train_sequences": len(sequences),
            **value_stats,
            **self.strategy.metrics(),
            **self.rollouts.counters(),
        }
        return record

    def run(self) -> dict[str, Any]:
        """Evaluate at step 0, then train until run.steps (or the time budget); returns a summary."""
        cfg = self.cfg
        start = time.monotonic()
        if cfg.run.eval_every:
            self.log.append({"step": 0, "eval_accuracy": self.evaluate(0), "policy_version": self.policy_version})
        steps_done = 0
        for step in range(self.step, cfg.run.steps):
            if cfg.run.time_budget_s and time.monotonic() - start > cfg.run.time_budget_s:
                break
            record = self.train_step(step)
            if cfg.run.eval_every and (step + 1) % cfg.run.eval_every == 0 or step + 1 == cfg.run.steps:
                record["eval_accuracy"] = self.evaluate(step + 1)
            record["elapsed_seconds"] = time.monotonic() - start
            self.log.append(record)
            self.step = step + 1
            steps_done += 1
        return {"steps": self.step, "steps_this_run": steps_done, "seconds": time.monotonic() - start}

    # -- the pieces ------------------------------------------------------------------------------------------

    def score(self, candidates: list[PromptRecord]) -> np.ndarray | None:
        """V's predicted pass rate of every candidate, when the strategy needs them."""
        if not self.strategy.needs_values:
            return None
        return np.asarray(ray.get(self.scorer.score.remote([c.prompt_token_ids for c in candidates])))

    def train_value(self, selected: list[PromptRecord], pass_rates: np.ndarray):
        """Start V's step on the selected prompts (DESIGN 1.8); runs beside the policy step."""
        if not self.strategy.needs_values:
            return None
        return self.scorer.train.remote([p.prompt_token_ids for p in selected], pass_rates.tolist())

    def choose_probe(self, candidates: list[PromptRecord], chosen: np.ndarray) -> dict:
        """A random, unfiltered sample of the candidates, rolled out to measure V's explained variance."""
        size = min(self.cfg.value.ev_sample, len(candidates)) if self.strategy.needs_values else 0
        idx = np.sort(self.rng.choice(len(candidates), size=size, replace=False)) if size else np.array([], int)
        chosen_set = set(int(i) for i in chosen)
        return {"indices": idx, "ids": [candidates[i].id for i in idx],
                "extra": [candidates[i] for i in idx if int(i) not in chosen_set]}

    def probe_explained_variance(self, probe: dict, samples: list[Sample], values: np.ndarray | None) -> float | None:
        """1 - Var(p - V)/Var(p) over the probes of the last few steps (a single step's 32 are noisy)."""
        if values is None or len(probe["indices"]) == 0:
            return None
        rewards: dict[str, list[float]] = {}
        for s in samples:
            rewards.setdefault(s.prompt_id, []).append(s.reward)
        p = np.array([np.mean(rewards[pid]) for pid in probe["ids"]])
        self.probes = (self.probes + [(values[probe["indices"]], p)])[-4:]
        v_all = np.concatenate([v for v, _ in self.probes])
        p_all = np.concatenate([q for _, q in self.probes])
        ev = explained_variance(_tensor(p_all), _tensor(v_all))
        return None if not np.isfinite(ev) else float(ev)

    def sync_weights(self, version: int) -> None:
        """Push the learner's new weights to every rollout worker; from here on they serve `version`."""
        ref = self.learners.state_ref()
        ray.get([w.load_weights.remote(ref, version) for w in self.workers], timeout=self.cfg.learner.timeout_s)
        self.policy_version = version

    def evaluate(self, step: int) -> float:
        """Held-out accuracy: mean verified reward of `run.eval_samples` samples per held-out prompt."""
        if not self.eval_prompts:
            return float("nan")
        samples = self.rollouts.generate(step, self.policy_version, self.eval_prompts, self.cfg.run.eval_samples,
                                         temperature=self.cfg.run.eval_temperature, evaluation=True)
        return float(np.mean([s.reward for s in samples]))


def _tensor(a):
    import torch

    return torch.as_tensor(np.asarray(a, dtype=np.float64))
