"""The schedule around the steps: evaluate at step 0, then train until `run.steps` (or a budget, `run.time_budget_s`
or `run.train_budget_s`), stopping at step boundaries for the control plane, evaluating and checkpointing on
schedule, on request and at the end.

    run = TrainingRun(cfg, run_dir, loop, evaluation, control)
    run.restore(checkpoint)       # optional: continue where a checkpoint left off
    summary = run.run()           # {"steps", "steps_this_run", "seconds", "train_seconds", "checkpoint"}

Each step's record goes to `RUN_DIR/metrics.jsonl` (the prompts it trained on to `selections.jsonl`, V's reliability
tables over the last steps to `calibration.json`) and to the control plane, with the run's two clocks
(`pcl.loop.state.RunClock`): `elapsed_seconds` (wall clock, pauses excluded) and `train_elapsed_seconds`
(evaluations and checkpoint writes excluded too).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pcl.checkpoint_store as ckpt
from pcl.config import Config
from pcl.loop.checkpoints import Checkpoints
from pcl.loop.evaluation import Evaluation
from pcl.loop.ports import Control
from pcl.loop.record import StepRecord
from pcl.loop.state import RunClock
from pcl.loop.step import StepLoop
from pcl.loop.runlog import SELECTIONS_FILE, MetricsLog


class TrainingRun:
    """A run's steps and everything around them; `state_bytes` and `keep_files` go to `Checkpoints`."""

    def __init__(self, cfg: Config, run_dir: str, loop: StepLoop, evaluation: Evaluation, control: Control,
                 state_bytes: int = 0, keep_files: tuple[str, ...] = ()):
        self.cfg, self.loop, self.evaluation, self.control, self.run_dir = cfg, loop, evaluation, control, run_dir
        self.clock = RunClock(loop.clock)
        self.checkpoints = Checkpoints(cfg, run_dir, loop, self.clock, control, state_bytes, keep_files)
        self.log = MetricsLog(run_dir)
        self.selections = MetricsLog(run_dir, SELECTIONS_FILE)
        self.restored = False  # continued from a checkpoint (`restore`)

    def run(self) -> dict[str, Any]:
        """Train from the current step to the end; returns a summary."""
        cfg, loop = self.cfg, self.loop
        self.clock.start()
        if loop.state.step == 0 and self.evaluation.held_out_due(0) and not self.restored:  # restored: done
            with self.clock.excluded():
                first = StepRecord(step=0, policy_version=loop.policy_version)
                first.update(self.evaluation.held_out(0, loop.policy_version))
            self.log.append(first.to_dict())
            self.control.publish(first, loop.policy_version)
        steps_done = 0
        for step in range(loop.state.step, cfg.run.steps):
            with self.clock.paused():  # tau / k changes; blocks while paused (a checkpoint asked for meanwhile
                self.control.at_step_boundary(step, loop.strategy, self.checkpoints.on_request)  # is written then)
            with self.clock.excluded():
                self.checkpoints.on_request()  # asked for while the last step ran
            if cfg.run.time_budget_s and self.clock.elapsed() > cfg.run.time_budget_s:
                break
            if self.train_budget_spent():  # by the last step, or before a resume
                break
            record = loop.train_step(step)
            with self.clock.excluded():
                record.update(self.evaluation.after_step(step + 1, loop.policy_version, self.clock.train_elapsed(),
                                                         last=self.train_budget_spent()))
            record.elapsed_seconds, record.train_elapsed_seconds = self.clock.elapsed(), self.clock.train_elapsed()
            self.log.append(record.to_dict())
            self.selections.append({"step": step + 1, "ids": loop.last_ids, "samples": loop.last_indices,
                                    "versions": loop.last_versions})
            loop.state.curriculum.write_tables(self.run_dir)  # V's reliability tables over the last steps
            self.control.publish(record, loop.policy_version)
            loop.state.skipped.check(cfg.learner.max_skipped_steps)  # after the record: the last skip is logged too
            loop.state.step = step + 1
            steps_done += 1
            with self.clock.excluded():
                self.checkpoints.after_step(record.to_dict(), suite_due=record.suite_average is not None)
        if self.checkpoints.last_step != loop.state.step:
            with self.clock.excluded():
                self.checkpoints.save()
        self.control.finish(loop.state.step)
        return {"steps": loop.state.step, "steps_this_run": steps_done, "seconds": self.clock.elapsed(),
                "train_seconds": self.clock.train_elapsed(), "checkpoint": str(ckpt.latest(self.checkpoints.root))}

    def train_budget_spent(self) -> bool:
        """Whether `run.train_budget_s` seconds of training are done (never, without one)."""
        budget = self.cfg.run.train_budget_s
        return bool(budget and self.clock.train_elapsed() >= budget)

    def restore(self, checkpoint: str) -> dict[str, Any]:
        """Continue where `checkpoint` left off (`Checkpoints.restore`); the metrics and selections of later
        steps (from the run that went on past it) are dropped from the run directory."""
        self.checkpoints.restore(checkpoint)
        self.restored = True  # a checkpoint at step 0 is written after the step-0 evaluation
        step = self.loop.state.step
        self.log.truncate_after(step)
        self.selections.truncate_after(step)
        return {"step": step, "policy_version": self.loop.policy_version,
                "checkpoint": str(Path(checkpoint).resolve())}
