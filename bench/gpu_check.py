"""GPU checks of the real-model path: the learner at a preset's scale, CUDA HF engine, NCCL FSDP2 learner, value
model, weight sync; every figure into one JSON file.

    python -m bench.gpu_check --out gpu-check.json           # on a CUDA machine
    python -m bench.gpu_check --device cpu --small --out x.json   # a smoke run of the same code on CPU (gloo)
    python -m bench.gpu_check --e2e --out e2e.json           # instead: PCL end to end, --local (bench/gpu_e2e.py)

Needs torch, transformers, safetensors, numpy and pyyaml only (no pydantic, Ray, Redis, vLLM). The policies are
built locally from a Qwen3Config with random weights (no hub); `--small` makes every model 2 layers of width 64.
Each check uses the product's own classes:

  scale       pcl.models.learner.PolicyLearner with a Qwen3-1.7B-shaped policy (28 layers, width 2048, tied
              151,936-token embeddings) on 8 sequences of 1,024 + 3,072 tokens, with the learner settings of
              configs/presets/qwen3-1.7b-base-math.yaml (token budget, activation checkpointing, model dtype), sdpa
              attention: peak GPU memory (torch.cuda.max_memory_allocated), tokens/s, model FLOPs utilisation
              MFU = (6 N + 12 L H Q T) x tokens/s over the device's dense bf16 peak (PEAK_TFLOPS by device
              name, or --peak-tflops): N non-embedding parameters, L layers, H query heads of size Q, T the
              sequence length (PaLM's model FLOPs, appendix B); and the hardware FLOPs utilisation HFU that also
              counts the forward recomputed under activation checkpointing (8 N + 16 L H Q T per token); which
              attention kernel ran
  engine      pcl.engines.hf.HFEngine.generate (Qwen3-0.6B shape): prompts x n samples, generated tokens/s
  learner     the same PolicyLearner at Qwen3-0.6B's shape and short sequences: tokens/s and its MFU
  value       pcl.models.value.ValueModel + ValueTrainer: scoring k*m prompts in float32 and with the bfloat16 scoring
              copy (the ratio of the two times), one training step on m, the copy's refresh
  weight sync PolicyLearner.full_state_dict (the gather) + HFEngine.load_weights (the copy in), seconds
  weights     with --weights (off by default): the scale check's Qwen3-1.7B-shaped policy packed into the collective
              weight sync's broadcast buckets (256 MiB) through host memory (the full state to the CPU and back)
              and streamed on the device, seconds and peak host memory each, and their ratios (bench.weight_buckets)

Random weights rarely emit EOS, so every response runs to its token budget. The last line printed is the scale
check's MFU.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench import ROOT, add_json_option, run
from bench.learner import (SHAPES, build_qwen3, finish_report, join_group, make_sequences, peak_memory_gb, random_ids,
                           synchronize, timed_steps)

# (prompts, samples per prompt, prompt tokens, new tokens) for the engine; learner and value sizes; the scale
# check's (sequences, prompt tokens, response tokens).
SIZES = {"full": {"engine": (64, 8, 128, 256), "learner": (64, 128, 256, 8), "value": (256, 4, 128),
                  "scale": (8, 1024, 3072)},
         "small": {"engine": (4, 2, 8, 8), "learner": (8, 8, 8, 4), "value": (8, 2, 8), "scale": (8, 16, 48)}}
PRESET = ROOT / "configs" / "presets" / "qwen3-1.7b-base-math.yaml"


# Dense bf16 tensor-core peaks (TFLOP/s, no sparsity: half the datasheets' "with sparsity" figures) by a substring
# of torch.cuda.get_device_name(), the first that matches: the H100 PCIe card (1,513 with sparsity) before the
# SXM part's "H100" (1,979).
PEAK_TFLOPS = {"H200": 989.0, "H100 PCIe": 756.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 125.0}


def peak_tflops(device_name: str, override: float | None) -> float | None:
    """The peak the MFU is measured against: --peak-tflops, else PEAK_TFLOPS by device name, else None."""
    if override is not None:
        return override
    return next((peak for key, peak in PEAK_TFLOPS.items() if key in device_name), None)


def mfu(parameters: int, tokens_per_second: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation by the crude 6 N formula (the 0.6B learner check, as recorded before)."""
    return None if peak is None else 6.0 * parameters * tokens_per_second / (peak * 1e12)


