"""The learners' torch.distributed process group and each rank's device (`pcl.models.learner`, `pcl.models.value_sharded`).

    backend = init_process_group("auto", "tcp://10.0.0.1:29500", rank, world_size)   # 'gloo' or 'nccl'
    device = resolve_device("auto", rank)                                            # cpu, or cuda:<rank % GPUs>
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist


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


def resolve_device(device: str, rank: int) -> torch.device:
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
