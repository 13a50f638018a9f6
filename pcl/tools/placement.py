"""The run's placement groups, as data: which bundles each role asks Ray for, and with which strategy.

    for group in placement_plan(cfg):        # learner, value (when the strategy needs V), rollout-0 ...
        group.role, group.bundles, group.strategy, group.setting

- learner: one bundle per rank ({GPU: learner.num_gpus_per_rank} + learner.resources), PACK: as few nodes as fit,
  so the FSDP ranks share a node whenever one has room for them all.
- value: one bundle per V rank (each a learner rank's GPUs + value.resources), PACK.
- rollout-i: one bundle per engine, all its tensor-parallel GPUs ({GPU: rollout.num_gpus_per_worker} +
  rollout.resources), STRICT_PACK: one node (vLLM's `mp` executor runs its TP workers beside the actor:
  `pcl.engines.vllm.executor_backend`).

On CPU (no GPUs asked) a bundle asks for CPU_BUNDLE_CPUS of a CPU instead: the actors share the cores (each pins
its own threads), so the bundle only records where the actor goes, and the same code runs in the tests. The
custom resources the config names are asked for either way. The Ray side is `entrypoints.fleet.reserve_placement`.
"""

from __future__ import annotations

from dataclasses import dataclass

from pcl.strategies import strategy_class

CPU_BUNDLE_CPUS = 0.01  # a CPU bundle's token reservation (see the module docstring)


@dataclass(frozen=True)
class RoleGroup:
    """One placement group: the role it places, the settings that size it, its bundles and strategy."""

    role: str
    setting: str
    bundles: tuple[dict[str, float], ...]
    strategy: str


def bundle(gpus: float, resources: dict[str, float] | None) -> dict[str, float]:
    """One bundle: the GPUs (or on CPU a token CPU share) and the custom resources."""
    out = {"GPU": float(gpus)} if gpus > 0 else {"CPU": CPU_BUNDLE_CPUS}
    out.update({name: float(amount) for name, amount in (resources or {}).items()})
    return out


def placement_plan(cfg) -> list[RoleGroup]:
    """The placement groups of a run (`pcl.config.Config`), in the order the fleet starts them."""
    learner, rollout = cfg.learner, cfg.rollout
    groups = [RoleGroup("learner", f"learner.num_ranks={learner.num_ranks}, learner.num_gpus_per_rank="
                        f"{learner.num_gpus_per_rank:g}, learner.resources={dict(learner.resources)}",
                        tuple(bundle(learner.num_gpus_per_rank, learner.resources)
                              for _ in range(learner.num_ranks)), "PACK")]
    if strategy_class(cfg.selection).needs_values:
        value = cfg.value
        groups.append(RoleGroup("value", f"value.num_ranks={value.num_ranks} (each learner.num_gpus_per_rank="
                                f"{learner.num_gpus_per_rank:g}), value.resources={dict(value.resources)}",
                                tuple(bundle(learner.num_gpus_per_rank, value.resources)
                                      for _ in range(value.num_ranks)), "PACK"))
    setting = (f"rollout.num_gpus_per_worker={rollout.num_gpus_per_worker:g} (tensor_parallel_size="
               f"{rollout.tensor_parallel_size}), rollout.resources={dict(rollout.resources)}")
    groups += [RoleGroup(f"rollout-{i}", setting, (bundle(rollout.num_gpus_per_worker, rollout.resources),),
                         "STRICT_PACK") for i in range(rollout.num_workers)]
    return groups
