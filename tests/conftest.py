"""Shared fixtures, one of each (built locally, no network):

- `tiny_model` (session): the embedded default's warm-started tiny model (`pcl make-tiny`, seed 0), built on first
  use into PCL_CACHE and reused; its path.
- `untrained_tiny` (session): the same policy shape (`pcl.tiny.build.policy_config`) with random weights (seed 0)
  and the tiny tokenizer, for tests that run the pipeline without the warmed-up build.
- `tiny_model_dir` (session): a 2-layer, width-64 Qwen3 with random weights (seeded) and the tiny tokenizer, that
  `AutoModelForCausalLM`, `AutoModel` and `AutoTokenizer` load like any Hugging Face checkpoint; built in well
  under a second. Read-only for tests: copy it to modify it.
- `ray_session` (session): local Ray, started once by `actors.runtime.start_ray` (the runtime environment the
  actors run with) and shut down at the end. Tests that use it run after all the others, so that Ray starts once
  and the rest of the suite runs without it.

The one tokenizer is the product's: `pcl.tiny.tokenizer.build_tokenizer()`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

# Embedding rows of the random test model: more than the tokenizer's 18 tokens, as a Qwen3 embedding has more
# rows than its tokenizer has tokens (151,936 for 151,669); ids past the tokenizer decode to nothing.
TINY_VOCAB_SIZE = 32


def build_tiny_qwen3(vocab_size: int = TINY_VOCAB_SIZE, seed: int = 0, **shape):
    """A random 2-layer Qwen3ForCausalLM, hidden 64, tied embeddings like the small Qwen3 models; `shape`
    overrides config fields (vLLM's CPU attention, for one, needs head_dim 32)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from pcl.tiny.tokenizer import BOS, EOS, PAD, VOCAB

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
        "pad_token_id": VOCAB[PAD],
        "eos_token_id": VOCAB[EOS],
        "bos_token_id": VOCAB[BOS],
        **shape,
    })
    torch.manual_seed(seed)
    # The default init (std 0.02) gives near-uniform next-token distributions; a wider one makes greedy
    # and sampled outputs differ, which the engine tests rely on.
    config.initializer_range = 0.2
    return Qwen3ForCausalLM(config).eval()


@pytest.fixture(scope="session")
def tiny_model() -> str:
    """Path of the warm-started tiny model (built once into PCL_CACHE, then reused)."""
    from pcl.tiny.build import build_tiny

    return str(build_tiny(seed=0))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """Directory of a saved tiny random Qwen3 policy and the tiny tokenizer (read-only for tests: copy to modify)."""
    from pcl.tiny.tokenizer import build_tokenizer

    path = tmp_path_factory.mktemp("tiny_qwen3")
    tokenizer = build_tokenizer()
    model = build_tiny_qwen3()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


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


@pytest.fixture(scope="session")
def ray_session():
    """Local Ray for the whole session (or the cluster in RAY_ADDRESS), with the actors' runtime environment."""
    import ray

    from actors.runtime import start_ray

    own = start_ray()
    yield
    if own:
        ray.shutdown()


def _uses_ray(item) -> bool:
    return "ray_session" in getattr(item, "fixturenames", ()) or item.get_closest_marker("ray") is not None


def pytest_collection_modifyitems(config, items):
    """Tests on the Ray session run last (in their order): Ray starts once, and the others run without it. With
    pytest-xdist (`make test` runs 2 workers, `--dist loadgroup`) every Ray test is in one group, so they run one
    after the other on one worker, with one Ray, while the other worker takes the rest of the suite."""
    for item in items:
        if _uses_ray(item):
            item.add_marker(pytest.mark.xdist_group("ray"))
    uses_ray = [item for item in items if "ray_session" in getattr(item, "fixturenames", ())]
    if uses_ray:
        others = [item for item in items if "ray_session" not in getattr(item, "fixturenames", ())]
        items[:] = others + uses_ray
