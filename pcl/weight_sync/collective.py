"""Weight sync over one torch.distributed group: learner rank 0 broadcasts, every vLLM worker receives.

The collective route of `rollout.weight_sync` (the other, `rpc`, sends safetensors chunks through vLLM's
`collective_rpc`). The sender (rank 0) and the receivers (ranks 1..W-1, one per vLLM worker, joined through
`pcl.engines.vllm.WeightUpdateExtension`) open a group of their own: a `TCPStore` at the sender's address and
a gloo (CPU) or NCCL (GPU) process group built on it, the same code for both backends. The group is not the
default one, so it lives beside the learner's FSDP group and vLLM's tensor-parallel group in the same
processes.

    # sender (learner rank 0)                      # each receiver (inside a vLLM worker)
    group = WeightGroup.open(addr, port, 0, W)     group = WeightGroup.open(addr, port, rank, W)
    group.broadcast(stream, BUCKET, specs=specs)   for bucket in group.receive(aliases): load(bucket)

Tensors travel bucket by bucket: each bucket is one flat byte buffer of at most about `bucket_bytes` (a
tensor larger than that gets its own, sent from its own memory without a copy), so a sync moves few large
messages. The sender takes the tensors from any iterable of (name, tensor): given their `specs` up front (a
learner knows its weights' names, dtypes and shapes without gathering them), it pulls each tensor only when
it packs that tensor's bucket, on the tensors' device, so the whole state never exists at once. Two buckets
are in flight at most: the sender packs bucket k + 1 while bucket k is on the wire, and a receiver takes
bucket k + 1 into a second buffer while its caller loads bucket k, so the transfer overlaps vLLM's load. A
sync opens with a header, the JSON list of (name, dtype, shape) and the bucket size (bounded to
MAX_HEADER_BYTES, dtypes checked against a fixed set, nothing unpickled), from which the receivers derive the
same buckets. A name the sender leaves out because the receiver's model ties it to another (vLLM's tied
`lm_head.weight`) is handed to the receiver's caller with the tensor of the name it is tied to (`aliases`).
A group that cannot form within `timeout_s` raises `WeightSyncError` naming the address.

The group's life: rank 0 hosts the rendezvous on a socket it holds bound from the moment its address is handed out
(`reserve_port`; no bind-then-close race for the port); the barrier that proves the group formed names the device
(NCCL would otherwise guess one per rank); every wait is bounded by `timeout_s`, and with NCCL its asynchronous
error handling is on (TORCH_NCCL_ASYNC_ERROR_HANDLING=2: a failed collective aborts the communicator and raises in
the caller, where the watchdog would otherwise end the process), so a lost peer surfaces as `WeightSyncError`
within the timeout. A member that sees a failure aborts its group at once (`abort`), and a member asked to join a
new group first closes the one it held, so communicators never leak across re-formations.
"""

from __future__ import annotations

import json
import math
import os
import socket
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


