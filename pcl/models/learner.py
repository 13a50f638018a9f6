"""The policy learner of one rank: FSDP2-sharded policy, AdamW, one on-policy gradient step per call.

M learner ranks form one torch.distributed process group; each rank builds a `PolicyLearner` and every
call below is collective (all ranks call it, in the same order):

    backend = init_process_group("auto", "tcp://10.0.0.1:29500", rank, world_size)
    learner = PolicyLearner(model_dir, cfg.optimizer, micro_batch_size=8, device="auto", dtype="float32",
                            rank=rank, world_size=world_size, seed=0)
    stats = learner.train_step(my_share, num_sequences=m * n)   # {loss, grad_norm, num_tokens, seconds}
    weights = learner.full_state_dict()                         # rank 0: full CPU tensors; others: {}

Sharding: `fully_shard` (FSDP2) on every decoder layer, then on the root (embeddings, final norm, head).
It runs on CPU with gloo through a CPU device mesh (`init_device_mesh("cpu", ...)`), and on GPU with NCCL.
Master weights and AdamW state are float32; `dtype` is the compute dtype (FSDP2 mixed precision casts
the gathered parameters to it, gradients are reduced in float32) and the dtype of exported weights.

Gradients are summed over ranks, not averaged: each rank's loss is already divided by the global number
of sequences (algorithm step 7), so the ranks' gradients add up to the gradient of the whole batch.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import timedelta
from numbers import Integral
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.distributed as dist

from pcl.loop.checkpoint_store import load_tensors
from pcl.config import OptimizerConfig
from pcl.rl import policy_gradient_loss, token_logprobs
from pcl.models.sharding import agree, full_state, shard_by_layer, total_norm

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_PAD_ID = 0  # any valid id: padded positions are masked out of attention and loss


def resolve_backend(backend: str) -> str:
    """'auto' -> 'nccl' when CUDA is available, else 'gloo'; 'gloo' / 'nccl' pass through."""
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend: expected 'auto', 'gloo' or 'nccl', got {backend!r}")
    return backend


def init_process_group(backend: str, init_method: str, rank: int, world_size: int,
                       timeout_s: float = 1800.0) -> str:
    """Join the learners' process group (e.g. init_method='tcp://host:port', rank 0 listens there).

    Returns the backend actually used. With NCCL the rank's CUDA device is selected first.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank: expected 0 <= rank < world_size ({world_size}), got {rank}")
    backend = resolve_backend(backend)
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout_s))
    return backend


def _resolve_device(device: str, rank: int) -> torch.device:
    """'auto' | 'cpu' | 'cuda' | 'cuda:N'; plain 'cuda' picks GPU rank % visible GPUs (0 under Ray)."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device != "cpu" and not (device.startswith("cuda") and torch.cuda.is_available()):
        raise ValueError(f"device: expected 'auto', 'cpu' or 'cuda[:N]' with CUDA available, got {device!r}")
    if device == "cpu":
        return torch.device("cpu")
    index = int(device.split(":")[1]) if ":" in device else rank % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


@dataclass
class MicroBatch:
    """Right-padded sequences (prompt + response) of one forward/backward pass."""

    input_ids: torch.Tensor  # [B, T] token ids, padded with _PAD_ID
    attention_mask: torch.Tensor  # [B, T] 1 on real tokens
    response_mask: torch.Tensor  # [B, T-1] 1 where the *next* token (input_ids[:, 1:]) is a response token
    advantages: torch.Tensor  # [B] A_i of each sequence (algorithm step 6)
    num_tokens: int  # response tokens in the micro-batch


def collate_micro_batch(sequences: Sequence[dict], device: torch.device) -> MicroBatch:
    """Pack sequences {prompt_token_ids, response_token_ids, advantage} into one right-padded MicroBatch."""
    width = max(_length(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), _PAD_ID, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    response_mask = torch.zeros((len(sequences), width - 1), dtype=torch.bool)
    for row, seq in enumerate(sequences):
        prompt, response = list(seq["prompt_token_ids"]), list(seq["response_token_ids"])
        length = len(prompt) + len(response)
        input_ids[row, :length] = torch.tensor(prompt + response, dtype=torch.long)
        attention_mask[row, :length] = 1
        # Logits at position t predict token t+1, so response token j (at len(prompt) + j) is scored at
        # position len(prompt) + j - 1.
        response_mask[row, len(prompt) - 1:length - 1] = True
    advantages = torch.tensor([float(s["advantage"]) for s in sequences], dtype=torch.float32)
    return MicroBatch(input_ids.to(device), attention_mask.to(device), response_mask.to(device),
                      advantages.to(device), int(response_mask.sum()))


def _length(sequence: dict) -> int:
    return len(sequence["prompt_token_ids"]) + len(sequence["response_token_ids"])


def _dummy_micro_batch(device: torch.device) -> MicroBatch:
    """Two tokens with advantage 0: zero loss and gradient, but the pass keeps this rank's all-gathers
    and reduce-scatters in step with ranks that hold more micro-batches."""
    batch = collate_micro_batch([{"prompt_token_ids": [_PAD_ID], "response_token_ids": [_PAD_ID],
                                  "advantage": 0.0}], device)
    batch.num_tokens = 0
    return batch


def check_sequences(sequences: Sequence[dict], num_sequences: int, vocab_size: int) -> str | None:
    """The first problem with a rank's share, as a message naming the bad input; None when usable."""
    if not isinstance(num_sequences, Integral) or num_sequences < max(1, len(sequences)):
        return (f"num_sequences: expected an int >= the {len(sequences)} sequences of this rank "
                f"(and >= 1), got {num_sequences!r}")
    for index, seq in enumerate(sequences):
        missing = {"prompt_token_ids", "response_token_ids", "advantage"} - set(seq)
        if missing:
            return f"sequence {index}: missing keys {sorted(missing)}"
        for key in ("prompt_token_ids", "response_token_ids"):
            ids = seq[key]
            if len(ids) == 0:
                return f"sequence {index}: {key} is empty"
            # min/max run at C speed; a share can hold thousands of sequences of thousands of tokens.
            low, high = min(ids), max(ids)
            integral = isinstance(low, Integral) and isinstance(high, Integral)
            if not (integral and 0 <= low and high < vocab_size):
                return f"sequence {index}: {key} must hold int ids in [0, {vocab_size}), got [{low}, {high}]"
        if not math.isfinite(float(seq["advantage"])):
            return f"sequence {index}: advantage is {seq['advantage']!r}"
    return None