def flops_per_token(shape: dict, sequence_length: int, recomputed: bool) -> float:
    """Training FLOPs per token: 6 N + 12 L H Q T (PaLM's model FLOPs; nanoGPT's estimate_mfu likewise), N the
    non-embedding parameters (the tied embedding, which is also the LM head, left out), L layers, H query heads of
    size Q (Qwen3's H Q may differ from its width; key-value heads shared by several query heads save no FLOPs), T
    the sequence length: forward 2 N + 4 L H Q T (Q K^T and the weighted sum of V, 2 T H Q each a layer, the full
    square counted as PaLM does), backward twice that. With `recomputed` the forward counted twice: 8 N + 16 L H Q T,
    the hardware's FLOPs under activation checkpointing."""
    from pcl.tools.shapes import ModelShape

    model = ModelShape(shape["vocab_size"], shape["hidden_size"], shape["num_hidden_layers"],
                       shape["intermediate_size"], shape["num_attention_heads"], shape["num_key_value_heads"],
                       shape["head_dim"], True, True)
    non_embedding = model.policy_params - model.embedding_params
    attention = model.layers * model.heads * model.head_dim * sequence_length
    return (8 * non_embedding + 16 * attention) if recomputed else (6 * non_embedding + 12 * attention)


def utilisation(shape: dict, sequence_length: int, tokens_per_second: float, peak: float | None,
                recomputed: bool) -> dict:
    """A learner step's throughput against the device's peak: model TFLOP/s, MFU (model FLOPs over the peak) and
    HFU (the FLOPs the hardware ran, the forward recomputed when `recomputed`); MFU and HFU None without a peak."""
    model = flops_per_token(shape, sequence_length, recomputed=False) * tokens_per_second
    hardware = flops_per_token(shape, sequence_length, recomputed) * tokens_per_second
    return {"model_tflops_per_s": model / 1e12, "mfu": None if peak is None else model / (peak * 1e12),
            "hfu": None if peak is None else hardware / (peak * 1e12)}


def preset_learner_settings(path: Path = PRESET) -> dict:
    """The learner keys and model dtype of a preset, read with yaml alone (no pydantic here)."""
    import yaml

    raw = yaml.safe_load(path.read_text())
    learner = raw.get("learner", {})
    return {"max_tokens_per_micro_batch": learner.get("max_tokens_per_micro_batch"),
            "activation_checkpointing": bool(learner.get("activation_checkpointing", False)),
            "micro_batch_size": int(learner.get("micro_batch_size", 8)),
            "compile": bool(learner.get("compile", False)),
            "dtype": raw.get("model", {}).get("dtype", "bfloat16"), "preset": path.name}


# Learner settings tried against the preset's by --scale-variants: name -> overrides of preset_learner_settings.
SCALE_VARIANTS = {
    "preset": {},
    "eager": {"compile": False},
    "no-ckpt": {"activation_checkpointing": False},
    "compile": {"compile": True},
    "compile-no-ckpt": {"compile": True, "activation_checkpointing": False},
    "budget-32k": {"max_tokens_per_micro_batch": 32768},
    "compile-budget-32k": {"compile": True, "max_tokens_per_micro_batch": 32768},
}


def check_scale(tmp: Path, device: str, small: bool, sizes: tuple, peak: float | None,
                overrides: dict | None = None) -> dict:
    """The Qwen3-1.7B-shaped policy at the preset's learner settings, or those with `overrides` (see the module
    docstring); the checkpoint is built once in `tmp` and reused."""
    from pcl.models.learner import AdamWSettings, PolicyLearner

    count, prompt_len, response_len = sizes
    settings = {**preset_learner_settings(), **(overrides or {})}
    shape = SHAPES["small" if small else "1.7b"]
    budget = settings["max_tokens_per_micro_batch"]
    if small and budget:  # the same number of micro-batches as the preset's budget at 4,096 tokens gives
        budget = budget * (prompt_len + response_len) // 4096
    dtype = settings["dtype"] if device.startswith("cuda") else "float32"
    path = tmp / "scale"
    if not (path / "config.json").exists():
        path = build_qwen3(path, shape, getattr(torch, dtype), device)
    join_group(device)
    learner = PolicyLearner(str(path), AdamWSettings(lr=1e-6), micro_batch_size=settings["micro_batch_size"],
                            device=device, dtype=dtype, max_tokens_per_micro_batch=budget,
                            activation_checkpointing=settings["activation_checkpointing"], attn_implementation="sdpa",
                            compile_layers=settings["compile"])
    attention = learner.model.config._attn_implementation
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    sequences = make_sequences(count, prompt_len, response_len, learner.vocab_size)
    result = timed_steps(learner, sequences, device, repeats=2)
    length = prompt_len + response_len
    rates = utilisation(shape, length, result["tokens_per_second"], peak, settings["activation_checkpointing"])
    figures = {"shape": "small" if small else "qwen3-1.7b", "preset": settings["preset"], "dtype": dtype,
               "sequences": count, "sequence_tokens": length, "tokens": result["tokens"],
               "max_tokens_per_micro_batch": budget, "activation_checkpointing": settings["activation_checkpointing"],
               "compile": settings["compile"],
               "micro_batches": result["stats"]["micro_batches"], "attention": attention,
               "seconds": result["seconds"], "tokens_per_second": result["tokens_per_second"],
               "peak_memory_gb": peak_memory_gb(device), **rates, "grad_norm": result["stats"]["grad_norm"]}
    del learner, result
    gc.collect()  # FSDP's hooks hold reference cycles: the 1.7B model and its optimizer state go only now
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return figures


