"""Weight sync over one torch.distributed group: learner rank 0 broadcasts, every vLLM worker receives.

The collective route of `rollout.weight_sync` (the other, `rpc`, sends safetensors chunks through vLLM's
`collective_rpc`). The sender (rank 0) and the receivers (ranks 1..W-1, one per vLLM worker, joined through
`pcl.engines.vllm.WeightUpdateExtension`) open a group of their own: a `TCPStore` at the sender's address and
a gloo (CPU) or NCCL (GPU) process group built on it, the same code for both backends. The group is not the
default one, so it lives beside the learner's FSDP group and vLLM's tensor-parallel group in the same
processes.

    # sender (learner rank 0)                      # each receiver (inside a vLLM worker)
    group = WeightGroup.open(addr, port, 0, W)     group = WeightGroup.open(addr, port, rank, W)
    group.broadcast(state_dict, BUCKET)            for bucket in group.receive(): load(bucket)

Tensors travel bucket by bucket: each bucket is one flat byte buffer of at most about `bucket_bytes` (a
tensor larger than that gets its own), so a sync moves few large messages. Two buckets are in flight at most:
the sender packs bucket k + 1 while bucket k is on the wire, and a receiver takes bucket k + 1 into a second
buffer while its caller loads bucket k, so the transfer overlaps vLLM's load. A sync opens with a header, the
JSON list of (name, dtype, shape) and the bucket size (bounded to MAX_HEADER_BYTES, dtypes checked against a
fixed set, nothing unpickled), from which the receivers derive the same buckets. A group that cannot form within `timeout_s` raises `WeightSyncError` naming the address.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from datetime import timedelta
from typing import Any

import torch

DEFAULT_BUCKET_BYTES = 256 << 20
MAX_HEADER_BYTES = 64 << 20
DTYPES = frozenset({"float32", "bfloat16", "float16", "float64", "int64", "int32", "int8", "uint8", "bool"})
TensorSpec = tuple[str, str, tuple[int, ...]]  # (name, dtype as torch spells it without "torch.", shape)


class WeightSyncError(RuntimeError):
    """The weight-sync group could not form or a broadcast failed (the message names the address)."""


def tensor_specs(named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> list[TensorSpec]:
    """(name, dtype, shape) of each tensor, in order: what the receivers need to allocate the buckets."""
    items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
    return [(name, str(t.dtype).removeprefix("torch."), tuple(t.shape)) for name, t in items]


def _nbytes(spec: TensorSpec) -> int:
    return math.prod(spec[2]) * getattr(torch, spec[1]).itemsize


def plan_buckets(specs: list[TensorSpec], bucket_bytes: int) -> list[list[int]]:
    """Indices of `specs` per bucket, in order; a bucket holds at most `bucket_bytes` unless one tensor is larger."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes: expected an integer >= 1, got {bucket_bytes!r}")
    buckets: list[list[int]] = []
    size = 0
    for index, spec in enumerate(specs):
        nbytes = _nbytes(spec)
        if not buckets or (buckets[-1] and size + nbytes > bucket_bytes):
            buckets.append([])
            size = 0
        buckets[-1].append(index)
        size += nbytes
    return buckets


