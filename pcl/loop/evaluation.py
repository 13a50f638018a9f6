"""Evaluation during training, through the `Rollouts` port: held-out accuracy and the paper's benchmark suite.

    evaluation = Evaluation(cfg, rollouts, run_dir, held_out_prompts, suite)
    record.update(evaluation.after_step(step, policy_version))   # eval_accuracy(_se), suite_<name>, suite_average

Held-out accuracy is the mean verified reward of `run.eval_samples` samples per held-out prompt, every
`run.eval_every` steps, or each time another `run.eval_every_s` seconds of training have passed (and at step 0
and the last step, or the step that spends `run.train_budget_s`). The suite is avg@k of each benchmark with the
same k and decoding as `pcl eval`, every `evaluation.every` steps and at the last step. Their time is not training
time: the run excludes it from `train_elapsed_seconds`.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from pcl.config import Config
from pcl.data.prompts import PromptRecord
from pcl.benchmarks import accuracy_with_se, avg_at_k, eval_plan, parse_k
from pcl.engines.request import RolloutRequest, SamplingParams
from pcl.loop.ports import Rollouts
from pcl.progress import reporter


class Evaluation:
    def __init__(self, cfg: Config, rollouts: Rollouts, run_dir: str, held_out: list[PromptRecord],
                 suite: dict[str, list[PromptRecord]] | None = None):
        self.cfg, self.rollouts, self.run_dir = cfg, rollouts, run_dir
        self.held_out_prompts = held_out
        self.suite = suite or {}
        self.next_at: float | None = None  # with run.eval_every_s: the training seconds of the next evaluation

    def held_out_due(self, step: int, train_seconds: float = 0.0, last: bool = False) -> bool:
        """Whether held-out accuracy is measured after `step` steps (1-based; 0 is before the first), with
        `train_seconds` of training done; `last`: the run stops after this step."""
        every, every_s = self.cfg.run.eval_every, self.cfg.run.eval_every_s
        if step == 0:
            return self.cfg.run.evaluates_held_out
        if every_s:
            if self.next_at is None:  # the first step of a run, or of a resumed one
                self.next_at = every_s if step == 1 else (train_seconds // every_s + 1) * every_s
            due = train_seconds >= self.next_at or last or step == self.cfg.run.steps
            if due:
                self.next_at = (train_seconds // every_s + 1) * every_s
            return due
        return bool(every and (step % every == 0 or last)) or step == self.cfg.run.steps

    def suite_due(self, step: int) -> bool:
        return bool(self.suite) and (step % self.cfg.evaluation.every == 0 or step == self.cfg.run.steps)

    def after_step(self, step: int, policy_version: int, train_seconds: float = 0.0,
                   last: bool = False) -> dict[str, float]:
        """The evaluations due after `step` steps, as record keys (none when none is due)."""
        out = {}
        if self.held_out_due(step, train_seconds, last):
            out.update(self.held_out(step, policy_version))
        if step and self.suite_due(step):
            out.update(self.run_suite(step, policy_version))
        return out

    def held_out(self, step: int, policy_version: int) -> dict[str, float]:
        """Held-out accuracy (mean verified reward of `run.eval_samples` samples per held-out prompt) and its
        standard error over prompts: `eval_accuracy`, `eval_accuracy_se`."""
        if not self.held_out_prompts:
            return {"eval_accuracy": float("nan")}
        requests = RolloutRequest.for_prompts(self.held_out_prompts, self.held_out_sampling())
        samples = self.rollouts.generate_rollouts(step, policy_version, requests, tag="eval",
                                                  on_progress=reporter(self.run_dir, "held-out evaluation"))
        rewards: dict[str, list[float]] = {}
        for sample in samples:
            rewards.setdefault(sample.prompt_id, []).append(sample.reward)
        accuracy, se = accuracy_with_se(list(rewards.values()))
        return {"eval_accuracy": accuracy, "eval_accuracy_se": se}

    def held_out_sampling(self) -> SamplingParams:
        """`run.eval_samples` samples per prompt with the rollout settings, at `run.eval_temperature` when set."""
        run = self.cfg.run
        sampling = SamplingParams.from_rollout_config(self.cfg.rollout, n=run.eval_samples)
        return sampling if run.eval_temperature is None else replace(sampling, temperature=run.eval_temperature)

    def run_suite(self, step: int, policy_version: int) -> dict[str, float]:
        """avg@k of each benchmark as `suite_<name>`, and their mean as `suite_average`."""
        ks, plan = parse_k(dict(self.cfg.evaluation.k), list(self.suite)), eval_plan(self.cfg)
        out = {}
        for name, prompts in self.suite.items():
            requests = RolloutRequest.for_prompts(prompts, plan.sampling_params(ks[name]))  # `pcl eval`'s decoding
            samples = self.rollouts.generate_rollouts(step, policy_version, requests, tag="suite",
                                                      on_progress=reporter(self.run_dir, f"evaluation {name}"))
            rewards: dict[str, list[float]] = {}
            for sample in samples:
                rewards.setdefault(sample.prompt_id, []).append(sample.reward)
            out[f"suite_{name}"] = avg_at_k(list(rewards.values()))
        out["suite_average"] = float(np.mean(list(out.values())))
        return out