def check_weight_buckets(tmp: Path, device: str, small: bool) -> dict:
    """bench.weight_buckets on the scale check's policy (built in `tmp` if the scale check did not run)."""
    from bench.weight_buckets import SMALL_BUCKET_BYTES, check_weights

    dtype = preset_learner_settings()["dtype"] if device.startswith("cuda") else "float32"
    path = tmp / "scale"
    if not (path / "config.json").exists():
        path = build_qwen3(path, SHAPES["small" if small else "1.7b"], getattr(torch, dtype), device)
    return check_weights(path, device, dtype, SMALL_BUCKET_BYTES if small else 256 << 20)


def check_engine(path: Path, device: str, dtype: str, sizes: tuple) -> tuple[dict, object]:
    from pcl.engines import SamplingParams
    from pcl.engines.hf import HFEngine

    prompts, n, prompt_len, new_tokens = sizes
    engine = HFEngine(str(path), device=device, dtype=dtype, seed=0, max_batch_size=prompts * n)
    batch = random_ids(prompts, prompt_len, engine.vocab_size, seed=1)
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
    from pcl.models.learner import AdamWSettings, PolicyLearner

    count, prompt_len, response_len, micro = sizes
    backend = join_group(device)
    learner = PolicyLearner(str(path), AdamWSettings(lr=1e-6), micro_batch_size=micro, device=device,
                            dtype=dtype, rank=0, world_size=1, seed=0, reshard_after_forward=True)
    sequences = make_sequences(count, prompt_len, response_len, learner.vocab_size)
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
    candidates = random_ids(k * m, prompt_len, model.vocab_size, seed=4)
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
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--e2e" in argv:  # PCL end to end with --local instead of the checks below (bench/gpu_e2e.py)
        from bench.gpu_e2e import main as end_to_end

        return end_to_end([a for a in argv if a != "--e2e"])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--small", action="store_true", help="2-layer width-64 models and small batches")
    parser.add_argument("--dtype", default=None, help="bfloat16 on CUDA, float32 on CPU by default")
    parser.add_argument("--out", default=None, help="write every figure to this JSON file (as --json)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the device's dense bf16 peak for the MFU (default: PEAK_TFLOPS by device name)")
    parser.add_argument("--scale-variants", default="", help="comma-separated learner settings to run the scale "
                        f"check with besides the preset's ({', '.join(SCALE_VARIANTS)})")
    parser.add_argument("--weights", action="store_true", help="also time packing the scale check's policy into "
                        "weight-sync buckets through host memory and streamed on the device (bench.weight_buckets)")
    parser.add_argument("--skip", default="", help="comma-separated checks to leave out: scale, engine, learner, "
                        "value (weight sync needs engine and learner)")
    parser.add_argument("--e2e", action="store_true", help="instead: PCL end to end with pcl train --local, and a "
                        "Qwen3-1.7B-shaped step part by part (python -m bench.gpu_e2e; its options follow)")
    add_json_option(parser)
    args = parser.parse_args(argv)
    if args.peak_tflops is not None and not args.peak_tflops > 0:
        parser.error(f"--peak-tflops {args.peak_tflops:g}: a peak is a positive number of TFLOP/s")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible (use --device cpu --small for a smoke run)")
    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    sizes, skip = SIZES["small" if args.small else "full"], set(filter(None, args.skip.split(",")))
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    report: dict = {"device": device_name, "torch": torch.__version__, "dtype": dtype,
                    "policy": "small" if args.small else "qwen3-0.6b-shape",
                    "peak_tflops": peak_tflops(device_name, args.peak_tflops)}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pcl-gpu-check-") as tmp:
        if "scale" not in skip:  # first, on an empty GPU: its peak memory is the step's alone
            report["scale"] = check_scale(Path(tmp), args.device, args.small, sizes["scale"], report["peak_tflops"])
        for name in filter(None, args.scale_variants.split(",")):
            if name not in SCALE_VARIANTS:
                parser.error(f"--scale-variants: unknown {name!r} (known: {', '.join(SCALE_VARIANTS)})")
            report.setdefault("scale_variants", {})[name] = check_scale(
                Path(tmp), args.device, args.small, sizes["scale"], report["peak_tflops"], SCALE_VARIANTS[name])
            print(f"  variant {name}: {_scale_line(report['scale_variants'][name], report['peak_tflops'])}",
                  flush=True)
        if args.weights:
            report["weights"] = check_weight_buckets(Path(tmp), args.device, args.small)
        path = build_qwen3(Path(tmp) / "policy", SHAPES["small" if args.small else "0.6b"], getattr(torch, dtype))
        report["parameters"] = _parameters(path)
        engine = learner = None
        if "engine" not in skip:
            report["engine"], engine = check_engine(path, args.device, dtype, sizes["engine"])
        if "learner" not in skip:
            report["learner"], learner = check_learner(path, args.device, dtype, sizes["learner"])
            report["learner"]["mfu"] = mfu(report["parameters"], report["learner"]["tokens_per_second"],
                                           report["peak_tflops"])
        if "value" not in skip:
            report["value"] = check_value(path, args.device, sizes["value"])
        if engine is not None and learner is not None:
            report["weight_sync"] = check_weight_sync(learner, engine, args.device)
    return finish_report(report, started, print_report, args.out, args.json)