class WeightGroup:
    """One member of a weight-sync group (rank 0 sends, the others receive)."""

    def __init__(self, group, store, rank: int, world_size: int, device: torch.device, address: str) -> None:
        self.group, self._store, self.rank, self.world_size = group, store, rank, world_size
        self.device, self.address = device, address

    @classmethod
    def open(cls, host: str, port: int, rank: int, world_size: int, backend: str = "gloo",
             timeout_s: float = 60.0, device: str | torch.device = "cpu") -> "WeightGroup":
        """Join the group at host:port as `rank` of `world_size` (rank 0 hosts the store); waits at most timeout_s."""
        import torch.distributed as dist

        if not 0 <= rank < world_size:
            raise ValueError(f"rank: expected 0 <= rank < world_size={world_size}, got {rank}")
        address = f"{host}:{port}"
        timeout = timedelta(seconds=timeout_s)
        try:
            store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout,
                                  wait_for_workers=False)
            store = dist.PrefixStore("pcl-weight-sync", store)
            group = _process_group(backend, store, rank, world_size, timeout)
            group.barrier().wait()  # every member is connected: the group has formed
        except (RuntimeError, ValueError, OSError) as exc:  # DistStoreError / DistNetworkError are RuntimeErrors
            raise WeightSyncError(f"weight-sync group at {address} ({backend}, rank {rank} of {world_size}) did not "
                                  f"form within {timeout_s:g} s: {exc}".splitlines()[0]) from exc
        return cls(group, store, rank, world_size, torch.device(device), address)

    def broadcast(self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
                  bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> int:
        """Rank 0: send the tensors (in the order of their `tensor_specs`); returns the bytes sent. The next
        bucket is packed while the current one is on the wire (two in flight at most)."""
        items = list(named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors)
        specs = tensor_specs(items)
        header = torch.frombuffer(bytearray(json.dumps([specs, bucket_bytes]).encode()), dtype=torch.uint8)
        self._broadcast(torch.tensor([header.numel()], dtype=torch.int64, device=self.device))
        self._broadcast(header.to(self.device))
        sent, in_flight = 0, deque()
        for bucket in plan_buckets(specs, bucket_bytes):
            flat = torch.cat([_as_bytes(items[i][1].detach().to(self.device)) for i in bucket])
            in_flight.append(self._start(flat))
            sent += flat.numel()
            if len(in_flight) > 1:
                self._finish(in_flight.popleft())
        while in_flight:
            self._finish(in_flight.popleft())
        return sent

    def receive(self) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Ranks > 0: the broadcast tensors, one list of (name, tensor) per bucket, as they arrive. While the
        caller holds bucket k (loading it), bucket k + 1 is being received into a second buffer."""
        specs, bucket_bytes = self._receive_header()
        buckets = plan_buckets(specs, bucket_bytes)
        pending = self._start_receive(specs, buckets[0]) if buckets else None
        for k, bucket in enumerate(buckets):
            flat = self._finish(pending)
            pending = self._start_receive(specs, buckets[k + 1]) if k + 1 < len(buckets) else None
            out, offset = [], 0
            for i in bucket:
                name, dtype, shape = specs[i]
                size = _nbytes(specs[i])
                out.append((name, flat[offset:offset + size].view(getattr(torch, dtype)).view(shape)))
                offset += size
            yield out

    def _start_receive(self, specs: list[TensorSpec], bucket: list[int]):
        flat = torch.empty(sum(_nbytes(specs[i]) for i in bucket), dtype=torch.uint8, device=self.device)
        return self._start(flat)

    def _receive_header(self) -> tuple[list[TensorSpec], int]:
        length = torch.zeros(1, dtype=torch.int64, device=self.device)
        self._broadcast(length)
        if not 0 < int(length) <= MAX_HEADER_BYTES:
            raise WeightSyncError(f"weight-sync header from {self.address}: {int(length)} bytes, expected 1.."
                                  f"{MAX_HEADER_BYTES}")
        header = torch.empty(int(length), dtype=torch.uint8, device=self.device)
        self._broadcast(header)
        try:
            raw_specs, bucket_bytes = json.loads(bytes(header.cpu().numpy()))
            specs = [(str(name), str(dtype), tuple(int(d) for d in shape)) for name, dtype, shape in raw_specs]
        except (ValueError, TypeError) as exc:
            raise WeightSyncError(f"weight-sync header from {self.address} is malformed: {exc}") from exc
        bad = sorted({dtype for _, dtype, _ in specs} - DTYPES)
        if bad or not isinstance(bucket_bytes, int) or bucket_bytes < 1:
            raise WeightSyncError(f"weight-sync header from {self.address}: dtypes {bad} or bucket size "
                                  f"{bucket_bytes!r} not accepted")
        return specs, bucket_bytes

    def _broadcast(self, flat: torch.Tensor) -> None:
        self._finish(self._start(flat))

    def _start(self, flat: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Post the broadcast of `flat` (rank 0 sends it, the others receive into it); `_finish` waits for it."""
        try:
            return flat, self.group.broadcast([flat], _broadcast_options(0))
        except RuntimeError as exc:
            raise self._failed(exc) from exc

    def _finish(self, posted: tuple[torch.Tensor, Any]) -> torch.Tensor:
        flat, work = posted
        try:
            work.wait()
        except RuntimeError as exc:
            raise self._failed(exc) from exc
        return flat

    def _failed(self, exc: RuntimeError) -> WeightSyncError:
        return WeightSyncError(f"weight-sync broadcast on the group at {self.address} failed: {exc}".splitlines()[0])

    def close(self) -> None:
        self.group, self._store = None, None


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().view(-1).view(torch.uint8)


def _broadcast_options(root: int):
    import torch.distributed as dist

    options = dist.BroadcastOptions()
    options.rootRank = root
    options.rootTensor = 0
    return options


def _process_group(backend: str, store, rank: int, world_size: int, timeout: timedelta):
    """A gloo or NCCL process group on `store`, outside torch.distributed's default group."""
    import torch.distributed as dist

    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, world_size, timeout)
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, world_size, options)
    raise ValueError(f"backend: expected 'gloo' or 'nccl', got {backend!r}")
