"""Shared fixtures: tiny random Qwen3 checkpoints built locally.

`untrained_tiny` is the embedded default's policy shape (`pcl.tiny.build.policy_config`) with random weights and
its tokenizer, for tests that run the pipeline without the warmed-up build. `tiny_model_dir` is a directory that `AutoModelForCausalLM`, `AutoModel` and `AutoTokenizer` load like
any Hugging Face checkpoint: a 2-layer, width-64 Qwen3 with random weights (seeded) and a
character-level tokenizer of 32 symbols. No network, built once per test session in well under a second.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

# Character-level vocabulary: three special tokens, then one token per symbol.
TINY_SPECIAL_TOKENS = ["<pad>", "<eos>", "<unk>"]
TINY_SYMBOLS = list("0123456789+-*=? abcdefghijklm")
TINY_PAD_ID, TINY_EOS_ID = 0, 1


def build_tiny_tokenizer():
    """A PreTrainedTokenizerFast that splits text into characters; <pad> = 0, <eos> = 1."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(TINY_SPECIAL_TOKENS + TINY_SYMBOLS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()  # characters join without separators
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )


def build_tiny_qwen3(vocab_size: int, seed: int = 0, **shape):
    """A random 2-layer Qwen3ForCausalLM, hidden 64, tied embeddings like the small Qwen3 models; `shape`
    overrides config fields (vLLM's CPU attention, for one, needs head_dim 32)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**{
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 256,
        "tie_word_embeddings": True,
        "pad_token_id": TINY_PAD_ID,
        "eos_token_id": TINY_EOS_ID,
        "bos_token_id": None,
        **shape,
    })
    torch.manual_seed(seed)
    # The default init (std 0.02) gives near-uniform next-token distributions; a wider one makes greedy
    # and sampled outputs differ, which the engine tests rely on.
    config.initializer_range = 0.2
    return Qwen3ForCausalLM(config).eval()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """Directory of a saved tiny Qwen3 policy and its tokenizer (read-only for tests: copy to modify)."""
    path = tmp_path_factory.mktemp("tiny_qwen3")
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_qwen3(vocab_size=len(tokenizer))
    model.generation_config.eos_token_id = TINY_EOS_ID
    model.generation_config.pad_token_id = TINY_PAD_ID
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def untrained_tiny(tmp_path_factory) -> Path:
    """Directory of the embedded default's policy shape with random weights (seed 0) and its tokenizer."""
    from transformers import Qwen3ForCausalLM

    from pcl.tiny.build import policy_config
    from pcl.tiny.tokenizer import build_tokenizer

    path = tmp_path_factory.mktemp("untrained-tiny")
    torch.manual_seed(0)
    tok = build_tokenizer()
    Qwen3ForCausalLM(policy_config(tok)).save_pretrained(path)
    tok.save_pretrained(path)
    return path