def _parameters(path: Path) -> int:
    """The parameters of the checkpoint at `path` (tied embeddings counted once, as stored)."""
    from safetensors import safe_open

    total = 0
    for file in path.glob("*.safetensors"):
        with safe_open(str(file), "pt") as f:
            total += sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())
    return total


def _ratio(value: float | None, peak: float | None) -> str:
    return "n/a (no peak known: --peak-tflops)" if value is None else f"{value:.1%} of {peak:g} TFLOP/s"


def _scale_line(c: dict, peak: float | None) -> str:
    return (f"{c['shape']} policy, {c['sequences']} x {c['sequence_tokens']} tokens, {c['preset']} settings (budget "
            f"{c['max_tokens_per_micro_batch']}, checkpointing {'on' if c['activation_checkpointing'] else 'off'}, "
            f"compile {'on' if c['compile'] else 'off'}, {c['dtype']}, attention {c['attention']}): "
            f"{c['micro_batches']:.0f} micro-batches, {c['seconds']:.2f} s, {c['tokens_per_second']:,.0f} tokens/s, "
            f"peak {c['peak_memory_gb']:.1f} GB, MFU {_ratio(c['mfu'], peak)}, HFU {_ratio(c['hfu'], peak)}")


def print_report(r: dict) -> None:
    print(f"device {r['device']}, torch {r['torch']}, {r['dtype']}, {r['seconds']:.0f} s in all")
    if "scale" in r:
        print(f"  scale        {_scale_line(r['scale'], r['peak_tflops'])}")
    for name, figures in r.get("scale_variants", {}).items():
        print(f"    {name:<20} {_scale_line(figures, r['peak_tflops'])}")
    if "engine" in r:
        e = r["engine"]
        print(f"  engine       {e['prompts']} prompts x n={e['n']}, {e['prompt_tokens']}-token prompts, "
              f"{e['generated_tokens']} tokens in {e['seconds']:.2f} s: {e['tokens_per_second']:,.0f} tokens/s")
    if "learner" in r:
        lr = r["learner"]
        print(f"  learner      {r['policy']} ({r['parameters'] / 1e6:.1f} M parameters), {lr['backend']}, "
              f"{lr['sequences']} sequences, {lr['tokens']} tokens, micro-batch {lr['micro_batch_size']}: "
              f"{lr['seconds']:.2f} s, {lr['tokens_per_second']:,.0f} tokens/s, grad norm {lr['grad_norm']:.3f}, "
              f"MFU (6 N) {_ratio(lr['mfu'], r['peak_tflops'])}")
    if "value" in r:
        v = r["value"]
        print(f"  value        scored {v['candidates']} prompts in {v['score_seconds']:.3f} s "
              f"({v['scored_prompts_per_second']:,.0f}/s) in float32, {v['score_seconds_bf16']:.3f} s with the "
              f"bfloat16 copy: x{v['bf16_speedup']:.2f}, values within {v['bf16_max_gap']:.1e}; one step on "
              f"{v['selected']} in {v['train_seconds']:.3f} s (copy refresh {v['refresh_seconds']:.3f} s)")
    if "weight_sync" in r:
        w = r["weight_sync"]
        print(f"  weight sync  {w['tensors']} tensors, {w['bytes'] / 1e6:.1f} MB: gather {w['gather_seconds']:.3f} s "
              f"+ load {w['load_seconds']:.3f} s = {w['seconds']:.3f} s")
    if "weights" in r:
        from bench.weight_buckets import weights_line

        print(f"  weights      {weights_line(r['weights'])}")
    if "scale" in r:
        print(f"scale check MFU: {_ratio(r['scale']['mfu'], r['peak_tflops'])}")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    run(main)
