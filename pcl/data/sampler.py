"""The prompt sampler: a seeded, epoch-shuffled stream of dataset indices with an exactly resumable cursor.

    sampler = PromptSampler(num_prompts=len(records), seed=cfg.run.seed)
    candidates = sampler.sample(k * m)      # step 1 of docs/architecture.md: k*m candidate prompts
    state = sampler.state_dict()            # JSON-serialisable; goes into the checkpoint
    sampler.load_state_dict(state)          # resumes the very same stream

    stream = PromptStream(train_prompts, seed)   # the loop's `Prompts` port: distinct PromptRecords per draw
    candidates = stream.sample(k * m)            # what the sampler actor serves, and `pcl train --local` uses

Epoch e visits every index exactly once, in an order that is a pure function of (seed, e), so the stream
needs no stored permutation: the state is just (epoch, cursor). A draw that runs past the end of an epoch
continues into the next one, so one draw can hold the same index twice (the end of epoch e and the start of
e+1) when it crosses a boundary.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pcl.data.fingerprint import data_changes, data_fingerprint

_STATE_KEYS = ("num_prompts", "seed", "epoch", "cursor")


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


class PromptSampler:
    def __init__(self, num_prompts: int, seed: int):
        if not _is_int(num_prompts) or num_prompts < 1:
            raise ValueError(
                f"PromptSampler: num_prompts must be a positive int (is the dataset empty?), got {num_prompts!r}"
            )
        if not _is_int(seed) or seed < 0:
            raise ValueError(f"PromptSampler: seed must be a non-negative int, got {seed!r}")
        self._num_prompts = int(num_prompts)
        self._seed = int(seed)
        self._epoch = 0
        self._cursor = 0  # position in the current epoch's order of the next index to hand out
        self._order = self.epoch_order(0)

    @property
    def num_prompts(self) -> int:
        return self._num_prompts

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def epoch(self) -> int:
        """The epoch the next index comes from (0-based)."""
        return self._epoch

    @property
    def cursor(self) -> int:
        """How many indices of the current epoch have been handed out, in [0, num_prompts)."""
        return self._cursor

    def epoch_order(self, epoch: int) -> np.ndarray:
        """int64[num_prompts]: the permutation of all indices that epoch `epoch` visits."""
        # A fresh generator per epoch seeded from (seed, epoch): the order never depends on the draw sizes.
        return np.random.default_rng([self._seed, epoch]).permutation(self._num_prompts)

    def sample(self, count: int) -> list[int]:
        """The next `count` indices of the stream, continuing into the next epoch(s) as needed."""
        if not _is_int(count) or count <= 0:
            raise ValueError(f"PromptSampler.sample: count must be a positive int, got {count!r}")
        indices: list[int] = []
        while len(indices) < count:
            take = min(count - len(indices), self._num_prompts - self._cursor)
            indices.extend(self._order[self._cursor : self._cursor + take].tolist())
            self._cursor += take
            if self._cursor == self._num_prompts:
                self._start_epoch(self._epoch + 1)
        return indices

    def _start_epoch(self, epoch: int) -> None:
        self._epoch, self._cursor = epoch, 0
        self._order = self.epoch_order(epoch)

    def state_dict(self) -> dict:
        """Plain ints only, so the state survives JSON (checkpoints, Redis)."""
        return {
            "num_prompts": self._num_prompts, "seed": self._seed, "epoch": self._epoch, "cursor": self._cursor,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue the stream a state_dict was taken from; the dataset size and seed must be the same."""
        if not isinstance(state, dict) or any(key not in state for key in _STATE_KEYS):
            raise ValueError(f"PromptSampler state must be a dict with keys {_STATE_KEYS}, got {state!r}")
        if not all(_is_int(state[key]) for key in _STATE_KEYS):
            raise ValueError(f"PromptSampler state values must be ints, got {state!r}")
        if state["num_prompts"] != self._num_prompts:
            raise ValueError(
                f"PromptSampler state is for {state['num_prompts']} prompts but the dataset has "
                f"{self._num_prompts}: the data changed since the checkpoint, so the saved position means "
                "other prompts"
            )
        if state["seed"] != self._seed:
            raise ValueError(
                f"PromptSampler state has seed {state['seed']} but this sampler has seed {self._seed}"
            )
        epoch, cursor = int(state["epoch"]), int(state["cursor"])
        if epoch < 0 or not 0 <= cursor <= self._num_prompts:
            raise ValueError(
                f"PromptSampler state: epoch {epoch} / cursor {cursor} out of range for {self._num_prompts} prompts"
            )
        self._start_epoch(epoch)
        if cursor == self._num_prompts:  # the end of an epoch is the start of the next one
            self._start_epoch(epoch + 1)
        else:
            self._cursor = cursor


def draw_distinct(sampler: PromptSampler, count: int) -> list[int]:
    """The next `count` distinct indices of the stream: a draw that crosses an epoch boundary can meet a
    prompt twice (once from each epoch); the repeat is skipped so a step never holds a prompt twice."""
    if count > sampler.num_prompts:
        raise ValueError(f"cannot draw {count} distinct prompts from a set of {sampler.num_prompts}")
    seen: dict[int, None] = {}
    while len(seen) < count:
        for i in sampler.sample(count - len(seen)):
            seen.setdefault(int(i), None)
    return list(seen)


class PromptStream:
    """The training set's prompt records (`pcl.data.prompts.PromptRecord`, templated and tokenised) drawn as the
    seeded, resumable stream above: the step loop's `Prompts` port (`pcl.loop.ports`), served by the sampler actor
    on a fleet and called directly in one process."""

    def __init__(self, prompts: list, seed: int):
        if not prompts:
            raise ValueError("the training set has no usable prompts")
        self.prompts = prompts
        self.sampler = PromptSampler(len(prompts), seed)
        self.fingerprint = data_fingerprint(prompts)  # saved with the cursor: a resume on other data is refused

    def sample(self, count: int) -> list:
        """The next `count` distinct prompts of the shuffled stream (crossing epochs as needed)."""
        return [self.prompts[i] for i in draw_distinct(self.sampler, count)]

    def records(self) -> list:
        """The whole training set, in dataset order (the reference pass rates cover every prompt)."""
        return self.prompts

    def state_dict(self) -> dict[str, Any]:
        return {**self.sampler.state_dict(), "data": self.fingerprint}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved cursor; refused (ValueError saying what differs) when it was taken on other data
        (`pcl.data.fingerprint.data_changes`, the check the driver ran before starting)."""
        differences = data_changes(state, self.prompts)
        if differences:
            raise ValueError("the sampler state was saved on other training data: " + "; ".join(differences))
        self.sampler.load_state_dict({k: v for k, v in state.items() if k != "data"})
