"""Packing the learner's weights into the collective weight sync's broadcast buckets, two ways: through host memory
(the full state gathered to the CPU, each bucket copied back to the device) and streamed on the device.

    python -m bench.weight_buckets --device cuda               # the Qwen3-1.7B-shaped policy, bfloat16
    python -m bench.weight_buckets --device cpu --small        # the same code on CPU (gloo), a 2-layer model
    python -m bench.weight_buckets --device cpu --shape 0.6b --dtype bfloat16 --repeats 1   # CPU, Qwen3-0.6B's shape
    python -m bench.gpu_check --weights ...                    # the same check inside the GPU check

Needs torch, transformers, safetensors and numpy only (the GPU check runs it). A `PolicyLearner` (1 rank) holds a
random Qwen3 (`bench.learner.build_qwen3`); learner rank 0 sends its weights on a one-member weight-sync group
(`pcl.weight_sync.collective.WeightGroup`: NCCL on CUDA, gloo on CPU), so each way runs the product's own packing
and broadcast calls with no peer to wait for:
  host      `group.broadcast(learner.full_state_dict(), bucket_bytes)`: what the collective route did before
  streamed  `pcl.weight_sync.stream.send_weights(learner, group, bucket_bytes)`: each tensor gathered on the
            device in the sync dtype and packed as it comes
For each, the fastest of `--repeats` runs (seconds), the peak host memory above the level at the start (resident
memory sampled every millisecond from /proc/self/statm) and, on CUDA, the peak device memory above it; then the
ratios host / streamed. The tied lm_head.weight is sent both ways here (no engine says it ties it).
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
import threading
import time
from pathlib import Path

import torch

from bench import add_json_option, run, write_figures
from bench.learner import SHAPES, build_qwen3, join_group, synchronize

GB = 1e9
SMALL_BUCKET_BYTES = 64 << 10  # several buckets for the 2-layer model


def resident_bytes() -> int | None:
    """This process's resident memory now (Linux: /proc/self/statm), or None where it cannot be read."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class HostPeak:
    """Resident memory sampled every millisecond on a thread while the block runs: the peak above its start."""

    def __enter__(self) -> "HostPeak":
        self.start = self.peak = resident_bytes()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self) -> None:
        while not self.done.is_set() and self.start is not None:
            self.peak = max(self.peak, resident_bytes() or 0)
            time.sleep(0.001)

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join()

    @property
    def extra(self) -> int | None:
        return None if self.start is None else max(0, self.peak - self.start)


def measure(way, device: str, repeats: int) -> dict:
    """The fastest of `repeats` runs of `way()` (returns bytes sent), the largest host and device peaks."""
    seconds, host, device_peak, sent = [], [], [], 0
    for _ in range(repeats):
        gc.collect()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        with HostPeak() as peak:
            start = time.perf_counter()
            sent = way()
            synchronize(device)
            seconds.append(time.perf_counter() - start)
        host.append(peak.extra)
        if device.startswith("cuda"):
            device_peak.append((torch.cuda.max_memory_allocated() - before) / GB)
    return {"seconds": min(seconds), "bytes": sent, "host_peak_gb": None if None in host else max(host) / GB,
            "device_peak_gb": max(device_peak) if device_peak else None}


def check_weights(path: Path, device: str, dtype: str, bucket_bytes: int, repeats: int = 2) -> dict:
    """Both ways for the checkpoint at `path` (see the module docstring); streamed first, so the host way's
    freed gigabytes do not sit under the streamed way's start."""
    from pcl.models.learner import AdamWSettings, PolicyLearner
    from pcl.weight_sync.collective import WeightGroup, reserve_port
    from pcl.weight_sync.stream import send_weights

    join_group(device)
    learner = PolicyLearner(str(path), AdamWSettings(lr=1e-6), micro_batch_size=1, device=device, dtype=dtype)
    listener = reserve_port("127.0.0.1")
    group = WeightGroup.open("127.0.0.1", listener.getsockname()[1], 0, 1,
                             "nccl" if device.startswith("cuda") else "gloo", 120.0, device, listen_socket=listener)
    try:
        streamed = measure(lambda: send_weights(learner, group, bucket_bytes), device, repeats)
        host = measure(lambda: group.broadcast(learner.full_state_dict(), bucket_bytes), device, repeats)
    finally:
        group.close()
    del learner
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    assert streamed["bytes"] == host["bytes"], "the two ways sent different amounts"
    figures = {"dtype": dtype, "bucket_bytes": bucket_bytes, "bytes": host["bytes"], "host": host,
               "streamed": streamed, "seconds_ratio": host["seconds"] / streamed["seconds"]}
    if host["host_peak_gb"] is not None and streamed["host_peak_gb"]:
        figures["host_peak_ratio"] = host["host_peak_gb"] / streamed["host_peak_gb"]
    return figures


def weights_line(w: dict) -> str:
    """One line of the figures: each way's seconds and peaks, and the ratios."""
    def way(f: dict) -> str:
        host = "n/a" if f["host_peak_gb"] is None else f"{f['host_peak_gb']:.3f} GB"
        gpu = "" if f["device_peak_gb"] is None else f", device peak +{f['device_peak_gb']:.3f} GB"
        return f"{f['seconds']:.3f} s, host peak +{host}{gpu}"

    memory = f", x{w['host_peak_ratio']:.1f} host memory" if "host_peak_ratio" in w else ""
    return (f"{w['bytes'] / GB:.3f} GB of {w['dtype']} weights in {w['bucket_bytes'] >> 10} KiB buckets: through the "
            f"host {way(w['host'])}; streamed on the device {way(w['streamed'])}; host / streamed: "
            f"x{w['seconds_ratio']:.2f} time{memory}")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--small", action="store_true", help="a 2-layer width-64 model and 64 KiB buckets")
    parser.add_argument("--shape", default="1.7b", choices=sorted(SHAPES), help="the model's shape "
                        "(bench.learner.SHAPES; --small: small)")
    parser.add_argument("--dtype", default=None, help="bfloat16 on CUDA, float32 on CPU by default")
    parser.add_argument("--bucket-mb", type=int, default=None, help="bucket size in MiB (default 256, the presets')")
    parser.add_argument("--repeats", type=int, default=2)
    add_json_option(parser)
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible (use --device cpu --small for a smoke run)")
    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    bucket = args.bucket_mb << 20 if args.bucket_mb else SMALL_BUCKET_BYTES if args.small else 256 << 20
    with tempfile.TemporaryDirectory(prefix="pcl-weight-buckets-") as tmp:
        path = build_qwen3(Path(tmp) / "policy", SHAPES["small" if args.small else args.shape], getattr(torch, dtype),
                           args.device)
        figures = check_weights(path, args.device, dtype, bucket, args.repeats)
    print(weights_line(figures))
    return write_figures(args.json, figures)


if __name__ == "__main__":
    run(main)
