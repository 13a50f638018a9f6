"""Generation with Hugging Face transformers, on CPU or one GPU: the tests' and the embedded default's engine.

    engine = HFEngine("runs/tiny/policy", device="cpu", seed=0)
    groups = engine.generate([[5, 6, 13, 7, 16]], SamplingParams(n=8, max_new_tokens=8))
    engine.load_weights(learner.state_dict(), version=1)

Prompts are generated in micro-batches of at most `max_batch_size` sequences (prompts x n) with left
padding and an attention mask (`model.generate` derives positions from the mask, so padding does not
shift them). Each prompt is prefilled once: the KV cache of all its tokens but the last is computed for
the distinct prompts and repeated for their n samples, whose generation starts at the last prompt token.
Against a prefill of every sample (`share_prefill=False`) that cuts the prefill n-fold, and it samples
the same tokens: the same logits, drawn in the same order. Sampling draws from torch's global generator
inside `torch.random.fork_rng`, seeded per call: results are reproducible and the caller's RNG state is left untouched. The generation config
is built from `SamplingParams` alone; nothing from the checkpoint's generation_config.json (a preset
temperature, top-k or repetition penalty) leaks into sampling except its EOS ids.
"""

from __future__ import annotations

import gc
import warnings

import torch

from pcl.engines.base import (
    Engine,
    Generation,
    NamedTensors,
    check_prompts,
    check_version,
    derive_seed,
    iter_named_tensors,
    left_pad,
    resolve_device,
    resolve_dtype,
)
from pcl.engines.request import SamplingParams

# transformers 5.x renames generate's and forward's `past_key_values` to `cache` and warns on every call (two
# lines per batch in a worker's log); the older name is the one every supported version accepts.
warnings.filterwarnings("ignore", message=r"`past_key_values` is deprecated", category=FutureWarning)


