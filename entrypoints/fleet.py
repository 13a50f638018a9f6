"""Placing the actors of a run:

    fleet = start_fleet(cfg, prepared, redis_url)       # sampler, scorer, learner ranks, workers, coordinator
    ...
    fleet.stop()
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import ray

from actors.handles import FleetHandles
from pcl.config import Config, ConfigError
from services.streams.rollout_client import publish_answers

log = logging.getLogger(__name__)


@dataclass
class Fleet:
    """The coordinator and the actors it drives (`actors.handles.FleetHandles`)."""

    coordinator: object
    handles: FleetHandles

    def stop(self) -> None:
        """Stop serving loops politely, then remove every actor."""
        h = self.handles
        workers = h.rollout_workers + h.verifiers
        try:
            ray.get([w.shutdown.remote() for w in workers], timeout=20)
        except Exception as exc:  # noqa: BLE001 - best effort; the actors are killed next
            log.warning("stopping workers: %s", exc)
        for actor in workers + [h.sampler, h.scorer, self.coordinator]:
            if actor is not None:
                ray.kill(actor, no_restart=True)
        if h.learners is not None:
            h.learners.kill()


def check_fleet_config(cfg: Config) -> None:
    """Refuse, before any actor starts, a rollout layout that cannot work, naming the setting. (rollout.max_in_flight
    needs no check beyond >= 1: a step's request chunks are cut no larger than it, see
    services.streams.rollout_client.request_chunks.)"""
    r = cfg.rollout
    gpus = r.num_gpus_per_worker
    if r.engine == "vllm" and gpus > 0 and (gpus != int(gpus) or int(gpus) % r.tensor_parallel_size):
        raise ConfigError(f"rollout.tensor_parallel_size={r.tensor_parallel_size} does not divide the engine's GPUs "
                          f"(rollout.num_gpus_per_worker={gpus:g}): each vLLM engine shards the model over its "
                          f"worker's whole GPUs")


def start_fleet(cfg: Config, prep, redis_url: str) -> Fleet:
    """Start every actor for a run and wait until each answers."""
    from actors.coordinator import Coordinator
    from actors.learner import LearnerGroup
    from actors.rollout import RolloutWorker
    from actors.sampler import PromptSamplerActor
    from actors.scorer import ValueScorerActor
    from actors.verifier import RewardVerifier
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from pcl.engines import max_model_len
    from pcl.strategies import strategy_class

    check_fleet_config(cfg)
    seed, run = cfg.run.seed, cfg.run.name
    policy = cfg.model.model_copy(update={"path": prep.policy_path})  # the model section, with the local copy
    h = FleetHandles(redis_url, prep.policy_path, prep.value_path)
    # The coordinator and the sampler live on the driver's node: they write the run directory beside the driver,
    # and losing them is losing the run's driver node anyway (the rest is placed by the resources it asks for).
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    h.sampler = PromptSamplerActor.options(scheduling_strategy=here).remote(prep.train_prompts, seed)
    if strategy_class(cfg.selection).needs_values:  # a class capability: no strategy is built here
        gpus = cfg.learner.num_gpus_per_rank  # every V rank: one learner rank's GPUs
        h.scorer = ValueScorerActor.options(num_gpus=gpus, resources=cfg.value.resources or None).remote(
            cfg.value, prep.value_path, "cuda" if gpus > 0 else "cpu", seed,
            checkpoints=str(prep.run_dir / "checkpoints"), num_gpus=gpus, timeout_s=cfg.learner.timeout_s)
    publish_answers(redis_url, run, prep.answers)
    h.verifiers = [RewardVerifier.options(resources=cfg.verifier.resources or None).remote(
        cfg.verifier, cfg.redis, cfg.run, redis_url, i) for i in range(cfg.verifier.num_workers)]
    h.rollout_workers = [
        RolloutWorker.options(num_gpus=cfg.rollout.num_gpus_per_worker, resources=cfg.rollout.resources or None).remote(
            cfg.rollout, cfg.redis, cfg.run, policy, redis_url, i, max_model_len(cfg))
        for i in range(cfg.rollout.num_workers)]
    h.learners = LearnerGroup.create(cfg.learner, cfg.optimizer, policy, seed)
    pings = [a.ping.remote() for a in [h.sampler, *h.verifiers, *h.rollout_workers, h.scorer] if a is not None]
    ray.get(pings, timeout=cfg.learner.timeout_s)
    coordinator = Coordinator.options(scheduling_strategy=here).remote(cfg.model_dump(), str(prep.run_dir), h,
                                                                      prep.eval_prompts, prep.suite)
    return Fleet(coordinator, h)
