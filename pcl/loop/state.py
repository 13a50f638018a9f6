"""What the step loop keeps across steps and restarts: its counters and RNG (`LoopState`) and the run's two
clocks (`RunClock`). Both go into a checkpoint's `state.json` under the keys below, and come back from it.

The two clocks of a run, both across resumes and without the time spent paused:

    elapsed_seconds        wall-clock seconds of training, held-out and suite evaluations and checkpoint writes
                           included (what `run.time_budget_s` is measured against)
    train_elapsed_seconds  the same without evaluations and checkpoint writes: the paper's time axis, the time
                           the method itself took (generation, selection, V, the policy step, weight syncs, and
                           the reference pass of `prefilter`)
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from pcl.data.prompts import PromptRecord
from pcl.loop.curriculum_window import CurriculumWindow
from pcl.loop.ports import Clock, Pending, Ready
from pcl.loop.skipped import SkippedPolicySteps

PROBE_WINDOW = 4  # steps whose probes V's explained variance is measured over (one step's are noisy)


@dataclass
class LoopState:
    """The step loop's own state (JSON types in `state_dict`)."""

    seed: int
    step: int = 0  # steps done (the next step's 0-based index)
    policy_version: int = 0  # the weights the rollout fleet serves
    prefetch_hits: int = 0  # steps whose candidates were drawn and scored during the previous step
    skipped: SkippedPolicySteps = field(default_factory=SkippedPolicySteps)  # policy steps the learner skipped
    probes: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)  # (V, p) of recent probes
    prefetched: tuple[list[PromptRecord], Pending] | None = None  # next step's candidates, V's scores
    prefetched_value_version: int | None = None  # V's version when it scored them
    value_version: int | None = None  # the policy version whose rollouts V last trained on (None: not yet)
    curriculum: CurriculumWindow = field(default_factory=CurriculumWindow)  # the curriculum's figures, pooled
    rng: np.random.Generator = field(init=False)  # draws V's explained-variance probe

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed + 7919)

    def add_probe(self, values: np.ndarray, rates: np.ndarray) -> None:
        self.probes = (self.probes + [(values, rates)])[-PROBE_WINDOW:]

    def state_dict(self) -> dict[str, Any]:
        prefetched = None
        if self.prefetched is not None:
            candidates, values = self.prefetched
            prefetched = {"ids": [c.id for c in candidates], "values": np.asarray(values.result()).tolist(),
                          "value_version": self.prefetched_value_version}
        return {
            "step": self.step,
            "policy_version": self.policy_version,
            "rng": self.rng.bit_generator.state,
            "probes": [[v.tolist(), p.tolist()] for v, p in self.probes],
            "prefetched": prefetched,
            "prefetch_hits": self.prefetch_hits,
            "value_version": self.value_version,
            "curriculum": self.curriculum.state_dict(),
            **self.skipped.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any], records: list[PromptRecord] | None = None) -> None:
        """`records` (the training set) resolve the prefetched candidates' ids; needed when there are some."""
        self.rng.bit_generator.state = state["rng"]
        self.step, self.policy_version = int(state["step"]), int(state["policy_version"])
        self.probes = [(np.asarray(v), np.asarray(p)) for v, p in state["probes"]]
        self.prefetched = None
        if state.get("prefetched"):
            by_id = {p.id: p for p in records or []}
            missing = [i for i in state["prefetched"]["ids"] if i not in by_id]
            if missing:
                raise ValueError(f"the state's prefetched candidates {missing[:3]} are not in the training set")
            candidates = [by_id[i] for i in state["prefetched"]["ids"]]
            self.prefetched = (candidates, Ready(np.asarray(state["prefetched"]["values"])))
            self.prefetched_value_version = state["prefetched"].get("value_version")
        self.prefetch_hits = int(state["prefetch_hits"])
        self.value_version = state.get("value_version")  # absent from checkpoints written before it was kept
        self.curriculum.load_state_dict(state.get("curriculum"))
        self.skipped.load_state_dict(state)


class RunClock:
    """Seconds of a run across resumes: the wall clock (pauses excluded) and the training clock (evaluations
    and checkpoint writes excluded too).

        clock.start()                         # when this process starts training
        with clock.paused():                  # a step boundary with the control plane: counts on neither clock
            ...
        with clock.excluded():                # an evaluation or a checkpoint write: not training time
            ...
        clock.elapsed(), clock.train_elapsed()

    A block inside another (a checkpoint written during a pause) is not counted twice.
    """

    def __init__(self, clock: Clock):
        self.clock = clock
        self.elapsed_offset = 0.0  # seconds of either clock before this process took over (a resumed run)
        self.train_offset = 0.0
        self.started: float | None = None
        self.stopped = {"paused": 0.0, "excluded": 0.0}  # seconds of each kind of block, this process
        self.since: dict[str, float] = {}  # the kind of block the clock is in, and since when

    def now(self) -> float:
        return self.clock.monotonic()

    def start(self) -> None:
        self.started, self.stopped, self.since = self.now(), {"paused": 0.0, "excluded": 0.0}, {}

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Time inside counts on neither clock."""
        with self._block("paused"):
            yield

    @contextmanager
    def excluded(self) -> Iterator[None]:
        """Time inside is wall-clock time, not training time."""
        with self._block("excluded"):
            yield

    @contextmanager
    def _block(self, kind: str) -> Iterator[None]:
        if self.since:  # inside another block: that one counts the time
            yield
            return
        self.since = {kind: self.now()}
        try:
            yield
        finally:
            self.stopped[kind] += self.now() - self.since.pop(kind)

    def _stopped(self, kind: str, now: float) -> float:
        return self.stopped[kind] + (now - self.since[kind] if kind in self.since else 0.0)

    def elapsed(self) -> float:
        """Wall-clock seconds of training so far, across resumes, pauses excluded."""
        if self.started is None:
            return self.elapsed_offset
        now = self.now()
        return self.elapsed_offset + now - self.started - self._stopped("paused", now)

    def train_elapsed(self) -> float:
        """Training seconds so far, across resumes: pauses, evaluations and checkpoint writes excluded."""
        if self.started is None:
            return self.train_offset
        now = self.now()
        return self.train_offset + now - self.started - self._stopped("paused", now) - self._stopped("excluded", now)

    def state_dict(self) -> dict[str, float]:
        return {"elapsed_seconds": self.elapsed(), "train_elapsed_seconds": self.train_elapsed()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A checkpoint written before the training clock existed continues it from its wall clock."""
        self.elapsed_offset = float(state["elapsed_seconds"])
        self.train_offset = float(state.get("train_elapsed_seconds", self.elapsed_offset))
        self.started = None
