"""decoder_layers finds the layers of a model FSDP2 has sharded (fully_shard gives each module a subclass named
FSDP<class>): a sharded V with activation checkpointing (the 4B and 8B presets) starts."""

from __future__ import annotations

import socket

import torch
import torch.distributed as dist


def test_decoder_layers_of_a_model_sharded_by_fsdp2():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import Qwen3Config, Qwen3Model

    from pcl.models.policy_forward import decoder_layers

    model = Qwen3Model(Qwen3Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, head_dim=8))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        for layer in model.layers:
            fully_shard(layer, mesh=mesh)
        assert type(model.layers[0]).__name__ != "Qwen3DecoderLayer"  # FSDP2's subclass
        assert decoder_layers(model) == list(model.layers)
    finally:
        dist.destroy_process_group()
    assert torch.is_tensor(next(model.parameters()))
