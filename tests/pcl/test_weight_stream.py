"""The learner's side of the collective weight sync (`pcl.weight_sync.stream.send_weights`) on a real two-rank gloo
FSDP2 learner of about 200 MB of bfloat16 weights, sent in 4 MiB buckets to a receiver (the ranks run in
tests/pcl/weight_stream_worker.py): the weights are gathered and sent bucket by bucket from the learner's own
tensors, never held whole on the host; what arrives equals the learner's full state bit for bit; a tied name the
engine shares is left out when asked."""

from __future__ import annotations

import json

import pytest

from tests.pcl import weight_stream_worker as worker

BUCKET_BYTES = 4 << 20


def build_model(path) -> None:
    """A random Qwen3 of 102 M parameters (8 layers of width 1024, a 8,192-token tied embedding), saved in bfloat16."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=8192, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                         num_attention_heads=8, num_key_value_heads=4, head_dim=128, max_position_embeddings=256,
                         tie_word_embeddings=True)
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).to(torch.bfloat16).save_pretrained(path)


@pytest.fixture(scope="module")
def sent(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("stream-model")
    build_model(model_dir)
    out = worker.run_ranks(str(model_dir), str(tmp_path_factory.mktemp("stream-out")), BUCKET_BYTES)
    return {name: json.loads((out / f"{name}.json").read_text())
            for name in ("sender", "received-skip", "received-all")}


def test_rank_0_never_holds_the_whole_state_while_it_sends(sent):
    """The first send's peak resident memory above its start stays under a third of the weights it sends: a few
    buckets and the largest tensor (measured: 42 MB for 206 MB). Gathering the full state to the host first cost
    565 MB here (the whole state, and the gather's buffers on top)."""
    stats = sent["sender"]
    assert stats["model_bytes"] > 150e6
    assert stats["peak_extra_rss"] < stats["model_bytes"] / 3, (
        f"peak {stats['peak_extra_rss'] / 1e6:.0f} MB above the start for {stats['model_bytes'] / 1e6:.0f} MB sent")


def test_the_tensors_handed_to_the_group_are_the_learners_own_device_with_no_host_copy(sent):
    """The send path asks for no host copy (`Tensor.cpu` is never called on rank 0 while it sends) and every
    tensor the group is handed is on the learner's device."""
    stats = sent["sender"]
    assert stats["cpu_calls"] == 0
    assert stats["devices"] == [stats["learner_device"]]


def test_what_arrives_equals_the_learners_full_state_and_the_tied_head_is_left_out_only_when_asked(sent):
    digests = sent["sender"]["digests"]
    assert "lm_head.weight" in digests and "model.embed_tokens.weight" in digests
    assert sent["received-skip"] == {name: d for name, d in digests.items() if name != "lm_head.weight"}
    assert list(sent["received-skip"]) == [name for name in digests if name != "lm_head.weight"]  # in order
    assert sent["received-all"] == digests
    head = sent["sender"]["sent_all"] - sent["sender"]["sent"]
    assert head == 8192 * 1024 * 2  # the head's bfloat16 bytes, sent only the second time
