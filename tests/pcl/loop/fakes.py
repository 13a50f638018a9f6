"""In-memory implementations of the step loop's ports (`pcl.loop.ports`): no Ray, no Redis, no model.

A world of prompts with known pass rates: rewards are Bernoulli draws that are a pure function of (prompt,
sample index, policy version), so two loops in the same state generate the same samples; V predicts the true
pass rate; generation advances a fake clock by a fixed time per sample, so durations are exact. The policy's
step takes `learner_seconds` of that clock, V's step `value_seconds` running beside the caller (its result is ready
that long after it started).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from pcl.samples import Sample
from pcl.config import Config, validate_tree
from pcl.data.prompts import PromptRecord
from pcl.engines.request import RolloutRequest
from pcl.loop.ports import Ready

SECONDS_PER_SAMPLE = 0.01


def config(selection: dict, **sections: dict) -> Config:
    """A small run: m=4 prompts of n=4 samples, V's probe of 6 candidates."""
    run = {"name": "fake", "seed": 0, "steps": 3, "m": 4, "n": 4, "eval_every": 0, "time_budget_s": None,
           **sections.pop("run", {})}
    tree = {"run": run, "selection": selection, "value": {"ev_sample": 6}, "model": {"path": "fake-policy"},
            "checkpoint": {"every": 0, "keep": 2}, **sections}
    return validate_tree(tree, "test")


def world(count: int = 40) -> tuple[list[PromptRecord], dict[str, float]]:
    """Prompts p0..p{count-1}, their true pass rates cycling through 0, 0.25, 0.5, 0.75, 1."""
    records = [PromptRecord(f"p{i}", f"{i}+1", str(i + 1), f"{i}+1=", (5, i + 3)) for i in range(count)]
    return records, {p.id: [0.0, 0.25, 0.5, 0.75, 1.0][i % 5] for i, p in enumerate(records)}


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Later:
    """Work running beside the caller on the fake clock: done `seconds` after it started; `result()` waits until
    then (advancing the clock when the caller gets there sooner)."""

    def __init__(self, clock: FakeClock, seconds: float, value: Any):
        self.clock, self.done_at, self.value = clock, clock.now + seconds, value

    def result(self) -> Any:
        self.clock.now = max(self.clock.now, self.done_at)
        return self.value


class FakePrompts:
    """A seeded shuffle with a cursor, distinct within a draw (the sampler's contract)."""

    def __init__(self, records: list[PromptRecord], seed: int = 0):
        self.prompts, self.seed, self.cursor = records, seed, 0
        self.drawn: list[list[str]] = []  # the ids of each draw

    def _index(self, position: int) -> int:
        epoch, offset = divmod(position, len(self.prompts))
        return int(np.random.default_rng([self.seed, epoch]).permutation(len(self.prompts))[offset])

    def sample(self, count: int) -> list[PromptRecord]:
        seen: dict[int, None] = {}
        while len(seen) < count:
            seen.setdefault(self._index(self.cursor), None)
            self.cursor += 1
        self.drawn.append([self.prompts[i].id for i in seen])
        return [self.prompts[i] for i in seen]

    def records(self) -> list[PromptRecord]:
        return list(self.prompts)

    def state_dict(self) -> dict[str, Any]:
        return {"cursor": self.cursor}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cursor = int(state["cursor"])


class FakeScorer:
    """V = the true pass rate; records what it was trained on."""

    def __init__(self, rates: dict[str, float], records: list[PromptRecord], clock: FakeClock | None = None,
                 seconds: float = 0.0):
        self.by_tokens = {tuple(p.prompt_token_ids): rates[p.id] for p in records}
        self.trained: list[list[float]] = []
        self.steps = 0
        self.clock, self.seconds = clock or FakeClock(), seconds  # each step's duration, beside the caller

    def score(self, prompt_token_ids: Sequence[Sequence[int]]) -> Ready:
        return Ready(np.array([self.by_tokens[tuple(t)] for t in prompt_token_ids]))

    def train(self, prompt_token_ids: Sequence[Sequence[int]], pass_rates: Sequence[float]) -> Later:
        self.trained.append(list(pass_rates))
        self.steps += 1
        return Later(self.clock, self.seconds, {"value_loss": float(np.mean(pass_rates)),
                                                "value_steps": float(self.steps), "value_train_seconds": self.seconds})

    def save(self, directory: str) -> None:
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / "v.json").write_text(json.dumps({"steps": self.steps}))

    def load(self, directory: str) -> None:
        self.steps = json.loads((Path(directory) / "v.json").read_text())["steps"]


