"""The paper's headline: picking m intermediate prompts out of k*m with the value model against estimating
their pass rates with rollouts, on the tiny task, one process, the same hardware.

    python bench/selection.py                  # m and k of configs/tiny.yaml: about a minute on 2 cores
    python bench/selection.py --m 128 --k 4 --value-prompts 4096

Per step, PCL pays V's inference on the k*m candidates plus one training step of V on the m selected prompts;
the rollout alternative (which the paper found as accurate as V with 3 rollouts per prompt) generates and
verifies 3 responses for each of the k*m candidates. V is the same size as the policy (the tiny Qwen3
backbone with a scalar head), both run on the CPU with the same threads, the HF engine generates with the
run config's sampling (temperature 1, max_new_tokens), math-verify scores in process. Each cost is the median
of `--repeats` timings on fresh candidates.

Before timing, V is trained as PCL trains it (one step per m prompts against n-rollout pass rates of the
initial policy) on `--value-prompts` training prompts, so its accuracy is that of a V partway into a run. The
accuracy part compares, on `--eval-prompts` other prompts, the explained variance 1 - Var(p - x)/Var(p) of V
and of j-rollout estimates (j = 1..16) against a reference pass rate p from 32 further rollouts.

The paper reports 12.1x (MATH) and 16.9x (DeepScaleR) for its models and hardware; the last line of the
output ends with our speed-up.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

REFERENCE_ROLLOUTS = 32
MAX_ESTIMATE_ROLLOUTS = 16
ESTIMATE_ROLLOUTS = 3  # the rollout estimate the paper found as accurate as V


def rewards_of(engine, params, prompts) -> np.ndarray:
    """float[len(prompts), params.n]: verified rewards of freshly generated responses (0 when truncated)."""
    from pcl.reward import math_reward

    groups = engine.generate([list(p.prompt_token_ids) for p in prompts], params)
    return np.array([[0.0 if g.finish_reason == "length" else math_reward(g.text, p.answer) for g in group]
                     for p, group in zip(prompts, groups)])


def explained_variance(p: np.ndarray, x: np.ndarray) -> float:
    return float(1.0 - np.var(p - x) / np.var(p))


def median_seconds(fn, repeats: int) -> float:
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "tiny.yaml"))
    parser.add_argument("--m", type=int, default=None, help="prompts per step (default: the config's run.m)")
    parser.add_argument("--k", type=int, default=None, help="pool factor (default: the config's selection.k)")
    parser.add_argument("--value-prompts", type=int, default=2048, help="prompts V is trained on before timing")
    parser.add_argument("--value-epochs", type=int, default=3)
    parser.add_argument("--eval-prompts", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="torch threads for the policy and V alike")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    from pcl.config import load_config
    from pcl.data import load_prompts
    from pcl.engines.base import SamplingParams
    from pcl.engines.hf import HFEngine
    from pcl.selection import select_closest
    from pcl.value import ValueModel, ValueTrainer
    from entrypoints.train import resolve_model_path

    cfg = load_config(args.config)
    m = args.m or cfg.run.m
    k = args.k or getattr(cfg.selection, "k", 4)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    policy = resolve_model_path(cfg.model.path, "model.path")
    tokenizer = AutoTokenizer.from_pretrained(policy)
    prompts, _ = load_prompts(cfg.data, tokenizer, split="train", seed=args.seed)
    order = np.random.default_rng(args.seed).permutation(len(prompts))
    need = args.value_prompts + args.eval_prompts + args.repeats * k * m
    if need > len(prompts):
        parser.error(f"{need} distinct prompts needed (value + eval + timing pools), the training set has "
                     f"{len(prompts)}")
    pick = [prompts[i] for i in order]
    train_pool, eval_pool = pick[:args.value_prompts], pick[args.value_prompts:args.value_prompts + args.eval_prompts]
    timing_pools = [pick[len(train_pool) + len(eval_pool) + r * k * m:][: k * m] for r in range(args.repeats)]

    engine = HFEngine(policy, device="cpu", seed=args.seed)
    sampling = lambda n: SamplingParams.from_rollout_config(cfg.rollout, n=n)  # noqa: E731
    value_path = resolve_model_path(cfg.value.path, "value.path") if cfg.value.path else policy
    trainer = ValueTrainer(ValueModel.from_pretrained(value_path), lr=cfg.value.lr, grad_clip=cfg.value.grad_clip,
                           batch_size=cfg.value.batch_size)
    params = sum(p.numel() for p in engine.model.parameters()), sum(p.numel() for p in trainer.model.parameters())
    print(f"policy {params[0] / 1e6:.2f} M parameters, V {params[1] / 1e6:.2f} M; m={m}, k={k}, "
          f"{torch.get_num_threads()} torch threads, {cfg.rollout.engine} engine, max_new_tokens "
          f"{cfg.rollout.max_new_tokens}", flush=True)

    # V as PCL trains it: one step per m prompts against pass rates of n rollouts.
    start = time.perf_counter()
    targets = rewards_of(engine, sampling(cfg.run.n), train_pool).mean(axis=1)
    for _ in range(args.value_epochs):
        for s in range(0, len(train_pool) - m + 1, m):
            trainer.train_step([list(p.prompt_token_ids) for p in train_pool[s:s + m]], targets[s:s + m])
    print(f"V trained on {len(train_pool)} prompts x {args.value_epochs} epochs ({trainer.steps} steps, "
          f"{time.perf_counter() - start:.0f}s)", flush=True)

    # Accuracy: V and j-rollout estimates against a 32-rollout reference, on prompts V never saw.
    values = trainer.score([list(p.prompt_token_ids) for p in eval_pool])
    reference = rewards_of(engine, sampling(REFERENCE_ROLLOUTS), eval_pool).mean(axis=1)
    estimates = rewards_of(engine, sampling(MAX_ESTIMATE_ROLLOUTS), eval_pool)
    ev_v = explained_variance(reference, values)
    print(f"\nexplained variance against a {REFERENCE_ROLLOUTS}-rollout pass rate, {len(eval_pool)} held-out prompts:")
    print(f"  {'V':>12}  {ev_v:+.3f}")
    ev_rollouts = {}
    for j in range(1, MAX_ESTIMATE_ROLLOUTS + 1):
        ev_rollouts[j] = explained_variance(reference, estimates[:, :j].mean(axis=1))
        print(f"  {j:>2} rollouts{'':>1}  {ev_rollouts[j]:+.3f}")
    matched = max([j for j, ev in ev_rollouts.items() if ev <= ev_v], default=0)
    print(f"  V is as accurate as a {matched}-rollout estimate" if matched else
          "  V is less accurate than a 1-rollout estimate")

    # Cost per step: V's inference on k*m and training on m, against 3 rollouts of each of the k*m.
    def v_step(r: int) -> None:
        pool = [list(p.prompt_token_ids) for p in timing_pools[r]]
        chosen = select_closest(trainer.score(pool), m, 0.5)
        trainer.train_step([pool[i] for i in chosen], np.full(m, 0.5))  # the targets do not change its cost

    def rollout_step(r: int) -> None:
        p = rewards_of(engine, sampling(ESTIMATE_ROLLOUTS), timing_pools[r]).mean(axis=1)
        select_closest(p, m, 0.5)

    score_s = median_seconds(lambda r: trainer.score([list(p.prompt_token_ids) for p in timing_pools[r]]),
                             args.repeats)
    v_s = median_seconds(v_step, args.repeats)
    rollout_s = median_seconds(rollout_step, args.repeats)
    print(f"\nseconds to pick {m} of {k * m} candidates (median of {args.repeats}):")
    print(f"  value model (inference on {k * m} + one training step on {m}): {v_s:.3f} s "
          f"(inference alone {score_s:.3f} s)")
    print(f"  {ESTIMATE_ROLLOUTS} rollouts per candidate ({ESTIMATE_ROLLOUTS * k * m} generations + math-verify): "
          f"{rollout_s:.3f} s")
    print("  paper: 12.1x (MATH), 16.9x (DeepScaleR)")
    print(f"speed-up of V over the {ESTIMATE_ROLLOUTS}-rollout estimate (m={m}, k={k}, tiny task, CPU): "
          f"{rollout_s / v_s:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
