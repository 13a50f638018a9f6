"""The parts of a run in one process: what the actors of a fleet hold, built from the same config sections.

    parts = LocalParts.start(cfg, device, policy_path, value_path, train_prompts, answers)   # cfg: one_device's
    loop = parts.step_loop(strategy, run_dir)          # pcl.loop.StepLoop on the in-process ports
    ...
    parts.close()                                      # the reward pool's processes, the process group, the engine

What each part is, and the actor that holds it on a fleet:

    PromptStream (pcl.data.sampler)                 the prompt sampler actor
    build_value_trainer at one rank (V)             the value scorer actor
    learner_for_run at world size 1 (FSDP2)         the learner group, one rank, in a process group of one
    make_engine (HF, or vLLM and its engine process)   a rollout worker
    RewardPool (spawned math-verify processes)      a verifier

On the CPU, torch's intra-op threads for the whole process are `rollout.threads` (a rollout worker's), set before
anything is built.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

from pcl.data.sampler import PromptStream
from pcl.loop.local.ports import EngineRollouts, LocalLearner, LocalScorer


def join_group(device: str) -> bool:
    """A torch.distributed process group of one (gloo on the CPU, NCCL on a GPU) for the FSDP2 learner; returns
    whether it was made here (False: this process already has one of size 1, which the learner shares)."""
    import torch.distributed as dist

    from pcl.models.process_group import init_process_group

    if dist.is_initialized():
        if dist.get_world_size() != 1:
            raise RuntimeError(f"this process is rank {dist.get_rank()} of a process group of "
                               f"{dist.get_world_size()}; a --local run needs a group of its own")
        return False
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    init_process_group("nccl" if device == "cuda" else "gloo", f"tcp://127.0.0.1:{port}", 0, 1)
    return True


@dataclass
class LocalParts:
    cfg: Any
    prompts: PromptStream
    scorer: LocalScorer | None
    rollouts: EngineRollouts
    learner: LocalLearner
    own_group: bool

    @classmethod
    def start(cls, cfg, device: str, policy_path: str, value_path: str | None, train_prompts: list,
              answers: dict) -> "LocalParts":
        """Build every part on `device` ('cpu' or 'cuda'); V only when `value_path` is given (the strategy needs
        it). A part that fails to build closes the ones built before it."""
        import torch

        from pcl.engines import make_engine, max_model_len
        from pcl.models.learner import learner_for_run
        from pcl.models.value_sharded import build_value_trainer
        from pcl.reward.pool import RewardPool

        if device == "cpu":
            torch.set_num_threads(cfg.rollout.threads)
        seed, v = cfg.run.seed, cfg.verifier
        pool = RewardPool(processes=v.processes, timeout_s=v.timeout_s, max_tasks_per_worker=v.max_tasks_per_worker)
        engine, own_group = None, False
        try:  # the pool's processes start meanwhile
            own_group = join_group(device)
            model = cfg.model.model_copy(update={"path": policy_path})
            learner = learner_for_run(cfg.learner, cfg.optimizer, model, seed, device)
            trainer = build_value_trainer(cfg.value, value_path, device, seed) if value_path else None
            extra = {"max_model_len": max_model_len(cfg)} if cfg.rollout.engine == "vllm" else {}
            engine = make_engine(cfg.rollout, policy_path, seed, dtype=cfg.model.dtype, device=device, **extra)
        except BaseException:
            _close(pool, engine, own_group)
            raise
        return cls(cfg, PromptStream(train_prompts, seed), LocalScorer(trainer) if trainer else None,
                   EngineRollouts(cfg, engine, pool, answers), LocalLearner(cfg, learner, engine, policy_path),
                   own_group)

    def step_loop(self, strategy, run_dir: str):
        """The step loop on these parts (`pcl.loop.StepLoop`)."""
        from pcl.loop import StepLoop

        return StepLoop(self.cfg, strategy, self.prompts, self.scorer, self.rollouts, self.learner, run_dir)

    def close(self) -> None:
        _close(self.rollouts.pool, self.rollouts.engine, self.own_group)


def _close(pool, engine, own_group: bool) -> None:
    """Stop the reward pool's processes, release the engine (vLLM's engine process with it), leave the group."""
    pool.close()
    if engine is not None:
        engine.close()
    if own_group:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
