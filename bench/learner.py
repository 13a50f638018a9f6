"""Peak memory and tokens/s of one policy-learner step over a sweep of settings, each point in its own process.

    python -m bench.learner                               # CPU: a 2-layer Qwen3-vocabulary model, 8 x 4,096 tokens
    python -m bench.learner --sweep-sequences 8           # every point at the full batch (slow on a small CPU)
    python -m bench.learner --points default,no-ckpt      # some of the points
    python -m bench.learner --json learner.json

The model has Qwen3's 151,936-token vocabulary (tied embeddings and head) with 2 layers of width 256 (40 M
parameters); the batch is 8 sequences of 1,024 prompt + 3,072 response tokens with random ids, a preset's shape.
Each point builds `pcl.models.learner.PolicyLearner` (1 rank, gloo on CPU, NCCL on a GPU; float32 on CPU) in a
fresh process, takes one warm-up step and one timed step, and reports the process's peak resident memory (peak
RSS, which includes loading the model) or, on a GPU, torch.cuda.max_memory_allocated. The points vary the
learner's settings: `learner.max_tokens_per_micro_batch`, `learner.activation_checkpointing`,
`learner.micro_batch_size`. The last line printed is the peak memory of the default point (the presets'
settings). On CPU one step of the default point is minutes (the LM head over 24,576 response positions and a
151,936-token vocabulary: ~8 TFLOP with its recomputation), so the other points run `--sweep-sequences`
sequences (2 by default) and the whole sweep takes about ten minutes on two cores.
"""

from __future__ import annotations

import argparse
import json
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench import ROOT, add_json_option, run, write_figures

# Qwen3Config fields; "cpu" is the bench's model, the other two the GPU check's (bench/gpu_check.py).
SHAPES = {
    "cpu": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=64, vocab_size=151_936),
    "0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, vocab_size=151_936),
    "1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, vocab_size=151_936),
    "small": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, vocab_size=512),
}
# name -> (max_tokens_per_micro_batch, activation_checkpointing, micro_batch_size); "default" is the presets'.
POINTS = {
    "default": (16384, True, 8),
    "no-ckpt": (16384, False, 8),
    "budget-8k": (8192, True, 8),
    "budget-32k": (32768, True, 8),
}
GB = 1e9


def build_qwen3(out: Path, shape: dict, dtype: torch.dtype = torch.bfloat16, device: str = "cpu") -> Path:
    """A random Qwen3 checkpoint (tied embeddings) with the character tokenizer, written to `out`."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from pcl.tiny.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    config = Qwen3Config(**shape, max_position_embeddings=8192, tie_word_embeddings=True,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    with torch.device(device):  # random init on the GPU is seconds where the CPU takes a minute at 1.7B
        model = Qwen3ForCausalLM(config).to(dtype)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def random_ids(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(4, vocab, (count, length), generator=generator).tolist()


def make_sequences(count: int, prompt_len: int, response_len: int, vocab: int) -> list[dict]:
    prompts, responses = random_ids(count, prompt_len, vocab, 2), random_ids(count, response_len, vocab, 3)
    return [{"prompt_token_ids": p, "response_token_ids": r, "advantage": (-1.0) ** i}
            for i, (p, r) in enumerate(zip(prompts, responses))]


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def join_group(device: str) -> str:
    """A 1-rank process group (NCCL on CUDA, gloo on CPU), once per process; returns its backend."""
    import torch.distributed as dist

    from pcl.models.learner import init_process_group

    if dist.is_initialized():
        return dist.get_backend()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return init_process_group("nccl" if device.startswith("cuda") else "gloo", f"tcp://127.0.0.1:{port}", 0, 1)


def leave_group() -> None:
    """Destroy this process's group (`join_group`'s, or a --local run's), if any."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def finish_report(report: dict, started: float, print_report, out: str | None, json_path: str | None) -> dict:
    """A GPU check's end: its total seconds, the process group left, the report printed and written to `out` and
    `json_path` (either may be None); returns the figures."""
    report["seconds"] = time.perf_counter() - started
    leave_group()
    print_report(report)
    write_figures(out, report)
    return write_figures(json_path, report)


def peak_memory_gb(device: str) -> float:
    """torch.cuda.max_memory_allocated on CUDA, else this process's peak RSS."""
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / GB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB


def timed_steps(learner, sequences: list[dict], device: str, repeats: int = 1) -> dict:
    """`repeats` timed steps over `sequences` (after a warm-up step on CUDA, whose first kernels and allocations
    are slow; a CPU step has no such start-up): seconds (the fastest), tokens/s, the last step's stats."""
    if device.startswith("cuda"):
        learner.train_step(sequences, num_sequences=len(sequences))
    times, stats = [], {}
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        stats = learner.train_step(sequences, num_sequences=len(sequences))
        synchronize(device)
        times.append(time.perf_counter() - start)
    tokens = sum(len(s["prompt_token_ids"]) + len(s["response_token_ids"]) for s in sequences)
    seconds = min(times)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_second": tokens / seconds, "stats": stats}