def reserve_port(host: str = "") -> socket.socket:
    """A listening TCP socket on a free port of this host, for rank 0 to hand to `WeightGroup.open`: the port is
    held from the moment its number is handed out (binding, closing and binding again later races other
    processes for it)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.listen(128)
    return sock


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

    def __init__(self, group, store, rank: int, world_size: int, device: torch.device, address: str,
                 timeout_s: float = 60.0) -> None:
        self.group, self._store, self.rank, self.world_size = group, store, rank, world_size
        self.device, self.address = device, address
        self.timeout = timedelta(seconds=timeout_s)

    @classmethod
    def open(cls, host: str, port: int, rank: int, world_size: int, backend: str = "gloo",
             timeout_s: float = 60.0, device: str | torch.device = "cpu",
             listen_socket: socket.socket | None = None) -> "WeightGroup":
        """Join the group at host:port as `rank` of `world_size` (rank 0 hosts the store, on `listen_socket` when
        given: a `reserve_port` socket bound to `port`); waits at most timeout_s."""
        import torch.distributed as dist

        if not 0 <= rank < world_size:
            raise ValueError(f"rank: expected 0 <= rank < world_size={world_size}, got {rank}")
        address = f"{host}:{port}"
        timeout = timedelta(seconds=timeout_s)
        device = torch.device(device)
        group = None
        try:
            handed = {}
            if rank == 0 and listen_socket is not None:  # the store takes the socket over (and closes it)
                handed["master_listen_fd"] = listen_socket.detach()
            store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout,
                                  wait_for_workers=False, **handed)
            store = dist.PrefixStore("pcl-weight-sync", store)
            group = _process_group(backend, store, rank, world_size, timeout)
            group.barrier(_barrier_options(device, timeout)).wait()  # every member is connected: formed
        except (RuntimeError, ValueError, OSError) as exc:  # DistStoreError / DistNetworkError are RuntimeErrors
            _abort(group)
            raise WeightSyncError(f"weight-sync group at {address} ({backend}, rank {rank} of {world_size}) did not "
                                  f"form within {timeout_s:g} s: {exc}".splitlines()[0]) from exc
        return cls(group, store, rank, world_size, device, address, timeout_s)

    def broadcast(self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
                  bucket_bytes: int = DEFAULT_BUCKET_BYTES, specs: list[TensorSpec] | None = None) -> int:
        """Rank 0: send the tensors; returns the bytes sent. Without `specs` they are listed first to read them;
        with `specs` (their `tensor_specs`, known before they exist) the iterable is read lazily, one bucket at a
        time, and each tensor must match its spec (else the group is aborted). The next bucket is packed while the
        current one is on the wire (two in flight at most)."""
        if specs is None:
            named_tensors = list(named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors)
            specs = tensor_specs(named_tensors)
        source = iter(named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors)
        header = torch.frombuffer(bytearray(json.dumps([specs, bucket_bytes]).encode()), dtype=torch.uint8)
        self._broadcast(torch.tensor([header.numel()], dtype=torch.int64, device=self.device))
        self._broadcast(header.to(self.device))
        sent, in_flight = 0, deque()
        for bucket in plan_buckets(specs, bucket_bytes):
            tensors = [self._pull(source, specs[i]) for i in bucket]
            # One tensor is sent from its own memory; several are packed into one buffer on their device.
            flat = _as_bytes(tensors[0]) if len(tensors) == 1 else torch.cat([_as_bytes(t) for t in tensors])
            del tensors
            in_flight.append(self._start(flat))
            sent += flat.numel()
            if len(in_flight) > 1:
                self._finish(in_flight.popleft())
        while in_flight:
            self._finish(in_flight.popleft())
        return sent

    def _pull(self, source: Iterator[tuple[str, torch.Tensor]], spec: TensorSpec) -> torch.Tensor:
        """The next tensor of `source`, on the group's device, checked against the spec the header declared."""
        name, tensor = next(source, (None, None))
        got = None if tensor is None else (name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape))
        if got != spec:
            self.abort()  # the receivers expect the declared bytes: fail them now rather than at their timeout
            found = "nothing" if got is None else f"{got[0]!r} {got[1]} {got[2]}"
            raise WeightSyncError(f"weight-sync broadcast on the group at {self.address}: the source gave {found}, "
                                  f"the header declared {spec[0]!r} {spec[1]} {spec[2]} (group aborted)")
        return tensor.detach().to(self.device)

    def receive(self, aliases: Mapping[str, str] | None = None) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Ranks > 0: the broadcast tensors, one list of (name, tensor) per bucket, as they arrive. While the
        caller holds bucket k (loading it), bucket k + 1 is being received into a second buffer. `aliases`
        {name: the name it is tied to}: a name the header leaves out whose tied name it carries follows that
        name in its bucket, with the same tensor."""
        specs, bucket_bytes = self._receive_header()
        sent = {spec[0] for spec in specs}
        followers = {tied: name for name, tied in (aliases or {}).items() if name not in sent and tied in sent}
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
                if name in followers:
                    out.append((followers[name], out[-1][1]))
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
        if self.group is None:
            raise WeightSyncError(f"weight-sync group at {self.address} is closed (a failure aborted it): "
                                  f"it must be formed again")
        try:
            return flat, self.group.broadcast([flat], _broadcast_options(0))
        except RuntimeError as exc:
            raise self._failed(exc) from exc

    def _finish(self, posted: tuple[torch.Tensor, Any]) -> torch.Tensor:
        flat, work = posted
        try:
            work.wait(self.timeout)  # bounded: a lost peer is an error within the timeout, not a hang
        except RuntimeError as exc:
            raise self._failed(exc) from exc
        return flat

    def _failed(self, exc: RuntimeError) -> WeightSyncError:
        """The group is no longer usable: abort it here at once, and name it in the error."""
        self.abort()
        return WeightSyncError(f"weight-sync broadcast on the group at {self.address} failed (group aborted): "
                               f"{exc}".splitlines()[0])

    def abort(self) -> None:
        """Abort the group's communicators without waiting for the peers (after a failure); idempotent."""
        group, self.group, self._store = self.group, None, None
        _abort(group)

    def close(self) -> None:
        """Leave the group: shut its communicators down (aborted when a shutdown is not possible); idempotent."""
        group, self.group, self._store = self.group, None, None
        if group is not None:
            try:
                group.shutdown()
            except RuntimeError:
                _abort(group)


def _abort(group) -> None:
    if group is not None:
        try:
            group.abort()
        except RuntimeError:  # already torn down
            pass


def _barrier_options(device: torch.device, timeout: timedelta):
    """The barrier's options, naming the device: NCCL otherwise guesses one per rank (and may pick a GPU the
    rank does not use)."""
    import torch.distributed as dist

    options = dist.BarrierOptions()
    options.timeout = timeout
    if device.type == "cuda":
        options.device_ids = [device.index if device.index is not None else torch.cuda.current_device()]
    return options


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
        # A failed collective aborts the communicator and raises here (2: CleanUpOnly), where NCCL's watchdog would
        # otherwise end the process; waits honour the timeout.
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
        os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, world_size, options)
    raise ValueError(f"backend: expected 'gloo' or 'nccl', got {backend!r}")
