"""Generation engines: one interface (`Engine`), two implementations (Hugging Face transformers, vLLM).

    engine = make_engine(cfg.rollout, model_path, seed=cfg.run.seed, dtype=cfg.model.dtype)
    groups = engine.generate(prompt_token_ids, SamplingParams.from_rollout_config(cfg.rollout, n=cfg.run.n))

The engine modules import transformers / vllm lazily, and the interface (`pcl.engines.base`, which needs torch)
is loaded on first use of its names, so importing this package, or its request types (`pcl.engines.request`:
what the streams carry), is cheap.
"""

from __future__ import annotations

from typing import Any

from pcl.engines.request import RolloutRequest, SamplingParams

__all__ = ["Engine", "FinishReason", "Generation", "NamedTensors", "RolloutRequest", "SamplingParams", "make_engine",
           "max_model_len"]
_INTERFACE = ("Engine", "FinishReason", "Generation", "NamedTensors")  # pcl.engines.base's, loaded when first used


def __getattr__(name: str) -> Any:
    if name in _INTERFACE:
        from pcl.engines import base

        return getattr(base, name)
    raise AttributeError(f"module 'pcl.engines' has no attribute {name!r}")


def max_model_len(cfg) -> int:
    """vLLM's context length for a run (`pcl.config.Config`): the longest prompt kept (data.max_prompt_tokens) and
    the longest response asked for, training's (rollout.max_new_tokens) or the evaluations' that go through the
    same fleet (evaluation.max_new_tokens). Without it vLLM sizes for the model's own context (32k-128k)."""
    evaluation = cfg.evaluation.max_new_tokens or cfg.rollout.max_new_tokens
    return cfg.data.max_prompt_tokens + max(cfg.rollout.max_new_tokens, evaluation)


def make_engine(rollout_cfg, model_path: str, seed: int, *, dtype: str | None = None,
                device: str = "auto", **engine_kwargs: Any) -> Engine:
    """The engine named by `rollout_cfg.engine` (a `pcl.config.RolloutConfig`), loaded from `model_path`.

    Args:
        rollout_cfg: the run's rollout section: engine, tensor_parallel_size, gpu_memory_utilization.
        model_path: checkpoint directory of the policy.
        seed: base sampling seed.
        dtype: parameter dtype ("float32", "bfloat16", "float16"); the engine's default when None
            (float32 for HF, the checkpoint's for vLLM).
        device: HF engine only: "auto", "cpu" or "cuda[:N]" (vLLM places itself).
        engine_kwargs: passed on (HFEngine: max_batch_size, num_threads, tokenizer_path; VLLMEngine:
            max_model_len, update_chunk_bytes, vllm.LLM arguments).
    """
    if rollout_cfg.engine == "hf":
        from pcl.engines.hf import HFEngine

        return HFEngine(model_path, device=device, dtype=dtype or "float32", seed=seed, **engine_kwargs)
    if rollout_cfg.engine == "vllm":
        from pcl.engines.vllm import VLLMEngine, executor_backend

        engine_kwargs.setdefault("distributed_executor_backend", executor_backend(rollout_cfg.tensor_parallel_size))
        return VLLMEngine(
            model_path,
            tensor_parallel_size=rollout_cfg.tensor_parallel_size,
            gpu_memory_utilization=rollout_cfg.gpu_memory_utilization,
            dtype=dtype or "auto",
            seed=seed,
            **engine_kwargs,
        )
    raise ValueError(f"rollout.engine: expected 'hf' or 'vllm', got {rollout_cfg.engine!r}")