class HFEngine(Engine):
    """A transformers causal LM behind the `Engine` interface.

    Args:
        model_path: local Hugging Face checkpoint directory (or hub name, when the network allows).
        device: "auto" (CUDA if available), "cpu", "cuda" or "cuda:N".
        dtype: "float32", "bfloat16", "float16" or a torch dtype.
        seed: base seed; call k without an explicit `SamplingParams.seed` uses derive_seed(seed, k).
        max_batch_size: sequences (prompts x n) per forward pass; bounds activation and KV-cache memory.
        tokenizer_path: tokenizer directory, the model's when None.
        num_threads: when set, torch's intra-op threads for the whole process (torch.set_num_threads).
            Several engines, learners and scorers sharing a few cores run far faster with 1 thread each:
            OpenMP threads that spin-wait for busy cores slow a tiny model's forward pass down 10-50x.
        share_prefill: prefill each prompt once for its n samples (the default); False prefills every sample.
    """

    def __init__(
        self,
        model_path: str,
        device: str | torch.device = "auto",
        dtype: str | torch.dtype = "float32",
        seed: int = 0,
        max_batch_size: int = 1024,
        tokenizer_path: str | None = None,
        num_threads: int | None = None,
        share_prefill: bool = True,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if max_batch_size < 1:
            raise ValueError(f"max_batch_size: expected an integer >= 1, got {max_batch_size!r}")
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        self.device = resolve_device(device)
        self.max_batch_size = max_batch_size
        self.share_prefill = share_prefill
        self._seed = seed
        self._calls = 0
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path or model_path)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=resolve_dtype(dtype))
        self.model.to(self.device).eval().requires_grad_(False)
        self.eos_token_ids = self._find_eos_ids()
        self.pad_token_id = self._find_pad_id()
        self.vocab_size = self.model.get_input_embeddings().num_embeddings
        # Replace the checkpoint's generation defaults so that only SamplingParams steer sampling.
        self.model.generation_config = self._generation_config(SamplingParams(n=1, temperature=0.0))
        # Live views of every parameter by its state-dict name (tied weights appear under both names).
        self._targets = self.model.state_dict()
        self._policy_version = 0

    def _find_eos_ids(self) -> list[int]:
        configured = self.model.generation_config.eos_token_id
        if configured is None:
            configured = self.tokenizer.eos_token_id
        if configured is None:
            raise ValueError("model has no EOS token: set eos_token_id in generation_config.json "
                             "or in the tokenizer")
        return [configured] if isinstance(configured, int) else list(configured)

    def _find_pad_id(self) -> int:
        for candidate in (self.tokenizer.pad_token_id, self.model.generation_config.pad_token_id):
            if candidate is not None:
                return int(candidate)
        return self.eos_token_ids[0]  # padding is masked out, any id works

    def _generation_config(self, params: SamplingParams):
        from transformers import GenerationConfig

        sampling = not params.greedy
        # Greedy leaves the sampling knobs unset: transformers warns about any it would ignore.
        return GenerationConfig(
            max_new_tokens=params.max_new_tokens,
            do_sample=sampling,
            temperature=params.temperature if sampling else None,
            top_k=(params.top_k if params.top_k_enabled else 0) if sampling else None,  # 0: no top-k warper
            top_p=params.top_p if sampling else None,
            num_beams=1,
            repetition_penalty=1.0,
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            use_cache=True,
            output_scores=False,
            output_logits=False,  # every step's [rows, V] logits kept to the end: SampledLogprobs instead
            return_dict_in_generate=True,
        )

    # -----------------------------------------------------------------------------------------------------

    def generate(self, prompt_token_ids: list[list[int]], params: SamplingParams) -> list[list[Generation]]:
        if self.model is None:
            raise RuntimeError("HFEngine.generate: the engine is closed")
        check_prompts(prompt_token_ids, self.vocab_size)
        call_seed = params.seed if params.seed is not None else derive_seed(self._seed, self._calls)
        self._calls += 1
        generation_config = self._generation_config(params)
        # Sequence s is sample s % n of prompt s // n; a micro-batch holds whole prompts (n samples each).
        prompts_per_batch = max(1, self.max_batch_size // params.n)
        responses: list[tuple[list[int], list[float]]] = []
        rng_devices = []
        if self.device.type == "cuda":
            index = self.device.index
            rng_devices = [index if index is not None else torch.cuda.current_device()]
        with torch.random.fork_rng(devices=rng_devices), torch.inference_mode():
            torch.manual_seed(call_seed)
            for start in range(0, len(prompt_token_ids), prompts_per_batch):
                batch = prompt_token_ids[start:start + prompts_per_batch]
                responses.extend(self._generate_batch(batch, params.n, generation_config))
        return self._to_generations(responses, params)

    def _generate_batch(self, prompts: list[list[int]], n: int,
                        generation_config) -> list[tuple[list[int], list[float]]]:
        """(response token ids, their log-probabilities) for n samples of each prompt (prompt-major), cut after the
        first EOS. A log-probability is log softmax of the raw logits (before temperature / top-k / top-p), as
        vLLM reports it with logprobs=0."""
        input_ids, attention_mask = left_pad(prompts, self.pad_token_id)  # [P, W] each
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        width = input_ids.shape[1]
        shared = {}
        if self.share_prefill and n > 1 and width > 1:  # one sample per prompt: nothing to share
            shared["past_key_values"] = self._prefill_once(input_ids[:, :-1], attention_mask[:, :-1], n)
        with SampledLogprobs(self.model) as sampled:
            output = self.model.generate(
                input_ids=input_ids.repeat_interleave(n, dim=0),
                attention_mask=attention_mask.repeat_interleave(n, dim=0),
                generation_config=generation_config,
                **shared,
            )  # sequences [P * n, W + T], T <= max_new_tokens; rows that stopped early are padded after their EOS
        generated = output.sequences[:, width:]
        logprobs = sampled.finish(generated)  # [P * n, T]
        eos = set(self.eos_token_ids)
        responses = []
        for row, row_logprobs in zip(generated.tolist(), logprobs.tolist()):
            stop = next((index for index, token in enumerate(row) if token in eos), None)
            end = len(row) if stop is None else stop + 1
            responses.append((row[:end], row_logprobs[:end]))
        return responses

    def _prefill_once(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, n: int):
        """The KV cache of the distinct prompts' tokens (all but the last), repeated for n samples each.

        Positions come from the mask as `model.generate` derives them, so the cache is the one a prefill
        of every sample would build."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        positions = (attention_mask.cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)
        self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                   past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache.batch_repeat_interleave(n)
        return cache

    def _to_generations(self, responses: list[tuple[list[int], list[float]]],
                        params: SamplingParams) -> list[list[Generation]]:
        texts = self.tokenizer.batch_decode([tokens for tokens, _ in responses], skip_special_tokens=True)
        eos = set(self.eos_token_ids)
        groups: list[list[Generation]] = [[] for _ in range(len(responses) // params.n)]
        for index, ((tokens, logprobs), text) in enumerate(zip(responses, texts)):
            stopped = bool(tokens) and tokens[-1] in eos
            groups[index // params.n].append(Generation(
                prompt_index=index // params.n,
                sample_index=index % params.n,
                token_ids=tokens,
                text=text,
                finish_reason="stop" if stopped else "length",
                num_tokens=len(tokens),
                policy_version=self._policy_version,
                logprobs=logprobs,
            ))
        return groups

    # -----------------------------------------------------------------------------------------------------

    def load_weights(self, weights: NamedTensors, version: int) -> int:
        """Copy tensors into the model in place (dtype and device converted); a partial state dict is fine.

        Names are the model's state-dict names (`model.layers.0.self_attn.q_proj.weight`, ...). An unknown
        name or a shape mismatch raises ValueError. Tensors are copied as they stream in, so a failure can
        leave a mix of old and new weights: the engine then reports policy_version -1 (no valid version)
        and a rollout worker serves nothing until the next complete load.
        """
        if self.model is None:
            raise RuntimeError("HFEngine.load_weights: the engine is closed")
        check_version(version)
        loaded = 0
        try:
            with torch.no_grad():
                for name, tensor in iter_named_tensors(weights):
                    self._copy_one(name, tensor)
                    loaded += 1
        except BaseException:
            self._policy_version = -1
            raise
        self._policy_version = version
        return loaded

    def _copy_one(self, name: str, tensor: torch.Tensor) -> None:
        target = self._targets.get(name)
        if target is None:
            raise ValueError(f"load_weights: unknown parameter {name!r}; expected one of the model's "
                             f"state-dict names such as {next(iter(self._targets))!r}")
        if target.shape != tensor.shape:
            raise ValueError(f"load_weights: {name!r} has shape {tuple(tensor.shape)}, "
                             f"the model expects {tuple(target.shape)}")
        target.copy_(tensor)

    def close(self) -> None:
        self.model = None
        self._targets = {}
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


class SampledLogprobs:
    """The sampled tokens' log-probabilities during `model.generate`, in O(rows x V) memory.

    A forward hook on the model keeps the log-softmax of the newest position's raw logits (before temperature,
    top-k, top-p: what vLLM reports with logprobs=0) for one step only; the next forward's input ids are the
    tokens sampled from it, so it is reduced to their log-probabilities there, and `finish` takes the last
    step's. Keeping every step's logits instead (`output_logits=True`) holds rows x T x V floats: 74 GiB for
    512 samples of 256 tokens at a 151,936-token vocabulary.
    """

    def __init__(self, model) -> None:
        self.model, self.handle = model, None
        self.previous: torch.Tensor | None = None  # [rows, V] log-probabilities of the next token
        self.values: list[torch.Tensor] = []  # [rows] per generated position

    def __enter__(self) -> "SampledLogprobs":
        self.handle = self.model.register_forward_hook(self._hook, with_kwargs=True)
        return self

    def __exit__(self, *exc) -> None:
        self.handle.remove()

    def _hook(self, module, args, kwargs, output) -> None:
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        if self.previous is not None:
            self.values.append(self.previous.gather(-1, input_ids[:, -1:]).squeeze(-1))
        self.previous = output.logits[:, -1].float().log_softmax(-1)

    def finish(self, generated: torch.Tensor) -> torch.Tensor:
        """[rows, T] log-probabilities of `generated` ([rows, T]), the last position's taken here."""
        if self.previous is not None and len(self.values) < generated.shape[1]:
            last = generated[:, len(self.values)].unsqueeze(-1)
            self.values.append(self.previous.gather(-1, last).squeeze(-1))
        self.previous = None
        if not self.values:
            return generated.new_zeros(generated.shape, dtype=torch.float32)
        return torch.stack(self.values[: generated.shape[1]], dim=1)
