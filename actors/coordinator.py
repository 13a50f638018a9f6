"""The coordinator actor: runs a training run's loop (`pcl.loop`) on the Ray fleet.

The algorithm and its schedule are in `pcl/loop/` (`step.py` is one step as the paper reads, `run.py` the
evaluations, checkpoints and pauses around the steps); they reach the fleet through ports, which
`actors/ports.py` implements on the actors and the Redis streams:

    prompts  -> the PromptSamplerActor          scorer   -> the ValueScorerActor (V)
    learner  -> the learner group, weight sync  rollouts -> the request / result / reward streams
    control  -> the control plane on Redis      (`services.control.run.RunControl`)

The driver (`entrypoints/train.py`) starts it, calls `restore(checkpoint)` to continue a run, then `run()`.
"""

from __future__ import annotations

from typing import Any

import ray

from actors.handles import ActorHealth, FleetHandles
from actors.runtime import heartbeat
from actors.stragglers import FleetRepair
from actors.ports import ActorScorer, FleetLearner, SamplerPrompts, StreamRollouts, state_bytes_estimate
from pcl.config import Config
from pcl.data.prompts import PromptRecord
from pcl.loop import Evaluation, StepLoop, TrainingRun
from pcl.strategies import make_strategy
from services.tracking.trackers import TRACKERS_FILE  # the tracker run ids, kept with each checkpoint


@ray.remote(num_cpus=0, max_restarts=0)
class Coordinator:
    def __init__(self, cfg: dict, run_dir: str, fleet: FleetHandles, eval_prompts: list[PromptRecord],
                 suite: dict[str, list[PromptRecord]] | None = None):
        from services.streams.rollout_client import RolloutClient  # noqa: PLC0415 - keeps redis out of import time
        from services.control.run import RunControl  # noqa: PLC0415
        from services.incarnations import Registry  # noqa: PLC0415

        cfg = Config.model_validate(cfg)
        self.heartbeat = heartbeat(Registry(fleet.redis_url, cfg.run.name), "coordinator", "coordinator")
        timeout_s = cfg.learner.timeout_s  # no remote call waits longer
        learner = FleetLearner(cfg, fleet.learners, fleet.rollout_workers, fleet.policy_path)
        repair = FleetRepair(learner, fleet.named())  # stragglers left out, stuck workers restarted
        client = RolloutClient(cfg, fleet.redis_url, live_workers=learner.live_workers, on_watch=repair)
        rollouts = StreamRollouts(client, learner, timeout_s, repair)
        scorer = ActorScorer(fleet.scorer, timeout_s) if fleet.scorer is not None else None
        strategy = make_strategy(cfg.selection, cfg.run.m, cfg.run.seed, n=cfg.run.n)
        loop = StepLoop(cfg, strategy, SamplerPrompts(fleet.sampler, timeout_s), scorer, rollouts, learner, run_dir)
        health = ActorHealth(fleet.named)  # each actor's word in the status, looked at after every step
        control = RunControl.for_coordinator(cfg, fleet.redis_url, health)  # pause, tau / k, status, health
        self.training = TrainingRun(cfg, run_dir, loop, Evaluation(cfg, rollouts, run_dir, eval_prompts, suite),
                                    control, state_bytes=state_bytes_estimate(fleet), keep_files=(TRACKERS_FILE,))

    def restore(self, checkpoint: str) -> dict[str, Any]:
        """Put the run back exactly where `checkpoint` left it (`pcl.loop.checkpoints`)."""
        return self.training.restore(checkpoint)

    def run(self) -> dict[str, Any]:
        """Train until run.steps (or the time budget); returns the summary."""
        return self.training.run()
