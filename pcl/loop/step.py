"""One training step of Prompt Curriculum Learning, read top-down as the paper's algorithm.

    record = StepLoop(cfg, strategy, prompts, scorer, rollouts, learner, run_dir).train_step(step)

Each step, in as many generation rounds as the selection strategy asks for (`pcl.strategies.base`), all with
the step's policy version:

    1. draw candidates from the prompt sampler             prompts.sample(k * m)
    2. V predicts their pass rates (prompt only)           scorer.score(...)
    3. the strategy selects what to generate               e.g. the m closest to tau
    4. generate n responses each and 5. verify them        rollouts.generate_rollouts(...)
until the strategy's batch of m prompts is ready; then
    6. group-mean advantages, 7. one policy-gradient step  learner.train(...)
    8. V's step on the batch's realised pass rates         scorer.train(...), beside 7
    9. the new weights to the rollout fleet                learner.sync_weights(version + 1)
and the step's metrics record. Besides the batch, V's explained-variance probe: once a step, a random
unfiltered sample of the scored candidates is rolled out too, to measure how well V predicts (PCL only).

Everything outside the algorithm is behind the ports of `pcl.loop.ports`; the schedule around the steps
(evaluations, checkpoints, pauses, the time budget) is `pcl.loop.run`.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import numpy as np

from pcl.loop.ahead import GenerationAhead
from pcl.loop.batch import group_samples, training_sequences
from pcl.config import Config
from pcl.data.prompts import PromptRecord
from pcl.engines.request import SamplingParams
from pcl.loop.ports import Clock, Learner, Prompts, Rollouts, Scorer, SystemClock
from pcl.loop.reference import reference_pass_rates
from pcl.loop.state import LoopState
from pcl.loop.resume import resume_strategy
from pcl.rl import IMPORTANCE_RATIO_KEYS, effective_ratio, explained_variance
from pcl.loop.record import StepRecord, check_keys
from pcl.loop.rounds import RoundLedger, StepBatch
from pcl.strategies.base import Request, Rollout, StepStrategy


class StepTimer(dict):
    """Named durations of a step on the loop's clock: `with timer("generation_seconds"): ...`."""

    def __init__(self, clock: Clock):
        super().__init__()
        self.clock = clock

    @contextmanager
    def __call__(self, name: str):
        check_keys([name], "StepTimer")  # a duration is a field of the step record
        start = self.clock.monotonic()
        try:
            yield
        finally:
            self[name] = self.get(name, 0.0) + self.clock.monotonic() - start