class FakeRollouts:
    """Verified samples with Bernoulli(pass rate) rewards keyed by (prompt, index, version); records each call."""

    def __init__(self, rates: dict[str, float], clock: FakeClock):
        self.rates, self.clock = rates, clock
        self.calls: list[dict] = []
        self.samples_total = 0

    def reward(self, prompt_id: str, index: int, version: int) -> float:
        digest = hashlib.blake2b(f"{prompt_id}|{index}|{version}".encode(), digest_size=4).digest()
        return float(int.from_bytes(digest, "little") / 2**32 < self.rates[prompt_id])

    def generate_rollouts(self, step: int, policy_version: int, requests: Sequence[RolloutRequest], tag: str = "",
                          on_progress=None) -> list[Sample]:
        out = [Sample(r.prompt_id, i, r.prompt_token_ids, (7, 8), self.reward(r.prompt_id, i, policy_version), "stop",
                      policy_version=policy_version)
               for r in requests for i in r.indices]
        self.calls.append({"step": step, "version": policy_version, "tag": tag, "samples": len(out),
                           "prompts": [r.prompt_id for r in requests], "sampling": {r.sampling for r in requests}})
        self.clock.advance(SECONDS_PER_SAMPLE * len(out))
        if tag == "":
            self.samples_total += len(out)
        return out

    def counters(self) -> dict[str, int]:
        return {"samples_total": self.samples_total}

    def state_dict(self) -> dict[str, Any]:
        return {"rollout_counters": {"totals": {"samples_total": self.samples_total}}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.samples_total = int(state["rollout_counters"]["totals"]["samples_total"])


class FakeLearner:
    """Counts its steps; the 'weights' are the number of steps taken. A step takes `seconds` of `clock`."""

    def __init__(self, clock: FakeClock | None = None, seconds: float = 0.0) -> None:
        self.clock, self.seconds = clock or FakeClock(), seconds
        self.steps = 0
        self.trained: list[tuple[int, int]] = []  # (sequences, global_count) of each step
        self.synced: list[int] = []

    def train(self, sequences: Sequence[dict], global_count: int) -> dict[str, float]:
        self.steps += 1
        self.trained.append((len(sequences), global_count))
        self.clock.advance(self.seconds)
        return {"loss": 0.1 * self.steps, "grad_norm": float(len(sequences)), "learner_padding_ratio": 0.25}

    def sync_weights(self, version: int) -> None:
        self.synced.append(version)

    def save(self, directory: str) -> None:
        (Path(directory) / "learner.json").write_text(json.dumps({"steps": self.steps}))

    def load(self, directory: str) -> None:
        self.steps = json.loads((Path(directory) / "learner.json").read_text())["steps"]


class FakeControl:
    """Scripted step boundaries: `plan[step]` may hold {"pause": seconds, "tau": .., "k": .., "checkpoint": id,
    "checkpoint_in_pause": id}; applies them as `services.control.run.RunControl` does."""

    def __init__(self, clock: FakeClock, plan: dict[int, dict] | None = None):
        self.clock, self.plan = clock, plan or {}
        self.published: list[dict] = []
        self.request: str | None = None
        self.done: list[tuple[str | None, str]] = []
        self.finished: int | None = None

    def at_step_boundary(self, step: int, strategy, on_checkpoint=None) -> float:
        action = self.plan.get(step, {})
        for key in ("tau", "k"):
            if key in action:
                setattr(strategy, key, action[key])
        self.request = action.get("checkpoint", self.request)
        if "pause" in action:
            self.clock.advance(action["pause"] / 2)
            if "checkpoint_in_pause" in action:
                self.request = action["checkpoint_in_pause"]
                on_checkpoint()
            self.clock.advance(action["pause"] / 2)
            return action["pause"]
        return 0.0

    def publish(self, record: dict, policy_version: int) -> None:
        self.published.append(record)

    def checkpoint_requested(self) -> str | None:
        return self.request

    def checkpoint_done(self, request_id: str | None, path: str) -> None:
        self.done.append((request_id, path))
        self.request = None

    def snapshot(self) -> dict:
        return {"tau": None}

    def finish(self, steps_done: int) -> None:
        self.finished = steps_done


def closest_to(tau: float, chosen: list[str], candidates: list[str], rates: dict[str, float]) -> bool:
    """Whether `chosen` are len(chosen) of `candidates` closest to tau (V is exact here)."""
    rest = [abs(rates[i] - tau) for i in candidates if i not in chosen]
    return set(chosen) <= set(candidates) and max(abs(rates[i] - tau) for i in chosen) <= min(rest, default=1.0)


class FakeFleet:
    """A run on the fakes: the ports, the loop and its schedule (`TrainingRun`)."""

    def __init__(self, run_dir: str | Path, cfg: Config, plan: dict[int, dict] | None = None,
                 held_out: int = 0, suite: dict[str, list[PromptRecord]] | None = None, count: int = 40,
                 learner_seconds: float = 0.0, value_seconds: float = 0.0):
        from pcl.loop import Evaluation, StepLoop, TrainingRun
        from pcl.strategies import make_strategy

        self.cfg, self.run_dir = cfg, str(run_dir)
        self.records, self.rates = world(count)
        self.clock = FakeClock()
        self.prompts = FakePrompts(self.records)
        self.scorer = FakeScorer(self.rates, self.records, self.clock, value_seconds)
        self.rollouts = FakeRollouts(self.rates, self.clock)
        self.learner = FakeLearner(self.clock, learner_seconds)
        self.control = FakeControl(self.clock, plan)
        self.strategy = make_strategy(cfg.selection, cfg.run.m, cfg.run.seed, n=cfg.run.n)
        scorer = self.scorer if self.strategy.needs_values else None
        self.loop = StepLoop(cfg, self.strategy, self.prompts, scorer, self.rollouts, self.learner, self.run_dir,
                             self.clock)
        evaluation = Evaluation(cfg, self.rollouts, self.run_dir, self.records[:held_out], suite)
        self.run = TrainingRun(cfg, self.run_dir, self.loop, evaluation, self.control)
