"""The coordinator actor: drives training one step at a time, exactly as DESIGN.md section 1 reads.

It owns no model. Each step it asks the sampler for candidates, the value scorer for their predicted pass
rates, lets the selection strategy choose (in as many generation rounds as the strategy asks for: see
`pcl.strategies.base`), sends the chosen prompts to the rollout fleet through the request stream, collects
exactly one verified sample per (prompt, sample index) from the reward stream, has the learner group take one
optimizer step, syncs the new weights to the fleet, trains V, and appends the step's metrics to
`RUN_DIR/metrics.jsonl` (and the prompt ids it trained on to `RUN_DIR/selections.jsonl`).

Checkpoints (`pcl.checkpoint` has the layout) are written every `checkpoint.every` steps, when the control plane
asks, and at the end; `restore()` puts a run back exactly where a checkpoint left it. While it waits for a
step's samples it gives the current weights to any rollout worker that Ray restarted.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import ray

from actors.runtime import gather
from pcl import checkpoint as ckpt
from pcl.batch import group_samples, training_sequences
from pcl.config import Config, dump_config, redacted
from pcl.data import PromptRecord
from pcl.progress import write_progress
from pcl.rl import effective_ratio, explained_variance
from pcl.rounds import RoundLedger
from pcl.runlog import METRICS_FILE, SELECTIONS_FILE, MetricsLog
from pcl.strategies import Request, make_strategy
from pcl.strategies.reference import REFERENCE_FILE, load_reference, pass_rates, save_reference
from services.tracking import TRACKERS_FILE  # the tracker run ids, kept with each checkpoint

REFERENCE_CHUNK = 1024  # prompts per generation call of the reference pass
BEST_FILE = "best.json"  # the best checkpoint by the evaluation suite's average
log = logging.getLogger(__name__)


class StepTimer(dict):
    """Collects named wall-clock durations of a step: `with timer("generation_seconds"): ...`."""

    @contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self[name] = self.get(name, 0.0) + time.perf_counter() - start


@dataclass
class StepBatch:
    """What a step's rounds produced: every sample (the ledger), the strategy's batch, V's scores, the probe."""

    ledger: RoundLedger
    prompts: list[PromptRecord] = field(default_factory=list)  # the m prompts trained on, in order
    values: dict[str, float] = field(default_factory=dict)  # V(x) of every scored candidate, by prompt id
    probe_ids: list[str] = field(default_factory=list)  # the unfiltered probe of V's explained variance
    probe_rates: list[float] = field(default_factory=list)  # their realised pass rates, in the same order

    @property
    def ids(self) -> list[str]:
        return [p.id for p in self.prompts]


