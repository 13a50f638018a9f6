"""GPU checks of the real-model path: CUDA HF engine, NCCL FSDP2 learner, value model, weight sync.

    python bench/gpu_check.py                          # on a CUDA machine: a Qwen3-0.6B-shaped policy
    python bench/gpu_check.py --device cpu --small     # a smoke run of the same code on CPU (gloo, tiny model)
    python bench/gpu_check.py --out gpu-check.json     # also write the figures as JSON

The policy is built locally from a Qwen3Config with random weights (no hub): `--small` is a 2-layer,
width-64 model; the default has Qwen3-0.6B's shape (28 layers, width 1024, 16 heads, 151,936 tokens). Random
weights rarely emit EOS, so every response runs to its token budget: the throughput figures are for full-
length responses. Each check uses the product's own classes:

  engine      pcl.engines.hf.HFEngine.generate: prompts x n samples, generated tokens per second
  learner     pcl.models.learner.PolicyLearner on a 1-rank NCCL (gloo on CPU) process group, FSDP2: one optimizer step
              over a batch of prompt + response sequences, trained tokens per second, the gradient norm, and the
              model FLOPs utilisation: 6 x parameters x tokens/s (forward 2N, backward 4N per token; attention
              scores not counted) over the device's dense bf16 peak (PEAK_TFLOPS by device name, or
              --peak-tflops)
  value       pcl.models.value.ValueModel + ValueTrainer: scoring k*m prompts in float32 and with the bfloat16 scoring
              copy (value.score_dtype; the ratio of the two times), one training step on m, the copy's refresh
  weight sync PolicyLearner.full_state_dict (the gather) + HFEngine.load_weights (the copy in), seconds

The last line ends with the engine's generated tokens per second.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

FULL = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
            num_key_value_heads=8, head_dim=128, vocab_size=151_936)
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, vocab_size=512)
# (prompts, samples per prompt, prompt tokens, new tokens) for the engine; learner and value sizes.
SIZES = {"full": {"engine": (64, 8, 128, 256), "learner": (64, 128, 256, 8), "value": (256, 4, 128)},
         "small": {"engine": (4, 2, 8, 8), "learner": (8, 8, 8, 4), "value": (8, 2, 8)}}


# Dense bf16 tensor-core peaks (TFLOP/s, no sparsity) by a substring of torch.cuda.get_device_name().
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 125.0}


def peak_tflops(device_name: str, override: float | None) -> float | None:
    """The peak the MFU is measured against: --peak-tflops, else PEAK_TFLOPS by device name, else None."""
    if override is not None:
        return override
    return next((peak for key, peak in PEAK_TFLOPS.items() if key in device_name), None)


def mfu(parameters: int, tokens_per_second: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation of a training step: 6 N FLOPs per trained token against `peak` TFLOP/s."""
    return None if peak is None else 6.0 * parameters * tokens_per_second / (peak * 1e12)


