"""The step loop's ports (`pcl.loop.ports`) in one process, over the core classes the actors wrap.

    scorer   = LocalScorer(build_value_trainer(cfg.value, value_path, device, seed))   # V, as the value scorer actor
    rollouts = EngineRollouts(cfg, engine, RewardPool(...), answers)                   # a rollout worker + a verifier
    learner  = LocalLearner(cfg, learner_for_run(...), engine, policy_path)           # a learner rank + weight sync
    control  = NoControl()                                                             # no control plane

The prompts port is `pcl.data.sampler.PromptStream` itself. Each port makes the calls its actor makes, in the same
order: `EngineRollouts` cuts requests into engine calls as a one-worker fleet does (`pcl.engines.batching`), scores
them with the same reward pool and truncation rule, and returns the samples ordered as the stream collector does;
`LocalLearner` trains on the one shard a one-rank learner group gets. So a one-rank, one-worker run on Ray and its
`--local` twin see the same batches (`tests/actors/test_local_parity.py`). What a process holds instead of a fleet:
no streams (nothing is dropped, dead-lettered or redelivered), and the weights go from the learner to the engine by
an in-process copy (device to device on a GPU).
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from pcl.engines.batching import by_sampling, request_chunks, seeded
from pcl.engines.request import RolloutRequest
from pcl.loop.batch import shard_sequences
from pcl.samples import Sample
from pcl.loop.ports import OnProgress, Ready
from pcl.loop.record import StepRecord
from pcl.reward.errors import check_verifier_errors
from pcl.reward.verdict import TRUNCATED_REWARD, is_truncated

WORKER = "rollout-0"  # the one engine's name in rollout_samples_by_worker, as a one-worker fleet's
WEIGHT_GROUP_BYTES = 256 << 20  # the learner's weights are gathered this much at a time for the copy


class LocalScorer:
    """V (`pcl.models.value.ValueTrainer`) scored and trained in this process; its calls return when done."""

    def __init__(self, trainer):
        self.trainer = trainer

    def score(self, prompt_token_ids: Sequence[Sequence[int]]) -> Ready:
        return Ready(self.trainer.score([list(p) for p in prompt_token_ids]))

    def train(self, prompt_token_ids: Sequence[Sequence[int]], pass_rates: Sequence[float]) -> Ready:
        from pcl.models.value import value_step_figures

        start = time.perf_counter()
        stats = self.trainer.train_step([list(p) for p in prompt_token_ids], list(pass_rates))
        return Ready(value_step_figures(stats, time.perf_counter() - start))

    def save(self, directory: str) -> None:
        self.trainer.save_checkpoint(directory)

    def load(self, directory: str) -> None:
        self.trainer.load_checkpoint(directory)


class EngineRollouts:
    """Generation on one engine and verification by the reward pool (`pcl.reward.pool.RewardPool`), in this process.

    Every sample comes from the engine's current weights; a call for another policy version is refused (the
    on-policy invariant a rollout worker keeps by serving only its own version). Log-probabilities that are not
    finite numbers <= 0 are not asked for again, as a fleet does once (`services.streams.refusals`): the learner
    refuses them, naming the sequence (`pcl.models.micro_batches`), and the run stops."""

    def __init__(self, cfg, engine, pool, answers: Mapping[str, Any]):
        self.cfg, self.engine, self.pool, self.answers = cfg, engine, pool, answers
        self.totals: Counter[str] = Counter()  # samples, response tokens, verifier timeouts and errors: all calls
        self.by_worker: Counter[str] = Counter()  # the current step's own samples
        self._by_worker_step: int | None = None

    def generate_rollouts(self, step: int, policy_version: int, requests: Sequence[RolloutRequest], tag: str = "",
                          on_progress: OnProgress | None = None) -> list[Sample]:
        if not requests:
            return []
        if self.engine.policy_version != policy_version:
            raise RuntimeError(f"step {step}: samples of policy version {policy_version} asked for, the engine "
                               f"holds version {self.engine.policy_version}")
        missing = next((r.prompt_id for r in requests if r.prompt_id not in self.answers), None)
        if missing is not None:  # a fleet's verifiers dead-letter such a sample; here it is named at once
            raise KeyError(f"step {step}: no gold answer for prompt id {missing!r}")
        run = f"{self.cfg.run.name}:{tag}" if tag else self.cfg.run.name
        if self.cfg.rollout.deterministic:
            requests = seeded(requests, self.cfg.run.seed, run, step)
        expected, limit = sum(r.n for r in requests), self.cfg.rollout.max_in_flight
        generated = []  # (request, Generation) in generation order
        for chunk in request_chunks(list(requests), 1, limit):  # the stream entries a one-worker fleet takes
            for batch in by_sampling(chunk, limit):
                groups = self.engine.generate([list(r.prompt_token_ids) for r in batch], batch[0].sampling)
                generated += [(r, g) for r, gens in zip(batch, groups) for g in gens]
                if on_progress is not None:
                    on_progress(len(generated), expected)
        samples, outcomes = self._verify(step, generated)
        self._count(samples, outcomes, step, own=not tag)
        return sorted(samples, key=lambda s: (s.prompt_id, s.sample_index))  # the stream collector's order

    def _verify(self, step: int, generated: list) -> tuple[list[Sample], list]:
        """Rewards (algorithm step 5): a truncated response scores 0 unverified, the rest go to the pool; returns
        the samples and the pool's outcomes."""
        scored = [(r, g) for r, g in generated if not is_truncated(g.finish_reason)]
        outcomes = self.pool.score_batch([(g.text, self.answers[r.prompt_id]) for r, g in scored])
        verdict = {id(g): o for (_, g), o in zip(scored, outcomes)}
        samples = []
        for r, g in generated:
            outcome = verdict.get(id(g))
            reward = TRUNCATED_REWARD if outcome is None else float(outcome.reward)
            # log-probabilities in float32, as the streams carry them (pcl.engines: both engines report float32)
            logprobs = tuple(np.asarray(g.logprobs, dtype=np.float32).tolist()) if g.logprobs else None
            samples.append(Sample(r.prompt_id, r.first_index + g.sample_index, tuple(r.prompt_token_ids),
                                  tuple(g.token_ids), reward, g.finish_reason, logprobs, g.policy_version))
        return samples, outcomes

    def _count(self, samples: list[Sample], outcomes: list, step: int, own: bool) -> None:
        """A call's samples into the totals (verifier errors beyond verifier.max_error_share raise) and, for the
        step's own samples (`own`: its rounds and V's probe, not evaluations), into the per-worker count."""
        errors = sum(o.error is not None for o in outcomes)
        self.totals.update(samples_total=len(samples), verifier_errors_total=errors,
                           generated_tokens_total=sum(len(s.response_token_ids) for s in samples),
                           verifier_timeouts_total=sum(bool(o.timed_out) for o in outcomes))
        check_verifier_errors(step, errors, len(samples), self.cfg.verifier.max_error_share)
        if own:
            if self._by_worker_step != step:
                self.by_worker, self._by_worker_step = Counter(), step
            self.by_worker[WORKER] += len(samples)

    def counters(self) -> dict[str, Any]:
        out = {key: int(self.totals[key]) for key in ("samples_total", "generated_tokens_total",
                                                        "verifier_timeouts_total", "verifier_errors_total")}
        out["rollout_samples_by_worker"] = dict(self.by_worker)
        return out

    def state_dict(self) -> dict[str, Any]:
        """The fleet's keys of state.json (`actors.ports.StreamRollouts`), so either path resumes the other's."""
        return {"worker_reloads": 0, "rollout_counters": {"dropped": {}, "totals": dict(self.totals)},
                "engines": [{"calls": int(getattr(self.engine, "_calls", 0))}]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.totals = Counter(state["rollout_counters"]["totals"])
        engines = state.get("engines") or []
        if len(engines) == 1 and hasattr(self.engine, "_calls"):
            self.engine._calls = int(engines[0]["calls"])


class LocalLearner:
    """The policy learner at world size 1 (`pcl.models.learner.PolicyLearner`) and the engine it feeds."""

    def __init__(self, cfg, learner, engine, policy_path: str):
        self.cfg, self.learner, self.engine, self.policy_path = cfg, learner, engine, policy_path

    def train(self, sequences: Sequence[dict], global_count: int) -> dict[str, float]:
        start = time.perf_counter()
        stats = dict(self.learner.train_step(shard_sequences(sequences, 1)[0], global_count))
        stats["learner_wall_seconds"] = time.perf_counter() - start
        return stats

    def sync_weights(self, version: int) -> None:
        """The learner's weights into the engine, tensor by tensor as they are gathered (on a GPU, device to
        device); the engine serves `version` from here on."""
        self.engine.load_weights(self.learner.stream_weights(WEIGHT_GROUP_BYTES), version)
        if self.learner.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.learner.device)  # the copy's time is the weight sync's, not generation's

    def save(self, directory: str) -> None:
        """The learner's files, and the tokenizer beside the policy in Hugging Face format."""
        from pcl.data.inputs import load_tokenizer

        self.learner.save_checkpoint(directory)
        load_tokenizer(self.cfg, self.policy_path).save_pretrained(Path(directory) / "policy")

    def load(self, directory: str) -> None:
        self.learner.load_checkpoint(directory)


class NoControl:
    """The control port of a run without a control plane: nothing changes tau or k, nothing pauses."""

    def at_step_boundary(self, step: int, strategy: Any, on_checkpoint=None) -> float:
        return 0.0

    def publish(self, record: StepRecord, policy_version: int) -> None:
        pass

    def checkpoint_requested(self) -> str | None:
        return None

    def checkpoint_done(self, request_id: str | None, path: str) -> None:
        pass

    def snapshot(self) -> dict:
        return {}

    def finish(self, steps_done: int) -> None:
        pass
