"""Generation with vLLM on GPUs: the production engine, behind the same `Engine` interface as HFEngine.

    engine = VLLMEngine("Qwen/Qwen3-1.7B-Base", tensor_parallel_size=1, gpu_memory_utilization=0.6,
                        dtype="bfloat16", seed=0)
    groups = engine.generate(prompt_token_ids, SamplingParams(n=16, temperature=1.0, max_new_tokens=4096))
    engine.load_weights(learner_state_dict, version=step + 1)

vllm is imported inside `VLLMEngine.__init__`, so this module imports (and `pcl.engines.make_engine`
works for the HF engine) on machines without it.

Weight updates use vLLM's worker-extension route, stable across the V0/V1 engines: the LLM is built with
`worker_extension_cls` naming `WeightUpdateExtension` below, whose method vLLM mixes into every worker;
`LLM.collective_rpc("pcl_load_weights", args=(packed,))` then runs it on each tensor-parallel worker,
where `model.load_weights(weights=...)` maps Hugging Face names onto vLLM's fused and sharded
parameters. Tensors travel as safetensors bytes in chunks of `update_chunk_bytes`, a format every vLLM
version's RPC layer carries, since RPC arguments are serialised by the engine and raw tensors are not
carried reliably across versions. After an update the prefix cache is reset: its KV blocks were
computed with the old weights and would otherwise leak the previous policy into new samples.
Quantised checkpoints that need vLLM's layer-wise reload are not supported by this route.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator

import torch

from pcl.engines.base import (
    Engine,
    Generation,
    NamedTensors,
    SamplingParams,
    check_prompts,
    check_version,
    derive_seed,
    iter_named_tensors,
)

WORKER_EXTENSION = f"{__name__}.WeightUpdateExtension"
DEFAULT_UPDATE_CHUNK_BYTES = 512 << 20  # bounds the size of one RPC message and its CPU copy


class WeightUpdateExtension:
    """Methods vLLM adds to each of its GPU workers (passed as `worker_extension_cls`; runs in the worker)."""

    def pcl_load_weights(self, packed: bytes) -> int:
        """Load one safetensors-packed chunk of Hugging Face-named tensors into this worker's model."""
        from safetensors.torch import load

        tensors = load(packed)
        runner = self.model_runner  # type: ignore[attr-defined]  # provided by the vLLM worker
        model = runner.get_model() if hasattr(runner, "get_model") else runner.model
        model.load_weights(weights=list(tensors.items()))
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return len(tensors)


def pack_weights(named_tensors: Iterable[tuple[str, torch.Tensor]], chunk_bytes: int) -> Iterator[bytes]:
    """Safetensors blobs of at most about `chunk_bytes` each (one tensor larger than that gets its own).

    Tied parameters (an lm_head sharing the embedding's storage) are cloned: safetensors refuses tensors
    that share memory, and vLLM's loader expects each name it is given to be a separate tensor.
    """
    from safetensors.torch import save

    chunk: dict[str, torch.Tensor] = {}
    chunk_size = 0
    seen_storage: set[int] = set()
    for name, tensor in named_tensors:
        tensor = tensor.detach().to("cpu").contiguous()
        storage = tensor.untyped_storage().data_ptr()
        if storage in seen_storage:
            tensor = tensor.clone()
        seen_storage.add(storage)
        nbytes = tensor.numel() * tensor.element_size()
        if chunk and chunk_size + nbytes > chunk_bytes:
            yield save(chunk)
            chunk, chunk_size, seen_storage = {}, 0, {storage}
        chunk[name] = tensor
        chunk_size += nbytes
    if chunk:
        yield save(chunk)


