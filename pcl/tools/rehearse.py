"""A preset's layout on CPU, for a rehearsal (`pcl train PRESET --rehearse`, entrypoints/rehearse.py):

    cfg, swapped = rehearsal_config(load_config(preset), load_config("configs/tiny.yaml"))
    for line in swapped: print(line)         # every setting the rehearsal changed, "key: preset -> rehearsal"

Kept as the preset says: the number of rollout workers and their tensor_parallel_size, the engine (vLLM stays
vLLM: its CPU build), the learner's and V's ranks, the weight-sync route and bucket, the queue settings (redis),
the selection strategy, the optimizer, the verifier workers, the custom resources. Swapped in from the tiny
config: the model and V's model, the data, the lengths (data.max_prompt_tokens, rollout.max_new_tokens), the
evaluation section and the logging backends. Shrunk to fit a 2-core machine: no GPUs (CPU bundles), gloo for
NCCL, one thread per worker, one verifier process, no compiled layers, 2 steps; m and n scaled to the tiny
config's (m rounded up to a multiple of the rollout workers) and rollout.max_in_flight scaled with m, so a step's
requests still make the preset's number of chunks a worker.
"""

from __future__ import annotations

import math

from pcl.config import Config

REHEARSAL_STEPS = 2


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in d.items():
        if isinstance(value, dict) and value and key not in ("resources",):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def rehearsal_config(preset, tiny):
    """The preset (`pcl.config.Config`) with the tiny config's model, data and lengths and the CPU shrinkage the
    module docstring lists; returns (config, swapped: one "key: before -> after" line per changed setting)."""
    d, t = preset.model_dump(), tiny.model_dump()
    workers = d["rollout"]["num_workers"]
    m = max(workers, math.ceil(t["run"]["m"] / workers) * workers)
    chunk = max(1, round(d["rollout"]["max_in_flight"] * m / d["run"]["m"]))
    d["run"].update(name=f"{d['run']['name']}-rehearsal", steps=REHEARSAL_STEPS, m=m, n=t["run"]["n"],
                    eval_every=0, time_budget_s=None)
    for section in ("data", "model", "evaluation", "logging"):
        d[section] = t[section]
    d["value"]["path"] = t["value"]["path"]
    d["rollout"].update(max_new_tokens=t["rollout"]["max_new_tokens"], num_gpus_per_worker=0.0, threads=1,
                        max_in_flight=chunk)
    d["learner"].update(num_gpus_per_rank=0.0, compile=False,
                        backend="gloo" if d["learner"]["backend"] == "nccl" else d["learner"]["backend"])
    d["verifier"]["processes"] = 1
    d["control"]["port"] = 0
    cfg = Config.model_validate(d)
    before, after = _flat(preset.model_dump()), _flat(cfg.model_dump())
    swapped = [f"{key}: {before.get(key)!r} -> {value!r}" for key, value in after.items()
               if before.get(key) != value]
    return cfg, swapped


def layout(cfg) -> tuple:
    """What a rehearsal exercises of a config: presets with the same layout rehearse the same thing."""
    r, learner = cfg.rollout, cfg.learner
    return (r.engine, r.num_workers, r.tensor_parallel_size, r.num_gpus_per_worker, r.weight_sync, r.max_in_flight,
            learner.num_ranks, learner.num_gpus_per_rank, cfg.value.num_ranks, cfg.verifier.num_workers,
            cfg.selection.type, cfg.run.m, cfg.run.n, tuple(cfg.redis.model_dump().items()))
