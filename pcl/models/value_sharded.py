"""One rank of the value model V sharded with FSDP2 over `value.num_ranks` processes (gloo on CPU, NCCL on GPU).

A full-size V (the policy's size, as the paper has it) trains in float32 with AdamW: about 16 bytes per
parameter (weights, gradients, two moments), ~121 GB for Qwen3-8B's backbone, more than one GPU holds.
Sharded over N ranks each holds 16/N bytes per parameter, plus an unsharded scoring copy (2 bytes per
parameter in bfloat16) that every rank refreshes after each step and scores its share of the candidates with,
without collectives:

    init_process_group("auto", "tcp://10.0.0.1:29501", rank, world_size)        # pcl.models.learner
    trainer = ShardedValueTrainer(ValueModel.from_pretrained(path), lr=1e-6, device="cuda",
                                  rank=rank, world_size=world_size, score_dtype="auto")
    values = trainer.score(my_share_of_candidates)           # local: the scoring copy
    stats = trainer.train_step(my_prompts, my_pass_rates)     # collective: one AdamW step over all shares
    trainer.save_checkpoint(directory)                        # collective: rank 0 writes

    trainer = build_value_trainer(cfg.value, path, "cpu", seed, rank, world_size, master, timeout_s)  # from config

`train_step`'s loss is a sum over prompts and FSDP2 sums gradients over ranks (`pcl.models.sharding`), so the ranks'
shares add up to the step one unsharded ValueTrainer takes on all the prompts. A checkpoint has the unsharded
trainer's format (`trainer.pt` with integer-keyed optimizer state), so either loads the other's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch
import torch.distributed as dist

from pcl.checkpoint_store import load_tensors
from pcl.rl import value_loss
from pcl.models.sharding import agree, full_state, shard_by_layer
from pcl.models.value import ValueModel, ValueTrainer, resolve_score_dtype, score_copy


class ShardedValueTrainer(ValueTrainer):
    """ValueTrainer over an FSDP2-sharded V; `train_step`, `state_dict`, `load_state_dict` and the checkpoint
    methods are collective (every rank calls them, in the same order), `score` is local.

    Args:
        model: the unsharded value model, float32, on CPU (it is sharded onto `device` here).
        device: this rank's device ('cpu' or 'cuda[:N]').
        rank, world_size: this process's place in the initialised process group.
        score_dtype: the scoring copy's dtype ('auto': bfloat16 on GPU, float32 on CPU); there is always one.
        lr, grad_clip, batch_size, weight_decay, betas, eps, max_tokens_per_micro_batch, activation_checkpointing:
            as ValueTrainer.
        reshard_after_forward: FSDP2's; False keeps gathered layers from forward to backward.
    """

    def __init__(self, model: ValueModel, lr: float, device: str | torch.device, rank: int, world_size: int,
                 score_dtype: str = "auto", grad_clip: float | None = 1.0, batch_size: int = 64,
                 weight_decay: float = 0.0, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 reshard_after_forward: bool = True, max_tokens_per_micro_batch: int | None = None,
                 activation_checkpointing: bool = False) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy

        if not dist.is_initialized():
            raise RuntimeError("ShardedValueTrainer: call pcl.models.learner.init_process_group(...) on every rank first")
        if (rank, world_size) != (dist.get_rank(), dist.get_world_size()):
            raise ValueError(f"rank/world_size ({rank}/{world_size}) differ from the process group's "
                             f"({dist.get_rank()}/{dist.get_world_size()})")
        device = torch.device(device)
        self.rank, self.world_size, self.device = rank, world_size, device
        dtype = resolve_score_dtype(score_dtype, device) or torch.float32
        scorer = score_copy(model, dtype).to(device)  # before sharding: the copy stays whole on every rank
        mesh = init_device_mesh(device.type, (world_size,))
        policy = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
        shard_by_layer(model, mesh, policy, reshard_after_forward, layers_of=model.backbone)
        super().__init__(model, lr, grad_clip=grad_clip, batch_size=batch_size, weight_decay=weight_decay,
                         betas=betas, eps=eps, max_tokens_per_micro_batch=max_tokens_per_micro_batch,
                         activation_checkpointing=activation_checkpointing)
        self.scorer = scorer

    def refresh_scorer(self) -> None:
        """Gather the trained weights into every rank's scoring copy (collective), one tensor at a time, cast
        to the copy's dtype before the gather (half the traffic in bfloat16)."""
        source = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, target in self.scorer.named_parameters():
                weight = source[name]
                if hasattr(weight, "full_tensor"):
                    weight = weight.detach().to(target.dtype).full_tensor()
                target.copy_(weight)

    def train_step(self, token_ids_list: Sequence[Sequence[int]], targets: Sequence[float]) -> dict[str, float]:
        """One AdamW step over every rank's share (this rank's may be empty; all of them together not).

        Returns loss (summed over all ranks' prompts, before the step), grad_norm (global, before
        clipping), num_prompts (all ranks'), skipped; the same on every rank.
        """
        problem, targets_tensor = None, None
        try:
            targets_tensor = self._check_targets(token_ids_list, targets, allow_empty=True)
        except ValueError as exc:
            problem = str(exc)
        try:
            batches = [] if problem else list(self._batches(token_ids_list))
        except ValueError as exc:  # a prompt over the token budget: raised below on every rank together
            problem, batches = str(exc), []
        # Every rank runs the same number of forward/backward passes (each is a chain of collectives) and
        # raises together when any share is bad, instead of leaving the others waiting.
        passes, failed = agree([max(1, len(batches)), problem is not None], dist.ReduceOp.MAX, self.device)
        (count,) = agree([0 if problem else len(targets_tensor)], dist.ReduceOp.SUM, self.device)
        if failed or count == 0:
            raise ValueError(problem or ("token_ids_list: train_step needs at least one prompt" if count == 0
                                         else "train_step: another value rank rejected its share"))
        self.optimizer.zero_grad(set_to_none=True)
        total_loss = torch.zeros((), dtype=torch.float64, device=self.device)
        for index in range(int(passes)):
            if index < len(batches):
                indices, input_ids, attention_mask = batches[index]
                values = self.model(input_ids, attention_mask)  # [b]
                loss = value_loss(values, targets_tensor[indices].to(values.device),
                                  reduction="sum")
            else:  # one padding token, weight 0: no gradient, but this rank's collectives stay in step
                one = torch.zeros((1, 1), dtype=torch.long, device=self.device)
                loss = self.model(one, torch.ones_like(one)).sum() * 0.0
            loss.backward()
            total_loss += loss.detach().double()
        grad_norm, skipped = self._clip_and_step()
        (loss_sum,) = agree([total_loss.item()], dist.ReduceOp.SUM, self.device)
        return {"loss": loss_sum, "grad_norm": grad_norm, "num_prompts": float(count), "skipped": float(skipped)}

    # ------------------------------------------------------------------------------------------------------
    # Checkpoints: full (unsharded, CPU) state on rank 0, in the unsharded trainer's format.

    def _names(self) -> list[str]:
        return [name for name, _ in self.model.named_parameters()]

    def state_dict(self) -> dict[str, Any]:
        """Full model and AdamW state on rank 0 (the unsharded trainer's format), {} on the others."""
        model, optimizer = full_state(self.model, self.optimizer)
        if self.rank != 0:
            return {}
        index = {name: i for i, name in enumerate(self._names())}
        # One rank's AdamW `step` tensors are the live ones: cloned, so the state does not move on.
        state = {index[name]: {k: v.clone() if torch.is_tensor(v) else v for k, v in entry.items()}
                 for name, entry in optimizer["state"].items()}
        groups = [{**group, "params": [index[name] for name in group["params"]]}
                  for group in optimizer["param_groups"]]
        model = {k: v.clone() if torch.is_tensor(v) else v for k, v in model.items()}
        return {"model": model, "optimizer": {"state": state, "param_groups": groups}, "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a `state_dict()` (of any number of ranks); rank 0's is broadcast (the others may pass {})."""
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                             set_optimizer_state_dict)

        problem = None
        if self.rank == 0 and {"model", "optimizer", "steps"} - set(state):
            problem = f"value trainer state: expected keys model, optimizer, steps; got {sorted(state)}"
        (failed,) = agree([problem is not None], dist.ReduceOp.MAX, self.device)
        if failed:
            raise ValueError(problem or "load_state_dict: rank 0 rejected the value checkpoint state")
        model_state, optimizer_state = {}, {}
        if self.rank == 0:
            names = self._names()
            model_state = dict(state["model"])
            entries = state["optimizer"]["state"].items()
            optimizer_state = {
                "state": {names[int(i)]: {k: v.clone() if torch.is_tensor(v) and v.dim() == 0 else v
                                          for k, v in entry.items()} for i, entry in entries},
                "param_groups": [{**group, "params": [names[int(i)] for i in group["params"]]}
                                 for group in state["optimizer"]["param_groups"]]}
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(self.model, model_state, options=options)
        set_optimizer_state_dict(self.model, self.optimizer, optimizer_state, options=options)
        (steps,) = agree([state["steps"] if self.rank == 0 else 0], dist.ReduceOp.MAX, self.device)
        self.steps = int(steps)
        self.refresh_scorer()

    def save_checkpoint(self, directory: str | Path) -> None:
        """What ValueTrainer.save_checkpoint writes (collective; rank 0 writes, with its RNG state)."""
        directory = Path(directory)
        state = self.state_dict()
        if self.rank == 0:
            self.model.save_pretrained(directory, state_dict=state["model"])
            torch.save({**state, "rng": torch.get_rng_state()}, directory / "trainer.pt")
        dist.barrier()

    def load_checkpoint(self, directory: str | Path) -> None:
        state = load_tensors(Path(directory) / "trainer.pt") if self.rank == 0 else {}
        self.load_state_dict(state)
        if self.rank == 0 and "rng" in state:
            torch.set_rng_state(state["rng"].cpu())