def run_point(model: str, point: str, sequences: int, prompt_len: int, response_len: int, device: str,
              dtype: str) -> dict:
    """One point in this process: build the learner with the point's settings, take the steps, measure."""
    from pcl.models.learner import AdamWSettings, PolicyLearner

    budget, checkpointing, micro = POINTS[point]
    join_group(device)
    learner = PolicyLearner(model, AdamWSettings(lr=1e-6), micro_batch_size=micro, device=device, dtype=dtype,
                            max_tokens_per_micro_batch=budget, activation_checkpointing=checkpointing,
                            attn_implementation="sdpa")
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    result = timed_steps(learner, make_sequences(sequences, prompt_len, response_len, learner.vocab_size), device)
    return {"point": point, "sequences": sequences, "max_tokens_per_micro_batch": budget,
            "activation_checkpointing": checkpointing,
            "micro_batch_size": micro, "micro_batches": result["stats"]["micro_batches"],
            "padding_ratio": result["stats"]["learner_padding_ratio"], "seconds": result["seconds"],
            "tokens_per_second": result["tokens_per_second"], "peak_gb": peak_memory_gb(device)}


def _child(args) -> dict:
    torch.set_num_threads(args.threads) if args.threads else None
    figures = run_point(args.model, args.point, args.sequences, args.prompt_tokens, args.response_tokens,
                        args.device, args.dtype)
    print(json.dumps(figures))
    return figures


def _spawn(args, model: Path, point: str) -> dict:
    sequences = args.sequences if point == "default" else args.sweep_sequences
    command = [sys.executable, "-m", "bench.learner", "--point", point, "--model", str(model),
               "--sequences", str(sequences), "--prompt-tokens", str(args.prompt_tokens),
               "--response-tokens", str(args.response_tokens), "--device", args.device, "--dtype", args.dtype,
               "--threads", str(args.threads)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        return {"point": point, "error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1],
                "exit": done.returncode}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", default=",".join(POINTS), help=f"comma-separated, of {', '.join(POINTS)}")
    parser.add_argument("--shape", default="cpu", choices=sorted(SHAPES))
    parser.add_argument("--sequences", type=int, default=8, help="sequences of the default point's step")
    parser.add_argument("--sweep-sequences", type=int, default=2, help="sequences of the other points' steps")
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--response-tokens", type=int, default=3072)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=0, help="torch threads per point (0: torch's default)")
    parser.add_argument("--point", default=None, help=argparse.SUPPRESS)  # a child process: one point
    parser.add_argument("--model", default=None, help=argparse.SUPPRESS)
    add_json_option(parser)
    args = parser.parse_args(argv)
    if args.point:
        return _child(args)
    points = args.points.split(",")
    unknown = sorted(set(points) - set(POINTS))
    if unknown:
        parser.error(f"--points: unknown {unknown}; known: {sorted(POINTS)}")
    with tempfile.TemporaryDirectory(prefix="pcl-bench-learner-") as tmp:
        model = build_qwen3(Path(tmp) / "policy", SHAPES[args.shape])
        rows = [_spawn(args, model, point) for point in points]
    figures = {"shape": args.shape, "sequences": args.sequences, "sweep_sequences": args.sweep_sequences,
               "prompt_tokens": args.prompt_tokens,
               "response_tokens": args.response_tokens, "device": args.device, "dtype": args.dtype, "points": rows}
    default = next((r for r in rows if r["point"] == "default" and "error" not in r), None)
    figures["default_peak_gb"] = default["peak_gb"] if default else None
    print_table(figures)
    return write_figures(args.json, figures)


def print_table(figures: dict) -> None:
    print(f"one learner step: {figures['shape']} model, sequences of ({figures['prompt_tokens']} + "
          f"{figures['response_tokens']}) tokens, {figures['device']} {figures['dtype']}")
    print(f"{'point':<12}{'seqs':>5}{'budget':>8}{'ckpt':>6}{'mbs':>5}{'passes':>8}{'padding':>9}{'seconds':>9}"
          f"{'tokens/s':>10}{'peak GB':>9}")
    for r in figures["points"]:
        if "error" in r:
            print(f"{r['point']:<12} failed (exit {r['exit']}): {r['error']}")
            continue
        checkpointing = "on" if r["activation_checkpointing"] else "off"
        print(f"{r['point']:<12}{r['sequences']:>5}{r['max_tokens_per_micro_batch']:>8}{checkpointing:>6}"
              f"{r['micro_batch_size']:>5}{r['micro_batches']:>8.0f}{r['padding_ratio']:>9.1%}{r['seconds']:>9.1f}"
              f"{r['tokens_per_second']:>10,.0f}{r['peak_gb']:>9.2f}")
    peak = figures["default_peak_gb"]
    print(f"peak memory of the default settings: {'n/a' if peak is None else f'{peak:.2f} GB'}")


if __name__ == "__main__":
    run(main)
