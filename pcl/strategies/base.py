"""The interface every selection strategy implements, and the pieces several of them share.

A strategy decides, within one training step, what work to ask for and when the batch is ready. The step loop
(`pcl.loop.step`) sees it through `StepStrategy`, in rounds all generated with the step's policy version:

    needs = strategy.needs                                  # Needs(values, reference_rollouts, prefetch)
    strategy.load_reference(pass_rates)                     # once, before step 1, when needs.reference_rollouts
    carried = strategy.start_step(step)                     # samples carried in from earlier steps (SPEED)
    while not strategy.ready:
        request = strategy.next_request()                   # Request(draw=..., score=...)
        candidates = sampler.sample(request.draw)           # fresh candidates (none when draw == 0)
        values = scorer.score(candidates) if request.score else None
        rollouts = strategy.propose(candidates, values)     # [Rollout(prompt, n)]: what to generate now
        strategy.observe(rewards_by_prompt_id)              # this round's rewards of those prompts
    prompts = strategy.end_step(ledger.samples_of)          # the m prompts to train on, in order
    strategy.metrics(); strategy.state_dict(); strategy.load_state_dict(state)

`Strategy` implements that view over a subclass's hooks: `begin_step` and `finish_step` (`start_step` and
`end_step` call them; SPEED's carried samples live in its own `start_step` / `end_step`), `needs` from the
class's `needs_values`.

The strategy never sees Ray, Redis or a model: it holds plain `PromptRecord`s and reward arrays, so each is
unit-tested on its own. It keeps what must survive a restart in `state_dict()` / `load_state_dict()` (JSON
types only) and reports its figures in `metrics()`.

What a strategy needs from the run is written on its class, readable without building one (the driver places
the value scorer by `needs_values`): `needs_values`, `uses_reference`, `tunable` (the settings the control
plane may change between steps, with their bounds; `tune(**changes)` is the only way they change) and
`config` (its `selection:` section, whose `type` is the strategy's `name`). `from_config` builds one from that
section. The registry of strategies is derived from the config's `Selection` union (`pcl.strategies`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from pcl.data.prompts import PromptRecord
from pcl.samples import Sample


@dataclass(frozen=True)
class Request:
    """What the coordinator should do at the start of a round."""

    draw: int = 0  # fresh candidates to draw from the prompt sampler (0: none this round)
    score: bool = False  # whether the value model scores the drawn candidates


@dataclass(frozen=True)
class Rollout:
    """Generate n more responses for one prompt in this round (sample indices continue across rounds).

    train=False: an estimation rollout, whose rewards the strategy observes but which is never trained on."""

    prompt: PromptRecord
    n: int
    train: bool = True


@dataclass(frozen=True)
class Needs:
    """What a strategy needs from the run, beyond candidates and rollouts."""

    values: bool = False  # V scores candidates (and is trained on the batch)
    reference_rollouts: int = 0  # n_pre: rollouts per training prompt with the initial policy, before step 1
    prefetch: int = 0  # candidates the loop draws and V scores during a step, for the next one (0: none)


@runtime_checkable
class StepStrategy(Protocol):
    """The loop's view of a selection strategy: what `pcl.loop.step.StepLoop` calls, and nothing else."""

    name: str

    @property
    def needs(self) -> Needs: ...

    @property
    def ready(self) -> bool: ...

    def load_reference(self, pass_rates: Mapping[str, float]) -> None: ...

    def start_step(self, step: int) -> list[Sample]: ...

    def next_request(self) -> Request: ...

    def propose(self, candidates: Sequence[PromptRecord], values: np.ndarray | None) -> list[Rollout]: ...

    def observe(self, rewards: Mapping[str, np.ndarray]) -> None: ...

    def end_step(self, samples_of: Callable[[Sequence[str]], list[Sample]]) -> list[PromptRecord]: ...

    def metrics(self) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class Tunable:
    """A setting the control plane may change between steps: its type and closed bounds (None: unbounded)."""

    kind: type  # int or float
    low: float | None = None
    high: float | None = None

    def check(self, key: str, value: Any) -> int | float:
        """`value` as this setting's type, or a ValueError naming `key` and the bad value."""
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise ValueError(f"selection.{key}: expected a number, got {value!r}")
        if self.kind is int and float(value) != int(value):
            raise ValueError(f"selection.{key}: expected a whole number, got {value!r}")
        value = self.kind(value)
        if not math.isfinite(value) or (self.low is not None and value < self.low) or (
                self.high is not None and value > self.high):
            bounds = f"[{self.low if self.low is not None else '-inf'}, {self.high if self.high is not None else 'inf'}]"
            raise ValueError(f"selection.{key}: {value!r} is outside {bounds}")
        return value