@ray.remote(num_cpus=0, max_restarts=0)
class Coordinator:
    def __init__(self, cfg: dict, run_dir: str, fleet: dict, eval_prompts: list[PromptRecord],
                 suite: dict[str, list[PromptRecord]] | None = None):
        from services.rollout_client import RolloutClient  # noqa: PLC0415 - keeps redis out of import time
        from services.run_control import RunControl  # noqa: PLC0415

        self.cfg = Config.model_validate(cfg)
        self.run_dir = run_dir
        self.sampler, self.scorer = fleet["sampler"], fleet["scorer"]
        self.learners, self.workers = fleet["learners"], fleet["rollout_workers"]
        self.rollouts = RolloutClient(self.cfg, fleet["redis_url"])
        self.eval_prompts = eval_prompts
        self.strategy = make_strategy(self.cfg.selection, self.cfg.run.m, self.cfg.run.seed, n=self.cfg.run.n)
        self.log = MetricsLog(run_dir)
        self.selections = MetricsLog(run_dir, SELECTIONS_FILE)
        self.policy_path = fleet.get("policy_path")
        # The first checkpoint's size, before there is one to measure (checked against the free space).
        models = (self.policy_path, fleet.get("value_path") if self.scorer is not None else None)
        self.state_bytes = ckpt.state_bytes_estimate([p for p in models if p])
        self.weights_ref = None  # the weights of policy_version in the object store (None: the initial ones)
        self.broadcast = _weight_broadcast(self.cfg, self.learners, self.workers)  # None: the rpc route
        self.elapsed_offset = 0.0  # training seconds before this process took over (a resumed run)
        self.clock_start: float | None = None
        self.last_checkpoint_step: int | None = None
        self.worker_reloads = 0  # weights given to rollout workers Ray restarted
        self.last_ids: list[str] = []
        self.suite = suite or {}  # the paper's benchmarks, evaluated every evaluation.every steps
        best = Path(run_dir) / BEST_FILE
        self.best = json.loads(best.read_text()) if best.is_file() else None  # {step, average, checkpoint, ...}
        self.rng = np.random.default_rng(self.cfg.run.seed + 7919)
        self.policy_version = 0
        self.probes: list[tuple[np.ndarray, np.ndarray]] = []  # (V, p) of recent unfiltered probes
        self.prefetched: tuple[list[PromptRecord], Any] | None = None  # next step's candidates, V's scores (ref)
        self.reference: dict[str, float] | None = None  # initial policy's pass rate by prompt id (when known)
        self.prefetch_hits = 0  # steps whose candidates were drawn and scored during the previous step
        self.step = 0
        self.control = RunControl.for_coordinator(self.cfg, fleet)  # pause, tau / k, status, heartbeat
        self.checkpoint_requested = self.control.checkpoint_requested  # -> pending request id or None

    # -- the algorithm ---------------------------------------------------------------------------------------

    def train_step(self, step: int) -> dict[str, Any]:
        """One step (DESIGN 1.1-1.8) with the configured selection strategy; returns the step's metrics record."""
        m, n, timer = self.cfg.run.m, self.cfg.run.n, StepTimer()
        with timer("step_seconds"):
            self.prepare_reference(timer)  # once: the initial policy's pass rates, where the strategy needs them
            batch = self.collect_batch(step, timer)  # 1-5. candidates, V, selection, verified responses
            self.last_ids = batch.ids
            samples = batch.ledger.samples_of(batch.ids)
            groups = group_samples(samples, batch.ids, n)
            with timer("train_seconds"):  # 6-7. group-mean advantages, one policy-gradient step; 8. train V
                value_ref = self.train_value(batch.prompts, groups.pass_rates)
                sequences = training_sequences(groups)
                learn = self.learners.train(sequences, global_count=m * n)
                value_stats = self.get(value_ref) if value_ref is not None else {}
            with timer("weight_sync_seconds"):
                self.sync_weights(self.policy_version + 1)
        return {
            "step": step + 1,
            "policy_version": self.policy_version,
            "effective_ratio": effective_ratio(_tensor(groups.rewards)),
            "train_reward_mean": float(groups.rewards.mean()),
            **timer,
            "selected_value_mean": _mean([batch.values[i] for i in batch.ids if i in batch.values]),
            "value_explained_variance": self.probe_explained_variance(batch),
            "selected_pass_rate_mean": float(groups.pass_rates.mean()),
            "selected_reference_pass_rate_mean": _mean([self.reference[i] for i in batch.ids if i in self.reference]),
            "generation_rounds": batch.ledger.rounds,
            "samples_generated": batch.ledger.generated,
            "prefetch_hits": self.prefetch_hits,
            "worker_reloads": self.worker_reloads,
            "grad_norm": learn.get("grad_norm"),
            "policy_loss": learn.get("loss"),
            "train_sequences": len(sequences),
            "batch_samples": len(samples),  # m*n, each (prompt, sample index) exactly once:
            "batch_unique_samples": len({(x.prompt_id, x.sample_index) for x in samples}),
            **value_stats,
            **self.strategy.metrics(),
            **self.rollouts.counters(),
        }

    def collect_batch(self, step: int, timer: StepTimer) -> StepBatch:
        """DESIGN 1.1-1.5 in the rounds the strategy asks for, all generated by this step's policy: draw (and
        score) candidates, let the strategy choose what to generate, generate and verify, show it the rewards;
        until its batch is ready. Sample indices continue across rounds (the ledger), so records never collide."""
        strategy, batch = self.strategy, StepBatch(RoundLedger())
        strategy.begin_step(step)
        batch.ledger.carry_in(strategy.carried_samples())  # SPEED's D_accepted from earlier steps (carry_over)
        while not strategy.ready:
            with timer("selection_seconds"):
                candidates, values = self.candidates(strategy.next_request())  # 1-2. candidates, V(x)
                rollouts = strategy.propose(candidates, values)  # 3. e.g. the m closest to tau
                probe = self.choose_probe(candidates, values, rollouts, batch)
                if strategy.pipelined:
                    self.prefetch_candidates()  # the next step's, scored while this one generates
            with timer("generation_seconds"):  # 4-5. responses, verified
                wanted = batch.ledger.reserve([(r.prompt, r.n) for r in rollouts] +
                                              [(p, self.cfg.run.n) for p in probe])
                samples = self.rollouts.generate_rollouts(step, self.policy_version, wanted, on_wait=self.check_fleet)
            batch.ledger.add(samples)
            rewards = batch.ledger.round_rewards(samples)
            batch.probe_rates += [float(rewards[i].mean()) for i in batch.probe_ids[len(batch.probe_rates):]]
            strategy.observe({r.prompt.id: rewards[r.prompt.id] for r in rollouts})
        batch.prompts = strategy.finish_step()
        strategy.carry(batch.ledger.samples_of(strategy.carry_ids))
        return batch

    def run(self) -> dict[str, Any]:
        """Evaluate at step 0, then train until run.steps (or the time budget), checkpointing on schedule, on
        request and at the end; returns a summary."""
        cfg = self.cfg
        self.clock_start = time.monotonic() - self.elapsed_offset
        if cfg.run.eval_every and self.step == 0:
            first = {"step": 0, **self.evaluate(0), "policy_version": self.policy_version}
            self.log.append(first)
            self.control.publish(first, self.policy_version)
        steps_done = 0
        for step in range(self.step, cfg.run.steps):
            # blocks while paused (pauses aren't budget); a checkpoint asked for meanwhile is written at once
            self.clock_start += self.control.at_step_boundary(step, self.strategy, self.checkpoint_on_request)
            self.checkpoint_on_request()  # asked for while the last step ran
            if cfg.run.time_budget_s and self.elapsed() > cfg.run.time_budget_s:
                break
            record = self.train_step(step)
            if cfg.run.eval_every and (step + 1) % cfg.run.eval_every == 0 or step + 1 == cfg.run.steps:
                record.update(self.evaluate(step + 1))
            suite_due = self.suite and ((step + 1) % cfg.evaluation.every == 0 or step + 1 == cfg.run.steps)
            if suite_due:
                record.update(self.evaluate_suite(step + 1))
            record["elapsed_seconds"] = self.elapsed()
            self.log.append(record)
            self.selections.append({"step": step + 1, "ids": self.last_ids})
            self.control.publish(record, self.policy_version)
            self.step = step + 1
            steps_done += 1
            if cfg.checkpoint.every and self.step % cfg.checkpoint.every == 0:
                self.save_checkpoint()
            if suite_due:
                self.track_best(record)
        if self.last_checkpoint_step != self.step:
            self.save_checkpoint()
        self.control.finish(self.step)
        return {"steps": self.step, "steps_this_run": steps_done, "seconds": self.elapsed(),
                "checkpoint": str(ckpt.latest(self.checkpoint_root))}

    def get(self, ref):
        """ray.get with the run's deadline for a remote call (learner.timeout_s): a call never waits forever."""
        return ray.get(ref, timeout=self.cfg.learner.timeout_s)

    def elapsed(self) -> float:
        """Training seconds of the run so far, across resumes, pauses excluded."""
        return time.monotonic() - self.clock_start if self.clock_start is not None else self.elapsed_offset

    # -- checkpoints -----------------------------------------------------------------------------------------

    @property
    def checkpoint_root(self) -> Path:
        return (Path(self.run_dir) / "checkpoints").resolve()

    def checkpoint_on_request(self) -> None:
        """Write a checkpoint if the control plane asked for one, and tell it where."""
        request = self.control.checkpoint_requested()
        if request is not None:
            self.control.checkpoint_done(request, self.save_checkpoint())

    def save_checkpoint(self) -> str:
        """Everything the run needs to continue exactly from this step boundary, written atomically (see
        `pcl.checkpoint`); the oldest beyond checkpoint.keep are deleted. Returns the checkpoint's path."""
        started = time.perf_counter()
        root, run_dir = self.checkpoint_root, Path(self.run_dir)
        ckpt.check_free_space(root, self.step, self.state_bytes)  # a clear error, before writing anything
        with ckpt.writing(root, self.step) as tmp:  # a failed write (a full disk) leaves no partial checkpoint
            self.learners.save_checkpoint(str(tmp))
            if self.scorer is not None:
                self.get(self.scorer.save_checkpoint.remote(str(tmp / "value")))
            if self.policy_path:
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(self.cfg.model.tokenizer or self.policy_path)
                tokenizer.save_pretrained(tmp / "policy")
            ckpt.write_json(tmp / "state.json", self.state_dict())
            ckpt.write_json(tmp / "control.json", self.control.snapshot())
            for name in (METRICS_FILE, SELECTIONS_FILE, REFERENCE_FILE, TRACKERS_FILE):
                if (run_dir / name).is_file():
                    shutil.copy2(run_dir / name, tmp / name)
            (tmp / "config.yaml").write_text(dump_config(redacted(self.cfg, token_mask=None)))
            final = ckpt.commit(tmp, root, self.step, {"policy_version": self.policy_version,
                                                        "strategy": self.cfg.selection.type,
                                                        "write_seconds": round(time.perf_counter() - started, 3)})
        ckpt.prune(root, self.cfg.checkpoint.keep, protect=((self.best or {}).get("checkpoint"),))
        self.last_checkpoint_step = self.step
        log.info("checkpoint %s written in %.1fs", final, time.perf_counter() - started)
        return str(final)

    def state_dict(self) -> dict[str, Any]:
        """The coordinator's own state and the sampler's, strategy's and rollout engines' (JSON)."""
        prefetched = None
        if self.prefetched is not None:
            candidates, values = self.prefetched
            prefetched = {"ids": [c.id for c in candidates], "values": np.asarray(self.get(values)).tolist()}
        return {
            "step": self.step,
            "policy_version": self.policy_version,
            "strategy_type": self.cfg.selection.type,
            "elapsed_seconds": self.elapsed(),
            "rng": self.rng.bit_generator.state,
            "sampler": self.get(self.sampler.state_dict.remote()),
            "strategy": self.strategy.state_dict(),
            "probes": [[v.tolist(), p.tolist()] for v, p in self.probes],
            "prefetched": prefetched,
            "prefetch_hits": self.prefetch_hits,
            "worker_reloads": self.worker_reloads,
            "rollout_counters": {"dropped": dict(self.rollouts.dropped), "totals": dict(self.rollouts.totals)},
            "engines": gather([w.rng_state.remote() for w in self.workers], self.cfg.learner.timeout_s,
                              "rollout engine state"),
        }

    def restore(self, checkpoint: str) -> dict[str, Any]:
        """Put the run back where `checkpoint` left it: policy and optimizer, V, the sampler's cursor, the
        strategy, every RNG, the counters; the rollout fleet gets the checkpoint's weights. Metrics and
        selections of later steps (from the run that went on past it) are dropped from the run directory."""
        path = Path(checkpoint).resolve()
        state = json.loads((path / "state.json").read_text())
        if state["strategy_type"] != self.cfg.selection.type:
            raise ValueError(f"checkpoint {path}: written by a {state['strategy_type']!r} run; this run's "
                             f"selection.type is {self.cfg.selection.type!r}")
        self.learners.load_checkpoint(str(path))
        if self.scorer is not None and (path / "value").is_dir():
            self.get(self.scorer.load_checkpoint.remote(str(path / "value")))
        self.get(self.sampler.load_state_dict.remote(state["sampler"]))
        self.strategy.load_state_dict(state["strategy"])
        self.rng.bit_generator.state = state["rng"]
        self.step, self.policy_version = int(state["step"]), int(state["policy_version"])
        self.elapsed_offset = float(state["elapsed_seconds"])
        self.probes = [(np.asarray(v), np.asarray(p)) for v, p in state["probes"]]
        if state.get("prefetched"):
            by_id = {p.id: p for p in self.get(self.sampler.records.remote())}
            candidates = [by_id[i] for i in state["prefetched"]["ids"]]
            self.prefetched = (candidates, ray.put(np.asarray(state["prefetched"]["values"])))
        self.prefetch_hits = int(state["prefetch_hits"])
        self.worker_reloads = int(state.get("worker_reloads", 0))
        self.rollouts.dropped.update(state["rollout_counters"]["dropped"])
        self.rollouts.totals.update(state["rollout_counters"]["totals"])
        run_dir = Path(self.run_dir)
        if (path / REFERENCE_FILE).is_file() and not (run_dir / REFERENCE_FILE).is_file():
            shutil.copy2(path / REFERENCE_FILE, run_dir / REFERENCE_FILE)
        self.sync_weights(self.policy_version)
        if len(state["engines"]) == len(self.workers):
            gather([w.load_rng_state.remote(e) for w, e in zip(self.workers, state["engines"])],
                   self.cfg.learner.timeout_s, "rollout engine state")
        self.log.truncate_after(self.step)
        self.selections.truncate_after(self.step)
        self.last_checkpoint_step = self.step
        return {"step": self.step, "policy_version": self.policy_version, "checkpoint": str(path)}

    # -- the pieces ------------------------------------------------------------------------------------------

    def candidates(self, request: Request) -> tuple[list[PromptRecord], np.ndarray | None]:
        """A round's fresh candidates and, when asked, V's predicted pass rates (prompt only): the ones drawn and
        scored during the previous step when they fit the request (pipelined selection), else drawn now."""
        prefetched, self.prefetched = self.prefetched, None
        if prefetched is not None and request.score and len(prefetched[0]) == request.draw:
            self.prefetch_hits += 1
            return prefetched[0], np.asarray(self.get(prefetched[1]))
        if request.draw == 0:
            return [], None
        candidates = self.get(self.sampler.sample.remote(request.draw))
        if not request.score:
            return candidates, None
        return candidates, np.asarray(self.get(self.scorer.score.remote([c.prompt_token_ids for c in candidates])))

    def prefetch_candidates(self) -> None:
        """Draw the next step's candidates now and have V score them while this step generates. V then scores
        them before it trains on this step's results: one update staler than without pipelining."""
        candidates = self.get(self.sampler.sample.remote(self.strategy.pool_size))
        self.prefetched = (candidates, self.scorer.score.remote([c.prompt_token_ids for c in candidates]))

    def train_value(self, selected: list[PromptRecord], pass_rates: np.ndarray):
        """Start V's step on the selected prompts (DESIGN 1.8); runs beside the policy step."""
        if not self.strategy.needs_values:
            return None
        return self.scorer.train.remote([p.prompt_token_ids for p in selected], pass_rates.tolist())

    def choose_probe(self, candidates: list[PromptRecord], values: np.ndarray | None, rollouts: list,
                     batch: StepBatch) -> list[PromptRecord]:
        """A random, unfiltered sample of the scored candidates (once a step), rolled out with n responses to
        measure V's explained variance; returns those the strategy is not generating already."""
        if values is None or batch.probe_ids or not len(candidates):
            return []
        batch.values.update({c.id: float(v) for c, v in zip(candidates, values)})
        size = min(self.cfg.value.ev_sample, len(candidates))
        idx = np.sort(self.rng.choice(len(candidates), size=size, replace=False)) if size else []
        batch.probe_ids = [candidates[i].id for i in idx]
        generating = {r.prompt.id for r in rollouts}
        return [candidates[i] for i in idx if candidates[i].id not in generating]

    def probe_explained_variance(self, batch: StepBatch) -> float | None:
        """1 - Var(p - V)/Var(p) over the probes of the last few steps (a single step's 32 are noisy)."""
        if not batch.probe_ids:
            return None
        v = np.array([batch.values[i] for i in batch.probe_ids])
        self.probes = (self.probes + [(v, np.array(batch.probe_rates))])[-4:]
        v_all = np.concatenate([v for v, _ in self.probes])
        p_all = np.concatenate([q for _, q in self.probes])
        ev = explained_variance(_tensor(p_all), _tensor(v_all))
        return None if not np.isfinite(ev) else float(ev)

    def prepare_reference(self, timer: StepTimer) -> None:
        """Once, before the first step: the initial policy's pass rate of every training prompt, from n_pre
        rollouts each, when the strategy filters on them (prefilter); read from the run directory's cache, or
        generated and cached. A cache already there (the experiment runner writes one) is read whatever the
        strategy, so every run reports the reference difficulty of the prompts it selected."""
        if self.reference is not None:
            return
        n_pre, path = self.strategy.reference_rollouts, Path(self.run_dir) / REFERENCE_FILE
        self.reference = {}
        if not n_pre and not path.exists():
            return
        prompts = self.get(self.sampler.records.remote())
        rates = load_reference(path, self.cfg.model.path, prompts, n_pre or None)
        if rates is None and n_pre:
            if self.policy_version != 0:
                raise RuntimeError(f"{path}: no reference pass rates for these prompts with n_pre={n_pre}, and "
                                   f"the initial policy is gone (policy version {self.policy_version})")
            with timer("reference_seconds"):  # in chunks, so the streams never hold the whole set at once
                rates, started = {}, time.time()
                for start in range(0, len(prompts), REFERENCE_CHUNK):
                    chunk = [(p, n_pre, 0) for p in prompts[start:start + REFERENCE_CHUNK]]
                    progress = self.progress("reference pass rates", start * n_pre, len(prompts) * n_pre, started)
                    rates.update(pass_rates(self.rollouts.generate_rollouts(0, 0, chunk, tag="reference",
                                                                       on_wait=self.check_fleet,
                                                                       on_progress=progress)))
            save_reference(path, self.cfg.model.path, prompts, n_pre, rates)
        self.reference = rates or {}
        if n_pre:
            self.strategy.load_reference(self.reference)

    def sync_weights(self, version: int) -> None:
        """Push the learner's new weights to every rollout worker; from here on they serve `version`. A worker
        that dies meanwhile is restarted by Ray and the load retried on it."""
        if self.broadcast is not None:  # rollout.weight_sync: collective (the object store ref is made on demand)
            self.broadcast.sync(version)
            self.weights_ref, self.policy_version = None, version
            return
        ref = self.learners.state_ref()
        gather([w.load_weights.remote(ref, version) for w in self.workers], self.cfg.learner.timeout_s,
               "weight sync")
        self.weights_ref, self.policy_version = ref, version

    def check_fleet(self) -> None:
        """Give the current weights to rollout workers that lack them: one that Ray restarted after its process
        died holds the initial weights and serves nothing until then (at version 0, when those are current, it
        is only told to serve)."""
        refs = [w.policy_version.remote() for w in self.workers]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=2.0)
        for worker, ref in zip(self.workers, refs):
            if ref not in ready:
                continue  # restarting (its model is loading): seen at the next check
            try:
                version = ray.get(ref)
            except ray.exceptions.RayError:
                continue
            if version != self.policy_version and self.weights_ref is None and self.policy_version == 0:
                self.get(worker.serve.remote())  # version 0: its initial weights are current
            elif version != self.policy_version:
                log.warning("rollout worker holds policy version %s, not %s (restarted?): reloading its weights",
                            version, self.policy_version)
                if self.weights_ref is None:  # collective route: this worker takes them by rpc, and the
                    self.weights_ref = self.learners.state_ref()  # group re-forms with it at the next sync
                    self.broadcast.invalidate()
                self.get(worker.load_weights.remote(self.weights_ref, self.policy_version))
                self.worker_reloads += 1

    def evaluate_suite(self, step: int) -> dict[str, float]:
        """The paper's benchmarks with the current policy through the fleet: avg@k of each (the same suite, k and
        decoding as `pcl eval`), as `suite_<name>` and their mean as `suite_average`."""
        from pcl.evaluation import avg_at_k, parse_k

        ev = self.cfg.evaluation
        ks = parse_k(dict(ev.k), list(self.suite))
        sampling = {"top_p": ev.top_p, "top_k": ev.top_k, "max_new_tokens": ev.max_new_tokens}
        out = {}
        for name, prompts in self.suite.items():
            samples = self.rollouts.generate_rollouts(step, self.policy_version, [(p, ks[name], 0) for p in prompts],
                                                      temperature=ev.temperature, tag="suite", on_wait=self.check_fleet,
                                                      sampling=sampling, on_progress=self.progress(f"evaluation {name}"))
            rewards: dict[str, list[float]] = {}
            for sample in samples:
                rewards.setdefault(sample.prompt_id, []).append(sample.reward)
            out[f"suite_{name}"] = avg_at_k(list(rewards.values()))
        out["suite_average"] = float(np.mean(list(out.values())))
        return out

    def track_best(self, record: dict) -> None:
        """With evaluation.keep_best: a new best score (evaluation.best_by) gets a checkpoint (kept whatever
        checkpoint.keep) and RUN_DIR/best.json names it."""
        from pcl.evaluation import best_score

        best_by = self.cfg.evaluation.best_by
        score = best_score(record, best_by)
        if not self.cfg.evaluation.keep_best or (self.best and score <= self.best.get("score", self.best["average"])):
            return
        path = self.save_checkpoint() if self.last_checkpoint_step != self.step else \
            str(self.checkpoint_root / ckpt.step_dir_name(self.step))
        self.best = {"step": self.step, "best_by": best_by, "score": score, "average": record["suite_average"],
                     "checkpoint": path,
                     "scores": {k: v for k, v in record.items() if k.startswith("suite_")}}
        ckpt.write_json(Path(self.run_dir) / BEST_FILE, self.best)

    def evaluate(self, step: int) -> dict[str, float]:
        """Held-out accuracy (mean verified reward of `run.eval_samples` samples per held-out prompt) and its
        standard error over prompts: `eval_accuracy`, `eval_accuracy_se`."""
        from pcl.evaluation import accuracy_with_se

        if not self.eval_prompts:
            return {"eval_accuracy": float("nan")}
        samples = self.rollouts.generate(step, self.policy_version, self.eval_prompts, self.cfg.run.eval_samples,
                                         temperature=self.cfg.run.eval_temperature, evaluation=True,
                                         on_wait=self.check_fleet, on_progress=self.progress("held-out evaluation"))
        rewards: dict[str, list[float]] = {}
        for sample in samples:
            rewards.setdefault(sample.prompt_id, []).append(sample.reward)
        accuracy, se = accuracy_with_se(list(rewards.values()))
        return {"eval_accuracy": accuracy, "eval_accuracy_se": se}

    def progress(self, task: str, offset: int = 0, total: int | None = None, started: float | None = None):
        """A generate call's `on_progress`: the task's samples so far in RUN_DIR/progress.json (at most twice a
        second), which the driver shows as a bar or plain lines."""
        last, started = [0.0], started or time.time()

        def report(done: int, expected: int) -> None:
            now = time.monotonic()
            if now - last[0] >= 0.5 or done == expected:
                last[0] = now
                write_progress(self.run_dir, task, offset + done, total or expected, started)

        return report


def _weight_broadcast(cfg: Config, learners, workers):
    """The collective weight sync of `rollout.weight_sync: collective` (NCCL with GPUs, else gloo), or None."""
    if cfg.rollout.weight_sync != "collective":
        return None
    from actors.weight_broadcast import WeightBroadcast  # noqa: PLC0415

    gpus = cfg.learner.num_gpus_per_rank > 0 and cfg.rollout.num_gpus_per_worker > 0
    return WeightBroadcast(learners, workers, cfg.rollout, "nccl" if gpus else "gloo", cfg.learner.timeout_s)


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def _tensor(a):
    import torch

    return torch.as_tensor(np.asarray(a, dtype=np.float64))
