"""FSDP2 helpers shared by the two sharded models, the policy learner (`pcl.models.learner`) and the value model
(`pcl.models.value_sharded`):

    shard_by_layer(model, mesh, mp_policy, reshard_after_forward=True, layers_of=model.backbone)
    loss, = agree([loss], dist.ReduceOp.SUM, device)

Gradients are summed over ranks, not averaged: both models divide (or sum) their loss over the whole batch
themselves, so the ranks' gradients add up to the batch gradient.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def shard_by_layer(model: torch.nn.Module, mesh, mp_policy, reshard_after_forward: bool = True,
                   layers_of: torch.nn.Module | None = None) -> None:
    """`fully_shard` each decoder layer (one all-gather / reduce-scatter group each), then `model` (the root:
    embeddings, final norm, heads).

    Args:
        model: the module trained (it becomes the root FSDP module).
        mesh: a 1-D device mesh over the ranks (`init_device_mesh("cpu" | "cuda", (world_size,))`).
        mp_policy: FSDP2's MixedPrecisionPolicy (compute and reduction dtypes).
        reshard_after_forward: False keeps each layer's gathered weights from forward to backward.
        layers_of: the Hugging Face model whose `_no_split_modules` names the layer class; `model` when None.
    """
    from torch.distributed.fsdp import FSDPModule, fully_shard

    owner = model if layers_of is None else layers_of
    layer_classes = set(getattr(owner, "_no_split_modules", None) or [])
    layers = [m for m in owner.modules() if type(m).__name__ in layer_classes]
    if not layers:
        raise ValueError(f"model {type(owner).__name__}: no decoder layers found to shard "
                         f"(looked for {sorted(layer_classes)})")
    options = {"mesh": mesh, "mp_policy": mp_policy, "reshard_after_forward": reshard_after_forward}
    for layer in layers:
        fully_shard(layer, **options)
    fully_shard(model, **options)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            # FSDP2 averages gradients over ranks by default; the losses here are already sums (or divided
            # by the global count), so the *sum* is the batch gradient. Divide factor 1 with plain SUM
            # collectives (gloo rejects the PREMUL_SUM op a bare factor of 1 would use).
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)


def agree(values: list[float], op: dist.ReduceOp, device: torch.device) -> list[float]:
    """`values` all-reduced over the process group with `op` (float64), as a list."""
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=op)
    return tensor.tolist()


def total_norm(norm: torch.Tensor) -> float:
    """A gradient norm from `clip_grad_norm_` as a float: the full (mesh-reduced) one for DTensor gradients."""
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


def full_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """The full (unsharded) model and optimizer state dicts of an FSDP2 model, gathered to CPU on every rank
    (a collective: every rank calls it)."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return (get_model_state_dict(model, options=options),
            get_optimizer_state_dict(model, optimizer, options=options))
