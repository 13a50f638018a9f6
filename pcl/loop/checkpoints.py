"""The run's checkpoints: when they are written, what goes in, and how a run continues from one.

    checkpoints = Checkpoints(cfg, run_dir, loop, clock, control, state_bytes)
    checkpoints.after_step(step, record, suite_due)  # every checkpoint.every steps; a new best suite score
    checkpoints.on_request()                         # the control plane asked for one
    checkpoints.save()                               # now (the run's end)
    state = checkpoints.restore(path)                # the learner, V and the loop as the checkpoint left them

A checkpoint (`pcl.checkpoint_store` has the layout and the atomic write) holds the learner's files (`learner.save`),
V's (`scorer.save` into `value/`), the loop's state and the run's two clocks (`state.json`), the control state
(`control.json`), the run directory's records up to this step and the configuration. The ports write their
own files; this module decides the rest.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pcl.checkpoint_store as ckpt
from pcl.config import Config, dump_config, redacted
from pcl.benchmarks import best_score
from pcl.loop.ports import Control
from pcl.loop.state import RunClock
from pcl.loop.step import StepLoop
from pcl.loop.runlog import METRICS_FILE, SELECTIONS_FILE
from pcl.data.reference_rates import REFERENCE_FILE

BEST_FILE = "best.json"  # the best checkpoint by the evaluation suite's score
RUN_FILES = (METRICS_FILE, SELECTIONS_FILE, REFERENCE_FILE)  # kept with each checkpoint, when present
log = logging.getLogger(__name__)


class Checkpoints:
    def __init__(self, cfg: Config, run_dir: str, loop: StepLoop, clock: RunClock, control: Control,
                 state_bytes: int = 0, keep_files: tuple[str, ...] = ()):
        """`state_bytes`: the first checkpoint's size, before there is one to measure (checked against the free
        space); `keep_files`: run-directory files besides RUN_FILES to keep with each checkpoint."""
        self.cfg, self.run_dir, self.loop, self.clock, self.control = cfg, Path(run_dir), loop, clock, control
        self.state_bytes = state_bytes
        self.keep_files = RUN_FILES + tuple(keep_files)
        self.last_step: int | None = None  # the step of the last checkpoint written or restored
        best = self.run_dir / BEST_FILE
        self.best = json.loads(best.read_text()) if best.is_file() else None  # {step, score, checkpoint, ...}

    @property
    def root(self) -> Path:
        return (self.run_dir / "checkpoints").resolve()

    def after_step(self, record: dict, suite_due: bool) -> None:
        """After a step is logged: the scheduled checkpoint, and one of a new best suite score."""
        step = self.loop.state.step
        if self.cfg.checkpoint.every and step % self.cfg.checkpoint.every == 0:
            self.save()
        if suite_due:
            self.track_best(record)

    def on_request(self) -> None:
        """Write a checkpoint if the control plane asked for one, and tell it where."""
        request = self.control.checkpoint_requested()
        if request is not None:
            self.control.checkpoint_done(request, self.save())

    def save(self) -> str:
        """Everything the run needs to continue exactly from this step boundary, written atomically; the
        oldest beyond checkpoint.keep are deleted (the best is kept). Returns the checkpoint's path."""
        start, step = self.clock.now(), self.loop.state.step
        ckpt.check_free_space(self.root, step, self.state_bytes)  # a clear error, before writing anything
        with ckpt.writing(self.root, step) as tmp:  # a failed write (a full disk) leaves no partial checkpoint
            self.loop.learner.save(str(tmp))
            if self.loop.scorer is not None:
                self.loop.scorer.save(str(tmp / "value"))
            ckpt.write_json(tmp / "state.json", {**self.loop.state_dict(), **self.clock.state_dict()})
            ckpt.write_json(tmp / "control.json", self.control.snapshot())
            for name in self.keep_files:
                if (self.run_dir / name).is_file():
                    shutil.copy2(self.run_dir / name, tmp / name)
            (tmp / "config.yaml").write_text(dump_config(redacted(self.cfg, token_mask=None)))
            final = ckpt.commit(tmp, self.root, step, {"policy_version": self.loop.policy_version,
                                                       "strategy": self.cfg.selection.type,
                                                       "write_seconds": round(self.clock.now() - start, 3)})
        ckpt.prune(self.root, self.cfg.checkpoint.keep, protect=((self.best or {}).get("checkpoint"),))
        self.last_step = step
        log.info("checkpoint %s written in %.1fs", final, self.clock.now() - start)
        return str(final)

    def track_best(self, record: dict) -> None:
        """With evaluation.keep_best: a new best score (evaluation.best_by) gets a checkpoint (kept whatever
        checkpoint.keep) and RUN_DIR/best.json names it."""
        best_by, step = self.cfg.evaluation.best_by, self.loop.state.step
        score = best_score(record, best_by)
        if not self.cfg.evaluation.keep_best or (self.best and score <= self.best.get("score", self.best["average"])):
            return
        path = self.save() if self.last_step != step else str(self.root / ckpt.step_dir_name(step))
        self.best = {"step": step, "best_by": best_by, "score": score, "average": record["suite_average"],
                     "checkpoint": path, "scores": {k: v for k, v in record.items() if k.startswith("suite_")}}
        ckpt.write_json(self.run_dir / BEST_FILE, self.best)

    def restore(self, checkpoint: str) -> dict[str, Any]:
        """Put the run back where `checkpoint` left it: policy and optimizer, V, the loop (sampler cursor,
        strategy, every RNG, the counters, the clocks); the rollout fleet gets the checkpoint's weights.
        Returns the checkpoint's state."""
        path = Path(checkpoint).resolve()
        state = json.loads((path / "state.json").read_text())
        self.loop.check_state(state, source=f"checkpoint {path}")
        self.loop.learner.load(str(path))
        if self.loop.scorer is not None and (path / "value").is_dir():
            self.loop.scorer.load(str(path / "value"))
        if (path / REFERENCE_FILE).is_file() and not (self.run_dir / REFERENCE_FILE).is_file():
            shutil.copy2(path / REFERENCE_FILE, self.run_dir / REFERENCE_FILE)
        self.loop.load_state_dict(state, checkpoint=str(path))
        self.clock.load_state_dict(state)
        self.last_step = self.loop.state.step
        return state
