"""The paper's headline: picking m intermediate prompts out of k*m with the value model against estimating
their pass rates with rollouts, and how the speed-up grows with the response length.

    python -m bench.selection                        # lengths 8, 32, 128, 512, 2048: about 2 minutes on 2 idle cores
    python -m bench.selection --quick                # lengths 8 and 128, a smaller V and curve
    python -m bench.selection --lengths 8,512 --width 256 --layers 4

Two parts, one process, the same hardware and torch threads for both sides.

Accuracy, on the tiny task. V (the tiny Qwen3 backbone with a scalar head, the policy's size) is trained as PCL
trains it (one step per m prompts against n-rollout pass rates of the initial policy) on `--value-prompts`
prompts. On `--eval-prompts` others, the explained variance 1 - Var(p - x)/Var(p) of V and of j-rollout
estimates (j = 1..16) is measured against a reference pass rate p from 32 further rollouts; j* is the largest j
whose estimate is no more accurate than V (the fair comparison; the paper found about 3).

Cost against response length. The tiny policy answers in ~8 tokens, so its rollouts are unrealistically cheap
next to V. The curve therefore uses a wider model of the same family, large enough that per-token work
dominates (`--width`, `--layers`: 256 x 4, about 3 M parameters, random weights with the tiny tokenizer; wider
is more faithful and slower), as both the policy and V, on the tiny task's prompts. Per step, PCL pays V's inference on C candidates plus one
training step of V on the C/k it selects; the rollout alternative generates n responses of each candidate with
the production engine (vLLM; its CPU build here) at a forced length L (EOS ignored, so every response has
exactly L tokens). Its responses are not verified (the random timing model writes noise, on which math-verify
mostly runs into its timeout): the rollout side is generation alone, which understates its cost. C is `--max-candidates` (k*m), fewer where L is long
(`--token-budget` bounds the tokens of one 3-rollout timing): both sides always time the same C candidates, and
a small C (long L) costs V relatively more (its batches are small), which understates its speed-up. The
j*-rollout cost is cost(1) + (j* - 1) (cost(3) - cost(1)) / 2 from the n=1 and n=3 timings (prefill once per
prompt, decoding per response). Each cost is the median of `--repeats` timings on fresh candidates (one for a
timing over `--long-s` seconds).

Printed per length: the speed-up against the 3-rollout estimate (the paper's comparison) and against the
j*-rollout estimate; then the lengths where the curve crosses the paper's 12.1x (MATH) and 16.9x
(DeepScaleR). The last line ends with the speed-up against 3 rollouts at the longest length (2048 by default).
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from bench import ROOT, add_json_option, run, write_figures

REFERENCE_ROLLOUTS = 32
MAX_ESTIMATE_ROLLOUTS = 16
ESTIMATE_ROLLOUTS = 3  # the rollout estimate the paper found as accurate as V
PAPER = {"MATH": 12.1, "DeepScaleR": 16.9}
DEFAULT_LENGTHS = "8,32,128,512,2048"


def rewards_of(engine, params, prompts) -> np.ndarray:
    """float[len(prompts), params.n]: verified rewards of freshly generated responses (0 when truncated)."""
    from pcl.reward.verdict import response_reward

    groups = engine.generate([list(p.prompt_token_ids) for p in prompts], params)
    return np.array([[response_reward(g.finish_reason, g.text, p.answer) for g in group]
                     for p, group in zip(prompts, groups)])


def explained_variance(p: np.ndarray, x: np.ndarray) -> float:
    return float(1.0 - np.var(p - x) / np.var(p))


def median_seconds(fn, repeats: int, long_s: float = math.inf) -> float:
    """Median of up to `repeats` timed calls fn(0), fn(1), ...; stops after a call that took over `long_s`."""
    times: list[float] = []
    for i in range(repeats):
        start = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - start)
        if times[-1] > long_s:
            break
    return statistics.median(times)


def accuracy(args, cfg, inputs, prompts, m: int) -> tuple[float, int]:
    """(V's explained variance, j*) on the tiny task: V trained as PCL trains it, then compared with j-rollout
    estimates against a 32-rollout reference on held-out prompts."""
    from pcl.engines import SamplingParams
    from pcl.engines.hf import HFEngine
    from pcl.models.value import ValueModel, ValueTrainer

    policy, value_path = inputs.policy_path, inputs.value_path
    train_pool = prompts[:args.value_prompts]
    eval_pool = prompts[args.value_prompts:args.value_prompts + args.eval_prompts]
    engine = HFEngine(policy, device="cpu", seed=args.seed)
    sampling = lambda n: SamplingParams.from_rollout_config(cfg.rollout, n=n)  # noqa: E731
    trainer = ValueTrainer(ValueModel.from_pretrained(value_path), lr=cfg.value.lr, grad_clip=cfg.value.grad_clip,
                           batch_size=cfg.value.batch_size)
    size = sum(p.numel() for p in trainer.model.parameters()) / 1e6
    start = time.perf_counter()
    targets = rewards_of(engine, sampling(cfg.run.n), train_pool).mean(axis=1)
    for _ in range(args.value_epochs):
        for s in range(0, len(train_pool) - m + 1, m):
            trainer.train_step([list(p.prompt_token_ids) for p in train_pool[s:s + m]], targets[s:s + m])
    print(f"accuracy, tiny task: V {size:.2f} M parameters trained on {len(train_pool)} prompts x "
          f"{args.value_epochs} epochs ({trainer.steps} steps of m={m}, {time.perf_counter() - start:.0f}s)",
          flush=True)

    values = trainer.score([list(p.prompt_token_ids) for p in eval_pool])
    reference = rewards_of(engine, sampling(REFERENCE_ROLLOUTS), eval_pool).mean(axis=1)
    estimates = rewards_of(engine, sampling(MAX_ESTIMATE_ROLLOUTS), eval_pool)
    ev_v = explained_variance(reference, values)
    print(f"explained variance against a {REFERENCE_ROLLOUTS}-rollout pass rate, {len(eval_pool)} held-out "
          f"prompts: V {ev_v:+.3f}")
    ev_rollouts = {j: explained_variance(reference, estimates[:, :j].mean(axis=1))
                   for j in range(1, MAX_ESTIMATE_ROLLOUTS + 1)}
    print("  j rollouts: " + "  ".join(f"{j}: {ev:+.3f}" for j, ev in ev_rollouts.items()))
    matched = max([j for j, ev in ev_rollouts.items() if ev <= ev_v], default=0)
    print(f"  V is as accurate as a {matched}-rollout estimate (j* = {max(matched, 1)})" if matched else
          "  V is less accurate than a 1-rollout estimate (j* = 1)", flush=True)
    return ev_v, max(matched, 1)


def timing_model(tokenizer, width: int, layers: int, max_len: int, seed: int, out_dir: Path) -> Path:
    """A Qwen3 checkpoint of the given width and depth (heads of 64, 2 KV heads, random weights) with the
    tiny tokenizer, for the cost curve: the tiny policy's 1.1 M parameters are too few for per-token work
    to dominate."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=width, intermediate_size=3 * width, num_hidden_layers=layers,
        num_attention_heads=width // 64, num_key_value_heads=2, head_dim=64, max_position_embeddings=max_len,
        tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    Qwen3ForCausalLM(config).save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return out_dir


def forced_length_engine(model_dir: Path, seed: int, max_len: int, kv_bytes: int):
    """The production VLLMEngine whose responses all run to max_new_tokens (EOS ignored)."""
    from pcl.engines.vllm import VLLMEngine

    class ForcedLength(VLLMEngine):
        def _sampling_params(self, params, request_seed):
            sampling = super()._sampling_params(params, request_seed)
            sampling.ignore_eos = True
            return sampling

    return ForcedLength(str(model_dir), dtype="float32", seed=seed, max_model_len=max_len,
                        kv_cache_memory_bytes=kv_bytes)


def cost_curve(args, tokenizer, prompts, j_fair: int) -> list[tuple[int, int, float, float, float]]:
    """(L, C, V seconds, 3-rollout seconds, j*-rollout seconds) per length, on the wide timing model."""
    import torch

    from pcl.engines import SamplingParams
    from pcl.strategies.selection import select_closest
    from pcl.models.value import ValueModel, ValueTrainer

    lengths = [int(x) for x in args.lengths.split(",")]
    max_len = max(len(p.prompt_token_ids) for p in prompts) + max(lengths) + 8
    workdir = Path(tempfile.mkdtemp(prefix="pcl-selection-bench-"))
    model_dir = timing_model(tokenizer, args.width, args.layers, max_len, args.seed, workdir)
    engine = forced_length_engine(model_dir, args.seed, max_len, args.kv_cache_mib << 20)
    torch.set_num_threads(args.threads)  # vLLM sets its own on construction; V gets the same
    trainer = ValueTrainer(ValueModel.from_pretrained(model_dir), lr=1e-6, batch_size=args.value_batch_size)
    size = sum(p.numel() for p in trainer.model.parameters()) / 1e6
    mean_prompt = statistics.mean(len(p.prompt_token_ids) for p in prompts)
    print(f"\ncost curve: policy and V {size:.1f} M parameters each ({args.layers} layers x {args.width}), "
          f"float32, {torch.get_num_threads()} torch threads; vLLM (CPU build) generates (not verified); "
          f"prompts of the tiny task ({mean_prompt:.1f} tokens on average); k={args.k}", flush=True)

    def v_step(pool) -> None:
        ids = [list(p.prompt_token_ids) for p in pool]
        m = max(1, len(ids) // args.k)
        chosen = select_closest(trainer.score(ids), m, 0.5)
        trainer.train_step([ids[i] for i in chosen], np.full(m, 0.5))  # the targets do not change its cost

    def rollout_step(pool, n: int, length: int) -> None:
        params = SamplingParams(n=n, temperature=1.0, max_new_tokens=length)
        groups = engine.generate([list(p.prompt_token_ids) for p in pool], params)
        if any(g.num_tokens != length for group in groups for g in group):
            raise RuntimeError(f"a response did not run to the forced length {length}")
        # Not verified: the random timing model's responses are noise, on which math-verify mostly times out.
        # Leaving verification out understates the rollout side's cost, so V's speed-up is a lower bound.
        select_closest(np.zeros(len(groups)), max(1, len(pool) // args.k), 0.5)

    v_step(prompts[:args.k])  # warm-up: first calls allocate
    rollout_step(prompts[:args.k], 1, 8)
    rows = []
    for length in lengths:
        fit = args.token_budget // (ESTIMATE_ROLLOUTS * length)
        c = min(args.max_candidates, max(args.min_candidates, 2 ** int(math.log2(max(fit, 1)))))
        pools = [prompts[(r * c) % len(prompts):][:c] for r in range(args.repeats)]
        v_s = median_seconds(lambda r: v_step(pools[r]), args.repeats)
        r3_s = median_seconds(lambda r: rollout_step(pools[r], ESTIMATE_ROLLOUTS, length), args.repeats, args.long_s)
        rj_s = r3_s
        if j_fair != ESTIMATE_ROLLOUTS:  # cost(n) = prefill + n * decode: from the 1- and 3-rollout timings
            r1_s = median_seconds(lambda r: rollout_step(pools[r], 1, length), args.repeats, args.long_s)
            rj_s = r1_s + (j_fair - 1) * (r3_s - r1_s) / (ESTIMATE_ROLLOUTS - 1)
        rows.append((length, c, v_s, r3_s, rj_s))
        print(f"  L={length:>5}  C={c:>5}  V {v_s:8.3f} s  {ESTIMATE_ROLLOUTS} rollouts {r3_s:8.3f} s  "
              f"{j_fair} rollouts {rj_s:8.3f} s  speed-up {r3_s / v_s:7.1f}x (vs {ESTIMATE_ROLLOUTS}), "
              f"{rj_s / v_s:7.1f}x (vs {j_fair})", flush=True)
    engine.close()
    return rows


def crossing(rows, target: float, column: int) -> str:
    """The response length where the speed-up (log-log interpolated between measured lengths) reaches target."""
    points = [(row[0], row[column] / row[2]) for row in rows]
    if points and points[0][1] >= target:
        return f"<= {points[0][0]} tokens"
    for (l0, s0), (l1, s1) in zip(points, points[1:]):
        if s0 < target <= s1:
            t = (math.log(target) - math.log(s0)) / (math.log(s1) - math.log(s0))
            return f"~{math.exp(math.log(l0) + t * (math.log(l1) - math.log(l0))):.0f} tokens"
    return f"not reached by {points[-1][0]} tokens" if points else "no lengths measured"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "tiny.yaml"))
    parser.add_argument("--quick", action="store_true", help="lengths 8,128, a smaller V training and token budget")
    parser.add_argument("--lengths", default=None, help=f"forced response lengths (default {DEFAULT_LENGTHS})")
    parser.add_argument("--m", type=int, default=None, help="prompts per V step in training (default: run.m)")
    parser.add_argument("--k", type=int, default=4, help="pool factor of the cost curve (the paper's 4)")
    parser.add_argument("--value-prompts", type=int, default=None, help="prompts V is trained on (default 2048)")
    parser.add_argument("--value-epochs", type=int, default=3)
    parser.add_argument("--eval-prompts", type=int, default=None, help="held-out prompts (default 512)")
    parser.add_argument("--width", type=int, default=256, help="the timing model's width (a multiple of 64)")
    parser.add_argument("--layers", type=int, default=4, help="the timing model's layers")
    parser.add_argument("--max-candidates", type=int, default=2048, help="k*m candidates at short lengths")
    parser.add_argument("--min-candidates", type=int, default=4, help="the fewest candidates at long lengths")
    parser.add_argument("--token-budget", type=int, default=None,
                        help="generated tokens of one 3-rollout timing (default 2**14; --quick 2**12)")
    parser.add_argument("--value-batch-size", type=int, default=256, help="V's prompts per forward pass")
    parser.add_argument("--kv-cache-mib", type=int, default=1024, help="vLLM's CPU KV cache")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--long-s", type=float, default=60.0, help="one timing over this many seconds suffices")
    parser.add_argument("--threads", type=int, default=2, help="torch threads for the policy and V alike")
    parser.add_argument("--seed", type=int, default=0)
    add_json_option(parser)
    args = parser.parse_args(argv)
    args.lengths = args.lengths or ("8,128" if args.quick else DEFAULT_LENGTHS)
    args.value_prompts = args.value_prompts or (512 if args.quick else 2048)
    args.eval_prompts = args.eval_prompts or (256 if args.quick else 512)
    args.token_budget = args.token_budget or (2 ** 12 if args.quick else 2 ** 14)
    if args.width % 64 or args.width < 128:
        parser.error(f"--width: expected a multiple of 64, at least 128; got {args.width}")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    from pcl.config import load_config
    from pcl.data.inputs import run_inputs, training_prompts

    cfg = load_config(args.config)
    m = args.m or cfg.run.m
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    inputs = run_inputs(cfg)
    prompts, _ = training_prompts(cfg, inputs.tokenizer, seed=args.seed)
    if args.value_prompts + args.eval_prompts > len(prompts):
        raise SystemExit(f"bench.selection: {args.value_prompts + args.eval_prompts} distinct prompts needed "
                         f"(value + eval), the training set has {len(prompts)}")
    prompts = [prompts[i] for i in np.random.default_rng(args.seed).permutation(len(prompts))]

    ev_v, j_fair = accuracy(args, cfg, inputs, prompts, m)
    timing_prompts = prompts[args.value_prompts + args.eval_prompts:] or prompts
    rows = cost_curve(args, inputs.tokenizer, timing_prompts, j_fair)

    print(f"\nspeed-up of V over rollout estimates against the response length (C candidates, k={args.k}, CPU):")
    print(f"  {'length':>6}  {'C':>5}  {'vs 3 rollouts':>13}  {f'vs {j_fair} (fair)':>13}")
    for length, c, v_s, r3_s, rj_s in rows:
        print(f"  {length:>6}  {c:>5}  {r3_s / v_s:12.1f}x  {rj_s / v_s:12.1f}x")
    for name, target in PAPER.items():
        print(f"  reaches the paper's {target}x ({name}): vs 3 rollouts at {crossing(rows, target, 3)}, "
              f"vs {j_fair} at {crossing(rows, target, 4)}")
    length, c, v_s, r3_s, rj_s = rows[-1]
    print(f"speed-up of V over the {ESTIMATE_ROLLOUTS}-rollout estimate at {length} tokens (vs {j_fair} rollouts: "
          f"{rj_s / v_s:.1f}x; C={c}, k={args.k}, CPU): {r3_s / v_s:.1f}x")
    return write_figures(args.json, {
        "explained_variance_v": ev_v, "j_star": j_fair, "k": args.k,
        "curve": [{"length": row[0], "candidates": row[1], "v_seconds": row[2], "rollouts_3_seconds": row[3],
                   "rollouts_j_seconds": row[4], "speedup_vs_3": row[3] / row[2], "speedup_vs_j": row[4] / row[2]}
                  for row in rows],
        "speedup_vs_3_at_longest": r3_s / v_s})


if __name__ == "__main__":  # vLLM may spawn its engine process: the guard keeps the child from re-running this
    run(main)