class Strategy:
    """The base of every selection strategy: the round protocol and the per-step bookkeeping."""

    name: ClassVar[str] = "base"  # its section's `type` (set from `config`)
    config: ClassVar[type | None] = None  # its `selection:` section (a pcl.config model)
    needs_values: ClassVar[bool] = False  # whether the value model scores candidates (and is trained on the batch)
    uses_reference: ClassVar[bool] = False  # whether it filters on the initial policy's pass rates (prefilter)
    tunable: ClassVar[dict[str, Tunable]] = {}  # what tune() may change between steps
    adapted: ClassVar[tuple[str, ...]] = ()  # settings it adapts while training (config: the starting value)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("config") is not None:
            cls.name = cls.config.model_fields["type"].default

    def __init__(self, m: int, n: int):
        self.check_run(m, n)
        self.m, self.n = m, n
        self.step = -1
        self.round = 0  # rounds of this step so far

    # -- building one, and what it needs from the run -----------------------------------------------------

    @classmethod
    def from_config(cls, selection, m: int, n: int, seed: int = 0) -> "Strategy":
        """The strategy for its `selection:` section, for m prompts of n responses per step."""
        raise NotImplementedError

    @classmethod
    def check_run(cls, m: int, n: int, selection=None) -> None:
        """A ValueError naming the keys when `selection` does not fit a run of m prompts, n responses each."""
        if m < 1 or n < 1:
            raise ValueError(f"a selection strategy needs run.m >= 1 and run.n >= 1, got m={m}, n={n}")

    def tune(self, **changes: Any) -> dict[str, tuple[Any, Any]]:
        """Change tunable settings from the next step on: validates every change first (a ValueError names the
        bad key or value, and nothing is applied), then applies them. Returns {key: (old, new)} of those that
        changed value."""
        unknown = [key for key in changes if key not in self.tunable]
        if unknown:
            can = ", ".join(sorted(self.tunable)) or "nothing"
            raise ValueError(f"selection strategy {self.name!r} cannot tune {', '.join(map(repr, unknown))} "
                             f"(it can tune: {can})")
        checked = {key: self.tunable[key].check(key, value) for key, value in changes.items()}
        changed = {key: (getattr(self, key), value) for key, value in checked.items() if getattr(self, key) != value}
        for key, (_, value) in changed.items():
            setattr(self, key, value)
        return changed

    # -- the loop's view (`StepStrategy`) ---------------------------------------------------------------

    @property
    def needs(self) -> Needs:
        """What this strategy needs from the run (V's scores; the reference pass rates; prefetched candidates)."""
        return Needs(values=self.needs_values)

    def load_reference(self, pass_rates: Mapping[str, float]) -> None:
        """The initial policy's pass rate of every training prompt, once before step 1 (`needs.reference_rollouts`)."""

    def start_step(self, step: int) -> list[Sample]:
        """Begin step `step` (0-based); returns the samples of earlier steps that its rounds continue (none here)."""
        self.begin_step(step)
        return []

    def end_step(self, samples_of: Callable[[Sequence[str]], list[Sample]]) -> list[PromptRecord]:
        """The step's batch (`finish_step`); `samples_of(prompt ids)` gives the step's samples of those prompts,
        for a strategy that keeps some for the next step."""
        return self.finish_step()

    # -- the round protocol ----------------------------------------------------------------------------

    def begin_step(self, step: int) -> None:
        """Forget the previous step's work; `step` is 0-based."""
        self.step, self.round = step, 0

    @property
    def ready(self) -> bool:
        """Whether `finish_step` can return the batch."""
        raise NotImplementedError

    def next_request(self) -> Request:
        """Candidates to draw (and score) for the next round."""
        raise NotImplementedError

    def propose(self, candidates: Sequence[PromptRecord], values: np.ndarray | None) -> list[Rollout]:
        """Given this round's fresh candidates (and V's scores when requested): what to generate now."""
        raise NotImplementedError

    def observe(self, rewards: Mapping[str, np.ndarray]) -> None:
        """This round's verified rewards of the proposed prompts: prompt id -> float[n of this round]."""
        self.round += 1

    def finish_step(self) -> list[PromptRecord]:
        """The step's batch: m prompts whose samples (from all rounds) are trained on, in order."""
        raise NotImplementedError

    # -- state and figures -----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        return {}


def zero_variance(rewards: np.ndarray) -> bool:
    """True when every response got the same reward: the group's advantages are all zero (no gradient)."""
    return bool(np.all(rewards == rewards[0])) if len(rewards) else True


def pool_draw(wanted: int, share: float, cap: int) -> int:
    """Candidates to draw so that about `wanted` pass a filter that passes `share` of them, within [1, cap]."""
    return int(min(cap, max(1, math.ceil(wanted / max(share, 1e-3)))))