class PolicyLearner:
    """One rank of the FSDP2 policy learner (see the module docstring); every method is collective."""

    def __init__(self, model_path: str, optimizer_cfg: OptimizerConfig, micro_batch_size: int,
                 device: str = "auto", dtype: str | torch.dtype = "float32", rank: int = 0,
                 world_size: int = 1, seed: int = 0, reshard_after_forward: bool = True):
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
        if isinstance(dtype, str) and dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {sorted(DTYPES)}, got {dtype!r}")
        self.dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
        self.rank, self.world_size, self.micro_batch_size = rank, world_size, micro_batch_size
        self.optimizer_cfg = optimizer_cfg
        # False keeps each layer's gathered weights for the whole step: one all-gather per layer per step
        # instead of two per micro-batch, for the memory of an unsharded model (small models, CPU runs).
        self.reshard_after_forward = reshard_after_forward
        self.device = _resolve_device(device, rank)
        torch.manual_seed(seed)

        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        self.vocab_size = self.model.get_input_embeddings().num_embeddings
        mesh = init_device_mesh(self.device.type, (world_size,))
        self._shard(mesh, MixedPrecisionPolicy(param_dtype=self.dtype, reduce_dtype=torch.float32))
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=optimizer_cfg.lr, betas=(optimizer_cfg.beta1, optimizer_cfg.beta2),
            eps=optimizer_cfg.eps, weight_decay=optimizer_cfg.weight_decay)
        self.steps = 0

    def _shard(self, mesh, mp_policy) -> None:
        shard_by_layer(self.model, mesh, mp_policy, self.reshard_after_forward)

    def _agree(self, values: list[float], op: dist.ReduceOp) -> list[float]:
        return agree(values, op, self.device)

    def train_step(self, sequences: Sequence[dict], num_sequences: int) -> dict[str, float]:
        """One optimizer step on this rank's share of the step's batch (algorithm step 7).

        Args:
            sequences: this rank's sequences, dicts with prompt_token_ids, response_token_ids (non-empty
                lists of ids) and advantage (float); may be empty.
            num_sequences: the number of sequences of the whole step over all ranks (the loss divisor).

        Returns:
            loss (the whole batch's, equal on all ranks), grad_norm (global, before clipping),
            num_tokens (this rank's response tokens), seconds (this rank's wall time), step_skipped
            (1.0 when the gradient norm was not finite and the update was skipped).
        """
        start = time.perf_counter()
        problem = check_sequences(sequences, num_sequences, self.vocab_size)
        # Longest first, so sequences of similar length share a micro-batch and little is padding.
        ordered = [] if problem else sorted(sequences, key=_length, reverse=True)
        size = self.micro_batch_size
        chunks = [ordered[i:i + size] for i in range(0, len(ordered), size)]
        # Every rank runs the same number of forward/backward passes (each pass is a chain of collectives),
        # and every rank raises together when any share is bad, instead of leaving the others waiting.
        num_passes, failed = self._agree([max(1, len(chunks)), problem is not None], dist.ReduceOp.MAX)
        if failed:
            raise ValueError(problem or "train_step: another learner rank rejected its share of the batch")
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum, num_tokens = torch.zeros((), device=self.device), 0
        for index in range(int(num_passes)):
            batch = (collate_micro_batch(chunks[index], self.device) if index < len(chunks)
                     else _dummy_micro_batch(self.device))
            if not self.reshard_after_forward:  # reshard after the last backward, before the update
                self.model.set_reshard_after_backward(index == num_passes - 1)
            loss_sum += self._forward_backward(batch, num_sequences)
            num_tokens += batch.num_tokens
        grad_norm = self._clip_gradients()
        skipped = not math.isfinite(grad_norm)
        if not skipped:
            self.optimizer.step()
            self.steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        (loss,) = self._agree([loss_sum.item()], dist.ReduceOp.SUM)
        return {"loss": loss, "grad_norm": grad_norm, "num_tokens": float(num_tokens),
                "seconds": time.perf_counter() - start, "step_skipped": float(skipped)}

    def _forward_backward(self, batch: MicroBatch, num_sequences: int) -> torch.Tensor:
        """Accumulate this micro-batch's gradient; FSDP2 reduce-scatters it into the sharded grads."""
        logits = self.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                            use_cache=False).logits  # [B, T, V]
        logprobs = token_logprobs(logits[:, :-1], batch.input_ids[:, 1:])  # [B, T-1]
        # On-policy: the sampling policy is the current one, so old_logprobs = logprobs and ratio = 1
        # (algorithm step 7); the gradient is the REINFORCE gradient with the group-mean baseline.
        loss = policy_gradient_loss(logprobs, logprobs.detach(), batch.advantages, batch.response_mask,
                                    num_sequences=num_sequences)
        loss.backward()
        return loss.detach()

    def _clip_gradients(self) -> float:
        """Global gradient norm over all ranks' shards (before clipping); clips when configured."""
        max_norm = self.optimizer_cfg.grad_clip
        # With DTensor gradients the norm is reduced over the mesh; an infinite max_norm only measures.
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(),
                                              max_norm=math.inf if max_norm is None else max_norm)
        return total_norm(norm)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The policy's full weights (HF names, CPU, in `dtype`) on rank 0; {} on the other ranks.

        One gather of all shards packed in a single buffer rather than one collective per tensor: the
        weight sync of every step goes through here, and per-tensor collectives cost ~1 ms each.
        """
        from torch.distributed.tensor import DTensor, Shard

        state = self.model.state_dict()
        sharded = {k: v for k, v in state.items() if isinstance(v, DTensor)}
        if any(v.placements != (Shard(0),) for v in sharded.values()):  # not FSDP2's layout: the generic path
            return self._gathered_state_dict()
        # FSDP2 shards dim 0 in torch.chunk pieces of ceil(rows / world) rows; pad every rank's piece to that.
        rows = {k: -(-v.shape[0] // self.world_size) for k, v in sharded.items()}
        width = {k: rows[k] * math.prod(v.shape[1:]) for k, v in sharded.items()}
        buffer = torch.zeros(sum(width.values()), dtype=self.dtype, device=self.device)
        offset = 0
        for k, v in sharded.items():
            local = v.to_local().detach().reshape(-1).to(self.dtype)
            buffer[offset:offset + local.numel()] = local
            offset += width[k]
        parts = [torch.empty_like(buffer) for _ in range(self.world_size)] if self.rank == 0 else None
        dist.gather(buffer, parts, dst=0)
        if self.rank != 0:
            return {}
        full, offset = {}, 0
        for k, v in sharded.items():
            pieces = [part[offset:offset + width[k]].view(rows[k], *v.shape[1:]) for part in parts]
            full[k] = torch.cat(pieces)[:v.shape[0]].cpu()
            offset += width[k]
        for k, v in state.items():
            if k not in full:  # replicated entries (buffers)
                full[k] = v.detach().to(self.dtype).cpu()
        return self._unshared({k: full[k] for k in state})

    def _gathered_state_dict(self) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        full = get_model_state_dict(self.model, options=options)
        return self._unshared({k: v.to(self.dtype) for k, v in full.items()}) if self.rank == 0 else {}

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
