"""Policy steps the learner skipped: it leaves the weights as they were when a step's loss or gradient norm is not
finite (`pcl.models.learner.PolicyLearner.train_step`, `step_skipped`). Each such step is a field of its record
(`policy_skipped`) and a count (`policy_skipped_steps_total`, a Prometheus counter); `learner.max_skipped_steps` of
them in a row stop the run with `SkippedSteps`, naming the steps and the cause.

    skipped = SkippedPolicySteps()              # LoopState.skipped, kept in the checkpoint's state.json
    record.policy_skipped = skipped.count(step, learn)
    skipped.check(cfg.learner.max_skipped_steps)   # after the step's record is written
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


class SkippedSteps(RuntimeError):
    """The learner skipped learner.max_skipped_steps policy steps in a row (a non-finite loss or gradient norm): the
    run stops rather than generate for steps that change nothing. A restart would repeat it."""


@dataclass
class SkippedPolicySteps:
    """The counts of skipped policy steps (see the module docstring)."""

    total: int = 0  # policy steps the learner skipped, all of the run
    in_a_row: int = 0  # of those, the ones since the last step it did not skip
    # (step, loss, gradient norm) of the last skipped step of this process: what `check` names
    last: tuple[int, Any, Any] | None = None

    def count(self, step: int, learn: dict[str, Any]) -> int:
        """1 when the learner skipped the update of step `step` (0-based; `learn`: its figures), else 0."""
        skipped = int(bool(learn.get("step_skipped")))
        self.total += skipped
        self.in_a_row = (self.in_a_row + 1) * skipped
        if skipped:
            self.last = (step + 1, learn.get("loss"), learn.get("grad_norm"))
        return skipped

    def check(self, limit: int) -> None:
        """SkippedSteps when `limit` (learner.max_skipped_steps) steps in a row were skipped: a non-finite loss or
        gradient that comes back step after step is no passing spike, and each such step spends its generation on
        nothing."""
        if self.in_a_row < limit or self.last is None:
            return
        step, loss, grad_norm = self.last
        cause = (f"a non-finite loss ({loss})" if loss is None or not math.isfinite(loss)
                 else f"a non-finite gradient norm ({grad_norm}, loss {loss})")
        first = step - self.in_a_row + 1
        raise SkippedSteps(f"the policy learner skipped {self.in_a_row} steps in a row (steps {first}-{step}; "
                           f"learner.max_skipped_steps = {limit}), the last for {cause}: the weights have not changed "
                           f"since step {first - 1}. Look for extreme advantages or engine log-probabilities in those "
                           f"steps' batches, or lower optimizer.lr.")

    def state_dict(self) -> dict[str, int]:
        return {"policy_skipped_total": self.total, "policy_skipped_in_a_row": self.in_a_row}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """From `state_dict`'s keys in a checkpoint's state; 0 where a checkpoint written before them has none."""
        self.total = int(state.get("policy_skipped_total", 0))
        self.in_a_row = int(state.get("policy_skipped_in_a_row", 0))
        self.last = None
