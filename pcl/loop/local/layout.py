"""A run's layout mapped onto one process and one device (`pcl train --local`), or refused naming the setting.

    cfg, device, mapped = one_device(cfg, cuda=torch.cuda.is_available())
    print(layout_line(device, mapped, threads))    # pcl: --local: one process on cpu, ...: learner.num_ranks 2 -> 1

One process runs the learner at world size 1, V unsharded, one engine and one reward pool, so the counts of ranks
and workers map to one (said, not silent). The device is a GPU when the config gives any role GPUs, else the CPU.
Refused, naming the setting: a config laid out for several machines (cluster.nodes > 1), GPUs the machine does not
have, and asynchronous steps (run.max_staleness > 0 overlaps generation with training on separate devices; one
process runs them in turn, which is the synchronous algorithm, not the one the setting asks for). Placement settings
(Ray's custom resources, the weight-sync route) have no meaning in one process and are left as they are.
"""

from __future__ import annotations

from pcl.config_schema import Config, ConfigError

# setting -> what one process has of it
ONE = {"learner.num_ranks": 1, "value.num_ranks": 1, "rollout.num_workers": 1, "verifier.num_workers": 1,
       "rollout.tensor_parallel_size": 1}


def _get(cfg: Config, key: str):
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def one_device(cfg: Config, cuda: bool) -> tuple[Config, str, list[str]]:
    """(the config with every count mapped to one, the device 'cpu' or 'cuda', one "key before -> after" per
    setting mapped); ConfigError naming the setting when the layout cannot be mapped."""
    if cfg.cluster.nodes > 1:
        raise ConfigError(f"cluster.nodes = {cfg.cluster.nodes}: this config is laid out for a cluster of "
                          f"{cfg.cluster.nodes} nodes, and --local runs on one device of one machine; run it "
                          f"without --local on the cluster, or set cluster.nodes=1")
    gpus = {"learner.num_gpus_per_rank": cfg.learner.num_gpus_per_rank,
            "rollout.num_gpus_per_worker": cfg.rollout.num_gpus_per_worker}
    asked = [f"{key} = {value:g}" for key, value in gpus.items() if value > 0]
    if asked and not cuda:
        raise ConfigError(f"{', '.join(asked)}: the config gives GPUs, and this machine has no CUDA device; set "
                          f"{' and '.join(key + '=0' for key, value in gpus.items() if value > 0)} to run --local "
                          f"on the CPU")
    if cfg.run.max_staleness:
        raise ConfigError(f"run.max_staleness = {cfg.run.max_staleness}: asynchronous steps generate on their own "
                          f"devices while the learner trains, and --local runs generation and training in turn on "
                          f"one; set run.max_staleness=0 (synchronous steps) to run it --local")
    mapped = [f"{key} {_get(cfg, key)} -> {one}" for key, one in ONE.items() if _get(cfg, key) != one]
    tree = cfg.model_dump()
    for key, one in ONE.items():
        section, name = key.split(".")
        tree[section][name] = one
    return Config.model_validate(tree), "cuda" if asked else "cpu", mapped


def layout_line(device: str, mapped: list[str], threads: int | None) -> str:
    """The one line that says where the run goes and what was mapped."""
    where = f"one process on {device}" + (f", torch threads {threads} (rollout.threads)" if threads else "")
    return f"pcl: --local: {where}" + (f"; mapped to one: {', '.join(mapped)}" if mapped else "")