def build_policy(out: Path, small: bool, dtype: torch.dtype) -> Path:
    """A random Qwen3 checkpoint with a character tokenizer (ids beyond the tokenizer are fine as input)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from pcl.tiny.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    config = Qwen3Config(**(SMALL if small else FULL), max_position_embeddings=4096, tie_word_embeddings=True,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).to(dtype)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def random_prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(4, vocab, (count, length), generator=generator).tolist()


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def check_engine(path: Path, device: str, dtype: str, sizes: tuple) -> tuple[dict, object]:
    from pcl.engines.base import SamplingParams
    from pcl.engines.hf import HFEngine

    prompts, n, prompt_len, new_tokens = sizes
    engine = HFEngine(str(path), device=device, dtype=dtype, seed=0, max_batch_size=prompts * n)
    batch = random_prompts(prompts, prompt_len, engine.vocab_size, seed=1)
    params = SamplingParams(n=n, temperature=1.0, top_p=1.0, top_k=-1, max_new_tokens=new_tokens)
    engine.generate(batch[:2], SamplingParams(n=1, max_new_tokens=4))  # warm-up: kernels, allocator
    synchronize(device)
    start = time.perf_counter()
    groups = engine.generate(batch, params)
    synchronize(device)
    seconds = time.perf_counter() - start
    tokens = sum(g.num_tokens for group in groups for g in group)
    assert len(groups) == prompts and all(len(group) == n for group in groups), "engine: wrong sample count"
    return {"prompts": prompts, "n": n, "prompt_tokens": prompt_len, "max_new_tokens": new_tokens,
            "generated_tokens": tokens, "seconds": seconds, "tokens_per_second": tokens / seconds}, engine


def check_learner(path: Path, device: str, dtype: str, sizes: tuple) -> tuple[dict, object]:
    from pcl.config import OptimizerConfig
    from pcl.models.learner import PolicyLearner, init_process_group

    count, prompt_len, response_len, micro = sizes
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = init_process_group("nccl" if device.startswith("cuda") else "gloo", f"tcp://127.0.0.1:{port}", 0, 1)
    learner = PolicyLearner(str(path), OptimizerConfig(lr=1e-6), micro_batch_size=micro, device=device,
                            dtype=dtype, rank=0, world_size=1, seed=0, reshard_after_forward=True)
    vocab = learner.vocab_size
    prompts = random_prompts(count, prompt_len, vocab, seed=2)
    responses = random_prompts(count, response_len, vocab, seed=3)
    sequences = [{"prompt_token_ids": p, "response_token_ids": r, "advantage": (-1.0) ** i}
                 for i, (p, r) in enumerate(zip(prompts, responses))]
    learner.train_step(sequences[:micro], num_sequences=micro)  # warm-up
    synchronize(device)
    start = time.perf_counter()
    stats = learner.train_step(sequences, num_sequences=count)
    synchronize(device)
    seconds = time.perf_counter() - start
    tokens = count * (prompt_len + response_len)
    return {"backend": backend, "sequences": count, "tokens": tokens, "micro_batch_size": micro,
            "seconds": seconds, "tokens_per_second": tokens / seconds, "grad_norm": stats["grad_norm"],
            "loss": stats["loss"]}, learner


def _timed_score(trainer, candidates: list, device: str):
    trainer.score(candidates[:2])  # warm-up
    synchronize(device)
    start = time.perf_counter()
    values = trainer.score(candidates)
    synchronize(device)
    return values, time.perf_counter() - start


def check_value(path: Path, device: str, sizes: tuple) -> dict:
    """Scoring k*m prompts with the float32 weights and with a bfloat16 copy (value.score_dtype), one training
    step on m (which refreshes the copy), and the refresh alone."""
    from pcl.models.value import ValueModel, ValueTrainer

    m, k, prompt_len = sizes
    model = ValueModel.from_pretrained(str(path), dtype="float32", device=device)
    with torch.no_grad():  # a random head (logits of about unit spread), so that the two dtypes' values can differ
        width = model.head.weight.shape[1]
        generator = torch.Generator().manual_seed(5)
        model.head.weight.copy_(torch.randn(model.head.weight.shape, generator=generator) / width ** 0.5)
    exact = ValueTrainer(model, lr=1e-6, batch_size=64)  # scores with the float32 weights
    trainer = ValueTrainer(model, lr=1e-6, batch_size=64, score_dtype="bfloat16")
    candidates = random_prompts(k * m, prompt_len, model.vocab_size, seed=4)
    values, score_seconds = _timed_score(exact, candidates, device)
    values_bf16, score_seconds_bf16 = _timed_score(trainer, candidates, device)
    start = time.perf_counter()
    stats = trainer.train_step(candidates[:m], [0.5] * m)
    synchronize(device)
    train_seconds = time.perf_counter() - start
    start = time.perf_counter()
    trainer.refresh_scorer()
    synchronize(device)
    refresh_seconds = time.perf_counter() - start
    assert values.shape == (k * m,) and ((values >= 0) & (values <= 1)).all(), "value: scores outside [0, 1]"
    return {"candidates": k * m, "selected": m, "prompt_tokens": prompt_len, "score_seconds": score_seconds,
            "scored_prompts_per_second": k * m / score_seconds, "score_seconds_bf16": score_seconds_bf16,
            "bf16_speedup": score_seconds / score_seconds_bf16,
            "bf16_max_gap": float(abs(values_bf16 - values).max()), "train_seconds": train_seconds,
            "refresh_seconds": refresh_seconds, "loss": stats.get("loss")}


def check_weight_sync(learner, engine, device: str) -> dict:
    synchronize(device)
    start = time.perf_counter()
    weights = learner.full_state_dict()
    gathered = time.perf_counter()
    loaded = engine.load_weights(weights, version=1)
    synchronize(device)
    done = time.perf_counter()
    size = sum(t.numel() * t.element_size() for t in weights.values())
    return {"tensors": loaded, "bytes": size, "gather_seconds": gathered - start, "load_seconds": done - gathered,
            "seconds": done - start, "engine_version": engine.policy_version}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--small", action="store_true", help="a 2-layer width-64 policy and small batches")
    parser.add_argument("--dtype", default=None, help="bfloat16 on CUDA, float32 on CPU by default")
    parser.add_argument("--out", default=None, help="also write the figures to this JSON file")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the device's dense bf16 peak for the MFU (default: PEAK_TFLOPS by device name)")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible (use --device cpu --small for a smoke run)")
    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    sizes = SIZES["small" if args.small else "full"]
    report: dict = {"device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
                    "torch": torch.__version__, "dtype": dtype, "policy": "small" if args.small else "qwen3-0.6b-shape"}
    with tempfile.TemporaryDirectory(prefix="pcl-gpu-check-") as tmp:
        path = build_policy(Path(tmp) / "policy", args.small, getattr(torch, dtype))
        report["engine"], engine = check_engine(path, args.device, dtype, sizes["engine"])
        report["learner"], learner = check_learner(path, args.device, dtype, sizes["learner"])
        report["value"] = check_value(path, args.device, sizes["value"])
        report["weight_sync"] = check_weight_sync(learner, engine, args.device)
        report["parameters"] = sum(p.numel() for p in engine.model.parameters())
    report["peak_tflops"] = peak_tflops(report["device"], args.peak_tflops)
    report["learner"]["mfu"] = mfu(report["parameters"], report["learner"]["tokens_per_second"],
                                   report["peak_tflops"])
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    print_report(report)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return report


def print_report(r: dict) -> None:
    e, lr, v, w = r["engine"], r["learner"], r["value"], r["weight_sync"]
    print(f"device {r['device']}, torch {r['torch']}, {r['dtype']}, policy {r['policy']} "
          f"({r['parameters'] / 1e6:.1f} M parameters)")
    print(f"  engine       {e['prompts']} prompts x n={e['n']}, {e['prompt_tokens']}-token prompts, "
          f"{e['generated_tokens']} tokens in {e['seconds']:.2f} s: {e['tokens_per_second']:,.0f} tokens/s")
    mfu_text = ("n/a (no peak known: --peak-tflops)" if lr["mfu"] is None
                else f"{lr['mfu']:.1%} of {r['peak_tflops']:g} TFLOP/s")
    print(f"  learner      {lr['backend']}, {lr['sequences']} sequences, {lr['tokens']} tokens, micro-batch "
          f"{lr['micro_batch_size']}: {lr['seconds']:.2f} s, {lr['tokens_per_second']:,.0f} tokens/s, "
          f"grad norm {lr['grad_norm']:.3f}, MFU {mfu_text}")
    print(f"  value        scored {v['candidates']} prompts in {v['score_seconds']:.3f} s "
          f"({v['scored_prompts_per_second']:,.0f}/s) in float32, {v['score_seconds_bf16']:.3f} s with the bfloat16 "
          f"copy: x{v['bf16_speedup']:.2f}, values within {v['bf16_max_gap']:.1e}; one step on {v['selected']} "
          f"in {v['train_seconds']:.3f} s (copy refresh {v['refresh_seconds']:.3f} s)")
    print(f"  weight sync  {w['tensors']} tensors, {w['bytes'] / 1e6:.1f} MB: gather {w['gather_seconds']:.3f} s "
          f"+ load {w['load_seconds']:.3f} s = {w['seconds']:.3f} s")
    print(f"engine generated tokens per second: {e['tokens_per_second']:.0f}")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
