"""Learner ranks for tests/pcl/test_learner.py: real processes joined by a real torch.distributed group.

    out = run_ranks(world_size=2, model_dir=..., out_dir=..., scenarios=["mbs1", "mbs4"])

spawns `world_size` processes (multiprocessing spawn), each builds `pcl.models.learner.PolicyLearner`s and runs
the named scenarios in order; rank 0 saves the gathered weights of each scenario as `<name>.pt` and every
rank saves its `train_step` stats as `<name>.rank<r>.json` under out_dir.
"""

from __future__ import annotations

import copy
import json
import math
import os
import random
import socket
import sys
from pathlib import Path

import torch

# Adam's eps is large on purpose: with a small eps the first AdamW update is ~lr * sign(grad) and would
# not notice a gradient that is off by a constant factor (e.g. averaged instead of summed over ranks).
OPTIMIZER = {"lr": 1e-2, "eps": 1e-2, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.99}
VOCAB_SIZE = 32  # the conftest tiny model's vocabulary
STEP_SEQUENCES, STEP_COUNT = 7, 7  # 7 sequences, divisor 7: uneven shares on 2 ranks
# A second step whose divisor exceeds its sequences, as when zero-advantage samples are left out.
NEXT_SEQUENCES, NEXT_COUNT = 5, 8

# name -> micro-batch size, gradient clip, how many of the step's sequences each rank gets (by world size).
SCENARIOS = {
    "mbs1": {"micro_batch_size": 1, "grad_clip": None, "shares": {1: [7], 2: [5, 2]}},
    "mbs4": {"micro_batch_size": 4, "grad_clip": None, "shares": {1: [7], 2: [7, 0]}},
    "clip": {"micro_batch_size": 2, "grad_clip": 0.5, "shares": {1: [7], 2: [3, 4]}},
    # Micro-batches by a token budget (the longest sequence has 14 tokens), and per-layer recomputation.
    "tokens": {"micro_batch_size": 8, "grad_clip": None, "shares": {1: [7], 2: [5, 2]},
               "kwargs": {"max_tokens_per_micro_batch": 20}},
    "ckpt": {"micro_batch_size": 2, "grad_clip": None, "shares": {1: [7], 2: [3, 4]},
             "kwargs": {"activation_checkpointing": True}},
    "both": {"micro_batch_size": 8, "grad_clip": None, "shares": {1: [7], 2: [4, 3]},
             "kwargs": {"activation_checkpointing": True, "max_tokens_per_micro_batch": 16}},
    # The same with each layer's computation compiled (torch.compile, Inductor's C++ backend on CPU).
    "compiled": {"micro_batch_size": 8, "grad_clip": None, "shares": {1: [7], 2: [4, 3]},
                 "kwargs": {"activation_checkpointing": True, "max_tokens_per_micro_batch": 16,
                            "compile_layers": True}},
}
# learner.off_policy in "off_policy": truncated importance sampling at this cap; the shifted engine log-probs
# give each response's first token the log-ratio log pi_learner - log pi_engine = 1 (ratio e, above the cap)
# and every other token -0.5.
OFF_POLICY_CAP, OFF_POLICY_LOG_RATIOS = 2.0, (1.0, -0.5)


def make_sequences(count: int, seed: int) -> list[dict]:
    """Deterministic sequences with prompts of 1-6 tokens, responses of 1-8 and non-zero advantages."""
    rng = random.Random(seed)
    sequences = []
    for index in range(count):
        prompt_len = 1 if index == 0 else rng.randint(1, 6)
        sequences.append({
            "prompt_token_ids": [rng.randrange(VOCAB_SIZE) for _ in range(prompt_len)],
            "response_token_ids": [rng.randrange(VOCAB_SIZE) for _ in range(rng.randint(1, 8))],
            "advantage": rng.choice([-1, 1]) * rng.uniform(0.1, 1.0),
        })
    return sequences


def split(sequences: list[dict], shares: list[int], rank: int) -> list[dict]:
    start = sum(shares[:rank])
    return sequences[start:start + shares[rank]]