def build_value_trainer(cfg, model_path: str, device: str, seed: int, rank: int = 0, world_size: int = 1,
                        master: tuple[str, int] | None = None, timeout_s: float = 1800.0) -> ValueTrainer:
    """V's trainer of one rank, built from the `value` section (`cfg`, a `pcl.config.ValueModelConfig`) with torch
    seeded by `seed` first: an unsharded ValueTrainer for one rank (the value scorer actor's, and `pcl train
    --local`'s), else a ShardedValueTrainer in a new process group (NCCL on GPU, gloo on CPU) whose rank 0 listens at
    `master`."""
    torch.manual_seed(seed)
    options = dict(grad_clip=cfg.grad_clip, batch_size=cfg.batch_size, score_dtype=cfg.score_dtype,
                   max_tokens_per_micro_batch=cfg.max_tokens_per_micro_batch,
                   activation_checkpointing=cfg.activation_checkpointing)
    if world_size == 1:
        return ValueTrainer(ValueModel.from_pretrained(model_path, dtype="float32", device=device), lr=cfg.lr,
                            **options)
    from pcl.models.process_group import init_process_group

    gpu = device.startswith("cuda")
    init_process_group("nccl" if gpu else "gloo", f"tcp://{master[0]}:{master[1]}", rank, world_size, timeout_s)
    where = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
    model = ValueModel.from_pretrained(model_path, dtype="float32", device="cpu")  # sharded onto `where`
    return ShardedValueTrainer(model, cfg.lr, device=where, rank=rank, world_size=world_size, **options)
