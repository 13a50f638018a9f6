"""The policy learner of one rank: FSDP2-sharded policy, AdamW, one on-policy gradient step per call.

M learner ranks form one torch.distributed process group; each rank builds a `PolicyLearner` and every
call below is collective (all ranks call it, in the same order):

    backend = init_process_group("auto", "tcp://10.0.0.1:29500", rank, world_size)
    learner = PolicyLearner(model_dir, cfg.optimizer, micro_batch_size=8, device="auto", dtype="bfloat16",
                            rank=rank, world_size=world_size, seed=0, max_tokens_per_micro_batch=16384,
                            activation_checkpointing=True)      # cfg.optimizer or an AdamWSettings
    stats = learner.train_step(my_share, num_sequences=m * n)   # {loss, grad_norm, num_tokens, seconds, ...}
    weights = learner.full_state_dict()                         # rank 0: full CPU tensors; others: {}
    for name, tensor in learner.stream_weights(256 << 20):     # rank 0: full tensors on its device, as gathered

Sharding: `fully_shard` (FSDP2) on every decoder layer, then on the root (embeddings, final norm, head).
It runs on CPU with gloo through a CPU device mesh (`init_device_mesh("cpu", ...)`), and on GPU with NCCL.
Master weights and AdamW state are float32; `dtype` is the compute dtype (FSDP2 mixed precision casts
the gathered parameters to it, gradients are reduced in float32) and the dtype of exported weights.

The model's forward is replaced (`pcl.models.policy_forward`): it returns the response tokens' log-probabilities
from the final hidden states through the LM head in chunks, so no [B, T, V] logits tensor exists; with
`activation_checkpointing` each decoder layer is recomputed in backward. Micro-batches are packed by a token
budget (`pcl.models.micro_batches`).

Gradients are summed over ranks, not averaged: each rank's loss is already divided by the global number
of sequences (algorithm step 7), so the ranks' gradients add up to the gradient of the whole batch.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Collection, Iterator
from typing import Any, Sequence

import torch
import torch.distributed as dist

from pcl.models.full_weights import stream_weights, weight_specs
from pcl.models.micro_batches import (MicroBatch, check_sequences, collate_micro_batch, dummy_micro_batch, length,
                                      pack_micro_batches, split_micro_batches)
from pcl.models.policy_forward import checkpoint_layers, decoder_layers, install_logprob_forward
from pcl.models.policy_forward import compile_layers as compile_decoder_layers
from pcl.models.process_group import init_process_group, resolve_backend, resolve_device
from pcl.models.sharding import agree, full_state, shard_by_layer, total_norm
from pcl.rl import policy_gradient_loss

__all__ = ["AdamWSettings", "PolicyLearner", "check_sequences", "collate_micro_batch", "init_process_group",
           "resolve_backend"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class AdamWSettings:
    """The optimizer settings the learner reads: the `optimizer` section's fields (`pcl.config.OptimizerConfig`
    has the same names and can be passed instead); a plain dataclass, so the learner imports without pydantic."""

    lr: float = 8e-6
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    grad_clip: float | None = 1.0


class PolicyLearner:
    """One rank of the FSDP2 policy learner (see the module docstring); every method is collective.

    max_tokens_per_micro_batch: micro-batches hold at most this many tokens, padding included (sequences x
        the longest); None: `micro_batch_size` sequences whatever their length. `micro_batch_size` caps the
        sequences of a micro-batch either way.
    activation_checkpointing: recompute each decoder layer's activations in the backward pass (memory of one
        layer's input per layer instead of all its activations, for about a third more compute).
    logits_chunk_tokens: positions whose logits exist at once (the LM head runs chunk by chunk).
    attn_implementation: the attention kernel ('sdpa', 'flash_attention_2', 'eager'); None: transformers' default.
    compile_layers: torch.compile each decoder layer's computation (fused elementwise kernels; the first passes
        of each new shape pay the compilation).
    """

    def __init__(self, model_path: str, optimizer_cfg: AdamWSettings, micro_batch_size: int,
                 device: str = "auto", dtype: str | torch.dtype = "float32", rank: int = 0,
                 world_size: int = 1, seed: int = 0, reshard_after_forward: bool = True,
                 max_tokens_per_micro_batch: int | None = None, activation_checkpointing: bool = False,
                 logits_chunk_tokens: int = 1024, attn_implementation: str | None = None,
                 compile_layers: bool = False):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy
        from transformers import AutoModelForCausalLM

        if not dist.is_initialized():
            raise RuntimeError("PolicyLearner: call init_process_group(...) on every rank first")
        if (rank, world_size) != (dist.get_rank(), dist.get_world_size()):
            raise ValueError(f"rank/world_size ({rank}/{world_size}) differ from the process group's "
                             f"({dist.get_rank()}/{dist.get_world_size()})")
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size: expected >= 1, got {micro_batch_size}")
        if max_tokens_per_micro_batch is not None and max_tokens_per_micro_batch < 2:
            raise ValueError(f"max_tokens_per_micro_batch: expected None or >= 2, got {max_tokens_per_micro_batch}")
        if isinstance(dtype, str) and dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {sorted(DTYPES)}, got {dtype!r}")
        self.dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
        self.rank, self.world_size, self.micro_batch_size = rank, world_size, micro_batch_size
        self.max_tokens_per_micro_batch = max_tokens_per_micro_batch
        self.optimizer_cfg = optimizer_cfg
        # False keeps each layer's gathered weights for the whole step: one all-gather per layer per step
        # instead of two per micro-batch, for the memory of an unsharded model (small models, CPU runs).
        self.reshard_after_forward = reshard_after_forward
        self.device = resolve_device(device, rank)
        torch.manual_seed(seed)

        extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, **extra)
        self.vocab_size = self.model.get_input_embeddings().num_embeddings
        install_logprob_forward(self.model, logits_chunk_tokens)
        if compile_layers:
            compile_decoder_layers(decoder_layers(self.model))
        if activation_checkpointing:
            checkpoint_layers(decoder_layers(self.model))
        mesh = init_device_mesh(self.device.type, (world_size,))
        self._shard(mesh, MixedPrecisionPolicy(param_dtype=self.dtype, reduce_dtype=torch.float32))
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=optimizer_cfg.lr, betas=(optimizer_cfg.beta1, optimizer_cfg.beta2),
            eps=optimizer_cfg.eps, weight_decay=optimizer_cfg.weight_decay,
            **({"fused": True} if self.device.type == "cuda" else {}))
        self.steps = 0

    def _shard(self, mesh, mp_policy) -> None:
        shard_by_layer(self.model, mesh, mp_policy, self.reshard_after_forward)

    def _agree(self, values: list[float], op: dist.ReduceOp) -> list[float]:
        return agree(values, op, self.device)

    def train_step(self, sequences: Sequence[dict], num_sequences: int) -> dict[str, float]:
        """One optimizer step on this rank's share of the step's batch (algorithm step 7).

        Args:
            sequences: this rank's sequences, dicts with prompt_token_ids, response_token_ids (non-empty
                lists of ids), advantage (float) and optionally response_logprobs (the engine's log p of each
                sampled token); may be empty.
            num_sequences: the number of sequences of the whole step over all ranks (the loss divisor).

        Returns:
            loss (the whole batch's, equal on all ranks), grad_norm (global, before clipping),
            num_tokens (this rank's response tokens), seconds (this rank's wall time), step_skipped
            (1.0 when the gradient norm was not finite and the update was skipped), micro_batches (this
            rank's passes), learner_padding_ratio (padding's share of the tokens computed, all ranks); with
            response_logprobs on any rank, logprob_gap_mean and logprob_gap_max: |log p_engine - log p_learner|
            over the sampled tokens of all ranks.
        """
        start = time.perf_counter()
        problem = check_sequences(sequences, num_sequences, self.vocab_size, self.max_tokens_per_micro_batch)
        lengths = [] if problem else [length(s) for s in sequences]
        chunks = pack_micro_batches(lengths, self.micro_batch_size, self.max_tokens_per_micro_batch)
        has_engine = any(s.get("response_logprobs") is not None for s in sequences) if not problem else False
        # Every rank runs the same number of forward/backward passes (each pass is a chain of collectives),
        # and every rank raises together when any share is bad, instead of leaving the others waiting.
        num_passes, failed, any_engine = self._agree([max(1, len(chunks)), problem is not None, has_engine],
                                                     dist.ReduceOp.MAX)
        if failed:
            raise ValueError(problem or "train_step: another learner rank rejected its share of the batch")
        # A rank with fewer micro-batches splits its own rather than run dummy passes.
        chunks = split_micro_batches(chunks, lengths, int(num_passes))
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        totals = torch.zeros(4, dtype=torch.float64, device=self.device)  # loss, gap sum, gap count, gap max
        num_tokens, computed, padded = 0, 0, 0
        for index in range(int(num_passes)):
            batch = (collate_micro_batch([sequences[i] for i in chunks[index]], self.device) if index < len(chunks)
                     else dummy_micro_batch(self.device))
            if not self.reshard_after_forward:  # reshard after the last backward, before the update
                self.model.set_reshard_after_backward(index == num_passes - 1)
            self._forward_backward(batch, num_sequences, totals)
            num_tokens += batch.num_tokens
            computed += batch.input_ids.numel()
            padded += batch.padded_tokens
        grad_norm = self._clip_gradients()
        skipped = not math.isfinite(grad_norm)
        if not skipped:
            self.optimizer.step()
            self.steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        return {**self._step_stats(totals, computed, padded, any_engine), "grad_norm": grad_norm,
                "num_tokens": float(num_tokens), "seconds": time.perf_counter() - start,
                "step_skipped": float(skipped), "micro_batches": float(len(chunks))}

    def _step_stats(self, totals: torch.Tensor, computed: int, padded: int, any_engine: bool) -> dict[str, float]:
        """The step's loss, padding ratio and (with engine log-probs) log-prob gaps over all ranks."""
        loss, gap_sum, gap_count, computed_all, padded_all = self._agree(
            totals[:3].tolist() + [computed, padded], dist.ReduceOp.SUM)
        stats = {"loss": loss, "learner_padding_ratio": padded_all / computed_all if computed_all else 0.0}
        if any_engine:
            (gap_max,) = self._agree([totals[3].item()], dist.ReduceOp.MAX)
            stats["logprob_gap_mean"] = gap_sum / gap_count if gap_count else math.nan
            stats["logprob_gap_max"] = gap_max if gap_count else math.nan
        return stats

    def _forward_backward(self, batch: MicroBatch, num_sequences: int, totals: torch.Tensor) -> None:
        """Accumulate this micro-batch's gradient (FSDP2 reduce-scatters it into the sharded grads); adds its
        loss and engine log-prob gaps to `totals` without a device sync."""
        flat = self.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                          response_mask=batch.response_mask)  # [N] log pi of each response token
        logprobs = torch.zeros(batch.response_mask.shape, dtype=flat.dtype, device=flat.device)
        logprobs = logprobs.masked_scatter(batch.response_mask, flat)  # [B, T-1]
        # On-policy: the sampling policy is the current one, so old_logprobs = logprobs and ratio = 1
        # (algorithm step 7); the gradient is the REINFORCE gradient with the group-mean baseline.
        loss = policy_gradient_loss(logprobs, logprobs.detach(), batch.advantages, batch.response_mask,
                                    num_sequences=num_sequences)
        loss.backward()
        totals[0] += loss.detach().double()
        if batch.engine_logprobs is not None:
            gap = (batch.engine_logprobs.double() - flat.detach().double()).abs()
            known = ~torch.isnan(gap)
            gap = torch.where(known, gap, 0.0)  # tokens without an engine log-prob count nowhere
            totals[1:3] += torch.stack([gap.sum(), known.sum().double()])
            if gap.numel():
                totals[3] = torch.maximum(totals[3], gap.max())

    def _clip_gradients(self) -> float:
        """Global gradient norm over all ranks' shards (before clipping); clips when configured."""
        max_norm = self.optimizer_cfg.grad_clip
        # With DTensor gradients the norm is reduced over the mesh; an infinite max_norm only measures.
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(),
                                              max_norm=math.inf if max_norm is None else max_norm)
        return total_norm(norm)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The policy's full weights (HF names, CPU, in `dtype`) on rank 0; {} on the other ranks: for checkpoints,
        exports and the rpc route. One gather of all shards (per-tensor collectives cost ~1 ms each)."""
        full = {name: tensor.cpu() for name, tensor in self.stream_weights(math.inf)}
        return self._unshared(full) if self.rank == 0 else {}

    def weight_specs(self, skip: Collection[str] = ()) -> list[tuple[str, str, tuple[int, ...]]]:
        """(name, dtype, shape) of what `stream_weights(..., skip)` yields, in order; no collective."""
        return weight_specs(self.model, self.dtype, skip)

    def stream_weights(self, group_bytes: float, skip: Collection[str] = ()) -> Iterator[tuple[str, torch.Tensor]]:
        """The full weights in `dtype` on this rank's device, gathered about `group_bytes` at a time and yielded on
        rank 0 one tensor at a time (nothing on the others); every rank must iterate it to its end
        (`pcl.models.full_weights`: the collective weight sync sends them as they come)."""
        return stream_weights(self.model, self.dtype, group_bytes, skip)

    def save_pretrained(self, path: str) -> None:
        """Write the policy in Hugging Face format (rank 0 writes; all ranks join the gather)."""
        weights = self.full_state_dict()
        if self.rank == 0:
            self.model.save_pretrained(path, state_dict=weights)
            # save_pretrained records the float32 master dtype; the saved tensors are in `dtype`.
            self.model.config.dtype = self.dtype
            self.model.config.save_pretrained(path)
        dist.barrier()

    def save_checkpoint(self, directory: str) -> None:
        """Write this learner group's part of a checkpoint into `directory` (collective): the policy in Hugging
        Face format under `policy/` and `learner.pt` (full float32 weights, AdamW state, step count) from rank 0,
        and each rank's torch RNG state in `learner-rng-<rank>.pt`."""
        directory = Path(directory)
        self.save_pretrained(str(directory / "policy"))
        state = self.state_dict()
        if self.rank == 0:
            torch.save(state, directory / "learner.pt")
        torch.save(torch.get_rng_state(), directory / f"learner-rng-{self.rank}.pt")
        dist.barrier()

    def load_checkpoint(self, directory: str) -> None:
        """Restore what `save_checkpoint` wrote (collective; rank 0 reads `learner.pt` and broadcasts it)."""
        directory = Path(directory)
        from pcl.loop.checkpoint_store import load_tensors  # imports pcl.loop (pydantic): only where needed

        state = load_tensors(directory / "learner.pt") if self.rank == 0 else {}
        self.load_state_dict(state)
        rng = directory / f"learner-rng-{self.rank}.pt"
        if rng.is_file():
            torch.set_rng_state(load_tensors(rng))

    def state_dict(self) -> dict[str, Any]:
        """Checkpoint state: full (unsharded, float32, CPU) model and AdamW state on rank 0, {} elsewhere.

        Full rather than sharded: one plain dict that `torch.save` writes and that loads into any number
        of ranks; rank 0 holds the whole model and optimizer state in CPU memory while it is built.
        """
        model, optimizer = full_state(self.model, self.optimizer)
        if self.rank != 0:
            return {}
        optimizer["state"] = {name: self._unshared(entry) for name, entry in optimizer["state"].items()}
        return {"model": self._unshared(model), "optimizer": optimizer, "steps": self.steps}

    def _unshared(self, tensors: dict[str, Any]) -> dict[str, Any]:
        """`tensors` with every tensor that shares memory with a live parameter or optimizer state cloned.

        Gathering returns new tensors, except where there is nothing to gather (one rank; AdamW's scalar
        `step`): those are the live tensors themselves and would change with the next step.
        """
        def storage(t: torch.Tensor) -> int:
            return (t.to_local() if hasattr(t, "to_local") else t).untyped_storage().data_ptr()

        live = {storage(p) for p in self.model.parameters()}
        live.update(storage(t) for entry in self.optimizer.state.values()
                    for t in entry.values() if torch.is_tensor(t))
        return {k: v.clone() if torch.is_tensor(v) and storage(v) in live else v for k, v in tensors.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()`'s output; rank 0's copy is broadcast (other ranks may pass {})."""
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                             set_optimizer_state_dict)

        problem = None
        if self.rank == 0 and {"model", "optimizer", "steps"} - set(state):
            problem = f"state: expected keys model, optimizer, steps; got {sorted(state)}"
        elif self.rank == 0 and (odd := set(state["model"]) ^ set(self.model.state_dict())):
            problem = f"state['model']: parameter names differ from the policy's, e.g. {sorted(odd)[:3]}"
        (failed,) = self._agree([problem is not None], dist.ReduceOp.MAX)
        if failed:
            raise ValueError(problem or "load_state_dict: rank 0 rejected the checkpoint state")
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        model_state, optimizer_state = {}, {}
        if self.rank == 0:
            # The loaders write into the dicts they are given and hand scalar tensors (AdamW's `step`)
            # to the optimizer as they are: give them copies, so the caller's state stays as it was.
            def copy_entry(entry: dict) -> dict:
                return {k: v.clone() if torch.is_tensor(v) and v.dim() == 0 else v for k, v in entry.items()}

            model_state = dict(state["model"])
            optimizer_state = {"state": {k: copy_entry(v) for k, v in state["optimizer"]["state"].items()},
                               "param_groups": [dict(g) for g in state["optimizer"]["param_groups"]]}
        set_model_state_dict(self.model, model_state, options=options)
        set_optimizer_state_dict(self.model, self.optimizer, optimizer_state, options=options)
        (steps,) = self._agree([state["steps"] if self.rank == 0 else 0], dist.ReduceOp.MAX)
        self.steps = int(steps)