def _same_tree(a, b) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same_tree(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same_tree(x, y) for x, y in zip(a, b))
    return torch.equal(a, b) if torch.is_tensor(a) else a == b


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _learner(model_dir: str, rank: int, world_size: int, device: str, micro_batch_size: int = 2,
             grad_clip: float | None = None, reshard_after_forward: bool = True, **kwargs):
    from pcl.config import OptimizerConfig
    from pcl.models.learner import PolicyLearner

    cfg = OptimizerConfig(grad_clip=grad_clip, **OPTIMIZER)
    return PolicyLearner(model_dir, cfg, micro_batch_size=micro_batch_size, device=device, dtype="float32",
                         rank=rank, world_size=world_size, seed=0,
                         reshard_after_forward=reshard_after_forward, **kwargs)


def _save(out: Path, name: str, rank: int, stats: dict, weights: dict | None = None) -> None:
    (out / f"{name}.rank{rank}.json").write_text(json.dumps(stats))
    if rank == 0 and weights is not None:
        torch.save(weights, out / f"{name}.pt")


def _run_step_scenario(name: str, model_dir: str, out: Path, rank: int, world_size: int, device: str) -> None:
    spec = SCENARIOS[name]
    learner = _learner(model_dir, rank, world_size, device, spec["micro_batch_size"], spec["grad_clip"],
                       **spec.get("kwargs", {}))
    share = split(make_sequences(STEP_SEQUENCES, seed=1), spec["shares"][world_size], rank)
    stats = learner.train_step(share, STEP_COUNT)
    if spec.get("kwargs", {}).get("compile_layers"):
        from torch._dynamo.utils import counters

        stats["compiled_frames"] = sum(counters["frames"].values())  # dynamo traced the layers' forward
    _save(out, name, rank, stats, learner.full_state_dict())
    if name == "mbs1":
        learner.save_pretrained(str(out / "hf"))


def _run_resume(model_dir: str, out: Path, rank: int, world_size: int, device: str) -> None:
    """A trains two steps; B loads A's checkpoint taken after step 1 and trains step 2."""
    first = split(make_sequences(STEP_SEQUENCES, seed=1), SCENARIOS["clip"]["shares"][world_size], rank)
    second = make_sequences(NEXT_SEQUENCES, seed=2)[rank::world_size]
    a = _learner(model_dir, rank, world_size, device)
    a.train_step(first, STEP_COUNT)
    state, weights = a.state_dict(), a.full_state_dict()
    kept, kept_weights = copy.deepcopy(state), copy.deepcopy(weights)
    checkpoint = out / f"checkpoint-{world_size}"  # through files, as a restart goes (torch.load weights_only)
    a.save_checkpoint(str(checkpoint))
    rng = torch.get_rng_state()
    a.train_step(second, NEXT_COUNT)
    after_a = a.full_state_dict()
    b = _learner(model_dir, rank, world_size, device)
    torch.manual_seed(1234)  # B's RNG must come from the checkpoint
    b.load_checkpoint(str(checkpoint))
    rng_restored = torch.equal(torch.get_rng_state(), rng)
    unchanged = _same_tree(kept, state)
    b.train_step(second, NEXT_COUNT)
    stats = {"steps_in_checkpoint": state.get("steps"), "state_keys": sorted(state), "rng_restored": rng_restored,
             "caller_state_unchanged": unchanged, "weights_unchanged": _same_tree(kept_weights, weights)}
    _save(out, "resume", rank, stats, {"a": after_a, "b": b.full_state_dict()})


