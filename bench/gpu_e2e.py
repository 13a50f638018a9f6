"""PCL end to end on one GPU (`pcl train --local`), and a Qwen3-1.7B-shaped step timed part by part.

    python -m bench.gpu_check --e2e --out e2e.json             # on a CUDA machine (the same as python -m bench.gpu_e2e)
    python -m bench.gpu_e2e --device cpu --small              # a smoke run of the same code on CPU (the default suite)

Needs what `bench/gpu_check.py` needs plus pydantic (the config) and math-verify (the reward), which a bare GPU
machine lacks: `python -m bench.gpu_wheels` downloads them for it as 10 wheels (10.1 MB; install line in its
docstring). Ray, Redis, vLLM, FastAPI and msgspec are not needed: `--local` runs without them (and without its
control plane where they are missing, said in a line; with them, it serves one on a free port). Two workloads:

  tiny-carry  `entrypoints.local.run_local` on configs/tiny-carry.yaml (the embedded default, its shipped policy) on
              the device for --steps steps: held-out accuracy at step 0 and after the last step (512 held-out
              prompts x 4 samples), steps per second of training, the mean step's split
  1.7b        a Qwen3-1.7B-shaped policy and V with random weights (28 layers, width 2048, 151,936 tokens), at
              configs/presets/qwen3-1.7b-base-math.yaml's lengths (1,024-token prompts, 3,072 new tokens), sampling and
              learner and V settings, the step cut from m=512 x n=16 to --m x --n (k=4 candidates a prompt); the
              parts of one --local step timed one after another with the same classes `pcl.loop.local` runs: V scores
              the k*m candidates and takes its step on m (V alone on the device: its float32 weights and AdamW state
              are ~27 GB), then the HF engine generates n responses of the m prompts (random weights rarely stop:
              every response runs to 3,072 tokens), the learner (1 rank, bf16 compute over float32 master weights,
              the preset's token budget and activation checkpointing; compilation off) takes its step on those m*n
              sequences (advantages +-1, so every sequence trains), and its weights are copied into the engine on
              the device (`pcl.loop.local.ports.LocalLearner.sync_weights`). The step's split is their sum. The engine is
              the HF engine (the preset's vLLM is not on such a machine).

Every figure goes to --out / --json. The last line printed is the tiny-carry run's held-out accuracy before -> after.
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
import time
from pathlib import Path

import torch

from bench import ROOT, add_json_option, run
from bench.learner import SHAPES, build_qwen3, finish_report, random_ids, synchronize

PRESET = ROOT / "configs" / "presets" / "qwen3-1.7b-base-math.yaml"
# tiny-carry: overrides of configs/tiny-carry.yaml; 1.7b: (m, n, k, prompt tokens, new tokens)
SIZES = {"full": {"tiny-carry": [], "1.7b": (8, 4, 4, 1024, 3072)},
         "small": {"tiny-carry": ["run.m=16", "run.n=4", "data.eval_size=32", "data.tiny_size=256",
                                  "value.ev_sample=8", "rollout.threads=1"], "1.7b": (4, 2, 4, 16, 16)}}


def check_tiny_carry(out: Path, device: str, steps: int, overrides: list[str]) -> dict:
    """The embedded default `--local` on the device for `steps` steps; its held-out accuracy before and after."""
    from entrypoints.local import run_local
    from pcl.config import load_config
    from pcl.loop.runlog import read_metrics

    gpus = ["learner.num_gpus_per_rank=1", "rollout.num_gpus_per_worker=1"] if device.startswith("cuda") else []
    cfg = load_config("configs/tiny-carry.yaml", [f"run.steps={steps}", f"run.eval_every={steps}",
                                                  "run.time_budget_s=null", "control.port=0",
                                                  "logging.backends=[console,jsonl]", *gpus, *overrides])
    start = time.perf_counter()
    assert run_local(cfg, run_dir=str(out)) == 0, "the --local run failed"
    records = read_metrics(out / "metrics.jsonl")
    trained = [r for r in records if "step_seconds" in r]
    split = {key: sum(r[key] for r in trained) / len(trained) for key in
             ("step_seconds", "selection_seconds", "generation_seconds", "train_seconds", "weight_sync_seconds")}
    return {"steps": len(trained), "m": cfg.run.m, "n": cfg.run.n, "held_out_prompts": cfg.data.eval_size,
            "eval_accuracy_before": records[0]["eval_accuracy"], "eval_se_before": records[0]["eval_accuracy_se"],
            "eval_accuracy_after": trained[-1]["eval_accuracy"], "eval_se_after": trained[-1]["eval_accuracy_se"],
            "train_seconds_total": trained[-1]["train_elapsed_seconds"],
            "steps_per_second": len(trained) / trained[-1]["train_elapsed_seconds"], "mean_step": split,
            "seconds": time.perf_counter() - start}


def _free(device: str) -> None:
    gc.collect()  # FSDP's hooks hold reference cycles: a learner's memory goes only now
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def _timed(device: str, call):
    synchronize(device)
    start = time.perf_counter()
    value = call()
    synchronize(device)
    return value, time.perf_counter() - start


def preset_config(device: str, small: bool, sizes: tuple):
    """The 1.7B preset with the step cut to (m, n) and, with `small`, its token budgets cut with the lengths."""
    from pcl.config import load_config

    m, n, k, prompt_len, new_tokens = sizes
    scale = (prompt_len + new_tokens) / 4096
    overrides = [f"run.m={m}", f"run.n={n}", f"selection.k={k}", f"data.max_prompt_tokens={prompt_len}",
                 f"rollout.max_new_tokens={new_tokens}", "rollout.engine=hf", "learner.compile=false"]
    if small:
        overrides += [f"learner.max_tokens_per_micro_batch={int(16384 * scale)}",
                      f"value.max_tokens_per_micro_batch={max(prompt_len, int(16384 * prompt_len / 1024))}"]
    if not device.startswith("cuda"):
        overrides += ["model.dtype=float32", "learner.num_gpus_per_rank=0", "rollout.num_gpus_per_worker=0",
                      "learner.backend=gloo"]
    return load_config(str(PRESET), overrides)


def check_preset_step(tmp: Path, device: str, small: bool, sizes: tuple) -> dict:
    """The 1.7B-shaped step's parts, one after another (see the module docstring)."""
    from pcl.engines import SamplingParams, make_engine
    from pcl.loop.local.parts import join_group
    from pcl.loop.local.ports import LocalLearner
    from pcl.models.learner import learner_for_run
    from pcl.models.value_sharded import build_value_trainer

    m, n, k, prompt_len, new_tokens = sizes
    cfg = preset_config(device, small, sizes)
    where = "cuda" if device.startswith("cuda") else "cpu"
    shape = SHAPES["small" if small else "1.7b"]
    path = build_qwen3(tmp / "policy-1.7b", shape, getattr(torch, cfg.model.dtype), where)
    candidates = random_ids(k * m, prompt_len, shape["vocab_size"], seed=4)
    out = {"shape": "small" if small else "qwen3-1.7b", "m": m, "n": n, "k": k, "prompt_tokens": prompt_len,
           "max_new_tokens": new_tokens, "dtype": cfg.model.dtype}

    trainer = build_value_trainer(cfg.value, str(path), where, cfg.run.seed)
    trainer.score(candidates[:2])  # warm-up: kernels, allocator
    _, out["value_score_seconds"] = _timed(where, lambda: trainer.score(candidates))
    _, out["value_train_seconds"] = _timed(where, lambda: trainer.train_step(candidates[:m], [0.5] * m))
    del trainer
    _free(where)

    engine = make_engine(cfg.rollout, str(path), cfg.run.seed, dtype=cfg.model.dtype, device=where)
    engine.generate(candidates[:2], SamplingParams(n=1, max_new_tokens=4))  # warm-up
    sampling = SamplingParams.from_rollout_config(cfg.rollout, n=n)
    groups, out["generation_seconds"] = _timed(where, lambda: engine.generate(candidates[:m], sampling))
    out["generated_tokens"] = sum(g.num_tokens for group in groups for g in group)
    out["generation_tokens_per_second"] = out["generated_tokens"] / out["generation_seconds"]

    join_group(where)
    model = cfg.model.model_copy(update={"path": str(path)})
    learner = LocalLearner(cfg, learner_for_run(cfg.learner, cfg.optimizer, model, cfg.run.seed, where), engine,
                           str(path))
    sequences = [{"prompt_token_ids": candidates[i // n], "response_token_ids": g.token_ids, "advantage": (-1.0) ** i}
                 for i, g in enumerate(g for group in groups for g in group)]
    learner.train(sequences[:2], 2)  # warm-up (and AdamW's state allocated)
    stats, out["learner_seconds"] = _timed(where, lambda: learner.train(sequences, m * n))
    tokens = sum(len(q["prompt_token_ids"]) + len(q["response_token_ids"]) for q in sequences)
    out["learner_tokens_per_second"] = tokens / out["learner_seconds"]
    out["learner_micro_batches"] = stats["micro_batches"]
    _, out["weight_sync_seconds"] = _timed(where, lambda: learner.sync_weights(1))
    out["weight_bytes"] = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    if where == "cuda":
        out["peak_memory_gb"] = torch.cuda.max_memory_allocated() / 1e9
    split = {"selection": out["value_score_seconds"], "generation": out["generation_seconds"],
             "train": out["learner_seconds"] + out["value_train_seconds"], "weight_sync": out["weight_sync_seconds"]}
    out["step_split_seconds"] = {**split, "step": sum(split.values())}
    del learner, engine
    _free(where)
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--small", action="store_true", help="small steps and a 2-layer width-64 model for 1.7b")
    parser.add_argument("--steps", type=int, default=None, help="tiny-carry steps (default 60; 2 with --small)")
    parser.add_argument("--skip", default="", help="comma-separated workloads to leave out: tiny-carry, 1.7b")
    parser.add_argument("--out", default=None, help="write every figure to this JSON file (as --json)")
    add_json_option(parser)
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible (use --device cpu --small for a smoke run)")
    sizes, skip = SIZES["small" if args.small else "full"], set(filter(None, args.skip.split(",")))
    steps = args.steps or (2 if args.small else 60)
    if not args.device.startswith("cuda"):
        torch.set_num_threads(1)  # a smoke run: on a busy CPU, OpenMP threads waiting on each other cost the most
    report = {"device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
              "torch": torch.__version__}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pcl-gpu-e2e-") as tmp:
        if "1.7b" not in skip:  # first, on an empty device
            report["1.7b"] = check_preset_step(Path(tmp), args.device, args.small, sizes["1.7b"])
        if "tiny-carry" not in skip:
            report["tiny-carry"] = check_tiny_carry(Path(tmp) / "tiny-carry", args.device, steps,
                                                    sizes["tiny-carry"])
    return finish_report(report, started, print_report, args.out, args.json)


def print_report(r: dict) -> None:
    print(f"device {r['device']}, torch {r['torch']}, {r['seconds']:.0f} s in all")
    if "1.7b" in r:
        p, s = r["1.7b"], r["1.7b"]["step_split_seconds"]
        print(f"  1.7b        {p['shape']} policy and V, {p['dtype']}, m={p['m']} x n={p['n']}, k={p['k']}, "
              f"{p['prompt_tokens']}-token prompts, {p['max_new_tokens']} new tokens, parts timed one after another")
        print(f"              generation {p['generated_tokens']} tokens in {p['generation_seconds']:.2f} s "
              f"({p['generation_tokens_per_second']:,.0f} tokens/s); V scored {p['k'] * p['m']} in "
              f"{p['value_score_seconds']:.3f} s, trained on {p['m']} in {p['value_train_seconds']:.3f} s; learner "
              f"step {p['learner_seconds']:.2f} s ({p['learner_tokens_per_second']:,.0f} tokens/s, "
              f"{p['learner_micro_batches']:.0f} micro-batches); weight copy {p['weight_bytes'] / 1e9:.2f} GB in "
              f"{p['weight_sync_seconds']:.3f} s")
        print("              step " + f"{s['step']:.2f} s: " + ", ".join(
            f"{key} {s[key]:.2f} s ({s[key] / s['step']:.0%})" for key in ("selection", "generation", "train",
                                                                          "weight_sync")))
    if "tiny-carry" in r:
        t, split = r["tiny-carry"], r["tiny-carry"]["mean_step"]
        print(f"  tiny-carry  {t['steps']} steps of m={t['m']} x n={t['n']} --local: {t['steps_per_second']:.2f} "
              f"steps/s of training; mean step {split['step_seconds']:.2f} s (selection "
              f"{split['selection_seconds']:.2f}, generation {split['generation_seconds']:.2f}, train "
              f"{split['train_seconds']:.2f}, weight sync {split['weight_sync_seconds']:.3f})")
        print(f"tiny-carry held-out accuracy ({t['held_out_prompts']} prompts): {t['eval_accuracy_before']:.3f} ± "
              f"{t['eval_se_before']:.3f} -> {t['eval_accuracy_after']:.3f} ± {t['eval_se_after']:.3f}")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    run(main)
