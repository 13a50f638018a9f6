"""The full (unsharded) weights of an FSDP2 model, gathered group by group on the model's own device.

    specs = weight_specs(model, torch.bfloat16, skip={"lm_head.weight"})    # (name, dtype, shape): no gather
    for name, tensor in stream_weights(model, torch.bfloat16, group_bytes=256 << 20):   # every rank iterates
        ...                                            # rank 0: full tensors on the model's device; others: none

Why streamed: the weight sync of every step needs the full weights on learner rank 0 only long enough to send
them. Gathering the whole state first (and to host memory) costs the model's size in host memory, twice on the
way (the gather's buffers and the assembled tensors), and a copy to the host and back before a GPU broadcast.
Here the state dict's entries are taken in order, in groups of about `group_bytes` in the sync dtype: each
group's shards are cast to that dtype on their device, gathered to rank 0 in one collective (per-tensor
collectives cost ~1 ms each on gloo), and handed out tensor by tensor before the next group is gathered. A
tensor as large as a group is gathered alone, straight into the buffer its full tensor is a view of (FSDP2's
`Shard(0)` pieces are consecutive row blocks, padding only at the end), so it is never copied again.

Every rank must iterate the whole stream (each group is a collective on the default process group), and all
ranks plan the same groups from the same shapes. Shards other than FSDP2's dim-0 layout are gathered one
tensor at a time with `DTensor.full_tensor()`. Floating-point entries are cast to the sync dtype, others
(integer buffers) keep theirs.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator

import torch
import torch.distributed as dist

TensorSpec = tuple[str, str, tuple[int, ...]]  # (name, dtype as torch spells it without "torch.", shape)


def _entries(model: torch.nn.Module, skip: Collection[str]) -> list[tuple[str, torch.Tensor]]:
    """The state dict's entries in order (a tied weight under each of its names), without `skip`."""
    return [(name, tensor) for name, tensor in model.state_dict().items() if name not in skip]


def _sync_dtype(tensor: torch.Tensor, dtype: torch.dtype) -> torch.dtype:
    return dtype if tensor.is_floating_point() else tensor.dtype


def weight_specs(model: torch.nn.Module, dtype: torch.dtype, skip: Collection[str] = ()) -> list[TensorSpec]:
    """(name, dtype, full shape) of every entry `stream_weights` yields, in order, read without a gather."""
    return [(name, str(_sync_dtype(t, dtype)).removeprefix("torch."), tuple(t.shape))
            for name, t in _entries(model, skip)]


def plan_groups(specs: list[TensorSpec], group_bytes: float) -> list[list[int]]:
    """Indices of `specs` per gather group, in order: at most `group_bytes` unless one tensor is larger."""
    groups: list[list[int]] = []
    size = 0
    for index, (_, dtype, shape) in enumerate(specs):
        nbytes = math.prod(shape) * getattr(torch, dtype).itemsize
        if not groups or (groups[-1] and size + nbytes > group_bytes):
            groups.append([])
            size = 0
        groups[-1].append(index)
        size += nbytes
    return groups


def stream_weights(model: torch.nn.Module, dtype: torch.dtype, group_bytes: float, skip: Collection[str] = ()
                   ) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor in the sync dtype on the model's device) on rank 0, in state-dict order; nothing on the
    other ranks, which must iterate too (every group is a collective). See the module docstring."""
    entries = _entries(model, skip)
    rank = dist.get_rank() if dist.is_initialized() else 0
    for group in plan_groups(weight_specs(model, dtype, skip), group_bytes):
        full = _gather_group([entries[i][1] for i in group], dtype, rank)
        if rank == 0:
            for i, tensor in zip(group, full):
                yield entries[i][0], tensor
        del full


def _gather_group(tensors: list[torch.Tensor], dtype: torch.dtype, rank: int) -> list[torch.Tensor | None]:
    """The full tensors of one group on rank 0 (None elsewhere): FSDP2's dim-0 shards in one gather, other
    DTensors each by `full_tensor()`, plain tensors (buffers, or a one-rank model) as they are."""
    from torch.distributed.tensor import DTensor, Shard

    out: list[torch.Tensor | None] = [None] * len(tensors)
    rows_sharded = []
    for index, tensor in enumerate(tensors):
        target = _sync_dtype(tensor, dtype)
        if not isinstance(tensor, DTensor):
            out[index] = tensor.detach().to(target) if rank == 0 else None
        elif tensor.placements == (Shard(0),) and tensor.device_mesh.ndim == 1 and tensor.is_floating_point():
            rows_sharded.append(index)
        else:
            out[index] = tensor.detach().to(target).full_tensor()
    if rows_sharded:
        gathered = _gather_rows([tensors[i] for i in rows_sharded], dtype, rank)
        for index, full in zip(rows_sharded, gathered):
            out[index] = full
    return out if rank == 0 else [None] * len(tensors)


def _gather_rows(shards: list, dtype: torch.dtype, rank: int) -> list[torch.Tensor]:
    """Full tensors on rank 0 ([] elsewhere) of DTensors sharded on dim 0 over their 1-D mesh, in one gather.

    FSDP2 shards dim 0 in torch.chunk pieces of ceil(rows / world) rows; every rank pads its piece to that.
    """
    world = shards[0].device_mesh.size()
    if world == 1:
        return [shard.to_local().detach().to(dtype) for shard in shards]
    rows = [-(-s.shape[0] // world) for s in shards]
    width = [r * math.prod(s.shape[1:]) for r, s in zip(rows, shards)]
    device = shards[0].to_local().device
    buffer = torch.zeros(sum(width), dtype=dtype, device=device)
    offset = 0
    for shard, size in zip(shards, width):
        local = shard.to_local().detach().reshape(-1)
        buffer[offset:offset + local.numel()] = local  # cast to the sync dtype as it is copied in
        offset += size
    received = torch.empty(world * buffer.numel(), dtype=dtype, device=device) if rank == 0 else None
    parts = list(received.chunk(world)) if received is not None else None
    dist.gather(buffer, parts, dst=0, group=shards[0].device_mesh.get_group())
    if rank != 0:
        return []
    if len(shards) == 1:  # the pieces are consecutive row blocks: the full tensor is the buffer's start
        return [received[:math.prod(shards[0].shape)].view(shards[0].shape)]
    full, offset = [], 0
    for shard, r, size in zip(shards, rows, width):
        pieces = [part[offset:offset + size].view(r, *shard.shape[1:]) for part in parts]
        full.append(torch.cat(pieces)[:shard.shape[0]])
        offset += size
    return full