class PlantedCode:
    """Pickles to a call of os.system: what a planted checkpoint file would run when unpickled."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _run_planted(model_dir: str, out: Path, rank: int, world_size: int, device: str) -> None:
    """One rank: a checkpoint whose learner.pt, then whose RNG file, is a pickle that runs code when loaded."""
    import shutil

    learner = _learner(model_dir, rank, world_size, device)
    good = out / "planted-good"
    learner.save_checkpoint(str(good))
    stats = {}
    for name in ("learner.pt", f"learner-rng-{rank}.pt"):
        bad, marker = out / f"planted-{name}", out / f"ran-{name}"
        shutil.copytree(good, bad)
        torch.save(PlantedCode(marker), bad / name)
        try:
            learner.load_checkpoint(str(bad))
            message = None
        except Exception as exc:  # noqa: BLE001 - reported to the test
            message = f"{type(exc).__name__}: {exc}"
        stats[name] = {"message": message, "code_ran": marker.exists()}
    _save(out, "planted", rank, stats)


def _run_unsharded(model_dir: str, out: Path, rank: int, world_size: int, device: str) -> None:
    """resume's learner A again, with gathered weights kept through each step (reshard_after_forward off)."""
    first = split(make_sequences(STEP_SEQUENCES, seed=1), SCENARIOS["clip"]["shares"][world_size], rank)
    second = make_sequences(NEXT_SEQUENCES, seed=2)[rank::world_size]
    learner = _learner(model_dir, rank, world_size, device, reshard_after_forward=False)
    stats = [learner.train_step(first, STEP_COUNT), learner.train_step(second, NEXT_COUNT)]
    _save(out, "unsharded", rank, {"steps": stats}, learner.full_state_dict())


def _run_gap(model_dir: str, out: Path, rank: int, world_size: int, device: str) -> None:
    """Rank 0's sequences carry engine log-probs (the learner's own, shifted by 0.25 on one token), rank 1's
    none; then a step where no rank has any."""
    learner = _learner(model_dir, rank, world_size, device, activation_checkpointing=True)
    share = split(make_sequences(STEP_SEQUENCES, seed=1), [4, 3] if world_size == 2 else [7], rank)
    with torch.no_grad():
        own = learner.model(**_batch_inputs(share))  # a collective: every rank runs it
    if rank == 0:
        offset = 0
        for index, seq in enumerate(share):
            size = len(seq["response_token_ids"])
            values = own[offset:offset + size].tolist()
            offset += size
            if index == 0:
                values[0] -= 0.25
            seq["response_logprobs"] = values
    with_gap = learner.train_step(share, STEP_COUNT)
    without = learner.train_step([{k: v for k, v in s.items() if k != "response_logprobs"} for s in share],
                                 STEP_COUNT)
    _save(out, "gap", rank, {"with": with_gap, "without": without})


def _run_off_policy(model_dir: str, out: Path, rank: int, world_size: int, device: str) -> None:
    """learner.off_policy.correction = truncated: one step with the engine's log-probs equal to the learner's own
    (on-policy), one from the same start with them shifted by OFF_POLICY_LOG_RATIOS."""
    from pcl.models.learner import OffPolicySettings

    share = split(make_sequences(STEP_SEQUENCES, seed=1), [4, 3] if world_size == 2 else [7], rank)
    stats, weights = {}, {}
    for name, (first, rest) in (("on_policy", (0.0, 0.0)), ("shifted", OFF_POLICY_LOG_RATIOS)):
        learner = _learner(model_dir, rank, world_size, device, micro_batch_size=2,
                           off_policy=OffPolicySettings("truncated", OFF_POLICY_CAP))
        with torch.no_grad():
            own = learner.model(**_batch_inputs(share)).tolist()  # a collective: every rank runs it
        sequences, offset = [], 0
        for seq in share:
            size = len(seq["response_token_ids"])
            shifts = [first] + [rest] * (size - 1)
            engine = [value - shift for value, shift in zip(own[offset:offset + size], shifts)]
            sequences.append({**seq, "response_logprobs": engine})
            offset += size
        stats[name] = learner.train_step(sequences, STEP_COUNT)
        weights[name] = learner.full_state_dict()
    _save(out, "off_policy", rank, stats, weights)


def _batch_inputs(share: list[dict]) -> dict:
    from pcl.models.micro_batches import collate_micro_batch

    batch = collate_micro_batch(share, torch.device("cpu"))
    return {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
            "response_mask": batch.response_mask}