class StepLoop:
    """The algorithm, one step at a time, on its ports; its state survives a restart through `state_dict`."""

    def __init__(self, cfg: Config, strategy: StepStrategy, prompts: Prompts, scorer: Scorer | None, rollouts: Rollouts,
                 learner: Learner, run_dir: str, clock: Clock | None = None):
        self.cfg, self.strategy, self.run_dir = cfg, strategy, run_dir
        self.prompts, self.scorer, self.rollouts, self.learner = prompts, scorer, rollouts, learner
        self.clock = clock or SystemClock()
        self.sampling = SamplingParams.from_rollout_config(cfg.rollout, n=cfg.run.n)  # every round's; n per rollout
        self.state = LoopState(cfg.run.seed)
        self.reference: dict[str, float] | None = None  # initial policy's pass rate by prompt id (when known)
        self.last_ids: list[str] = []  # the prompts the last step trained on
        self.last_indices: list[list[int]] = []  # the sample indices of each of them (selections.jsonl)
        self.last_versions: list[list[int]] = []  # the policy version that generated each of those samples
        staleness = cfg.run.max_staleness
        self.ahead = GenerationAhead(self, staleness) if staleness else None  # asynchronous steps

    @property
    def policy_version(self) -> int:
        return self.state.policy_version

    # -- the algorithm ---------------------------------------------------------------------------------------

    def train_step(self, step: int) -> StepRecord:
        """Step `step` (0-based) with the configured selection strategy; returns the step's metrics record."""
        m, n, timer = self.cfg.run.m, self.cfg.run.n, StepTimer(self.clock)
        with timer("step_seconds"):
            self.prepare_reference(timer)  # once: the initial policy's pass rates, where the strategy needs them
            batch = self.next_batch(step, timer)  # 1-5. candidates, V, selection, verified responses
            self.last_ids = batch.ids
            samples = batch.ledger.samples_of(batch.ids)
            by_prompt = [batch.ledger.samples_of([pid]) for pid in batch.ids]
            self.last_indices = [[s.sample_index for s in group] for group in by_prompt]
            self.last_versions = [[s.policy_version for s in group] for group in by_prompt]
            groups = group_samples(samples, batch.ids, n)
            if self.ahead is not None:  # asynchronous: step + s's batch is generated while this one trains
                self.ahead.start(step, timer)
            with timer("train_seconds"):  # 6-7. group-mean advantages, one policy-gradient step; 8. train V
                value_step = self.train_value(batch.prompts, groups.pass_rates)
                sequences = training_sequences(groups, self.cfg.learner.off_policy.correction)
                learn = self.learner.train(sequences, global_count=m * n)
                value_stats = value_step.result() if value_step is not None else {}
            waits = self.ahead.finish(timer) if self.ahead is not None else {}
            with timer("weight_sync_seconds"):  # 9.
                self.sync_weights(self.policy_version + 1)
        record = StepRecord(
            step=step + 1, policy_version=self.policy_version,
            effective_ratio=effective_ratio(_tensor(groups.rewards)), train_reward_mean=float(groups.rewards.mean()),
            probe_seconds=batch.probe_seconds,
            selected_value_mean=_mean([batch.values[i] for i in batch.ids if i in batch.values]),
            value_explained_variance=self.probe_explained_variance(batch),
            selected_pass_rate_mean=float(groups.pass_rates.mean()),
            selected_reference_pass_rate_mean=_mean([self.reference[i] for i in batch.ids if i in self.reference]),
            generation_rounds=batch.ledger.rounds, samples_generated=batch.ledger.generated - batch.probe_samples,
            probe_samples=batch.probe_samples, prefetch_hits=self.state.prefetch_hits,
            grad_norm=learn.get("grad_norm"), policy_loss=learn.get("loss"), train_sequences=len(sequences),
            learner_padding_ratio=learn.get("learner_padding_ratio"),
            batch_samples=len(samples),  # m*n, each (prompt, sample index) exactly once:
            batch_unique_samples=len({(x.prompt_id, x.sample_index) for x in samples}))
        record.update({**timer, **value_stats, **self.strategy.metrics(), **self.rollouts.counters(), **waits})
        record.batch_staleness = self.policy_version - 1 - batch.version  # 0 in synchronous steps
        gaps = ("logprob_gap_mean", "logprob_gap_max")  # the learner's, where the engine reported log-probs
        record.update({f"rollout_{key}": learn[key] for key in gaps if key in learn})
        record.update({key: learn[key] for key in IMPORTANCE_RATIO_KEYS if key in learn})  # with a correction
        return record

    def next_batch(self, step: int, timer: StepTimer) -> StepBatch:
        """This step's batch: collected now (synchronous steps), or generated during step - s (asynchronous)."""
        return self.ahead.take(step, timer) if self.ahead is not None else self.collect_batch(step, timer)

    def collect_batch(self, step: int, timer: StepTimer) -> StepBatch:
        """Steps 1-5 in the rounds the strategy asks for, all generated by this step's policy: draw (and score)
        candidates, let the strategy choose what to generate, generate and verify, show it the rewards; until
        its batch is ready. Sample indices continue across rounds (the ledger), so records never collide."""
        strategy, batch = self.strategy, StepBatch(RoundLedger(), version=self.policy_version)
        batch.ledger.carry_in(strategy.start_step(step))  # SPEED's D_accepted from earlier steps (carry_over)
        while not strategy.ready:
            rollouts, probe = self.select(step, batch, timer)  # 1-3.
            requests = self.round_requests(rollouts, probe, batch)
            start = self.clock.monotonic()
            samples = self.rollouts.generate_rollouts(step, self.policy_version, requests)  # 4-5.
            self.account_generation(batch, len(probe), requests, self.clock.monotonic() - start, timer)
            self.observe(batch, rollouts, samples)
        batch.prompts = strategy.end_step(batch.ledger.samples_of)  # SPEED keeps D_accepted's samples
        return batch

    def select(self, step: int, batch: StepBatch, timer: StepTimer) -> tuple[list[Rollout], list[PromptRecord]]:
        """Steps 1-3 for one round: candidates, V's predictions of them, the strategy's rollouts; and the probe's
        prompts when it is due."""
        strategy = self.strategy
        with timer("selection_seconds"):
            candidates, values = self.candidates(strategy.next_request())  # 1-2. candidates, V(x)
            rollouts = strategy.propose(candidates, values)  # 3. e.g. the m closest to tau
            if values is not None:  # V's predictions of this round's candidates, for the record
                batch.values.update({c.id: float(v) for c, v in zip(candidates, values)})
            probe = self.choose_probe(candidates, values, rollouts, batch) if self.probe_due(step) else []
            if strategy.needs.prefetch:
                self.prefetch_candidates()  # the next step's, scored while this one generates
        return rollouts, probe

    def round_requests(self, wanted: list[Rollout], probe: list[PromptRecord], batch: StepBatch) -> list:
        """A round's requests: the strategy's rollouts and the probe's in one call (the probe adds no round trip)."""
        return batch.ledger.reserve(wanted + [Rollout(p, self.cfg.run.n) for p in probe], self.sampling)

    def account_generation(self, batch: StepBatch, probes: int, requests: list, seconds: float,
                           timer: StepTimer) -> None:
        """The probe's share of a generation call's seconds, by sample count, is the probe's, not generation's, so
        `generation_seconds` measures the same work for every strategy."""
        probe_samples = probes * self.cfg.run.n
        total = sum(r.n for r in requests)
        probe_seconds = seconds * probe_samples / total if total else 0.0
        batch.probe_samples += probe_samples
        batch.probe_seconds += probe_seconds
        timer["generation_seconds"] = timer.get("generation_seconds", 0.0) + seconds - probe_seconds

    def observe(self, batch: StepBatch, rollouts: list[Rollout], samples: list) -> None:
        """A round's verified samples into the batch; the strategy sees its rollouts' rewards."""
        batch.ledger.add(samples)
        rewards = batch.ledger.round_rewards(samples)
        batch.probe_rates += [float(rewards[i].mean()) for i in batch.probe_ids[len(batch.probe_rates):]]
        self.strategy.observe({r.prompt.id: rewards[r.prompt.id] for r in rollouts})

    # -- the pieces ------------------------------------------------------------------------------------------

    def candidates(self, request: Request) -> tuple[list[PromptRecord], np.ndarray | None]:
        """A round's fresh candidates and, when asked, V's predicted pass rates (prompt only): the ones drawn and
        scored during the previous step when they fit the request (pipelined selection), else drawn now."""
        prefetched, self.state.prefetched = self.state.prefetched, None
        if prefetched is not None and request.score and len(prefetched[0]) == request.draw:
            self.state.prefetch_hits += 1
            return prefetched[0], np.asarray(prefetched[1].result())
        if request.draw == 0:
            return [], None
        candidates = self.prompts.sample(request.draw)
        if not request.score:
            return candidates, None
        return candidates, np.asarray(self._scorer().score([c.prompt_token_ids for c in candidates]).result())

    def prefetch_candidates(self) -> None:
        """Draw the next step's candidates now and have V score them while this step generates. V then scores
        them before it trains on this step's results: one update staler than without pipelining."""
        candidates = self.prompts.sample(self.strategy.needs.prefetch)
        self.state.prefetched = (candidates, self._scorer().score([c.prompt_token_ids for c in candidates]))

    def train_value(self, selected: list[PromptRecord], pass_rates: np.ndarray):
        """Start V's step on the selected prompts (step 8); runs beside the policy step."""
        if not self.strategy.needs.values:
            return None
        return self._scorer().train([p.prompt_token_ids for p in selected], pass_rates.tolist())

    def sync_weights(self, version: int) -> None:
        """The rollout fleet serves `version` from here on."""
        self.learner.sync_weights(version)
        self.state.policy_version = version

    def probe_due(self, step: int) -> bool:
        """V's explained-variance probe runs on every `value.ev_every`-th step (the first included): it is
        monitoring, and its rollouts cost the step time they take."""
        return step % self.cfg.value.ev_every == 0

    def choose_probe(self, candidates: list[PromptRecord], values: np.ndarray | None, rollouts: list,
                     batch: StepBatch) -> list[PromptRecord]:
        """A random, unfiltered sample of the scored candidates (once a step), rolled out with n responses to
        measure V's explained variance; returns those the strategy is not generating already."""
        if values is None or batch.probe_ids or not len(candidates):
            return []
        size = min(self.cfg.value.ev_sample, len(candidates))
        idx = np.sort(self.state.rng.choice(len(candidates), size=size, replace=False)) if size else []
        batch.probe_ids = [candidates[i].id for i in idx]
        generating = {r.prompt.id for r in rollouts}
        return [candidates[i] for i in idx if candidates[i].id not in generating]

    def probe_explained_variance(self, batch: StepBatch) -> float | None:
        """1 - Var(p - V)/Var(p) over the probes of the last few steps (a single step's 32 are noisy)."""
        if not batch.probe_ids:
            return None
        self.state.add_probe(np.array([batch.values[i] for i in batch.probe_ids]), np.array(batch.probe_rates))
        v_all = np.concatenate([v for v, _ in self.state.probes])
        p_all = np.concatenate([q for _, q in self.state.probes])
        ev = explained_variance(_tensor(p_all), _tensor(v_all))
        return None if not np.isfinite(ev) else float(ev)

    def prepare_reference(self, timer: StepTimer) -> None:
        """Once, before the first step: the initial policy's pass rates of the training prompts, when the
        strategy filters on them (prefilter) or the run directory has them (`pcl.loop.reference`)."""
        if self.reference is not None:
            return
        n_pre = self.strategy.needs.reference_rollouts
        self.reference = reference_pass_rates(self.rollouts, self.prompts, self.run_dir, self.cfg.model.path, n_pre,
                                              self.policy_version, self.sampling, timed=timer)
        if n_pre:
            self.strategy.load_reference(self.reference)

    def _scorer(self) -> Scorer:
        if self.scorer is None:
            raise RuntimeError(f"selection strategy {self.strategy.name!r} asked for V's scores, and this run "
                               "has no value model")
        return self.scorer

    # -- state -----------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The loop's state and its ports' (JSON): what `state.json` of a checkpoint holds."""
        return {
            **self.state.state_dict(),
            "strategy_type": self.cfg.selection.type,
            "sampler": self.prompts.state_dict(),
            "strategy": self.strategy.state_dict(),
            **self.rollouts.state_dict(),
            **({"ahead": self.ahead.state_dict()} if self.ahead is not None else {}),
        }

    def check_state(self, state: dict[str, Any], source: str = "the state") -> None:
        """A ValueError when `state` was written by a run of another selection strategy."""
        if state["strategy_type"] != self.cfg.selection.type:
            raise ValueError(f"{source}: written by a {state['strategy_type']!r} run; this run's selection.type "
                             f"is {self.cfg.selection.type!r}")

    def load_state_dict(self, state: dict[str, Any], checkpoint: str | None = None) -> None:
        """Continue from `state_dict`'s output: the sampler's cursor, the strategy, every RNG and counter; the
        rollout fleet is given the learner's weights (restored beforehand) as the state's policy version. From a
        `checkpoint`, this run's selection settings meet the checkpoint's by the resume rule (`pcl.loop.resume`)."""
        self.check_state(state)
        self.prompts.load_state_dict(state["sampler"])
        if checkpoint is None:
            self.strategy.load_state_dict(state["strategy"])
        else:
            resume_strategy(self.strategy, state["strategy"], self.cfg.selection, checkpoint, int(state["step"]))
        self.state.load_state_dict(state, self.prompts.records() if state.get("prefetched") else None)
        if self.ahead is not None:
            self.ahead.load_state_dict(state.get("ahead", []), self.prompts.records())
        elif state.get("ahead"):
            raise ValueError(f"the state holds {len(state['ahead'])} batches generated ahead (run.max_staleness > 0); "
                             "this run has run.max_staleness = 0: resume it with the checkpoint's run.max_staleness")
        self.sync_weights(self.policy_version)
        self.rollouts.load_state_dict(state)  # after the weights, as the engines' sampling state was saved


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def _tensor(a):
    import torch

    return torch.as_tensor(np.asarray(a, dtype=np.float64))
