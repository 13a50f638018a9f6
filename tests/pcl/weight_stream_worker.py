"""Learner ranks for tests/pcl/test_weight_stream.py: two real processes of a gloo FSDP2 learner, and one receiver of
the weight-sync group (a thread of rank 1's process, as a vLLM worker would be another process).

    out = run_ranks(model_dir, out_dir, bucket_bytes=4 << 20)

Rank 0 sends the learner's weights twice with `pcl.weight_sync.stream.send_weights` (first leaving out the tied
lm_head.weight, then everything) while rank 1 joins the gathers; rank 0 records what the first send cost it (peak
extra resident memory, sampled; calls of `Tensor.cpu`; the devices of the tensors handed to the group) and the
digests of its `full_state_dict`, the receiver the digests of what it received, into JSON files under out_dir.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

import torch

SKIPPED = ("lm_head.weight",)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def digest(tensor: torch.Tensor) -> str:
    """The tensor's dtype, shape and bytes, hashed: equal digests mean equal tensors bit for bit."""
    raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return f"{tensor.dtype}{tuple(tensor.shape)}:{hashlib.sha256(raw).hexdigest()}"


class PeakRss:
    """The process's resident memory sampled every millisecond on a thread: the peak above the level at start."""

    def __init__(self) -> None:
        import psutil

        self.process = psutil.Process()
        self.start = self.peak = self.process.memory_info().rss
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self.done.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.001)

    def __enter__(self) -> "PeakRss":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)

    @property
    def extra(self) -> int:
        return self.peak - self.start


class Watched:
    """The weight group of rank 0 with its `broadcast` watched: the device of every tensor handed over."""

    def __init__(self, group) -> None:
        self.group, self.devices = group, set()

    def broadcast(self, named_tensors, bucket_bytes, **kwargs) -> int:
        items = named_tensors.items() if isinstance(named_tensors, dict) else named_tensors

        def watched():
            for name, tensor in items:
                self.devices.add(str(tensor.device))
                yield name, tensor

        source = watched() if "specs" in kwargs else dict(watched())
        return self.group.broadcast(source, bucket_bytes, **kwargs)


def _receive(port: int, out: Path) -> None:
    from pcl.weight_sync.collective import WeightGroup

    group = WeightGroup.open("127.0.0.1", port, 1, 2, "gloo", timeout_s=120)
    for send in ("skip", "all"):
        received = {name: digest(tensor) for bucket in group.receive() for name, tensor in bucket}
        (out / f"received-{send}.json").write_text(json.dumps(received))
    group.close()


def _send_and_measure(learner, group, bucket_bytes: int, out: Path) -> None:
    """Rank 0: the first send under watch (memory, host copies, devices), the second plain."""
    from pcl.weight_sync.stream import send_weights

    watched, cpu_calls, plain_cpu = Watched(group), [0], torch.Tensor.cpu

    def counted_cpu(self, *args, **kwargs):
        cpu_calls[0] += 1
        return plain_cpu(self, *args, **kwargs)

    torch.Tensor.cpu = counted_cpu
    try:
        with PeakRss() as rss:
            sent = send_weights(learner, watched, bucket_bytes, skip=SKIPPED)
    finally:
        torch.Tensor.cpu = plain_cpu
    sent_all = send_weights(learner, group, bucket_bytes)
    full = learner.full_state_dict()
    model_bytes = sum(t.numel() * t.element_size() for name, t in full.items() if name not in SKIPPED)
    stats = {"sent": sent, "sent_all": sent_all, "model_bytes": model_bytes, "peak_extra_rss": rss.extra,
             "cpu_calls": cpu_calls[0], "devices": sorted(watched.devices), "learner_device": str(learner.device),
             "digests": {name: digest(t) for name, t in full.items()}}
    (out / "sender.json").write_text(json.dumps(stats))


def _rank_main(rank: int, port: int, weight_port: int, model_dir: str, out_dir: str, bucket_bytes: int) -> None:
    import torch.distributed as dist

    from pcl.models.learner import AdamWSettings, PolicyLearner, init_process_group
    from pcl.weight_sync.collective import WeightGroup
    from pcl.weight_sync.stream import send_weights

    torch.set_num_threads(1)
    out = Path(out_dir)
    init_process_group("gloo", f"tcp://127.0.0.1:{port}", rank, 2, timeout_s=300)
    try:
        learner = PolicyLearner(model_dir, AdamWSettings(), micro_batch_size=1, device="cpu", dtype="bfloat16",
                                rank=rank, world_size=2, seed=0)
        if rank == 0:
            group = WeightGroup.open("127.0.0.1", weight_port, 0, 2, "gloo", timeout_s=120)
            _send_and_measure(learner, group, bucket_bytes, out)
            group.close()
        else:
            receiver = threading.Thread(target=_receive, args=(weight_port, out))
            receiver.start()
            send_weights(learner, None, bucket_bytes, skip=SKIPPED)  # joins rank 0's gathers
            send_weights(learner, None, bucket_bytes)
            learner.full_state_dict()
            receiver.join(300)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # past c10d's finalization (see tests/pcl/learner_worker.py)


def run_ranks(model_dir: str, out_dir: str, bucket_bytes: int) -> Path:
    """Both ranks in spawned processes whose large allocations are returned to the system when freed (so that
    resident memory follows what is live); raises if either fails."""
    import torch.multiprocessing as mp

    previous = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(256 << 10)
    try:
        mp.spawn(_rank_main, args=(free_port(), free_port(), str(model_dir), str(out_dir), bucket_bytes), nprocs=2,
                 join=True)
    finally:
        if previous is None:
            os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)
        else:
            os.environ["MALLOC_MMAP_THRESHOLD_"] = previous
    return Path(out_dir)
