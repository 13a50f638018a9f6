"""`pcl eval`: the paper's evaluation suite on one model, configured by a run config like `pcl train`.

    cfg = load_config(["configs/presets/qwen3-4b-base-math.yaml"], ["model.path=exports/q4b"])
    run_eval(cfg, out=None)          # the table on stdout; eval.json and eval.md in evals/q4b

What it reads: model.path (a Hugging Face model directory, a checkpoint's policy/, a hub name, or 'tiny'),
model.tokenizer, model.dtype and model.device; the `evaluation` section (suite, k, limit, temperature, top_p, top_k,
max_new_tokens: `pcl.benchmarks.eval_plan`); data.template, data.root and data.max_prompt_tokens; rollout.engine,
rollout.max_new_tokens (when evaluation.max_new_tokens is unset), rollout.gpu_memory_utilization and
rollout.tensor_parallel_size; verifier.processes and verifier.timeout_s; run.seed.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

from pcl.config import Config, ConfigError

HF_BATCH_SIZE = 256  # sequences (prompts x k) per generate call with the hf engine; vLLM batches by itself


def _load_suite(cfg: Config, model: str, plan) -> tuple[dict, str | None]:
    """The benchmarks' prompt records, templated with the model's tokenizer, and the data root they came from."""
    from transformers import AutoConfig

    from pcl import benchmarks as ev
    from pcl.data.inputs import load_tokenizer

    tokenizer = load_tokenizer(cfg, model)
    root = ev.eval_data_root(cfg.data.root)
    try:
        suite = ev.load_suite(plan.names, tokenizer, cfg.data.template, root=root, limit=cfg.evaluation.limit,
                              max_prompt_tokens=cfg.data.max_prompt_tokens)
    except (ValueError, OSError) as exc:
        raise ConfigError(str(exc)) from None
    context = getattr(AutoConfig.from_pretrained(model), "max_position_embeddings", None)
    longest = max(len(r.prompt_token_ids) for records in suite.values() for r in records) + plan.max_new_tokens
    if context and longest > context:
        print(f"pcl: warning: the longest prompt plus the response budget ({plan.max_new_tokens} tokens) is {longest} "
              f"tokens, beyond the model's context ({context} positions)", file=sys.stderr)
    return suite, root


def run_eval(cfg: Config, out: str | None = None) -> int:
    """Evaluate cfg.model.path on the configured suite; print the table, write eval.json and eval.md to `out`
    (default evals/<model name>). Bad input is a ConfigError naming it, before any model loads where it can be."""
    from pcl import benchmarks as ev
    from pcl.engines import make_engine
    from pcl.reward.pool import RewardPool

    try:
        plan = ev.eval_plan(cfg)
        plan.sampling_params(1)  # bad decoding fails here
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    engine_name = cfg.rollout.engine
    if engine_name == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ConfigError("rollout.engine = 'vllm': vLLM is not installed (pip install 'pcl-service[gpu]'); "
                          "use rollout.engine=hf")
    from pcl.data.inputs import resolve_model_path

    model = resolve_model_path(cfg.model.path, "model.path")
    suite, root = _load_suite(cfg, model, plan)
    batch_size = HF_BATCH_SIZE if engine_name == "hf" else 1 << 16
    extra = {"max_batch_size": batch_size} if engine_name == "hf" else {}
    try:
        engine = make_engine(cfg.rollout, model, cfg.run.seed, dtype=cfg.model.dtype, device=cfg.model.device,
                             **extra)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    start = time.perf_counter()
    with engine, RewardPool(processes=cfg.verifier.processes, timeout_s=cfg.verifier.timeout_s) as pool:
        results = ev.evaluate(engine, pool, suite, plan.ks, plan.sampling, plan.max_new_tokens, seed=cfg.run.seed,
                              batch_size=batch_size)
    meta = {"model": cfg.model.path, "model_path": model, "engine": engine_name, "template": cfg.data.template,
            **plan.sampling, "max_new_tokens": plan.max_new_tokens, "limit": cfg.evaluation.limit,
            "seed": cfg.run.seed, "data_root": root, "seconds": round(time.perf_counter() - start, 1)}
    paths = ev.write_reports(results, Path(out) if out else ev.default_out_dir(cfg.model.path, model), meta)
    print(ev.format_table(results))
    print(f"pcl: wrote {paths[0]} and {paths[1]}")
    return 0