def _run_bad_share(model_dir: str, out: Path, rank: int, world_size: int, device: str) -> None:
    """The last rank's share has an empty response: every rank must raise, none may hang."""
    learner = _learner(model_dir, rank, world_size, device)
    share = make_sequences(2, seed=3)[rank::world_size]
    if rank == world_size - 1:
        share = share + [{"prompt_token_ids": [1, 2], "response_token_ids": [], "advantage": 1.0}]
    try:
        learner.train_step(share, 4)
        message = None
    except ValueError as exc:
        message = str(exc)
    ok = learner.train_step(make_sequences(2, seed=3)[rank::world_size], 2)  # the group still works
    _save(out, "bad", rank, {"message": message, "next_loss": ok["loss"]})


def _run_poisoned(model_dir: str, out: Path, rank: int, world_size: int, device: str) -> None:
    """The last rank's share carries a NaN engine log-probability (every rank must raise, before any pass); then a
    share whose advantage overflows the gradient (every rank skips the step); then a good step."""
    from pcl.models.learner import OffPolicySettings

    learner = _learner(model_dir, rank, world_size, device, off_policy=OffPolicySettings("truncated", 2.0))
    share = [{**seq, "response_logprobs": [-1.0] * len(seq["response_token_ids"])}
             for seq in make_sequences(4, seed=3)[rank::world_size]]
    stats: dict = {}
    if rank == world_size - 1:
        nan = [math.nan] * len(share[1]["response_token_ids"])
        poisoned = [share[0], {**share[1], "response_logprobs": nan}]
    else:
        poisoned = share
    try:
        learner.train_step(poisoned, 4)
    except ValueError as exc:
        stats["refused"] = str(exc)
    before = learner.full_state_dict()
    overflow = [{**seq, "advantage": 3e38} for seq in share]  # finite, but its gradient is not
    stats["overflow"] = learner.train_step(overflow, 4)
    after_overflow = learner.full_state_dict()
    stats["next"] = learner.train_step(share, 4)
    _save(out, "poisoned", rank, stats, {"before": before, "after_overflow": after_overflow,
                                         "after_next": learner.full_state_dict()})


def _rank_main(rank: int, world_size: int, port: int, model_dir: str, out_dir: str, scenarios: list[str],
               backend: str, device: str) -> None:
    import torch.distributed as dist

    from pcl.models.learner import init_process_group

    torch.set_num_threads(1)
    init_process_group(backend, f"tcp://127.0.0.1:{port}", rank, world_size, timeout_s=120)
    try:
        for name in scenarios:
            if name == "resume":
                _run_resume(model_dir, Path(out_dir), rank, world_size, device)
            elif name == "planted":
                _run_planted(model_dir, Path(out_dir), rank, world_size, device)
            elif name == "bad":
                _run_bad_share(model_dir, Path(out_dir), rank, world_size, device)
            elif name == "poisoned":
                _run_poisoned(model_dir, Path(out_dir), rank, world_size, device)
            elif name == "gap":
                _run_gap(model_dir, Path(out_dir), rank, world_size, device)
            elif name == "off_policy":
                _run_off_policy(model_dir, Path(out_dir), rank, world_size, device)
            elif name == "unsharded":
                _run_unsharded(model_dir, Path(out_dir), rank, world_size, device)
            else:
                _run_step_scenario(name, model_dir, Path(out_dir), rank, world_size, device)
    finally:
        dist.destroy_process_group()
    # Every result is on disk now. Leave without the interpreter's finalization: there, a c10d thread left
    # joinable can std::terminate the process (SIGABRT, "terminate called without an active exception"),
    # about one exit in six on a 2-core VM, which would fail a run whose scenarios all passed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_ranks(world_size: int, model_dir: str, out_dir: str, scenarios: list[str], backend: str = "gloo",
              device: str = "cpu") -> Path:
    """Run the scenarios on `world_size` spawned ranks; raises if any rank fails."""
    import torch.multiprocessing as mp

    args = (world_size, free_port(), str(model_dir), str(out_dir), scenarios, backend, device)
    mp.spawn(_rank_main, args=args, nprocs=world_size, join=True)
    return Path(out_dir)
