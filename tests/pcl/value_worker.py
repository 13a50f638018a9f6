"""Ranks of a sharded value model for tests/pcl/test_value_sharded.py: real processes joined by gloo.

    out = run_ranks(world_size=2, model_dir=..., out_dir=...)

spawns `world_size` processes, each builds a `pcl.models.value_sharded.ShardedValueTrainer` on the tiny model and
runs the scenarios below; rank 0 writes what the test compares (`<name>.pt`), every rank its stats
(`<name>.rank<r>.json`).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

# A large Adam eps, as in learner_worker: the first update then scales with the gradient, so a gradient that
# is averaged instead of summed over ranks would show.
ADAM = {"lr": 1e-2, "eps": 1e-2, "weight_decay": 0.1}
BATCH_SIZE, GRAD_CLIP = 2, 0.05  # clip low enough to bite: the global norm is clipped, not a shard's
PROMPTS = [[4, 5, 6], [7, 8, 9, 10, 11, 12, 13], [5], [6, 6, 6, 6, 6], [20, 21, 22], [9, 9], [3, 30, 3]]
TARGETS = [0.1, 0.9, 0.5, 0.0, 1.0, 0.25, 0.75]
# The second step's prompts; each rank's share as [start, end) of the list, by world size. Step 2 leaves
# rank 1 without prompts: it must run empty passes in step with rank 0's.
STEPS = [(PROMPTS, TARGETS, {1: [(0, 7)], 2: [(0, 5), (5, 7)]}),
         (PROMPTS[2:], TARGETS[2:], {1: [(0, 5)], 2: [(0, 5), (5, 5)]})]


def randomised_model(model_dir: str):
    """The tiny V with a seeded non-zero head (a zero head gives the backbone no gradient)."""
    from pcl.models.value import ValueModel

    model = ValueModel.from_pretrained(model_dir, dtype="float32", device="cpu")
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        model.head.weight.copy_(torch.randn(model.head.weight.shape, generator=generator) * 0.3)
        model.head.bias.fill_(0.1)
    return model


def _trainer(model_dir: str, rank: int, world_size: int):
    from pcl.models.value_sharded import ShardedValueTrainer

    return ShardedValueTrainer(randomised_model(model_dir), device="cpu", rank=rank, world_size=world_size,
                               score_dtype="float32", grad_clip=GRAD_CLIP, batch_size=BATCH_SIZE, **ADAM)


def _share(step: int, world_size: int, rank: int) -> tuple[list, list]:
    prompts, targets, shares = STEPS[step]
    start, end = shares[world_size][rank]
    return prompts[start:end], targets[start:end]


def _scorer_gap(trainer, state: dict) -> float:
    """Largest difference between the scoring copy and the full trained weights (rank 0)."""
    copy = trainer.scorer.state_dict()
    return max((copy[k].float() - v.float()).abs().max().item() for k, v in state["model"].items())


def _run(model_dir: str, out: Path, rank: int, world_size: int) -> None:
    a = _trainer(model_dir, rank, world_size)
    stats, results = [], {}
    for step in range(2):
        stats.append(a.train_step(*_share(step, world_size, rank)))
        state = a.state_dict()
        if step == 0:
            a.save_checkpoint(out / "checkpoint")
        if rank == 0:
            results[f"weights{step}"] = state["model"]
            results[f"scorer_gap{step}"] = _scorer_gap(a, state)
    results["scores"] = torch.tensor(a.score(PROMPTS))  # every rank scores alone, with its copy
    b = _trainer(model_dir, rank, world_size)  # resumes from the checkpoint after step 1
    b.load_checkpoint(out / "checkpoint")
    stats.append(b.train_step(*_share(1, world_size, rank)))
    resumed = b.state_dict()
    try:  # a bad target on the last rank: every rank raises, none waits
        bad_prompts, bad_targets = _share(0, world_size, rank)
        b.train_step(bad_prompts, [1.5] * len(bad_targets) if rank == world_size - 1 else bad_targets)
        message = None
    except ValueError as exc:
        message = str(exc)
    after_bad = b.train_step(*_share(1, world_size, rank))  # the group still works
    (out / f"stats.rank{rank}.json").write_text(json.dumps(
        {"steps": stats, "bad": message, "after_bad_loss": after_bad["loss"], "steps_b": b.steps}))
    if rank == 0:
        results["resumed"] = resumed["model"]
    torch.save(results, out / f"results.rank{rank}.pt")


def _rank_main(rank: int, world_size: int, port: int, model_dir: str, out_dir: str) -> None:
    import torch.distributed as dist

    from pcl.models.learner import init_process_group

    torch.set_num_threads(1)
    init_process_group("gloo", f"tcp://127.0.0.1:{port}", rank, world_size, timeout_s=120)
    try:
        _run(model_dir, Path(out_dir), rank, world_size)
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # see learner_worker: skip interpreter finalization once every result is on disk


def run_ranks(world_size: int, model_dir: str, out_dir: str) -> Path:
    import torch.multiprocessing as mp

    from tests.pcl.learner_worker import free_port

    mp.spawn(_rank_main, args=(world_size, free_port(), str(model_dir), str(out_dir)), nprocs=world_size,
             join=True)
    return Path(out_dir)