class VLLMEngine(Engine):
    """A vLLM `LLM` (offline engine) behind the `Engine` interface.

    Args:
        model_path: Hugging Face checkpoint directory or hub name.
        tensor_parallel_size: GPUs the model is sharded over.
        gpu_memory_utilization: fraction of each GPU vLLM may take (weights + KV cache).
        dtype: "auto", "bfloat16", "float16" or "float32".
        seed: base seed; call k without `SamplingParams.seed` samples prompt i with derive_seed(seed, k, i).
        max_model_len: context length (prompt + response); the model's when None.
        update_chunk_bytes: size of one weight-update message.
        llm_kwargs: further `vllm.LLM` arguments (enforce_eager, enable_prefix_caching, ...).
    """

    def __init__(
        self,
        model_path: str,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.6,
        dtype: str = "auto",
        seed: int = 0,
        max_model_len: int | None = None,
        update_chunk_bytes: int = DEFAULT_UPDATE_CHUNK_BYTES,
        **llm_kwargs,
    ) -> None:
        try:
            import vllm
        except ImportError as exc:
            raise ImportError("VLLMEngine needs vLLM and a CUDA GPU: pip install 'pcl-service[gpu]', "
                              "or set rollout.engine=hf") from exc
        self._vllm = vllm
        self._seed = seed
        self._calls = 0
        self.update_chunk_bytes = update_chunk_bytes
        self._llm = vllm.LLM(
            model=model_path,
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            # vLLM reads generation_config.json only for its EOS ids (extra stop tokens, as HFEngine does);
            # the explicit SamplingParams of each request override its sampling presets.
            worker_extension_cls=WORKER_EXTENSION,
            **llm_kwargs,
        )
        self._policy_version = 0

    def generate(self, prompt_token_ids: list[list[int]], params: SamplingParams) -> list[list[Generation]]:
        if self._llm is None:
            raise RuntimeError("VLLMEngine.generate: the engine is closed")
        check_prompts(prompt_token_ids)  # vLLM checks ids against its own vocabulary
        call_seed = params.seed if params.seed is not None else derive_seed(self._seed, self._calls)
        self._calls += 1
        # One seed per prompt: a single seed shared by all prompts would correlate their samples.
        requests = [self._sampling_params(params, derive_seed(call_seed, index))
                    for index in range(len(prompt_token_ids))]
        prompts = [{"prompt_token_ids": list(prompt)} for prompt in prompt_token_ids]  # vllm TokensPrompt
        outputs = self._llm.generate(prompts, requests, use_tqdm=False)
        return [self._to_generations(index, output) for index, output in enumerate(outputs)]

    def _sampling_params(self, params: SamplingParams, seed: int):
        return self._vllm.SamplingParams(
            n=params.n,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k_enabled else -1,
            max_tokens=params.max_new_tokens,
            seed=seed,
            skip_special_tokens=True,
        )

    def _to_generations(self, prompt_index: int, request_output) -> list[Generation]:
        group = []
        for completion in sorted(request_output.outputs, key=lambda c: c.index):
            if completion.finish_reason not in ("stop", "length"):
                raise RuntimeError(f"vLLM request for prompt {prompt_index} ended with finish_reason "
                                   f"{completion.finish_reason!r}")
            tokens = list(completion.token_ids)
            group.append(Generation(
                prompt_index=prompt_index,
                sample_index=completion.index,
                token_ids=tokens,
                text=completion.text,
                finish_reason=completion.finish_reason,
                num_tokens=len(tokens),
                policy_version=self._policy_version,
            ))
        return group

    def load_weights(self, weights: NamedTensors, version: int) -> int:
        """Send Hugging Face-named tensors to every worker; a partial state dict is fine.

        On failure the engine reports policy_version -1 (weights possibly mixed) and re-raises.
        """
        if self._llm is None:
            raise RuntimeError("VLLMEngine.load_weights: the engine is closed")
        check_version(version)
        loaded = 0
        try:
            for packed in pack_weights(iter_named_tensors(weights), self.update_chunk_bytes):
                per_worker = self._llm.collective_rpc("pcl_load_weights", args=(packed,))
                loaded += int(per_worker[0])
            self._llm.reset_prefix_cache()
        except BaseException:
            self._policy_version = -1
            raise
        self._policy_version = version
        return loaded

    def close(self) -> None:
        self._llm = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
